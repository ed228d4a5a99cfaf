// attention.cpp: causal multi-head self-attention with a saved log-sum-exp, forward and backward.
//
// Layouts: qkv/dqkv (B, T, 3*C) with C = NH*HS, rows [Q | K | V], each block head-major (head h owns columns
// h*HS .. (h+1)*HS of its block); out/dout (B, T, C) head-major; lse (B, NH, T).
// Per (b, h), with Q, K, V, O, dO the (T, HS) slices, t the query row, u the key row, scale = 1/sqrt(HS):
//   forward:  S = Q K^T * scale, masked to u <= t;  lse_t = log sum_u exp(S_tu);  P = exp(S - lse);  O = P V
//   backward: P recomputed from lse;  dV = P^T dO;  dP = dO V^T;  D_t = sum_u P_tu dP_tu (= dO_t . O_t);
//             dS = P * (dP - D_t);  dQ = dS K * scale;  dK = dS^T Q * scale.   dqkv is overwritten.
// Nothing of size (B, NH, T, T) exists. The fast path runs the (b, h) pairs in parallel, walks query rows t in
// order and keeps one row of scores/probabilities in a thread-local buffer that grows once; each (b, h) writes
// only its own columns, so there are no races and the result does not depend on the thread count.
// Precision: qkv, out, dout and dqkv are D; lse is fp32. For bf16 / fp16 the fast path converts qkv (and dout, out)
// into fp32 scratch once (each K and V row is read T times), accumulates each (b, h)'s output rows and dq/dk/dv in
// per-thread fp32 scratch, and rounds every element once on store.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "engine/backends/cpu/ops.h"
#include "engine/backends/cpu/ops/precision.h"
#include "engine/backends/cpu/ops/vec_math.h"

namespace ms::cpu {
namespace {

struct AttentionShape {
    int64_t B, T, NH, HS, C;
};

AttentionShape check_shapes(const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t NH) {
    MS_CHECK(qkv.ndim == 3, "attention: qkv must be (B, T, 3*C), got {} dims", qkv.ndim);
    MS_CHECK(NH > 0 && qkv.dim(2) % (3 * NH) == 0, "attention: qkv width {} is not a multiple of 3 * NH({})",
             qkv.dim(2), NH);
    const AttentionShape s{qkv.dim(0), qkv.dim(1), NH, qkv.dim(2) / (3 * NH), qkv.dim(2) / 3};
    MS_CHECK(out.numel() == s.B * s.T * s.C, "attention: out/dout has {} elements, expected B({}) * T({}) * C({})",
             out.numel(), s.B, s.T, s.C);
    MS_CHECK(lse.numel() == s.B * s.NH * s.T, "attention: lse has {} elements, expected B({}) * NH({}) * T({})",
             lse.numel(), s.B, s.NH, s.T);
    return s;
}

// Head h of batch b: row t of Q starts at q + t * stride (column h*HS of the qkv row), K at C further, V at 2*C.
template <class D>
struct HeadView {
    const D* q;
    const D* k;
    const D* v;
    int64_t stride;  // 3*C elements between consecutive rows
};

template <class D>
HeadView<D> head_view(const D* qkv, const AttentionShape& s, int64_t b, int64_t h) {
    const D* base = qkv + b * s.T * 3 * s.C + h * s.HS;
    return {base, base + s.C, base + 2 * s.C, 3 * s.C};
}

template <class D>
void forward_reference(const AttentionForwardArgs& a, const AttentionShape& s) {
    const D* qkv = a.qkv.as<D>();
    D* out = a.out.as<D>();
    float* lse = a.lse.f32();
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.HS));
    std::vector<double> p(static_cast<size_t>(s.T));
    for (int64_t b = 0; b < s.B; ++b) {
        for (int64_t h = 0; h < s.NH; ++h) {
            const HeadView<D> hv = head_view(qkv, s, b, h);
            for (int64_t t = 0; t < s.T; ++t) {
                const D* q = hv.q + t * hv.stride;
                double max = -std::numeric_limits<double>::infinity();
                for (int64_t u = 0; u <= t; ++u) {
                    const D* k = hv.k + u * hv.stride;
                    double dot = 0.0;
                    for (int64_t d = 0; d < s.HS; ++d) dot += static_cast<double>(to_float(q[d])) * to_float(k[d]);
                    p[u] = dot * scale;
                    max = std::max(max, p[u]);
                }
                double sum = 0.0;
                for (int64_t u = 0; u <= t; ++u) sum += std::exp(p[u] - max);
                const double row_lse = max + std::log(sum);
                D* o = out + (b * s.T + t) * s.C + h * s.HS;
                for (int64_t d = 0; d < s.HS; ++d) {
                    double acc = 0.0;
                    for (int64_t u = 0; u <= t; ++u) {
                        acc += std::exp(p[u] - row_lse) * to_float(hv.v[u * hv.stride + d]);
                    }
                    o[d] = from_float<D>(static_cast<float>(acc));
                }
                lse[(b * s.NH + h) * s.T + t] = static_cast<float>(row_lse);
            }
        }
    }
}

template <class D>
void backward_reference(const AttentionBackwardArgs& a, const AttentionShape& s) {
    const D* qkv = a.qkv.as<D>();
    const D* dout = a.dout.as<D>();
    const float* lse = a.lse.f32();
    D* dqkv = a.dqkv.as<D>();
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.HS));
    const size_t TT = static_cast<size_t>(s.T * s.T);
    std::vector<double> P(TT), dS(TT);  // (T, T) for one (b, h) at a time
    for (int64_t b = 0; b < s.B; ++b) {
        for (int64_t h = 0; h < s.NH; ++h) {
            const HeadView<D> hv = head_view(qkv, s, b, h);
            const D* dO = dout + b * s.T * s.C + h * s.HS;
            D* dq = dqkv + b * s.T * 3 * s.C + h * s.HS;
            D* dk = dq + s.C;
            D* dv = dq + 2 * s.C;
            const auto dot = [&](const D* x, const D* y) {
                double acc = 0.0;
                for (int64_t d = 0; d < s.HS; ++d) acc += static_cast<double>(to_float(x[d])) * to_float(y[d]);
                return acc;
            };
            for (int64_t t = 0; t < s.T; ++t) {
                const double row_lse = lse[(b * s.NH + h) * s.T + t];
                double D_t = 0.0;
                for (int64_t u = 0; u < s.T; ++u) {
                    if (u > t) {
                        P[t * s.T + u] = dS[t * s.T + u] = 0.0;
                        continue;
                    }
                    P[t * s.T + u] = std::exp(dot(hv.q + t * hv.stride, hv.k + u * hv.stride) * scale - row_lse);
                    dS[t * s.T + u] = dot(dO + t * s.C, hv.v + u * hv.stride);  // dP for now
                    D_t += P[t * s.T + u] * dS[t * s.T + u];
                }
                for (int64_t u = 0; u <= t; ++u) dS[t * s.T + u] = P[t * s.T + u] * (dS[t * s.T + u] - D_t);
            }
            for (int64_t t = 0; t < s.T; ++t) {
                for (int64_t d = 0; d < s.HS; ++d) {
                    double gq = 0.0, gk = 0.0, gv = 0.0;
                    for (int64_t u = 0; u < s.T; ++u) {
                        gq += dS[t * s.T + u] * to_float(hv.k[u * hv.stride + d]);
                        gk += dS[u * s.T + t] * to_float(hv.q[u * hv.stride + d]);
                        gv += P[u * s.T + t] * to_float(dO[u * s.C + d]);
                    }
                    dq[t * 3 * s.C + d] = from_float<D>(static_cast<float>(gq * scale));
                    dk[t * 3 * s.C + d] = from_float<D>(static_cast<float>(gk * scale));
                    dv[t * 3 * s.C + d] = from_float<D>(static_cast<float>(gv));
                }
            }
        }
    }
}

// Scratch for one row of scores: thread-local, grows to the largest T seen and is then reused.
float* row_scratch(int64_t T) {
    static thread_local std::vector<float> scratch;
    if (scratch.size() < static_cast<size_t>(2 * T)) scratch.resize(static_cast<size_t>(2 * T));
    return scratch.data();
}

inline float dot_f32(const float* x, const float* y, int64_t n) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t d = 0; d < n; ++d) acc += x[d] * y[d];
    return acc;
}

inline void axpy_f32(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
    for (int64_t d = 0; d < n; ++d) y[d] += alpha * x[d];
}

// The fast paths read fp32: the tensors themselves for D = fp32, else `src` converted once into scratch `slot`.
template <class D>
const float* as_f32(const Tensor& t, Scratch slot) {
    const D* src = t.as<D>();
    if constexpr (kIsF32<D>) {
        (void)slot;
        return src;
    } else {
        const int64_t n = t.numel();
        float* dst = scratch_f32(slot, static_cast<size_t>(n));
#pragma omp parallel
        convert_to_f32_team(src, dst, n);
        return dst;
    }
}

template <class D>
void forward_fast(const AttentionForwardArgs& a, const AttentionShape& s) {
    const float* qkv = as_f32<D>(a.qkv, Scratch::kA);
    D* out = a.out.as<D>();
    float* lse = a.lse.f32();
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < s.B * s.NH; ++bh) {
        const int64_t b = bh / s.NH, h = bh % s.NH;
        const HeadView<float> hv = head_view(qkv, s, b, h);
        float* p = row_scratch(s.T);
        for (int64_t t = 0; t < s.T; ++t) {
            const float* q = hv.q + t * hv.stride;
            float max = -std::numeric_limits<float>::infinity();
            for (int64_t u = 0; u <= t; ++u) {
                p[u] = dot_f32(q, hv.k + u * hv.stride, s.HS) * scale;
                max = std::max(max, p[u]);
            }
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t u = 0; u <= t; ++u) {
                p[u] = exp_approx(p[u] - max);
                sum += p[u];
            }
            const float inv_sum = 1.0f / sum;
            D* o_d = out + (b * s.T + t) * s.C + h * s.HS;
            float* o;  // the fp32 output row: o_d itself for fp32
            if constexpr (kIsF32<D>) {
                o = o_d;
            } else {
                o = scratch_f32(Scratch::kD, static_cast<size_t>(s.HS));
            }
            std::fill_n(o, s.HS, 0.0f);
            for (int64_t u = 0; u <= t; ++u) axpy_f32(p[u] * inv_sum, hv.v + u * hv.stride, o, s.HS);
            if constexpr (!kIsF32<D>) {
                for (int64_t d = 0; d < s.HS; ++d) o_d[d] = from_float<D>(o[d]);
            }
            lse[bh * s.T + t] = max + std::log(sum);
        }
    }
}

template <class D>
void backward_fast(const AttentionBackwardArgs& a, const AttentionShape& s) {
    const float* qkv = as_f32<D>(a.qkv, Scratch::kA);
    const float* dout = as_f32<D>(a.dout, Scratch::kB);
    const float* out = as_f32<D>(a.out, Scratch::kC);
    const float* lse = a.lse.f32();
    D* dqkv = a.dqkv.as<D>();
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
    // fp32: dq/dk/dv accumulate in dqkv itself (row stride 3*C). Otherwise in this thread's fp32 scratch (T, 3*HS),
    // row stride 3*HS, rounded into dqkv once the (b, h) is done.
    const int64_t acc_stride = kIsF32<D> ? 3 * s.C : 3 * s.HS;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < s.B * s.NH; ++bh) {
        const int64_t b = bh / s.NH, h = bh % s.NH;
        const HeadView<float> hv = head_view(qkv, s, b, h);
        const float* dO = dout + b * s.T * s.C + h * s.HS;
        const float* O = out + b * s.T * s.C + h * s.HS;
        D* dq_d = dqkv + b * s.T * 3 * s.C + h * s.HS;
        float* dq;
        if constexpr (kIsF32<D>) {
            dq = dq_d;
        } else {
            dq = scratch_f32(Scratch::kD, static_cast<size_t>(s.T * 3 * s.HS));
        }
        float* dk = dq + (kIsF32<D> ? s.C : s.HS);
        float* dv = dq + 2 * (kIsF32<D> ? s.C : s.HS);
        for (int64_t t = 0; t < s.T; ++t) {
            std::fill_n(dq + t * acc_stride, s.HS, 0.0f);
            std::fill_n(dk + t * acc_stride, s.HS, 0.0f);
            std::fill_n(dv + t * acc_stride, s.HS, 0.0f);
        }
        float* p = row_scratch(s.T);
        float* ds = p + s.T;
        for (int64_t t = 0; t < s.T; ++t) {
            const float* q = hv.q + t * hv.stride;
            const float* dO_t = dO + t * s.C;
            const float row_lse = lse[bh * s.T + t];
            const float D_t = dot_f32(dO_t, O + t * s.C, s.HS);
            for (int64_t u = 0; u <= t; ++u) {
                p[u] = dot_f32(q, hv.k + u * hv.stride, s.HS) * scale - row_lse;
                ds[u] = dot_f32(dO_t, hv.v + u * hv.stride, s.HS);  // dP for now
            }
#pragma omp simd
            for (int64_t u = 0; u <= t; ++u) {
                p[u] = exp_approx(p[u]);
                ds[u] = p[u] * (ds[u] - D_t) * scale;  // the scale of dQ and dK folded in once
            }
            float* dq_t = dq + t * acc_stride;
            for (int64_t u = 0; u <= t; ++u) {
                axpy_f32(p[u], dO_t, dv + u * acc_stride, s.HS);
                axpy_f32(ds[u], q, dk + u * acc_stride, s.HS);
                axpy_f32(ds[u], hv.k + u * hv.stride, dq_t, s.HS);
            }
        }
        if constexpr (!kIsF32<D>) {
            for (int64_t t = 0; t < s.T; ++t) {
                for (int64_t j = 0; j < 3; ++j) {
                    for (int64_t d = 0; d < s.HS; ++d) {
                        dq_d[t * 3 * s.C + j * s.C + d] = from_float<D>(dq[t * acc_stride + j * s.HS + d]);
                    }
                }
            }
        }
    }
}

}  // namespace

void attention_forward(const AttentionForwardArgs& a, OpMode mode) {
    const AttentionShape s = check_shapes(a.qkv, a.out, a.lse, a.NH);
    const DType D = activation_dtype(a.qkv, "attention_forward", "qkv");
    expect_d(a.out, D, "attention_forward", "out", "qkv");
    expect_f32(a.lse, "attention_forward", "lse", "statistics");
    dispatch_float(D, [&](auto tag) {
        using T = decltype(tag);
        if (mode == OpMode::kReference) {
            forward_reference<T>(a, s);
        } else {
            forward_fast<T>(a, s);
        }
    });
}

void attention_backward(const AttentionBackwardArgs& a, OpMode mode) {
    const AttentionShape s = check_shapes(a.qkv, a.dout, a.lse, a.NH);
    MS_CHECK(a.dqkv.numel() == a.qkv.numel() && a.out.numel() == a.dout.numel(),
             "attention: dqkv/out have {}/{} elements, expected {}/{}", a.dqkv.numel(), a.out.numel(), a.qkv.numel(),
             a.dout.numel());
    const DType D = activation_dtype(a.qkv, "attention_backward", "qkv");
    expect_d(a.dout, D, "attention_backward", "dout", "qkv");
    expect_d(a.out, D, "attention_backward", "out", "qkv");
    expect_d(a.dqkv, D, "attention_backward", "dqkv", "qkv");
    expect_f32(a.lse, "attention_backward", "lse", "statistics");
    dispatch_float(D, [&](auto tag) {
        using T = decltype(tag);
        if (mode == OpMode::kReference) {
            backward_reference<T>(a, s);
        } else {
            backward_fast<T>(a, s);
        }
    });
}

}  // namespace ms::cpu
