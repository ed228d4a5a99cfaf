// layernorm.cuh: launchers of LayerNorm over the last dim, forward and backward (kernels live in layernorm.cu).
#pragma once

#include <cstddef>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// T: the activation dtype, float, bf16 or fp16 (inp, out, weight, bias, dout, dinp); mean, rstd and the scratch are
// fp32 whatever T is; dweight and dbias are G, float or T itself (backend.h precision contract).
// out = (inp - mean) * rstd * weight + bias per row; mean and rstd (N) are saved for the backward.
template <class T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N, int C,
                       float eps, cudaStream_t stream);

// The residual add fused in front: res_out = res_a + (res_b + res_bias[c]) (res_bias (C) may be null), rounded
// once to T, then layernorm_forward of res_out; bit-identical to residual_forward followed by layernorm_forward.
// res_out may alias res_a, out may alias res_b.
template <class T>
void layernorm_residual_forward(T* out, float* mean, float* rstd, T* res_out, const T* res_a, const T* res_b,
                                const NoDeduce<T>* res_bias, const T* weight, const T* bias, int N, int C, float eps,
                                cudaStream_t stream);

// Floats of scratch layernorm_backward needs (per-chunk partial sums of dweight and dbias); the caller owns it.
size_t layernorm_backward_scratch_floats(int N, int C);

// dinp = or += per `write`; dweight += sum_n dout * norm; dbias += sum_n dout. Deterministic (no atomics).
// kAdd rounds the fp32 sum of the old dinp and the new term once; dweight and dbias are from_float<G>(old + the fp32
// sum over the rows), one rounding each.
template <class T, class G>
void layernorm_backward(T* dinp, G* dweight, G* dbias, float* scratch, const T* dout, const T* inp, const T* weight,
                        const float* mean, const float* rstd, int N, int C, DinpWrite write, cudaStream_t stream);

}  // namespace ms::cuda
