/*
Residual forward: the residual stream's add, out = a + (b + bias[i % M]) elementwise (bias optional).
Layout: a, b, out (n) T (float, bf16, fp16), contiguous; bias (M) with M dividing n (the row-parallel linear's bias,
added after the tensor-parallel all-reduce of b). Accumulation contract: out is overwritten and may alias a. The same
additions in the same order as cpu/ops/residual.cpp, in fp32, rounded once to T, so the result is bit-identical to the
CPU. No backward: it is the identity on both inputs.
*/
#include "engine/backends/cuda/kernels/residual.cuh"

namespace ms::cuda {
namespace {

constexpr int kBlockSize = 256;

// ----------------------------------------------------------------------------
// CUDA kernels

// out and a may alias, so neither is __restrict__.
template <class T>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, const T* bias, int64_t n, int64_t M) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = from_float<T>(bias ? to_float(a[i]) + (to_float(b[i]) + to_float(bias[i % M]))
                                    : to_float(a[i]) + to_float(b[i]));
    }
}

}  // namespace

// ----------------------------------------------------------------------------
// kernel launchers

template <class T>
void residual_forward(T* out, const T* a, const T* b, const NoDeduce<T>* bias, int64_t n, int64_t M,
                      cudaStream_t stream) {
    MS_ASSERT(!bias || (M > 0 && n % M == 0), "residual: bias has %lld elements, which does not divide n = %lld",
              static_cast<long long>(M), static_cast<long long>(n));
    if (n == 0) return;
    ms_launch(residual_forward_kernel<T>, grid_stride_blocks(n, kBlockSize), kBlockSize, 0, stream, out, a, b, bias, n,
              M);
    MS_CUDA_LAUNCH_CHECK();
}

#define MS_INSTANTIATE(T) \
    template void residual_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, cudaStream_t);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE

}  // namespace ms::cuda
