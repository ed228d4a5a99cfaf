// layernorm.cuh: launchers of LayerNorm over the last dim, forward and backward (kernels live in layernorm.cu).
#pragma once

#include <cstddef>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// out = (inp - mean) * rstd * weight + bias per row; mean and rstd (N) are saved for the backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C, float eps, cudaStream_t stream);

// Floats of scratch layernorm_backward needs (per-chunk partial sums of dweight and dbias); the caller owns it.
size_t layernorm_backward_scratch_floats(int N, int C);

// dinp = or += per `write`; dweight += sum_n dout * norm; dbias += sum_n dout. Deterministic (no atomics).
void layernorm_backward(float* dinp, float* dweight, float* dbias, float* scratch, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C, DinpWrite write,
                        cudaStream_t stream);

}  // namespace ms::cuda
