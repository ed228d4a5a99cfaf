// adamw.cuh: launcher of the fused AdamW pass (kernels live in adamw.cu).
#pragma once

#include <cstdint>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

struct AdamWHyper {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale;  // clipping factor folded into the pass
    int64_t step;      // t >= 1, for the bias corrections
};

// param, m, v (n) fp32 updated in place; grad (n) G (float, bf16, fp16) only read, widened to fp32; param_copy (n) T
// (float, bf16, fp16; nullptr: none) = the updated param rounded to T.
template <class T, class G>
void adamw(float* param, float* m, float* v, const G* grad, T* param_copy, int64_t n, const AdamWHyper& h,
           cudaStream_t stream);

// The fp32-only update: no param_copy.
inline void adamw(float* param, float* m, float* v, const float* grad, int64_t n, const AdamWHyper& h,
                  cudaStream_t stream) {
    adamw<float, float>(param, m, v, grad, nullptr, n, h, stream);
}

}  // namespace ms::cuda
