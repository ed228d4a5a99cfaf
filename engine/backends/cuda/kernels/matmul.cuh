// matmul.cuh: launchers of the Linear layer, out = inp @ weight^T + bias, and its backward (kernels in matmul.cu).
#pragma once

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// T: the activation dtype (float, bf16, fp16) of inp, weight, bias, out, dout, dinp; G: the parameter gradients'
// (dweight, dbias), float or T itself (backend.h precision contract). Products accumulate in fp32; each T output is
// rounded once (the forward after adding the bias), and each G gradient once: from_float<G>(old + the fp32 sum).

// out (N, M) = inp (N, K) @ weight (M, K)^T + bias (M) (bias optional: nullptr).
template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, const NoDeduce<T>* bias, int N, int K, int M,
                    cudaStream_t stream);

// dinp (N, K) = or += dout @ weight per `write` (skipped when dinp is nullptr); dweight (M, K) += dout^T @ inp;
// dbias (M) += sum_n dout[n, :] (skipped when dbias is nullptr). Deterministic (no atomics).
template <class T, class G>
void matmul_backward(NoDeduce<T>* dinp, G* dweight, NoDeduce<G>* dbias, const T* dout, const T* inp, const T* weight,
                     int N, int K, int M, DinpWrite write, cudaStream_t stream);

// grad[i] = from_float<G>(grad[i] + contribution[i]) for i < n: an fp32 contribution (cuBLASLt's bias gradient)
// added to a gradient of dtype G (float, bf16, fp16) with one rounding.
template <class G>
void add_to_gradient(G* grad, const float* contribution, int n, cudaStream_t stream);

}  // namespace ms::cuda
