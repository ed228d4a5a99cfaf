// ring_attention.h: attention over a sequence split across a context group (context parallelism,
// engine/parallel/context_split.h), as a ring that passes key/value blocks from rank to rank; causal, or
// bidirectional (RingAttentionShape::causal false: every query row sees every key of its sequence, on every block,
// which needs no chunk pairing). On a group of one rank it is attention through the block ops: the image tower's
// bidirectional attention (engine/clip/).
//
// Rank i of cp holds chunks i and 2cp-1-i of each sequence (T = 2c local rows, c per chunk), and with them the
// queries, keys and values of those rows. At ring step s it holds the key/value block of rank j = (i - s) mod cp
// and attends to the part of it its queries may see:
//   s = 0 (j = i):  causal attention over its own 2c rows (its chunks are in sequence order);
//   j < i:          all 2c query rows see the block's first chunk (chunk j, earlier than both of i's), not its
//                   second (2cp-1-j, later than both);
//   j > i:          only the second query chunk (2cp-1-i) sees the block, and it sees both of its chunks.
// Each block's result is merged into an fp32 running output by its log-sum-exp (Backend::attention_block_forward);
// the output is rounded to the activation dtype once at the end, and the final log-sum-exp is kept for the
// backward. Every rank does the same work per step (the load balance of the chunk pairing).
//
// The blocks travel as packed [K | V] rows (copy_columns from qkv). While a block is computed the next one is
// already on its way: step s posts the exchange (send to rank i+1, receive from i-1) of the block in hand before
// computing with it, and waits for it after. The backward walks the ring the same way with the final statistics
// (Backend::attention_block_backward): dQ accumulates here in fp32, and each block's fp32 [dK | dV] accumulator
// travels with it, each rank adding its part, so that after cp steps (the last exchange carrying only the
// accumulators) every rank has the gradients of its own keys and values. A step computes its part of the block's
// dK/dV into a buffer of its own while the previous step's accumulator exchange is in flight, then adds it into the
// block's accumulator once that has arrived and sends it on: the accumulators' exchange runs behind the next block's
// compute too (all but the last).
//
// Scratch: the op's memory besides its inputs and outputs, one fp32 tensor of ring_*_scratch_elems() planned
// like any activation that lives for one op: two key/value blocks and the fp32 output (forward); two key/value
// blocks, two travelling fp32 [dK | dV] accumulators, a step's own part and the fp32 dQ (backward).
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "engine/backends/backend.h"

namespace ms::graph {

struct RingAttentionShape {
    int64_t B = 1, T = 1;     // sequences, local rows of each (T = 2c)
    int64_t NH = 1, NKV = 1;  // query and key/value heads held here
    int64_t HS = 1;           // head size
    DType act = DType::kF32;  // qkv, out and the travelling key/value blocks
    bool causal = true;       // false: every query row sees every key row of its sequence, on every block
};
int64_t ring_forward_scratch_elems(const RingAttentionShape& s);
int64_t ring_backward_scratch_elems(const RingAttentionShape& s);

// out (B, T, NH*HS) and lse (B, NH, T) of qkv (B, T, (NH + 2*NKV)*HS), for this rank of `cp` (any size; one rank is
// causal attention through the block ops).
void ring_attention_forward(Backend& be, Communicator& cp, const RingAttentionShape& s, const Tensor& qkv,
                            const Tensor& out, const Tensor& lse, float* scratch);
// dqkv (B, T, (NH + 2*NKV)*HS), overwritten, from dout and the forward's qkv, out and lse.
void ring_attention_backward(Backend& be, Communicator& cp, const RingAttentionShape& s, const Tensor& dout,
                             const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dqkv,
                             float* scratch);

}  // namespace ms::graph
