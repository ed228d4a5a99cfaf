/*
GELU, tanh approximation, forward and backward, elementwise.
  u = sqrt(2/pi) (x + 0.044715 x^3);  gelu(x) = 0.5 x (1 + tanh u)
  gelu'(x) = 0.5 (1 + tanh u) + 0.5 x sech^2(u) u',  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
Both use 0.5 (1 + tanh u) = s = sigmoid(2u) = 1 / (1 + e^-2u) and sech^2 u = 4 s (1 - s) with 1 - s = e^-2u s, as
cpu/ops/gelu.cpp's fast path does: one expf per element and no cancellation when |u| is large.
Layout: inp, out, dout, dinp (n) T (float, bf16, fp16), contiguous; fp32 math, one rounding per stored element.
Accumulation contract: out is overwritten (must not alias inp); dinp is overwritten and may alias dout (each
thread reads its element before writing it).
*/
#include "engine/backends/cuda/kernels/gelu.cuh"

namespace ms::cuda {
namespace {

constexpr int kBlockSize = 256;
constexpr float kTwoSqrt2OverPi = 2.0f * 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

// ----------------------------------------------------------------------------
// CUDA kernels

template <class T>
__global__ void gelu_forward_kernel(T* __restrict__ out, const T* __restrict__ inp, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float x = to_float(inp[i]);
        out[i] = from_float<T>(x / (1.0f + expf(-kTwoSqrt2OverPi * (x + kCubic * x * x * x))));
    }
}

// dinp and dout may alias, so neither is __restrict__.
template <class T>
__global__ void gelu_backward_kernel(T* dinp, const T* __restrict__ inp, const T* dout, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float x = to_float(inp[i]);
        // e^-2u, capped below float overflow (x < -10): an infinite e would make e * s = inf * 0 = NaN.
        const float e = expf(fminf(-kTwoSqrt2OverPi * (x + kCubic * x * x * x), 88.0f));
        const float s = 1.0f / (1.0f + e);  // 0.5 (1 + tanh u)
        const float one_minus_s = e * s;
        const float du2 = kTwoSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);  // 2 u'
        dinp[i] = from_float<T>((s + x * s * one_minus_s * du2) * to_float(dout[i]));
    }
}

}  // namespace

// ----------------------------------------------------------------------------
// kernel launchers

template <class T>
void gelu_forward(T* out, const T* inp, int64_t n, cudaStream_t stream) {
    MS_ASSERT(out != inp, "gelu: out must not alias inp (the backward reads inp)");
    if (n == 0) return;
    ms_launch(gelu_forward_kernel<T>, grid_stride_blocks(n, kBlockSize), kBlockSize, 0, stream, out, inp, n);
    MS_CUDA_LAUNCH_CHECK();
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    ms_launch(gelu_backward_kernel<T>, grid_stride_blocks(n, kBlockSize), kBlockSize, 0, stream, dinp, inp, dout, n);
    MS_CUDA_LAUNCH_CHECK();
}

#define MS_INSTANTIATE(T)                                               \
    template void gelu_forward<T>(T*, const T*, int64_t, cudaStream_t); \
    template void gelu_backward<T>(T*, const T*, const T*, int64_t, cudaStream_t);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE

}  // namespace ms::cuda
