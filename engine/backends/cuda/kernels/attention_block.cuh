// attention_block.cuh: launchers of one key/value block of ring attention (context parallelism), forward with the
// log-sum-exp merge and backward, and of copy_columns (kernels live in attention_block.cu).
#pragma once

#include <cstdint>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// The shape of one block (backend.h, AttentionBlockForwardArgs): qkv (B, T, (NH + 2*NKV)*HS); kv (B, Tk, Wkv) with
// key/value head j's K at columns kv_column + j*HS and its V at kv_column + (NKV + j)*HS; query rows [q_begin,
// q_begin + q_rows) against key rows [0, kv_rows), with `causal` row q_begin + t against key rows u <= t. HS <=
// kAttentionMaxHS (attention.cuh).
struct AttentionBlockShape {
    int B, T, Tk, Wkv, kv_column, q_begin, q_rows, kv_rows, NH, NKV, HS;
    bool causal;
};

// S: the activation dtype of qkv and kv (float, bf16, fp16), computed in fp32. acc (B, T, NH*HS) and lse (B, NH, T)
// fp32: the block's output o_b and log-sum-exp lse_b of the shape's query rows overwrite them (merge false) or are
// merged into them: lse' = log(exp(lse) + exp(lse_b)), acc' = acc e^(lse - lse') + o_b e^(lse_b - lse').
template <class S>
void attention_block_forward(float* acc, float* lse, const S* qkv, const S* kv, const AttentionBlockShape& shape,
                             bool merge, cudaStream_t stream);

// The block's gradient from the final out and lse (S: dout, qkv, out, kv): dq (B, T, NH*HS) fp32 += over the
// shape's query rows, dkv (B, Tk, 2*NKV*HS) fp32 [dK | dV] += over key rows [0, kv_rows).
template <class S>
void attention_block_backward(float* dq, float* dkv, const S* dout, const S* qkv, const S* out, const float* lse,
                              const S* kv, const AttentionBlockShape& shape, cudaStream_t stream);

// dst[r, dst_column + c] = from_float<D>(to_float(src[r, src_column + c])) for r < rows, c < cols, src (rows, ws) and
// dst (rows, wd) row-major, S and D float, bf16 or fp16; dst must not overlap src.
template <class S, class D>
void copy_columns(D* dst, const S* src, int64_t rows, int64_t ws, int64_t wd, int64_t src_column, int64_t dst_column,
                  int64_t cols, cudaStream_t stream);

}  // namespace ms::cuda
