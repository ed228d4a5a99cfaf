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
// (b, key/value head) pairs (each walks its group's query heads in order); a head's query rows go in blocks of
// kQueryBlock, and a block's products (S = Q K^T, O = P V; in the backward also dP = dO V^T, dQ = dS K, and dK, dV
// added for the keys [0, e) the block sees) are single-threaded OpenBLAS sgemm calls whose shapes follow from T and HS
// alone, with the softmax between them in per-thread scratch of kQueryBlock x T. Each task writes only its own
// columns, so there are no races and the result does not depend on the thread count or on the layout around a head.
// Precision: qkv, out, dout and dqkv are D; lse is fp32. For bf16 / fp16 the fast path converts qkv (and dout, out)
// into fp32 scratch once (each K and V row is read T times), accumulates each (b, h)'s output rows and dq/dk/dv in
// per-thread fp32 scratch, and rounds every element once on store.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "engine/backends/cpu/ops.h"
#include "engine/backends/cpu/ops/column_blocks.h"
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

// Query rows per block of the fast paths: a block's products are GEMMs of this many rows, and its last rows'
// masked keys (at most kQueryBlock - 1 past a row's own) are the causal work computed and discarded.
constexpr int64_t kQueryBlock = 64;

// The fast paths' per-thread scratch, grown once: a query block's scores then probabilities (s), and in the backward
// dO V^T then the scores' gradients (dp, grown only by the backward), each kQueryBlock rows of up to T keys; o, a
// block's output rows (16-bit D).
struct BlockScratch {
    std::vector<float> s, dp, o;
};

enum class Pass : bool { kForward, kBackward };

BlockScratch& block_scratch(int64_t T, int64_t HS, Pass pass) {
    thread_local BlockScratch x;
    const auto grow = [](std::vector<float>& v, int64_t n) {
        if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
    };
    grow(x.s, kQueryBlock * T);
    if (pass == Pass::kBackward) grow(x.dp, kQueryBlock * T);
    grow(x.o, kQueryBlock * HS);
    return x;
}

// A query block: rows [t0, t0 + rows) of a head, which see keys [0, e) between them, e = t0 + rows (row t sees
// [0, t + 1); its scores past those get probability 0).
struct QueryBlock {
    int64_t t0, rows, e;
};

inline QueryBlock query_block(int64_t t0, int64_t T) {
    const int64_t rows = std::min(kQueryBlock, T - t0);
    return {t0, rows, t0 + rows};
}

// Row r of the block's scores s (ld e, already times the scale): probabilities p_u = exp(s_u - shift) for u < n, 0
// for n <= u < e; returns their sum, in 16 lanes (lane k sums u = k mod 16 in order, then the lanes in order).
inline float exp_row(float* s, int64_t n, int64_t e, float shift) {
    constexpr int64_t kLanes = 16;
    float lanes[kLanes] = {};
    int64_t u = 0;
    for (; u + kLanes <= n; u += kLanes) {
#pragma omp simd
        for (int64_t k = 0; k < kLanes; ++k) {
            s[u + k] = exp_approx(s[u + k] - shift);
            lanes[k] += s[u + k];
        }
    }
    for (int64_t k = 0; u + k < n; ++k) {
        s[u + k] = exp_approx(s[u + k] - shift);
        lanes[k] += s[u + k];
    }
    std::fill(s + n, s + e, 0.0f);
    float sum = 0.0f;
    for (float lane : lanes) sum += lane;
    return sum;
}

// C (rows x cols, ldc) = alpha * A (rows x inner) B + beta * C, with A and B each as stored or transposed.
inline void gemm(bool ta, bool tb, int64_t rows, int64_t cols, int64_t inner, float alpha, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(rows),
                static_cast<int>(cols), static_cast<int>(inner), alpha, a, static_cast<int>(lda), b,
                static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

template <class D>
void forward_fast(const AttentionForwardArgs& a, const AttentionShape& s) {
    use_single_threaded_blas();
    const float* qkv = as_f32<D>(a.qkv, Scratch::kA);
    D* out = a.out.as<D>();
    float* lse = a.lse.f32();
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < s.B * s.NH; ++bh) {
        const int64_t b = bh / s.NH, h = bh % s.NH;
        const HeadView<float> hv = head_view(qkv, s, b, h);
        BlockScratch& x = block_scratch(s.T, s.HS, Pass::kForward);
        D* o = out + b * s.T * s.C + h * s.HS;
        for (int64_t t0 = 0; t0 < s.T; t0 += kQueryBlock) {
            const QueryBlock q = query_block(t0, s.T);
            gemm(false, true, q.rows, q.e, s.HS, scale, hv.q + t0 * hv.stride, hv.stride, hv.k, hv.stride, 0.0f,
                 x.s.data(), q.e);
            float inv_sum[kQueryBlock];  // the rows' probabilities are normalised in their output rows
            for (int64_t r = 0; r < q.rows; ++r) {
                float* p = x.s.data() + r * q.e;
                const int64_t n = t0 + r + 1;
                const float max = max_f32(p, n);
                const float sum = exp_row(p, n, q.e, max);
                inv_sum[r] = 1.0f / sum;
                lse[bh * s.T + t0 + r] = max + std::log(sum);
            }
            float* o_rows = x.o.data();  // fp32: the output rows themselves, normalised in place
            int64_t ldo = s.HS;
            if constexpr (kIsF32<D>) {
                o_rows = o + t0 * s.C;
                ldo = s.C;
            }
            gemm(false, false, q.rows, s.HS, q.e, 1.0f, x.s.data(), q.e, hv.v, hv.stride, 0.0f, o_rows, ldo);
            for (int64_t r = 0; r < q.rows; ++r) {
                float* o_r = o_rows + r * ldo;
                D* dst = o + (t0 + r) * s.C;
#pragma omp simd
                for (int64_t d = 0; d < s.HS; ++d) dst[d] = from_float<D>(o_r[d] * inv_sum[r]);
            }
        }
    }
}

template <class D>
void backward_fast(const AttentionBackwardArgs& a, const AttentionShape& s) {
    use_single_threaded_blas();
    const float* qkv = as_f32<D>(a.qkv, Scratch::kA);
    const float* dout = as_f32<D>(a.dout, Scratch::kB);
    const float* out = as_f32<D>(a.out, Scratch::kC);
    const float* lse = a.lse.f32();
    D* dqkv = a.dqkv.as<D>();
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
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
        BlockScratch& x = block_scratch(s.T, s.HS, Pass::kBackward);
        for (int64_t h = kv * s.G; h < (kv + 1) * s.G; ++h) {
            float* dq = acc + (kIsF32<D> ? q_column(s, h) : 0);
            const HeadView<float> hv = head_view(qkv, s, b, h);
            const float* dO = dout + b * s.T * s.C + h * s.HS;
            const float* O = out + b * s.T * s.C + h * s.HS;
            const float* row_lse = lse + (b * s.NH + h) * s.T;
            for (int64_t t0 = 0; t0 < s.T; t0 += kQueryBlock) {
                const QueryBlock q = query_block(t0, s.T);
                const float* q_rows = hv.q + t0 * hv.stride;
                const float* dO_rows = dO + t0 * s.C;
                gemm(false, true, q.rows, q.e, s.HS, scale, q_rows, hv.stride, hv.k, hv.stride, 0.0f, x.s.data(), q.e);
                gemm(false, true, q.rows, q.e, s.HS, 1.0f, dO_rows, s.C, hv.v, hv.stride, 0.0f, x.dp.data(), q.e);
                for (int64_t r = 0; r < q.rows; ++r) {
                    const int64_t t = t0 + r, n = t + 1;
                    const float D_t = dot_f32(dO + t * s.C, O + t * s.C, s.HS);
                    const float shift = row_lse[t];
                    float* p = x.s.data() + r * q.e;
                    float* ds = x.dp.data() + r * q.e;
#pragma omp simd
                    for (int64_t u = 0; u < n; ++u) {
                        p[u] = exp_approx(p[u] - shift);
                        ds[u] = p[u] * (ds[u] - D_t) * scale;
                    }
                    std::fill(p + n, p + q.e, 0.0f);
                    std::fill(ds + n, ds + q.e, 0.0f);
                }
                // dq of the block's rows (all their keys are in the block: written, not added); dk and dv of keys
                // [0, e) added, the blocks in order, then the group's heads in order
                gemm(false, false, q.rows, s.HS, q.e, 1.0f, x.dp.data(), q.e, hv.k, hv.stride, 0.0f,
                     dq + t0 * acc_stride, acc_stride);
                gemm(true, false, q.e, s.HS, q.rows, 1.0f, x.dp.data(), q.e, q_rows, hv.stride, 1.0f, dk, acc_stride);
                gemm(true, false, q.e, s.HS, q.rows, 1.0f, x.s.data(), q.e, dO_rows, s.C, 1.0f, dv, acc_stride);
            }
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
