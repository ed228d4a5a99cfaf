// attention.cuh: launchers of causal multi-head self-attention, flash style (kernels live in attention.cu).
#pragma once

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// Largest head size the kernels take (their shared-memory tiles are sized for it).
inline constexpr int kAttentionMaxHS = 64;

// out = softmax(Q K^T / sqrt(HS) + causal mask) V per head; lse (B, NH, T) = log-sum-exp of each softmax row.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int NH, int HS, cudaStream_t stream);

// dqkv (B, T, 3*NH*HS) overwritten, the probabilities recomputed from lse; `out` is the forward's output.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int B,
                        int T, int NH, int HS, cudaStream_t stream);

}  // namespace ms::cuda
