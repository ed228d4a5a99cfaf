// rmsnorm.cuh: launchers of RMSNorm (Llama) over the last dim, forward and backward (kernels live in rmsnorm.cu).
#pragma once

#include <cstddef>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// T: the activation dtype, float, bf16 or fp16 (inp, out, weight, dout, dinp); rstd and the scratch are fp32;
// G, dweight's type: float or T (backend.h precision contract).
// out = inp * rstd * weight per row, rstd = 1 / sqrt(mean(inp^2) + eps) (N) saved for the backward.
template <class T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps, cudaStream_t stream);

// Floats of scratch rmsnorm_backward needs (per-chunk partial sums of dweight); the caller owns it.
size_t rmsnorm_backward_scratch_floats(int N, int C);

// dinp = or += per `write`; dweight[c] = from_float<G>(dweight[c] + sum_n dout * inp * rstd), the sum fp32.
// Deterministic (no atomics).
template <class T, class G>
void rmsnorm_backward(T* dinp, G* dweight, float* scratch, const T* dout, const T* inp, const T* weight,
                      const float* rstd, int N, int C, DinpWrite write, cudaStream_t stream);

}  // namespace ms::cuda
