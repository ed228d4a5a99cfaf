// cross_attention.h: attention whose queries come from one tensor and whose keys and values from another, with
// sequences of different lengths: CLIP's cross-modal layers, where each caption's T text rows attend to the S rows of
// its image (engine/model/clip_tower.cpp). Bidirectional: every query row sees every key row of its sequence.
//
// It runs on the block ops of ring attention (Backend::attention_block_forward / _backward, one block: all S key
// rows). Those read the queries from the first NH*HS columns of a (B, T, (NH + 2*NH)*HS) qkv tensor, so the op packs
// q into such a tensor in its scratch (copy_columns) and leaves the other columns zero; kv is the packed [K | V] rows
// the block ops take as a key/value block. The forward's fp32 output and the backward's fp32 dQ and [dK | dV] are
// rounded to the activation dtype once at the end.
//
// Scratch, one fp32 tensor of cross_*_scratch_elems() planned as an activation living for one op: the packed qkv and
// the fp32 output (forward); the packed qkv, fp32 dQ and fp32 [dK | dV] (backward).
#pragma once

#include <cstdint>

#include "engine/backends/backend.h"

namespace ms::graph {

struct CrossAttentionShape {
    int64_t B = 1;            // sequences
    int64_t T = 1, S = 1;     // query rows and key/value rows of each
    int64_t NH = 1;           // heads held here (keys and values have as many)
    int64_t HS = 1;           // head size
    DType act = DType::kF32;  // q, kv, out and their gradients
};
int64_t cross_forward_scratch_elems(const CrossAttentionShape& s);
int64_t cross_backward_scratch_elems(const CrossAttentionShape& s);

// out (B, T, NH*HS) and lse (B, NH, T) of q (B, T, NH*HS) against kv (B, S, 2*NH*HS) packed [K | V] per row.
void cross_attention_forward(Backend& be, const CrossAttentionShape& s, const Tensor& q, const Tensor& kv,
                             const Tensor& out, const Tensor& lse, float* scratch);
// dq (B, T, NH*HS) and dkv (B, S, 2*NH*HS), overwritten, from dout and the forward's q, kv, out and lse.
void cross_attention_backward(Backend& be, const CrossAttentionShape& s, const Tensor& dout, const Tensor& q,
                              const Tensor& kv, const Tensor& out, const Tensor& lse, const Tensor& dq,
                              const Tensor& dkv, float* scratch);

}  // namespace ms::graph
