// embedding.cuh: launchers of the vocab-parallel token + position embedding (kernels live in embedding.cu).
#pragma once

#include <cstdint>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// D: the activation dtype, float, bf16 or fp16 (out, table, pos, dout); dtable and dpos are G, float or D itself
// (backend.h precision contract).
// out[n] = (table[tokens[n] - vocab_start] if held here, else 0) + (pos ? pos[n % T] : 0), summed in fp32 and rounded
// once to D. N must be a multiple of T.
template <class D>
void embedding_forward(D* out, const int32_t* tokens, const D* table, const NoDeduce<D>* pos, int N, int C, int V_local,
                       int64_t vocab_start, int T, cudaStream_t stream);

// dtable[tokens[n] - vocab_start] += dout[n] for the tokens held here; dpos[n % T] += dout[n] when dpos is given.
// Deterministic and bit-identical to cpu/ops/embedding.cpp: every element is summed in token order, no atomics. A
// 16-bit G element becomes from_float<G>(old + its fp32 sum from 0), one rounding per call.
template <class D, class G>
void embedding_backward(G* dtable, NoDeduce<G>* dpos, const int32_t* tokens, const D* dout, int N, int C, int V_local,
                        int64_t vocab_start, int T, cudaStream_t stream);

}  // namespace ms::cuda
