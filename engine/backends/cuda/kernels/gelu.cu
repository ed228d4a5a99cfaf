/*
GELU, tanh approximation, forward and backward, elementwise.
  u = sqrt(2/pi) (x + 0.044715 x^3);  gelu(x) = 0.5 x (1 + tanh u)
  gelu'(x) = 0.5 (1 + tanh u) + 0.5 x sech^2(u) u',  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
Both use 0.5 (1 + tanh u) = s = sigmoid(2u) = 1 / (1 + e^-2u) and sech^2 u = 4 s (1 - s) with 1 - s = e^-2u s, as
cpu/ops/gelu.cpp's fast path does: one expf per element and no cancellation when |u| is large.
Layout: inp, out, dout, dinp (n) T (float, bf16, fp16), contiguous; fp32 math, one rounding per stored element.
bf16 / fp16: when every pointer is 16-byte aligned, the first n - n % 8 elements move as 16-byte packs of 8
(pack.cuh) and the rest one by one; each element's math is the same function either way, so the bits are too.
Accumulation contract: out is overwritten (must not alias inp); dinp is overwritten and may alias dout (each
thread reads its element before writing it).
*/
#include "engine/backends/cuda/kernels/gelu.cuh"
#include "engine/backends/cuda/pack.cuh"

namespace ms::cuda {
namespace {

constexpr int kBlockSize = 256;
constexpr float kTwoSqrt2OverPi = 2.0f * 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

// ----------------------------------------------------------------------------
// CUDA kernels

__device__ __forceinline__ float gelu_value(float x) {
    return x / (1.0f + expf(-kTwoSqrt2OverPi * (x + kCubic * x * x * x)));
}

__device__ __forceinline__ float gelu_grad(float x, float dy) {
    // e^-2u, capped below float overflow (x < -10): an infinite e would make e * s = inf * 0 = NaN.
    const float e = expf(fminf(-kTwoSqrt2OverPi * (x + kCubic * x * x * x), 88.0f));
    const float s = 1.0f / (1.0f + e);  // 0.5 (1 + tanh u)
    const float one_minus_s = e * s;
    const float du2 = kTwoSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);  // 2 u'
    return (s + x * s * one_minus_s * du2) * dy;
}

// Elements [0, n_packed) in packs (n_packed a multiple of the pack size; 0 for float or misaligned pointers), then
// [n_packed, n) one by one, both grid-stride.
template <class T>
__global__ void gelu_forward_kernel(T* __restrict__ out, const T* __restrict__ inp, int64_t n, int64_t n_packed) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if constexpr (sizeof(T) == 2) {
        constexpr int K = Pack<T>::kSize;
        for (int64_t i = tid * K; i < n_packed; i += stride * K) {
            const Pack<T> x = load_pack(inp + i);
            Pack<T> y;
            for (int k = 0; k < K; ++k) y.v[k] = from_float<T>(gelu_value(to_float(x.v[k])));
            store_pack(out + i, y);
        }
    }
    for (int64_t i = n_packed + tid; i < n; i += stride) out[i] = from_float<T>(gelu_value(to_float(inp[i])));
}

// dinp and dout may alias, so neither is __restrict__ (a pack of dout is read before the same pack of dinp is
// written, by the same thread).
template <class T>
__global__ void gelu_backward_kernel(T* dinp, const T* __restrict__ inp, const T* dout, int64_t n, int64_t n_packed) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if constexpr (sizeof(T) == 2) {
        constexpr int K = Pack<T>::kSize;
        for (int64_t i = tid * K; i < n_packed; i += stride * K) {
            const Pack<T> x = load_pack(inp + i), dy = load_pack(dout + i);
            Pack<T> dx;
            for (int k = 0; k < K; ++k) dx.v[k] = from_float<T>(gelu_grad(to_float(x.v[k]), to_float(dy.v[k])));
            store_pack(dinp + i, dx);
        }
    }
    for (int64_t i = n_packed + tid; i < n; i += stride) {
        dinp[i] = from_float<T>(gelu_grad(to_float(inp[i]), to_float(dout[i])));
    }
}

// The packed prefix of n elements for these pointers: n - n % 8 for 16-bit T when all are 16-byte aligned, else 0.
template <class T>
int64_t packed_elements(int64_t n, std::initializer_list<const void*> ptrs) {
    if constexpr (sizeof(T) == 2) {
        if (pack_aligned(ptrs)) return n - n % Pack<T>::kSize;
    }
    return 0;
}

// Blocks for the packed prefix and the scalar rest (grid-stride over whichever needs more threads).
template <class T>
int launch_blocks(int64_t n, int64_t n_packed) {
    const int64_t work = n_packed > 0 ? n_packed / Pack<T>::kSize + (n - n_packed) : n;
    return grid_stride_blocks(work, kBlockSize);
}

}  // namespace

// ----------------------------------------------------------------------------
// kernel launchers

template <class T>
void gelu_forward(T* out, const T* inp, int64_t n, cudaStream_t stream) {
    MS_ASSERT(out != inp, "gelu: out must not alias inp (the backward reads inp)");
    if (n == 0) return;
    const int64_t n_packed = packed_elements<T>(n, {out, inp});
    ms_launch(gelu_forward_kernel<T>, launch_blocks<T>(n, n_packed), kBlockSize, 0, stream, out, inp, n, n_packed);
    MS_CUDA_LAUNCH_CHECK();
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    const int64_t n_packed = packed_elements<T>(n, {dinp, inp, dout});
    ms_launch(gelu_backward_kernel<T>, launch_blocks<T>(n, n_packed), kBlockSize, 0, stream, dinp, inp, dout, n,
              n_packed);
    MS_CUDA_LAUNCH_CHECK();
}

#define MS_INSTANTIATE(T)                                               \
    template void gelu_forward<T>(T*, const T*, int64_t, cudaStream_t); \
    template void gelu_backward<T>(T*, const T*, const T*, int64_t, cudaStream_t);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE

}  // namespace ms::cuda
