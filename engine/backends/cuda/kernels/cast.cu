/*
Dtype conversion, elementwise: dst[i] = from_float<D>(to_float(src[i])), rounding to nearest even with the integer
conversions of engine/core/half.h, so the GPU, the CPU emulation and cpu/ops/cast.cpp give the same bits.
Layout: src, dst (n) contiguous, not overlapping.
*/
#include "engine/backends/cuda/kernels/cast.cuh"

namespace ms::cuda {
namespace {

constexpr int kBlockSize = 256;

// ----------------------------------------------------------------------------
// CUDA kernels

template <class S, class D>
__global__ void cast_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        dst[i] = from_float<D>(to_float(src[i]));
    }
}

}  // namespace

// ----------------------------------------------------------------------------
// kernel launchers

template <class S, class D>
void cast(D* dst, const S* src, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    ms_launch(cast_kernel<S, D>, grid_stride_blocks(n, kBlockSize), kBlockSize, 0, stream, dst, src, n);
    MS_CUDA_LAUNCH_CHECK();
}

template void cast<float, bf16>(bf16*, const float*, int64_t, cudaStream_t);
template void cast<float, fp16>(fp16*, const float*, int64_t, cudaStream_t);
template void cast<bf16, float>(float*, const bf16*, int64_t, cudaStream_t);
template void cast<fp16, float>(float*, const fp16*, int64_t, cudaStream_t);
template void cast<bf16, fp16>(fp16*, const bf16*, int64_t, cudaStream_t);
template void cast<fp16, bf16>(bf16*, const fp16*, int64_t, cudaStream_t);

}  // namespace ms::cuda
