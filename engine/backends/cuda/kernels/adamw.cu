/*
AdamW, one fused pass (decoupled weight decay, bias correction), elementwise:
  g = grad * grad_scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
  param -= lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * param )
Layout: param, m, v (n) fp32, contiguous (the master weights and their optimizer state, whatever the model's dtype);
grad (n) G, fp32 or bf16 / fp16 (16-bit gradients, backend.h), widened to fp32 on load; param_copy (n) T (optional):
the updated param rounded to T, the model's bf16 / fp16 weights, written in the same pass (a fused cast). The bias
corrections are computed on the host in double, once.
Accumulation contract: param, m and v are updated in place; grad is only read; param_copy is overwritten.
*/
#include <cmath>

#include "engine/backends/cuda/kernels/adamw.cuh"

namespace ms::cuda {
namespace {

constexpr int kBlockSize = 256;

// ----------------------------------------------------------------------------
// CUDA kernels

template <class T, class G>
__global__ void adamw_kernel(float* __restrict__ param, float* __restrict__ m, float* __restrict__ v,
                             const G* __restrict__ grad, T* __restrict__ param_copy, int64_t n, float lr, float beta1,
                             float beta2, float eps, float weight_decay, float grad_scale, float inv_correction1,
                             float inv_correction2) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float g = to_float(grad[i]) * grad_scale;
        const float mi = beta1 * m[i] + (1.0f - beta1) * g;
        const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float p =
            param[i] - lr * ((mi * inv_correction1) / (sqrtf(vi * inv_correction2) + eps) + weight_decay * param[i]);
        param[i] = p;
        if (param_copy != nullptr) param_copy[i] = from_float<T>(p);
    }
}

}  // namespace

// ----------------------------------------------------------------------------
// kernel launchers

template <class T, class G>
void adamw(float* param, float* m, float* v, const G* grad, T* param_copy, int64_t n, const AdamWHyper& h,
           cudaStream_t stream) {
    MS_ASSERT(h.step >= 1, "adamw: step is %lld, must be >= 1 (bias corrections divide by 1 - beta^step)",
              static_cast<long long>(h.step));
    if (n == 0) return;
    const double correction1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(h.step));
    const double correction2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(h.step));
    ms_launch(adamw_kernel<T, G>, grid_stride_blocks(n, kBlockSize), kBlockSize, 0, stream, param, m, v, grad,
              param_copy, n, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.grad_scale,
              static_cast<float>(1.0 / correction1), static_cast<float>(1.0 / correction2));
    MS_CUDA_LAUNCH_CHECK();
}

// Every (param_copy, grad) pair of dtypes.
#define MS_INSTANTIATE_T(T, G) \
    template void adamw<T, G>(float*, float*, float*, const G*, T*, int64_t, const AdamWHyper&, cudaStream_t);
#define MS_INSTANTIATE(G) MS_INSTANTIATE_T(float, G) MS_INSTANTIATE_T(bf16, G) MS_INSTANTIATE_T(fp16, G)
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE
#undef MS_INSTANTIATE_T

}  // namespace ms::cuda
