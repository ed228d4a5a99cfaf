// matmul.cpp: the Linear layer, out = inp @ weight^T + bias, and its backward.
//
// Layouts (row-major): inp/dinp (N, K), weight/dweight (M, K) (Linear orientation), bias/dbias (M), out/dout (N, M).
// Backward: dinp = dout @ weight (= or += per `accumulate`, skipped when dinp is undefined),
//           dweight += dout^T @ inp,  dbias += sum_n dout[n, :].
// Fast path: OpenBLAS sgemm (its own thread pool; deterministic for a fixed thread count), bias and dbias with
// OpenMP over rows / column blocks. Reference path: triple loops with double accumulators.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/backends/cpu/ops.h"

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

void forward_reference(const MatmulForwardArgs& a, const MatmulShape& s) {
    const float* inp = a.inp.f32();
    const float* weight = a.weight.f32();
    const float* bias = a.bias.defined() ? a.bias.f32() : nullptr;
    float* out = a.out.f32();
    for (int64_t n = 0; n < s.N; ++n) {
        for (int64_t m = 0; m < s.M; ++m) {
            double acc = bias ? bias[m] : 0.0;
            for (int64_t k = 0; k < s.K; ++k) acc += static_cast<double>(inp[n * s.K + k]) * weight[m * s.K + k];
            out[n * s.M + m] = static_cast<float>(acc);
        }
    }
}

void forward_fast(const MatmulForwardArgs& a, const MatmulShape& s) {
    const float* inp = a.inp.f32();
    const float* weight = a.weight.f32();
    float* out = a.out.f32();
    float beta = 0.0f;
    if (a.bias.defined()) {
        // Seed every output row with the bias, then let sgemm add the product into it (beta = 1).
        const float* bias = a.bias.f32();
#pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < s.N; ++n) std::copy_n(bias, s.M, out + n * s.M);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(s.N), static_cast<int>(s.M),
                static_cast<int>(s.K), 1.0f, inp, static_cast<int>(s.K), weight, static_cast<int>(s.K), beta, out,
                static_cast<int>(s.M));
}

void backward_reference(const MatmulBackwardArgs& a, const MatmulShape& s) {
    const float* dout = a.dout.f32();
    const float* inp = a.inp.f32();
    const float* weight = a.weight.f32();
    float* dweight = a.dweight.f32();
    std::vector<double> acc(static_cast<size_t>(s.K));
    if (a.dinp.defined()) {
        float* dinp = a.dinp.f32();
        for (int64_t n = 0; n < s.N; ++n) {
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int64_t m = 0; m < s.M; ++m) {
                const double d = dout[n * s.M + m];
                for (int64_t k = 0; k < s.K; ++k) acc[k] += d * weight[m * s.K + k];
            }
            for (int64_t k = 0; k < s.K; ++k) {
                const float g = static_cast<float>(acc[k]);
                dinp[n * s.K + k] = a.accumulate == Accumulate::kAdd ? dinp[n * s.K + k] + g : g;
            }
        }
    }
    for (int64_t m = 0; m < s.M; ++m) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t n = 0; n < s.N; ++n) {
            const double d = dout[n * s.M + m];
            for (int64_t k = 0; k < s.K; ++k) acc[k] += d * inp[n * s.K + k];
        }
        for (int64_t k = 0; k < s.K; ++k) dweight[m * s.K + k] += static_cast<float>(acc[k]);
    }
    if (a.dbias.defined()) {
        float* dbias = a.dbias.f32();
        for (int64_t m = 0; m < s.M; ++m) {
            double sum = 0.0;
            for (int64_t n = 0; n < s.N; ++n) sum += dout[n * s.M + m];
            dbias[m] += static_cast<float>(sum);
        }
    }
}

// dbias[m] += sum_n dout[n, m]: column blocks of 64 floats across threads, rows in order within a block.
void bias_backward_fast(const float* dout, float* dbias, int64_t N, int64_t M) {
    constexpr int64_t kBlock = 64;
    const int64_t num_blocks = (M + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < num_blocks; ++blk) {
        const int64_t m0 = blk * kBlock, m1 = std::min(M, m0 + kBlock);
        float sum[kBlock] = {};
        for (int64_t n = 0; n < N; ++n) {
            const float* d = dout + n * M;
#pragma omp simd
            for (int64_t m = m0; m < m1; ++m) sum[m - m0] += d[m];
        }
        for (int64_t m = m0; m < m1; ++m) dbias[m] += sum[m - m0];
    }
}

void backward_fast(const MatmulBackwardArgs& a, const MatmulShape& s) {
    const float* dout = a.dout.f32();
    const float* inp = a.inp.f32();
    const float* weight = a.weight.f32();
    const int N = static_cast<int>(s.N), K = static_cast<int>(s.K), M = static_cast<int>(s.M);
    if (a.dinp.defined()) {
        // dinp (N, K) = dout (N, M) @ weight (M, K)
        const float beta = a.accumulate == Accumulate::kAdd ? 1.0f : 0.0f;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, K, M, 1.0f, dout, M, weight, K, beta, a.dinp.f32(),
                    K);
    }
    // dweight (M, K) += dout^T (M, N) @ inp (N, K)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, K, N, 1.0f, dout, M, inp, K, 1.0f, a.dweight.f32(), K);
    if (a.dbias.defined()) bias_backward_fast(dout, a.dbias.f32(), s.N, s.M);
}

}  // namespace

void matmul_forward(const MatmulForwardArgs& a, OpMode mode) {
    const MatmulShape s = check_shapes(a.inp, a.weight, a.bias, a.out);
    if (mode == OpMode::kReference) {
        forward_reference(a, s);
    } else {
        forward_fast(a, s);
    }
}

void matmul_backward(const MatmulBackwardArgs& a, OpMode mode) {
    const MatmulShape s = check_shapes(a.inp, a.weight, a.dbias, a.dout);
    MS_CHECK(a.dweight.numel() == s.M * s.K, "matmul: dweight has {} elements, expected M({}) * K({})",
             a.dweight.numel(), s.M, s.K);
    if (a.dinp.defined()) {
        MS_CHECK(a.dinp.numel() == s.N * s.K, "matmul: dinp has {} elements, expected N({}) * K({})", a.dinp.numel(),
                 s.N, s.K);
    }
    if (mode == OpMode::kReference) {
        backward_reference(a, s);
    } else {
        backward_fast(a, s);
    }
}

}  // namespace ms::cpu
