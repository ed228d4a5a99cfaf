// matmul.cpp: the Linear layer, out = inp @ weight^T + bias, and its backward.
//
// Layouts (row-major): inp/dinp (N, K), weight/dweight (M, K) (Linear orientation), bias/dbias (M), out/dout (N, M).
// Backward: dinp = dout @ weight (= or += per `accumulate`, skipped when dinp is undefined),
//           dweight += dout^T @ inp,  dbias += sum_n dout[n, :].
// Fast path: one thread pool for the whole backend. out, dinp and dweight are each cut into tiles fixed by their
// shape (column_blocks.h, output_tiles and weight_tiles), each one single-threaded OpenBLAS sgemm call, shared out over
// the OpenMP team (column_blocks.h says why fixed cuts keep the bits independent of the thread count); the bias is
// seeded on the forward's tiles, dbias summed over fixed column blocks. Reference path: triple loops with double
// accumulators. GELU fusion (backend.h: gelu_out, gelu_inp): the matmul as above, then gelu.cpp's op on its output, in
// the same mode: bit-identical to the two ops called one after the other. Precision: inp, weight, bias, out, dout and
// dinp are D; dweight and dbias are fp32 or D. For D = fp32 sgemm reads and writes the tensors themselves. For bf16 /
// fp16 the fast path first converts the D operands into thread-local fp32 scratch (exact), runs the same sgemm tiles on
// it, and rounds each fp32 result (accumulator plus bias; for kAdd, old value plus new term) once into the D output; an
// fp32 dweight or dbias accumulates straight into its tensor. A D dweight gets each tile's product computed by the same
// sgemm call into fp32 scratch zeroed first (what an fp32 dweight starting at 0 would hold), then rounded into it once;
// a D dbias gets each column's fp32 sum rounded in once.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/backends/cpu/ops.h"
#include "engine/backends/cpu/ops/column_blocks.h"
#include "engine/backends/cpu/ops/precision.h"

namespace ms::cpu {
namespace {

struct MatmulShape {
    int64_t N, K, M;
};

MatmulShape check_shapes(const Tensor& inp, const Tensor& weight, const Tensor& bias, const Tensor& out) {
    const int64_t K = inp.dim(-1);
    const MatmulShape s{inp.numel() / K, K, weight.numel() / K};
    MS_CHECK(weight.dim(-1) == K, "matmul: weight is (.., {}) but inp is (.., {})", weight.dim(-1), K);
    MS_CHECK(out.numel() == s.N * s.M, "matmul: out/dout has {} elements, expected N({}) * M({})", out.numel(), s.N,
             s.M);
    if (bias.defined()) {
        MS_CHECK(bias.numel() == s.M, "matmul: bias/dbias has {} elements, expected M = {}", bias.numel(), s.M);
    }
    // sgemm takes int dimensions.
    MS_CHECK(s.N <= INT32_MAX && s.K <= INT32_MAX && s.M <= INT32_MAX, "matmul: a dimension exceeds INT32_MAX");
    return s;
}

template <class D>
void forward_reference(const MatmulForwardArgs& a, const MatmulShape& s) {
    const D* inp = a.inp.as<D>();
    const D* weight = a.weight.as<D>();
    const D* bias = a.bias.defined() ? a.bias.as<D>() : nullptr;
    D* out = a.out.as<D>();
    for (int64_t n = 0; n < s.N; ++n) {
        for (int64_t m = 0; m < s.M; ++m) {
            double acc = bias ? to_float(bias[m]) : 0.0;
            for (int64_t k = 0; k < s.K; ++k) {
                acc += static_cast<double>(to_float(inp[n * s.K + k])) * to_float(weight[m * s.K + k]);
            }
            out[n * s.M + m] = from_float<D>(static_cast<float>(acc));
        }
    }
}

// The tile (rows, cols) of out (fp32) = inp @ weight^T + bias, inp and weight fp32, bias D.
template <class B>
void forward_tile(const float* inp, const float* weight, const B* bias, float* out, const MatmulShape& s,
                  const Slice& rows, const Slice& cols) {
    // Seed the tile with the bias, then let sgemm add the product into it (beta = 1).
    if (bias) {
        for (int64_t n = rows.begin; n < rows.end; ++n) {
            if constexpr (kIsF32<B>) {
                std::copy(bias + cols.begin, bias + cols.end, out + n * s.M + cols.begin);
            } else {
                for (int64_t m = cols.begin; m < cols.end; ++m) out[n * s.M + m] = to_float(bias[m]);
            }
        }
    }
    // out[rows, cols] (n, m) = inp[rows, :] (n, K) @ weight[cols, :]^T (K, m)
    const int K = static_cast<int>(s.K), M = static_cast<int>(s.M);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows.size(), cols.size(), K, 1.0f, inp + rows.begin * s.K, K,
                weight + cols.begin * s.K, K, bias ? 1.0f : 0.0f, out + rows.begin * s.M + cols.begin, M);
}

template <class D>
void forward_fast(const MatmulForwardArgs& a, const MatmulShape& s) {
    use_single_threaded_blas();
    const D* inp = a.inp.as<D>();
    const D* weight = a.weight.as<D>();
    const D* bias = a.bias.defined() ? a.bias.as<D>() : nullptr;
    D* out = a.out.as<D>();
    const TileGrid tiles = output_tiles(s.N, s.M);
    if constexpr (kIsF32<D>) {
#pragma omp parallel
        for_each_thread_tile(
            tiles, [&](const Slice& rows, const Slice& cols) { forward_tile(inp, weight, bias, out, s, rows, cols); });
    } else {
        float* inp_f = scratch_f32(Scratch::kA, static_cast<size_t>(s.N * s.K));
        float* weight_f = scratch_f32(Scratch::kB, static_cast<size_t>(s.M * s.K));
        float* out_f = scratch_f32(Scratch::kC, static_cast<size_t>(s.N * s.M));
#pragma omp parallel
        {
            convert_to_f32_team(inp, inp_f, s.N * s.K);
            convert_to_f32_team(weight, weight_f, s.M * s.K);  // the implicit barrier: both complete below
            for_each_thread_tile(tiles, [&](const Slice& rows, const Slice& cols) {
                forward_tile(inp_f, weight_f, bias, out_f, s, rows, cols);
                for (int64_t n = rows.begin; n < rows.end; ++n) {
                    for (int64_t m = cols.begin; m < cols.end; ++m)
                        out[n * s.M + m] = from_float<D>(out_f[n * s.M + m]);
                }
            });
        }
    }
}

template <class D>
void backward_reference(const MatmulBackwardArgs& a, const MatmulShape& s) {
    const D* dout = a.dout.as<D>();
    const D* inp = a.inp.as<D>();
    const D* weight = a.weight.as<D>();
    const ParamGrad<D> dweight = ParamGrad<D>::of(a.dweight);
    std::vector<double> acc(static_cast<size_t>(s.K));
    if (a.dinp.defined()) {
        D* dinp = a.dinp.as<D>();
        for (int64_t n = 0; n < s.N; ++n) {
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int64_t m = 0; m < s.M; ++m) {
                const double d = to_float(dout[n * s.M + m]);
                for (int64_t k = 0; k < s.K; ++k) acc[k] += d * to_float(weight[m * s.K + k]);
            }
            for (int64_t k = 0; k < s.K; ++k) {
                const float g = static_cast<float>(acc[k]);
                dinp[n * s.K + k] =
                    from_float<D>(a.accumulate == Accumulate::kAdd ? to_float(dinp[n * s.K + k]) + g : g);
            }
        }
    }
    for (int64_t m = 0; m < s.M; ++m) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t n = 0; n < s.N; ++n) {
            const double d = to_float(dout[n * s.M + m]);
            for (int64_t k = 0; k < s.K; ++k) acc[k] += d * to_float(inp[n * s.K + k]);
        }
        for (int64_t k = 0; k < s.K; ++k) dweight.add(m * s.K + k, static_cast<float>(acc[k]));
    }
    if (a.dbias.defined()) {
        const ParamGrad<D> dbias = ParamGrad<D>::of(a.dbias);
        for (int64_t m = 0; m < s.M; ++m) {
            double sum = 0.0;
            for (int64_t n = 0; n < s.N; ++n) sum += to_float(dout[n * s.M + m]);
            dbias.add(m, static_cast<float>(sum));
        }
    }
}

// dbias[m] += sum_n dout[n, m] for m in [m0, m1): blocks of 64 columns, each summed over the rows in order.
template <class G>
void bias_backward_slice(const float* dout, G* dbias, int64_t N, int64_t M, int64_t m0, int64_t m1) {
    constexpr int64_t kBlock = 64;
    for (int64_t b0 = m0; b0 < m1; b0 += kBlock) {
        const int64_t b1 = std::min(m1, b0 + kBlock);
        float sum[kBlock] = {};
        for (int64_t n = 0; n < N; ++n) {
            const float* d = dout + n * M;
#pragma omp simd
            for (int64_t m = b0; m < b1; ++m) sum[m - b0] += d[m];
        }
        for (int64_t m = b0; m < b1; ++m) dbias[m] = add_rounded(dbias[m], sum[m - b0]);
    }
}

// The tile (rows, cols) of dweight (M, K) += the product sgemm(c) writes at `c` (the tile's first element, leading
// dimension K). An fp32 dweight takes it in place; a D dweight gets it in the same place of `acc` (M, K) fp32, zeroed
// first, and then rounded in once per element.
template <class G, class Gemm>
void dweight_tile(G* dweight, float* acc, const Slice& rows, const Slice& cols, int64_t K, Gemm&& sgemm) {
    const int64_t offset = rows.begin * K + cols.begin;
    if constexpr (kIsF32<G>) {
        sgemm(dweight + offset);
    } else {
        for (int64_t r = rows.begin; r < rows.end; ++r) std::fill_n(acc + r * K + cols.begin, cols.size(), 0.0f);
        sgemm(acc + offset);
        for (int64_t r = rows.begin; r < rows.end; ++r) {
            add_rounded_range(dweight + r * K + cols.begin, acc + r * K + cols.begin, cols.size());
        }
    }
}

// The calling thread's share of the backward on fp32 operands: its tiles of dinp (N, K) in dinp_tiles (= or += per
// dinp_beta, skipped when dinp is null) and of dweight (M, K) (+=, fp32 or D: dweight_tile), and dbias (+=) over its
// columns thread_columns(M).
template <class G, class GB>
void backward_tiles(const float* dout, const float* inp, const float* weight, float* dinp, float dinp_beta,
                    const TileGrid& dinp_tiles, G* dweight, float* dweight_acc, GB* dbias, const MatmulShape& s) {
    const int K = static_cast<int>(s.K), M = static_cast<int>(s.M), N = static_cast<int>(s.N);
    if (dinp) {
        for_each_thread_tile(dinp_tiles, [&](const Slice& rows, const Slice& cols) {
            // dinp[rows, cols] (n, k) = dout[rows, :] (n, M) @ weight[:, cols] (M, k)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows.size(), cols.size(), M, 1.0f,
                        dout + rows.begin * s.M, M, weight + cols.begin, K, dinp_beta,
                        dinp + rows.begin * s.K + cols.begin, K);
        });
    }
    for_each_thread_tile(weight_tiles(s.M, s.K), [&](const Slice& rows, const Slice& cols) {
        // dweight[rows, cols] (m, k) += dout[:, rows]^T (m, N) @ inp[:, cols] (N, k)
        dweight_tile(dweight, dweight_acc, rows, cols, s.K, [&](float* c) {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows.size(), cols.size(), N, 1.0f, dout + rows.begin,
                        M, inp + cols.begin, K, 1.0f, c, K);
        });
    });
    const Slice m_cols = thread_columns(s.M);
    if (dbias && m_cols.size() > 0) bias_backward_slice(dout, dbias, s.N, s.M, m_cols.begin, m_cols.end);
}

// G, GB: the storage types of dweight and dbias (float or D).
template <class D, class G, class GB>
void backward_fast(const MatmulBackwardArgs& a, const MatmulShape& s) {
    use_single_threaded_blas();
    const D* dout = a.dout.as<D>();
    const D* inp = a.inp.as<D>();
    const D* weight = a.weight.as<D>();
    D* dinp = a.dinp.defined() ? a.dinp.as<D>() : nullptr;
    G* dweight = a.dweight.as<G>();
    GB* dbias = a.dbias.defined() ? a.dbias.as<GB>() : nullptr;
    // A D dweight's fp32 contribution (dweight_tile).
    float* dweight_acc = kIsF32<G> ? nullptr : scratch_f32(Scratch::kGrad, static_cast<size_t>(s.M * s.K));
    const bool add = a.accumulate == Accumulate::kAdd;
    const TileGrid dinp_tiles = output_tiles(s.N, s.K);
    if constexpr (kIsF32<D>) {
#pragma omp parallel
        backward_tiles(dout, inp, weight, dinp, add ? 1.0f : 0.0f, dinp_tiles, dweight, dweight_acc, dbias, s);
    } else {
        float* dout_f = scratch_f32(Scratch::kA, static_cast<size_t>(s.N * s.M));
        float* inp_f = scratch_f32(Scratch::kB, static_cast<size_t>(s.N * s.K));
        float* weight_f = scratch_f32(Scratch::kC, static_cast<size_t>(s.M * s.K));
        // The new term of dinp in fp32, rounded (after adding the old value for kAdd) once below.
        float* dinp_f = dinp ? scratch_f32(Scratch::kD, static_cast<size_t>(s.N * s.K)) : nullptr;
#pragma omp parallel
        {
            convert_to_f32_team(dout, dout_f, s.N * s.M);
            convert_to_f32_team(inp, inp_f, s.N * s.K);
            convert_to_f32_team(weight, weight_f, s.M * s.K);  // the implicit barrier: all complete below
            backward_tiles(dout_f, inp_f, weight_f, dinp_f, 0.0f, dinp_tiles, dweight, dweight_acc, dbias, s);
            if (dinp) {  // this thread's own dinp tiles, as backward_tiles computed them
                for_each_thread_tile(dinp_tiles, [&](const Slice& rows, const Slice& cols) {
                    for (int64_t n = rows.begin; n < rows.end; ++n) {
                        for (int64_t k = cols.begin; k < cols.end; ++k) {
                            const float g = dinp_f[n * s.K + k];
                            dinp[n * s.K + k] = from_float<D>(add ? to_float(dinp[n * s.K + k]) + g : g);
                        }
                    }
                });
            }
        }
    }
}

}  // namespace

void matmul_forward(const MatmulForwardArgs& a, OpMode mode) {
    const MatmulShape s = check_shapes(a.inp, a.weight, a.bias, a.out);
    const DType D = activation_dtype(a.inp, "matmul_forward", "inp");
    expect_d(a.weight, D, "matmul_forward", "weight", "inp");
    expect_d(a.bias, D, "matmul_forward", "bias", "inp");
    expect_d(a.out, D, "matmul_forward", "out", "inp");
    if (a.gelu_out.defined()) {
        MS_CHECK(a.gelu_out.numel() == s.N * s.M, "matmul: gelu_out has {} elements, expected N({}) * M({})",
                 a.gelu_out.numel(), s.N, s.M);
        MS_CHECK(a.gelu_out.data != a.out.data, "matmul: gelu_out must not alias out (the backward reads out)");
    }
    dispatch_float(D, [&](auto tag) {
        using T = decltype(tag);
        if (mode == OpMode::kReference) {
            forward_reference<T>(a, s);
        } else {
            forward_fast<T>(a, s);
        }
    });
    if (a.gelu_out.defined()) gelu_forward({.inp = a.out, .out = a.gelu_out}, mode);
}

void matmul_backward(const MatmulBackwardArgs& a, OpMode mode) {
    const MatmulShape s = check_shapes(a.inp, a.weight, a.dbias, a.dout);
    MS_CHECK(a.dweight.numel() == s.M * s.K, "matmul: dweight has {} elements, expected M({}) * K({})",
             a.dweight.numel(), s.M, s.K);
    if (a.dinp.defined()) {
        MS_CHECK(a.dinp.numel() == s.N * s.K, "matmul: dinp has {} elements, expected N({}) * K({})", a.dinp.numel(),
                 s.N, s.K);
    }
    if (a.gelu_inp.defined()) {
        MS_CHECK(a.dinp.defined() && a.accumulate == Accumulate::kOverwrite,
                 "matmul: gelu_inp needs dinp with accumulate = kOverwrite (dinp = gelu'(gelu_inp) * (dout @ weight))");
        MS_CHECK(a.gelu_inp.numel() == s.N * s.K, "matmul: gelu_inp has {} elements, expected N({}) * K({})",
                 a.gelu_inp.numel(), s.N, s.K);
    }
    const DType D = activation_dtype(a.inp, "matmul_backward", "inp");
    expect_d(a.dout, D, "matmul_backward", "dout", "inp");
    expect_d(a.weight, D, "matmul_backward", "weight", "inp");
    expect_d(a.dinp, D, "matmul_backward", "dinp", "inp");
    expect_grad(a.dweight, D, "matmul_backward", "dweight", "inp");
    expect_grad(a.dbias, D, "matmul_backward", "dbias", "inp");
    dispatch_float(D, [&](auto tag) {
        using T = decltype(tag);
        if (mode == OpMode::kReference) return backward_reference<T>(a, s);
        // dbias's type when it is undefined does not matter: take dweight's.
        const DType dbias_dtype = a.dbias.defined() ? a.dbias.dtype : a.dweight.dtype;
        dispatch_grad<T>(a.dweight.dtype, [&](auto g) {
            dispatch_grad<T>(dbias_dtype, [&](auto gb) { backward_fast<T, decltype(g), decltype(gb)>(a, s); });
        });
    });
    if (a.gelu_inp.defined()) gelu_backward({.inp = a.gelu_inp, .dout = a.dinp, .dinp = a.dinp}, mode);
}

}  // namespace ms::cpu
