/*
Residual forward: the residual stream's add, out = a + (b + bias[i % M]) elementwise (bias optional).
Layout: a, b, out (n) T (float, bf16, fp16), contiguous; bias (M) with M dividing n (the row-parallel linear's bias,
added after the tensor-parallel all-reduce of b). Accumulation contract: out is overwritten and may alias a. The same
additions in the same order as cpu/ops/residual.cpp, in fp32, rounded once to T, so the result is bit-identical to the
CPU. No backward: it is the identity on both inputs.
bf16 / fp16: when every pointer is 16-byte aligned and M is a multiple of 8 (or there is no bias), the first
n - n % 8 elements move as 16-byte packs of 8 (pack.cuh), the rest one by one; each element's arithmetic is the
same either way.
*/
#include "engine/backends/cuda/kernels/residual.cuh"
#include "engine/backends/cuda/pack.cuh"

namespace ms::cuda {
namespace {

constexpr int kBlockSize = 256;

// ----------------------------------------------------------------------------
// CUDA kernels

template <class T>
__device__ __forceinline__ T residual_value(T a, T b, const T* bias, int64_t j) {
    return from_float<T>(bias ? to_float(a) + (to_float(b) + to_float(bias[j])) : to_float(a) + to_float(b));
}

// Elements [0, n_packed) in packs (n_packed a multiple of the pack size, and of M's when there is a bias, so a pack
// at i reads bias[i % M, + 8); 0 for float or misaligned pointers), then [n_packed, n) one by one. out and a may
// alias, so neither is __restrict__ (a thread reads a pack of a before writing the same pack of out).
template <class T>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, const T* bias, int64_t n, int64_t M,
                                        int64_t n_packed) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if constexpr (sizeof(T) == 2) {
        constexpr int K = Pack<T>::kSize;
        for (int64_t i = tid * K; i < n_packed; i += stride * K) {
            const Pack<T> pa = load_pack(a + i), pb = load_pack(b + i);
            const int64_t j = bias ? i % M : 0;
            Pack<T> po;
            for (int k = 0; k < K; ++k) po.v[k] = residual_value(pa.v[k], pb.v[k], bias, j + k);
            store_pack(out + i, po);
        }
    }
    for (int64_t i = n_packed + tid; i < n; i += stride) out[i] = residual_value(a[i], b[i], bias, bias ? i % M : 0);
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
    int64_t n_packed = 0;
    if constexpr (sizeof(T) == 2) {
        constexpr int K = Pack<T>::kSize;
        if (pack_aligned({out, a, b, bias}) && (!bias || M % K == 0)) n_packed = n - n % K;
    }
    const int64_t work = n_packed > 0 ? n_packed / Pack<T>::kSize + (n - n_packed) : n;
    ms_launch(residual_forward_kernel<T>, grid_stride_blocks(work, kBlockSize), kBlockSize, 0, stream, out, a, b, bias,
              n, M, n_packed);
    MS_CUDA_LAUNCH_CHECK();
}

#define MS_INSTANTIATE(T) \
    template void residual_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, cudaStream_t);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE

}  // namespace ms::cuda
