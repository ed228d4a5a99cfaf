// attention_block.cpp: one key/value block of ring attention (backend.h, AttentionBlockForwardArgs), forward with the
// log-sum-exp merge and backward from the final statistics, and copy_columns, which packs the ring's key/value
// columns and writes its fp32 gradients back.
//
// Layouts as attention.cpp's: qkv (B, T, (NH + 2*NKV)*HS), out/acc/dout/dq (B, T, NH*HS), lse (B, NH, T); the block's
// key/value head j at columns kv_column + j*HS (K) and kv_column + (NKV + j)*HS (V) of kv (B, Tk, Wkv); dkv
// (B, Tk, 2*NKV*HS) packed [dK | dV]. Per (b, query head h), query row t in [q_begin, q_begin + q_rows), key row u in
// [0, kv_rows) (u <= t - q_begin with causal), scale = 1/sqrt(HS):
//   forward:  s_u = q_t . k_u * scale;  lse_b = log sum_u exp(s_u);  o_b = sum_u exp(s_u - lse_b) v_u, merged into
//             (acc, lse) by lse' = log(exp(lse) + exp(lse_b)), acc' = acc e^(lse - lse') + o_b e^(lse_b - lse')
//   backward: p_u = exp(s_u - lse_t) (the final lse);  D_t = dO_t . O_t;  ds_u = p_u (dO_t . v_u - D_t) * scale;
//             dq_t += sum_u ds_u k_u;  dk_u += ds_u q_t;  dv_u += p_u dO_t
// The reference works in double, one (b, h) at a time. The fast path runs the (b, h) pairs of the forward in
// parallel, and the (b, key/value head) pairs of the backward (each walking its group's query heads in order), so
// every task writes only its own columns: no races, and the bits do not depend on the thread count; a head's kernels
// are attention_tiles.h's. 16-bit inputs are converted into fp32 scratch once.
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

struct BlockShape {
    int64_t B, T, Tk, NH, NKV, HS, C, W, Wkv, G;
    int64_t kv_column, q_begin, q_rows, kv_rows;
    bool causal;
    // the keys query row t (absolute, in [q_begin, q_begin + q_rows)) sees: [0, keys(t))
    int64_t keys(int64_t t) const { return causal ? t - q_begin + 1 : kv_rows; }
};

BlockShape check_block(const char* op, const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                       int64_t kv_column, int64_t q_begin, int64_t q_rows, int64_t kv_rows, bool causal, int64_t NH,
                       int64_t NKV) {
    const int64_t nkv = attention_kv_heads(NH, NKV);
    MS_CHECK(qkv.ndim == 3 && kv.ndim == 3, "{}: qkv and kv must be 3-D (B, T, width), got {} and {} dims", op,
             qkv.ndim, kv.ndim);
    MS_CHECK(qkv.dim(2) % (NH + 2 * nkv) == 0, "{}: qkv width {} is not a multiple of NH({}) + 2 * NKV({})", op,
             qkv.dim(2), NH, nkv);
    BlockShape s{};
    s.B = qkv.dim(0);
    s.T = qkv.dim(1);
    s.Tk = kv.dim(1);
    s.NH = NH;
    s.NKV = nkv;
    s.HS = qkv.dim(2) / (NH + 2 * nkv);
    s.C = NH * s.HS;
    s.W = qkv.dim(2);
    s.Wkv = kv.dim(2);
    s.G = NH / nkv;
    s.kv_column = kv_column;
    s.q_begin = q_begin;
    s.q_rows = q_rows;
    s.kv_rows = kv_rows;
    s.causal = causal;
    MS_CHECK(kv.dim(0) == s.B, "{}: kv has batch {}, qkv {}", op, kv.dim(0), s.B);
    MS_CHECK(kv_column >= 0 && kv_column + 2 * nkv * s.HS <= s.Wkv,
             "{}: keys and values at column {} need {} columns of kv's {}", op, kv_column, 2 * nkv * s.HS, s.Wkv);
    MS_CHECK(q_begin >= 0 && q_rows >= 0 && q_begin + q_rows <= s.T && kv_rows >= 1 && kv_rows <= s.Tk,
             "{}: query rows [{}, {}) of {} and key rows [0, {}) of {}", op, q_begin, q_begin + q_rows, s.T, kv_rows,
             s.Tk);
    MS_CHECK(!causal || (q_begin == 0 && kv_rows == q_rows),
             "{}: a causal block is the rank's own: q_begin {} must be 0 and kv_rows {} equal q_rows {}", op, q_begin,
             kv_rows, q_rows);
    MS_CHECK(out.numel() == s.B * s.T * s.C, "{}: out/acc has {} elements, expected B({}) * T({}) * C({})", op,
             out.numel(), s.B, s.T, s.C);
    MS_CHECK(lse.numel() == s.B * s.NH * s.T, "{}: lse has {} elements, expected B({}) * NH({}) * T({})", op,
             lse.numel(), s.B, s.NH, s.T);
    return s;
}

// Reads the inputs as fp32: the tensor itself for fp32, else converted once into scratch `slot`.
template <class D>
const float* input_f32(const Tensor& t, Scratch slot) {
    if constexpr (kIsF32<D>) {
        (void)slot;
        return t.as<float>();
    } else {
        const int64_t n = t.numel();
        float* dst = scratch_f32(slot, static_cast<size_t>(n));
        const D* src = t.as<D>();
#pragma omp parallel
        convert_to_f32_team(src, dst, n);
        return dst;
    }
}

// One query row's block result (o_b over HS values, lse_b) merged into acc_row / *lse_row.
template <class Real>
void merge_row(bool merge, const Real* o_b, Real lse_b, float* acc_row, float* lse_row, int64_t HS) {
    if (!merge) {
        for (int64_t d = 0; d < HS; ++d) acc_row[d] = static_cast<float>(o_b[d]);
        *lse_row = static_cast<float>(lse_b);
        return;
    }
    const Real old = *lse_row;
    const Real m = std::max(old, lse_b);
    const Real merged = m + std::log(std::exp(old - m) + std::exp(lse_b - m));
    const Real keep = std::exp(old - merged), add = std::exp(lse_b - merged);
    for (int64_t d = 0; d < HS; ++d) acc_row[d] = static_cast<float>(acc_row[d] * keep + o_b[d] * add);
    *lse_row = static_cast<float>(merged);
}

// The forward of one (batch b, query head h) whose keys and values start at k0 and v0.
void fast_forward_head(const AttentionBlockForwardArgs& a, const BlockShape& s, int64_t b, int64_t h, const float* q0,
                       const float* k0, const float* v0) {
    float* acc = a.acc.f32() + b * s.T * s.C + h * s.HS;
    float* lse = a.lse.f32() + (b * s.NH + h) * s.T;
    tiles::head_forward(
        q0, s.W, k0, v0, s.Wkv, s.kv_rows, s.HS, s.q_begin, s.q_begin + s.q_rows, [&](int64_t t) { return s.keys(t); },
        [&](int64_t t, const float* o, float row_lse) {
            merge_row<float>(a.merge, o, row_lse, acc + t * s.C, lse + t, s.HS);
        });
}

template <class D>
void block_forward(const AttentionBlockForwardArgs& a, const BlockShape& s, OpMode mode) {
    const float* qkv = input_f32<D>(a.qkv, Scratch::kA);
    const float* kv = input_f32<D>(a.kv, Scratch::kB);
    float* acc = a.acc.f32();
    float* lse = a.lse.f32();
    const bool reference = mode == OpMode::kReference;
#pragma omp parallel for schedule(static) if (!reference)
    for (int64_t bh = 0; bh < s.B * s.NH; ++bh) {
        const int64_t b = bh / s.NH, h = bh % s.NH, j = h / s.G;
        const float* q0 = qkv + b * s.T * s.W + h * s.HS;
        const float* k0 = kv + b * s.Tk * s.Wkv + s.kv_column + j * s.HS;
        const float* v0 = kv + b * s.Tk * s.Wkv + s.kv_column + (s.NKV + j) * s.HS;
        if (!reference) {
            fast_forward_head(a, s, b, h, q0, k0, v0);
            continue;
        }
        std::vector<double> pd(static_cast<size_t>(s.kv_rows)), od(static_cast<size_t>(s.HS));
        const double scale = 1.0 / std::sqrt(static_cast<double>(s.HS));
        for (int64_t t = s.q_begin; t < s.q_begin + s.q_rows; ++t) {
            const float* q = q0 + t * s.W;
            const int64_t n = s.keys(t);
            double max = -std::numeric_limits<double>::infinity();
            for (int64_t u = 0; u < n; ++u) {
                double dot = 0.0;
                for (int64_t d = 0; d < s.HS; ++d) dot += static_cast<double>(q[d]) * k0[u * s.Wkv + d];
                pd[u] = dot * scale;
                max = std::max(max, pd[u]);
            }
            double sum = 0.0;
            for (int64_t u = 0; u < n; ++u) sum += std::exp(pd[u] - max);
            const double row_lse = max + std::log(sum);
            std::fill(od.begin(), od.end(), 0.0);
            for (int64_t u = 0; u < n; ++u) {
                const double p = std::exp(pd[u] - row_lse);
                for (int64_t d = 0; d < s.HS; ++d) od[d] += p * v0[u * s.Wkv + d];
            }
            merge_row<double>(a.merge, od.data(), row_lse, acc + (b * s.T + t) * s.C + h * s.HS,
                              lse + (b * s.NH + h) * s.T + t, s.HS);
        }
    }
}

// The gradients of one (batch b, key/value head j) group: dq of its query heads' rows and the dk, dv rows at dk0,
// dv0 (row stride Wd).
void fast_backward_group(const BlockShape& s, int64_t b, int64_t j, const float* qkv, const float* dout,
                         const float* out, const float* lse, float* dq, const float* k0, const float* v0, float* dk0,
                         float* dv0, int64_t Wd) {
    tiles::HeadScratch& x = tiles::head_scratch();
    const int64_t np = tiles::load_keys(x, k0, v0, s.Wkv, s.kv_rows, s.HS, true);
    for (int64_t h = j * s.G; h < (j + 1) * s.G; ++h) {
        const int64_t rows = b * s.T * s.C + h * s.HS;  // the head's first row of dout, out and dq
        const tiles::HeadGrads g{.q = qkv + b * s.T * s.W + h * s.HS,
                                 .dO = dout + rows,
                                 .O = out + rows,
                                 .lse = lse + (b * s.NH + h) * s.T,
                                 .k = k0,
                                 .q_stride = s.W,
                                 .dO_stride = s.C,
                                 .O_stride = s.C,
                                 .k_stride = s.Wkv,
                                 .dq = dq + rows,
                                 .dk = dk0,
                                 .dv = dv0,
                                 .dq_stride = s.C,
                                 .dkv_stride = Wd};
        tiles::head_backward(
            g, s.HS, np, s.q_begin, s.q_begin + s.q_rows, [&](int64_t t) { return s.keys(t); }, x);
    }
}

template <class D>
void block_backward(const AttentionBlockBackwardArgs& a, const BlockShape& s, OpMode mode) {
    const float* qkv = input_f32<D>(a.qkv, Scratch::kA);
    const float* kv = input_f32<D>(a.kv, Scratch::kB);
    const float* dout = input_f32<D>(a.dout, Scratch::kC);
    const float* out = input_f32<D>(a.out, Scratch::kGrad);
    const float* lse = a.lse.f32();
    float* dq = a.dq.f32();
    float* dkv = a.dkv.f32();
    const bool reference = mode == OpMode::kReference;
    const int64_t Wd = 2 * s.NKV * s.HS;  // dkv's row width
#pragma omp parallel for schedule(static) if (!reference)
    for (int64_t bj = 0; bj < s.B * s.NKV; ++bj) {
        const int64_t b = bj / s.NKV, j = bj % s.NKV;
        const float* k0 = kv + b * s.Tk * s.Wkv + s.kv_column + j * s.HS;
        const float* v0 = kv + b * s.Tk * s.Wkv + s.kv_column + (s.NKV + j) * s.HS;
        float* dk0 = dkv + b * s.Tk * Wd + j * s.HS;
        float* dv0 = dkv + b * s.Tk * Wd + (s.NKV + j) * s.HS;
        if (!reference) {
            fast_backward_group(s, b, j, qkv, dout, out, lse, dq, k0, v0, dk0, dv0, Wd);
            continue;
        }
        // The reference sums every term of the block in double and adds it to the accumulators once.
        std::vector<double> gk(static_cast<size_t>(s.kv_rows * s.HS), 0.0);
        std::vector<double> gv(static_cast<size_t>(s.kv_rows * s.HS), 0.0);
        std::vector<double> gq(static_cast<size_t>(s.HS));
        const double scale = 1.0 / std::sqrt(static_cast<double>(s.HS));
        for (int64_t h = j * s.G; h < (j + 1) * s.G; ++h) {
            for (int64_t t = s.q_begin; t < s.q_begin + s.q_rows; ++t) {
                const float* q = qkv + (b * s.T + t) * s.W + h * s.HS;
                const float* dO = dout + (b * s.T + t) * s.C + h * s.HS;
                const float* O = out + (b * s.T + t) * s.C + h * s.HS;
                float* dq_t = dq + (b * s.T + t) * s.C + h * s.HS;
                const int64_t n = s.keys(t);
                const double row_lse = lse[(b * s.NH + h) * s.T + t];
                double D_t = 0.0;
                for (int64_t d = 0; d < s.HS; ++d) D_t += static_cast<double>(dO[d]) * O[d];
                std::fill(gq.begin(), gq.end(), 0.0);
                for (int64_t u = 0; u < n; ++u) {
                    const float* k = k0 + u * s.Wkv;
                    const float* v = v0 + u * s.Wkv;
                    double qk = 0.0, dp = 0.0;
                    for (int64_t d = 0; d < s.HS; ++d) {
                        qk += static_cast<double>(q[d]) * k[d];
                        dp += static_cast<double>(dO[d]) * v[d];
                    }
                    const double p = std::exp(qk * scale - row_lse);
                    const double ds = p * (dp - D_t) * scale;
                    for (int64_t d = 0; d < s.HS; ++d) {
                        gq[d] += ds * k[d];
                        gk[u * s.HS + d] += ds * q[d];
                        gv[u * s.HS + d] += p * dO[d];
                    }
                }
                for (int64_t d = 0; d < s.HS; ++d) dq_t[d] += static_cast<float>(gq[d]);
            }
        }
        for (int64_t u = 0; u < s.kv_rows; ++u) {
            for (int64_t d = 0; d < s.HS; ++d) {
                dk0[u * Wd + d] += static_cast<float>(gk[u * s.HS + d]);
                dv0[u * Wd + d] += static_cast<float>(gv[u * s.HS + d]);
            }
        }
    }
}

}  // namespace

void attention_block_forward(const AttentionBlockForwardArgs& a, OpMode mode) {
    const BlockShape s = check_block("attention_block_forward", a.qkv, a.kv, a.acc, a.lse, a.kv_column, a.q_begin,
                                     a.q_rows, a.kv_rows, a.causal, a.NH, a.NKV);
    const DType D = activation_dtype(a.qkv, "attention_block_forward", "qkv");
    expect_d(a.kv, D, "attention_block_forward", "kv", "qkv");
    expect_f32(a.acc, "attention_block_forward", "acc", "running output");
    expect_f32(a.lse, "attention_block_forward", "lse", "statistics");
    dispatch_float(D, [&](auto tag) { block_forward<decltype(tag)>(a, s, mode); });
}

void attention_block_backward(const AttentionBlockBackwardArgs& a, OpMode mode) {
    const BlockShape s = check_block("attention_block_backward", a.qkv, a.kv, a.dout, a.lse, a.kv_column, a.q_begin,
                                     a.q_rows, a.kv_rows, a.causal, a.NH, a.NKV);
    MS_CHECK(a.out.numel() == a.dout.numel() && a.dq.numel() == a.dout.numel(),
             "attention_block_backward: out/dq have {}/{} elements, dout {}", a.out.numel(), a.dq.numel(),
             a.dout.numel());
    MS_CHECK(a.dkv.numel() == s.B * s.Tk * 2 * s.NKV * s.HS,
             "attention_block_backward: dkv has {} elements, expected B({}) * Tk({}) * 2 * NKV({}) * HS({})",
             a.dkv.numel(), s.B, s.Tk, s.NKV, s.HS);
    const DType D = activation_dtype(a.qkv, "attention_block_backward", "qkv");
    expect_d(a.kv, D, "attention_block_backward", "kv", "qkv");
    expect_d(a.dout, D, "attention_block_backward", "dout", "qkv");
    expect_d(a.out, D, "attention_block_backward", "out", "qkv");
    expect_f32(a.lse, "attention_block_backward", "lse", "statistics");
    expect_f32(a.dq, "attention_block_backward", "dq", "accumulator");
    expect_f32(a.dkv, "attention_block_backward", "dkv", "accumulator");
    dispatch_float(D, [&](auto tag) { block_backward<decltype(tag)>(a, s, mode); });
}

void copy_columns(const CopyColumnsArgs& a) {
    check_copy_columns(a);
    const int64_t rows = a.src.dim(0), ws = a.src.dim(1), wd = a.dst.dim(1);
    visit_float(a.src.dtype, [&](auto s) {
        visit_float(a.dst.dtype, [&](auto d) {
            using S = decltype(s);
            using D = decltype(d);
            const S* src = a.src.as<S>();
            D* dst = a.dst.as<D>();
#pragma omp parallel for schedule(static) if (rows * a.cols > (1 << 16))
            for (int64_t r = 0; r < rows; ++r) {
                for (int64_t c = 0; c < a.cols; ++c)
                    dst[r * wd + a.dst_column + c] = from_float<D>(to_float(src[r * ws + a.src_column + c]));
            }
        });
    });
}

}  // namespace ms::cpu
