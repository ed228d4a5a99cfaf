// cast.cuh: launcher of the dtype conversion (kernels live in cast.cu).
#pragma once

#include <cstdint>

#include "engine/backends/cuda/common.cuh"
#include "engine/core/half.h"

namespace ms::cuda {

// dst[i] = from_float<D>(to_float(src[i])) over n values (S, D: float, bf16, fp16); dst must not overlap src.
template <class S, class D>
void cast(D* dst, const S* src, int64_t n, cudaStream_t stream);

}  // namespace ms::cuda
