// sum_squares.cuh: launcher of the deterministic sum of squares (kernels live in sum_squares.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// Doubles of scratch sum_squares needs (one partial per chunk of x); the caller owns it.
size_t sum_squares_scratch_doubles(int64_t n);

// *out = sum_i x[i]^2 in double, written to a device scalar (the caller copies it back when it needs the value).
// Bit-identical from run to run and from GPU to GPU: the chunking depends on n only.
// T: the gradient buffer's dtype, float, bf16 or fp16 (16-bit gradients).
template <class T>
void sum_squares(double* out, double* scratch, const T* x, int64_t n, cudaStream_t stream);

}  // namespace ms::cuda
