/*
SwiGLU (Llama's MLP activation), forward and backward, elementwise over (N, F).
Layout: inp/dinp (N, 2F) T rows [gate (F) | up (F)], out/dout (N, F) T, where T is float, bf16 or fp16.
  out = silu(g) u with silu(g) = g s, s = sigmoid(g) = 1 / (1 + e^-g);
  dgate = dout u s (1 + g e^-g s), dup = dout g s   (1 - s written as e^-g s, which does not cancel for large g),
as cpu/ops/swiglu.cpp's fast path; e^-g is capped below float overflow, so g << 0 gives 0, not inf * 0 = NaN.
One thread per (n, f), grid-stride; fp32 math, one rounding per stored element. Outputs are overwritten.
*/
#include "engine/backends/cuda/kernels/swiglu.cuh"

namespace ms::cuda {
namespace {

constexpr int kBlockSize = 256;

template <class T>
__global__ void swiglu_forward_kernel(T* __restrict__ out, const T* __restrict__ inp, int64_t N, int F) {
    const int64_t n_elems = N * F;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n_elems; idx += stride) {
        const int64_t n = idx / F;
        const int f = static_cast<int>(idx % F);
        const float g = to_float(inp[n * 2 * F + f]), u = to_float(inp[n * 2 * F + F + f]);
        const float s = 1.0f / (1.0f + expf(fminf(-g, 88.0f)));
        out[idx] = from_float<T>(g * s * u);
    }
}

template <class T>
__global__ void swiglu_backward_kernel(T* __restrict__ dinp, const T* __restrict__ inp, const T* __restrict__ dout,
                                       int64_t N, int F) {
    const int64_t n_elems = N * F;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n_elems; idx += stride) {
        const int64_t n = idx / F;
        const int f = static_cast<int>(idx % F);
        const float g = to_float(inp[n * 2 * F + f]), u = to_float(inp[n * 2 * F + F + f]);
        const float dy = to_float(dout[idx]);
        const float e = expf(fminf(-g, 88.0f));
        const float s = 1.0f / (1.0f + e);
        dinp[n * 2 * F + f] = from_float<T>(dy * u * s * fmaf(g, e * s, 1.0f));
        dinp[n * 2 * F + F + f] = from_float<T>(dy * g * s);
    }
}

}  // namespace

template <class T>
void swiglu_forward(T* out, const T* inp, int64_t N, int F, cudaStream_t stream) {
    MS_ASSERT(N >= 0 && F > 0, "swiglu: N = %lld, F = %d (F must be positive)", static_cast<long long>(N), F);
    if (N == 0) return;
    ms_launch(swiglu_forward_kernel<T>, grid_stride_blocks(N * F, kBlockSize), kBlockSize, 0, stream, out, inp, N, F);
    MS_CUDA_LAUNCH_CHECK();
}

template <class T>
void swiglu_backward(T* dinp, const T* inp, const T* dout, int64_t N, int F, cudaStream_t stream) {
    MS_ASSERT(N >= 0 && F > 0, "swiglu: N = %lld, F = %d (F must be positive)", static_cast<long long>(N), F);
    if (N == 0) return;
    ms_launch(swiglu_backward_kernel<T>, grid_stride_blocks(N * F, kBlockSize), kBlockSize, 0, stream, dinp, inp, dout,
              N, F);
    MS_CUDA_LAUNCH_CHECK();
}

#define MS_INSTANTIATE(T)                                                      \
    template void swiglu_forward<T>(T*, const T*, int64_t, int, cudaStream_t); \
    template void swiglu_backward<T>(T*, const T*, const T*, int64_t, int, cudaStream_t);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE

}  // namespace ms::cuda
