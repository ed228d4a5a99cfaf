// embedding.cuh: launchers of the vocab-parallel token + position embedding (kernels live in embedding.cu).
#pragma once

#include <cstdint>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// out[n] = (table[tokens[n] - vocab_start] if held here, else 0) + (pos ? pos[n % T] : 0). N must be a multiple of T.
void embedding_forward(float* out, const int32_t* tokens, const float* table, const float* pos, int N, int C,
                       int V_local, int64_t vocab_start, int T, cudaStream_t stream);

// dtable[tokens[n] - vocab_start] += dout[n] for the tokens held here; dpos[n % T] += dout[n] when dpos is given.
// Deterministic and bit-identical to cpu/ops/embedding.cpp: every element is summed in token order, no atomics.
void embedding_backward(float* dtable, float* dpos, const int32_t* tokens, const float* dout, int N, int C, int V_local,
                        int64_t vocab_start, int T, cudaStream_t stream);

}  // namespace ms::cuda
