// matmul.cuh: launchers of the Linear layer, out = inp @ weight^T + bias, and its backward (kernels in matmul.cu).
#pragma once

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// out (N, M) = inp (N, K) @ weight (M, K)^T + bias (M) (bias optional: nullptr).
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int K, int M,
                    cudaStream_t stream);

// dinp (N, K) = or += dout @ weight per `write` (skipped when dinp is nullptr); dweight (M, K) += dout^T @ inp;
// dbias (M) += sum_n dout[n, :] (skipped when dbias is nullptr). Deterministic (no atomics).
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int K, int M, DinpWrite write, cudaStream_t stream);

}  // namespace ms::cuda
