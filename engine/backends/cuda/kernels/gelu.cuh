// gelu.cuh: launchers of GELU (tanh approximation), forward and backward (kernels live in gelu.cu).
#pragma once

#include <cstdint>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// out[i] = gelu(inp[i]) over n values; out must not alias inp (the backward needs inp).
void gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t stream);
// dinp[i] = gelu'(inp[i]) * dout[i]; dinp is overwritten and may alias dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, cudaStream_t stream);

}  // namespace ms::cuda
