// attention.cpp: causal self-attention (multi-head, or grouped-query with NKV < NH key/value heads) with a saved
// log-sum-exp, forward and backward.
//
// Layouts: qkv/dqkv (B, T, W) with W = (NH + 2*NKV)*HS, rows [Q: NH*HS | K: NKV*HS | V: NKV*HS], each block
// head-major (head h owns columns h*HS .. (h+1)*HS of its block); out/dout (B, T, C) with C = NH*HS head-major;
// lse (B, NH, T). Query head h reads key/value head h / G, G = NH / NKV (the group size; NKV = NH: multi-head).
// Per (b, h), with Q, dO, O the (T, HS) slices of query head h, K, V those of its key/value head, t the query row,
// u the key row, scale = 1/sqrt(HS):
//   forward:  S = Q K^T * scale, masked to u <= t;  lse_t = log sum_u exp(S_tu);  P = exp(S - lse);  O = P V
//   backward: P recomputed from lse;  dV = P^T dO;  dP = dO V^T;  D_t = sum_u P_tu dP_tu (= dO_t . O_t);
//             dS = P * (dP - D_t);  dQ = dS K * scale;  dK = dS^T Q * scale.   dqkv is overwritten.
//   dK and dV of a key/value head are the sums of those terms over its G query heads, added in head order into one
//   accumulator per element (so G = 1 is multi-head attention, bit for bit).
// Nothing of size (B, NH, T, T) exists. The fast forward runs the (b, h) pairs in parallel, the fast backward the
// (b, key/value head) pairs (each walks its group's query heads in order); both walk query rows in tiles, in order,
// with attention_tiles.h's kernels and thread-local buffers that grow once; each task writes only its own columns,
// so there are no races and the result does not depend on the thread count.
// Precision: qkv, out, dout and dqkv are D; lse is fp32. For bf16 / fp16 the fast path converts qkv (and dout, out)
// into fp32 scratch once (each K and V row is read T times), accumulates each (b, h)'s output rows and dq/dk/dv in
// per-thread fp32 scratch, and rounds every element once on store.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "engine/backends/cpu/ops.h"
#include "engine/backends/cpu/ops/attention_tiles.h"
#include "engine/backends/cpu/ops/precision.h"
#include "engine/backends/cpu/ops/vec_math.h"

namespace ms::cpu {
namespace {

struct AttentionShape {
    int64_t B, T, NH, NKV, HS;
    int64_t C;  // NH*HS: the width of out and of the Q block
    int64_t W;  // (NH + 2*NKV)*HS: the width of qkv
    int64_t G;  // NH / NKV query heads per key/value head
};

AttentionShape check_shapes(const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t NH, int64_t NKV) {
    const int64_t kv = attention_kv_heads(NH, NKV);
    MS_CHECK(qkv.ndim == 3, "attention: qkv must be (B, T, (NH + 2*NKV)*HS), got {} dims", qkv.ndim);
    MS_CHECK(qkv.dim(2) % (NH + 2 * kv) == 0, "attention: qkv width {} is not a multiple of NH({}) + 2 * NKV({})",
             qkv.dim(2), NH, kv);
    const int64_t HS = qkv.dim(2) / (NH + 2 * kv);
    const AttentionShape s{qkv.dim(0), qkv.dim(1), NH, kv, HS, NH * HS, qkv.dim(2), NH / kv};
    MS_CHECK(out.numel() == s.B * s.T * s.C, "attention: out/dout has {} elements, expected B({}) * T({}) * C({})",
             out.numel(), s.B, s.T, s.C);
    MS_CHECK(lse.numel() == s.B * s.NH * s.T, "attention: lse has {} elements, expected B({}) * NH({}) * T({})",
             lse.numel(), s.B, s.NH, s.T);
    return s;
}

// Query head h of batch b: row t of Q starts at q + t * stride (column h*HS of the qkv row), of K and V (those of
// key/value head h / G) at k + t * stride and v + t * stride.
template <class D>
struct HeadView {
    const D* q;
    const D* k;
    const D* v;
    int64_t stride;  // W elements between consecutive rows
};

// Columns of query head h's Q, and of key/value head kv's K and V, in a qkv (or dqkv) row.
inline int64_t q_column(const AttentionShape& s, int64_t h) { return h * s.HS; }
inline int64_t k_column(const AttentionShape& s, int64_t kv) { return s.C + kv * s.HS; }
inline int64_t v_column(const AttentionShape& s, int64_t kv) { return s.C + (s.NKV + kv) * s.HS; }

template <class D>
HeadView<D> head_view(const D* qkv, const AttentionShape& s, int64_t b, int64_t h) {
    const D* row = qkv + b * s.T * s.W;
    const int64_t kv = h / s.G;
    return {row + q_column(s, h), row + k_column(s, kv), row + v_column(s, kv), s.W};
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
    const size_t TT = static_cast<size_t>(s.T * s.T), THS = static_cast<size_t>(s.T * s.HS);
    std::vector<double> P(TT), dS(TT);     // (T, T) for one (b, h) at a time
    std::vector<double> gk(THS), gv(THS);  // (T, HS): dK / scale and dV of one key/value head, over its group
    const auto dot = [&](const D* x, const D* y) {
        double acc = 0.0;
        for (int64_t d = 0; d < s.HS; ++d) acc += static_cast<double>(to_float(x[d])) * to_float(y[d]);
        return acc;
    };
    for (int64_t b = 0; b < s.B; ++b) {
        for (int64_t kv = 0; kv < s.NKV; ++kv) {
            std::fill(gk.begin(), gk.end(), 0.0);
            std::fill(gv.begin(), gv.end(), 0.0);
            for (int64_t h = kv * s.G; h < (kv + 1) * s.G; ++h) {
                const HeadView<D> hv = head_view(qkv, s, b, h);
                const D* dO = dout + b * s.T * s.C + h * s.HS;
                D* dq = dqkv + b * s.T * s.W + q_column(s, h);
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
                        double gq = 0.0;
                        double& gk_td = gk[t * s.HS + d];
                        double& gv_td = gv[t * s.HS + d];
                        for (int64_t u = 0; u < s.T; ++u) {
                            gq += dS[t * s.T + u] * to_float(hv.k[u * hv.stride + d]);
                            gk_td += dS[u * s.T + t] * to_float(hv.q[u * hv.stride + d]);
                            gv_td += P[u * s.T + t] * to_float(dO[u * s.C + d]);
                        }
                        dq[t * s.W + d] = from_float<D>(static_cast<float>(gq * scale));
                    }
                }
            }
            D* dk = dqkv + b * s.T * s.W + k_column(s, kv);
            D* dv = dqkv + b * s.T * s.W + v_column(s, kv);
            for (int64_t t = 0; t < s.T; ++t) {
                for (int64_t d = 0; d < s.HS; ++d) {
                    dk[t * s.W + d] = from_float<D>(static_cast<float>(gk[t * s.HS + d] * scale));
                    dv[t * s.W + d] = from_float<D>(static_cast<float>(gv[t * s.HS + d]));
                }
            }
        }
    }
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
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < s.B * s.NH; ++bh) {
        const int64_t b = bh / s.NH, h = bh % s.NH;
        const HeadView<float> hv = head_view(qkv, s, b, h);
        D* o = out + b * s.T * s.C + h * s.HS;
        tiles::head_forward(
            hv.q, hv.stride, hv.k, hv.v, hv.stride, s.T, s.HS, 0, s.T, [](int64_t t) { return t + 1; },
            [&](int64_t t, const float* o_t, float row_lse) {
                for (int64_t d = 0; d < s.HS; ++d) o[t * s.C + d] = from_float<D>(o_t[d]);
                lse[bh * s.T + t] = row_lse;
            });
    }
}

template <class D>
void backward_fast(const AttentionBackwardArgs& a, const AttentionShape& s) {
    const float* qkv = as_f32<D>(a.qkv, Scratch::kA);
    const float* dout = as_f32<D>(a.dout, Scratch::kB);
    const float* out = as_f32<D>(a.out, Scratch::kC);
    const float* lse = a.lse.f32();
    D* dqkv = a.dqkv.as<D>();
    // fp32: dq/dk/dv accumulate in dqkv itself (row stride W). Otherwise in this thread's fp32 scratch (T, 3*HS), row
    // stride 3*HS, [dq | dk | dv]: dq rounded into dqkv once its query head is done, dk and dv once the group is.
    const int64_t acc_stride = kIsF32<D> ? s.W : 3 * s.HS;
#pragma omp parallel for schedule(static)
    for (int64_t bkv = 0; bkv < s.B * s.NKV; ++bkv) {
        const int64_t b = bkv / s.NKV, kv = bkv % s.NKV;
        D* row_d = dqkv + b * s.T * s.W;
        float* acc;
        if constexpr (kIsF32<D>) {
            acc = row_d;
        } else {
            acc = scratch_f32(Scratch::kD, static_cast<size_t>(s.T * 3 * s.HS));
        }
        float* dk = acc + (kIsF32<D> ? k_column(s, kv) : s.HS);
        float* dv = acc + (kIsF32<D> ? v_column(s, kv) : 2 * s.HS);
        for (int64_t t = 0; t < s.T; ++t) {
            std::fill_n(dk + t * acc_stride, s.HS, 0.0f);
            std::fill_n(dv + t * acc_stride, s.HS, 0.0f);
        }
        // round an accumulator block (column `from` of acc's rows) into dqkv's column `to`
        const auto store = [&](int64_t from, int64_t to) {
            for (int64_t t = 0; t < s.T; ++t) {
                for (int64_t d = 0; d < s.HS; ++d) {
                    row_d[t * s.W + to + d] = from_float<D>(acc[t * acc_stride + from + d]);
                }
            }
        };
        tiles::HeadScratch& x = tiles::head_scratch();
        const HeadView<float> kv_view = head_view(qkv, s, b, kv * s.G);
        const int64_t np = tiles::load_keys(x, kv_view.k, kv_view.v, kv_view.stride, s.T, s.HS, true);
        for (int64_t h = kv * s.G; h < (kv + 1) * s.G; ++h) {
            float* dq = acc + (kIsF32<D> ? q_column(s, h) : 0);
            for (int64_t t = 0; t < s.T; ++t) std::fill_n(dq + t * acc_stride, s.HS, 0.0f);
            const HeadView<float> hv = head_view(qkv, s, b, h);
            const int64_t rows = b * s.T * s.C + h * s.HS;  // the head's first row of dout and out
            const tiles::HeadGrads g{.q = hv.q,
                                     .dO = dout + rows,
                                     .O = out + rows,
                                     .lse = lse + (b * s.NH + h) * s.T,
                                     .k = hv.k,
                                     .q_stride = hv.stride,
                                     .dO_stride = s.C,
                                     .O_stride = s.C,
                                     .k_stride = hv.stride,
                                     .dq = dq,
                                     .dk = dk,
                                     .dv = dv,
                                     .dq_stride = acc_stride,
                                     .dkv_stride = acc_stride};
            tiles::head_backward(
                g, s.HS, np, 0, s.T, [](int64_t t) { return t + 1; }, x);
            if constexpr (!kIsF32<D>) store(0, q_column(s, h));
        }
        if constexpr (!kIsF32<D>) {
            store(s.HS, k_column(s, kv));
            store(2 * s.HS, v_column(s, kv));
        }
    }
}

}  // namespace

void attention_forward(const AttentionForwardArgs& a, OpMode mode) {
    const AttentionShape s = check_shapes(a.qkv, a.out, a.lse, a.NH, a.NKV);
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
    const AttentionShape s = check_shapes(a.qkv, a.dout, a.lse, a.NH, a.NKV);
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
