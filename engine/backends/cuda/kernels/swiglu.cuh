// swiglu.cuh: launchers of SwiGLU, forward and backward (kernels live in swiglu.cu).
#pragma once

#include <cstdint>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// T: float, bf16 or fp16, computed in fp32. inp/dinp (N, 2F) rows [gate | up], out/dout (N, F).
// out = silu(gate) * up; out must not overlap inp.
template <class T>
void swiglu_forward(T* out, const T* inp, int64_t N, int F, cudaStream_t stream);
// dinp = [dout * up * silu'(gate) | dout * silu(gate)], overwritten; must not overlap dout or inp.
template <class T>
void swiglu_backward(T* dinp, const T* inp, const T* dout, int64_t N, int F, cudaStream_t stream);

}  // namespace ms::cuda
