// residual.cuh: launcher of the residual stream's add (kernels live in residual.cu).
#pragma once

#include <cstdint>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// out[i] = a[i] + (b[i] + bias[i % M]) over n values; bias may be null (then M is ignored). out may alias a.
void residual_forward(float* out, const float* a, const float* b, const float* bias, int64_t n, int64_t M,
                      cudaStream_t stream);

}  // namespace ms::cuda
