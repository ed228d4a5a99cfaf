// residual.cuh: launcher of the residual stream's add (kernels live in residual.cu).
#pragma once

#include <cstdint>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// out[i] = a[i] + (b[i] + bias[i % M]) over n values, in fp32, rounded once to T (float, bf16, fp16); bias may be
// null (then M is ignored). out may alias a.
template <class T>
void residual_forward(T* out, const T* a, const T* b, const NoDeduce<T>* bias, int64_t n, int64_t M,
                      cudaStream_t stream);

}  // namespace ms::cuda
