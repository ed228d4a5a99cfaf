// gelu.cuh: launchers of GELU (tanh approximation), forward and backward (kernels live in gelu.cu).
#pragma once

#include <cstdint>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// T: float, bf16 or fp16 (common.cuh), computed in fp32.
// out[i] = gelu(inp[i]) over n values; out must not alias inp (the backward needs inp).
template <class T>
void gelu_forward(T* out, const T* inp, int64_t n, cudaStream_t stream);
// dinp[i] = gelu'(inp[i]) * dout[i]; dinp is overwritten and may alias dout.
template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n, cudaStream_t stream);

}  // namespace ms::cuda
