// rope.cuh: launcher of the rotary position embedding, in place on qkv's Q and K heads (kernel lives in rope.cu).
#pragma once

#include <cstdint>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// Which way rope rotates: ms::RopeDirection (backend.h), which nvcc cannot include.
enum class RopeRotation : uint8_t { kForward, kInverse };

// T: float, bf16 or fp16 (qkv), computed in fp32 with the fp32 table (P, HS) [cos | sin] (engine/backends/
// rope_table.h). qkv is (N, row); of each row the first `rotated` columns (the Q and K heads, a multiple of HS) are
// rotated, pairs (i, i + HS/2) of each head by the angle of the row's position: positions[n] (int32, in [0, P)) or,
// with positions null, n % T. kInverse applies the transpose.
template <class T>
void rope(T* qkv, const float* table, const int32_t* positions, int64_t N, int row, int rotated, int HS, int T_len,
          RopeRotation rotation, cudaStream_t stream);

}  // namespace ms::cuda
