// gpt_activations.h: the static memory plan of one Gpt chunk's activations and scratch (memory/planner.h).
//
// Every buffer forward() and backward() touch besides parameters and gradients is a BufferRequest whose lifetime
// comes from the op sequence of one micro-batch on the chunk: the forward's ops, the hand-off op (the output is
// copied into a pipeline send buffer, the output gradient received: parts without the head), the backward's ops
// and a last op for what is read after backward() returns (grad_input, copied out by the pipeline; losses()).
// The builder walks the ops in the order Gpt::forward and Gpt::backward run them, each op naming the buffers it
// reads or writes, so a buffer lives from the first op that touches it to the last.
//
// Two groups, planned separately:
//   kSlot     what a micro-batch keeps from its forward to its backward (saved activations, pipeline hand-offs,
//             tokens, targets, loss statistics): one block per activation slot. Inside a slot, buffers with
//             disjoint lifetimes share memory (dinp, written by the last backward op, reuses saved activations
//             that backward has consumed; the output reuses nothing, as all saved activations are live then).
//   kScratch  what lives inside one forward() or backward() call (c_proj outputs, the residual-stream and LayerNorm
//             input gradients, dloss, each layer's dfch / datty / dqkv, sequence-parallel staging): one block per
//             chunk, shared by all its slots -- a rank runs one call at a time and no call reads another's scratch.
//             Forward and backward scratch overlap; a layer's dfch overlaps its datty and dqkv.
// Scratch never shares memory with a slot: other slots' saved activations are live whenever a call runs.
//
// Row counts: N = max_batch * T rows; with sequence parallelism (tp > 1) the residual stream and LayerNorm
// statistics hold only this rank's N / tp rows (Megatron's activation saving); gathered inputs of the
// column-parallel layers and everything inside the tensor-parallel regions hold all N.
//
// Two levels, so that planning costs the same for 2 layers as for 2000 (memory/planner.h packs n buffers in O(n^2)):
//   layer  one layer's buffers, placed by plan_buffers() over their lifetimes in the op sequence. A layer's slot
//          buffers (its saved activations) are all live between its forward and its backward, so no two layers'
//          may share memory; its scratch buffers live inside its backward, which no other layer's overlaps.
//   chunk  the chunk's own buffers and two blocks standing for its layers, placed by plan_buffers() over the same op
//          sequence walked with one layer for all: "layers" (kSlot), layer l's saved activations at l * the layer
//          slot size, and "layer_scratch" (kScratch), one layer's scratch, reused by every layer's backward. A
//          block lives from the first to the last op of its layers; every chunk buffer either spans all the
//          layers' ops or lies outside them, so one walked layer gives the chunk buffers the same overlaps as all.
// plan_gpt_activation_layout() is that plan, its size independent of the layer count (what `plan` and the trainer's
// memory check read before anything per layer exists); plan_gpt_activations() adds every buffer of every layer with
// its offset and its exact lifetime from the op sequence walked over all layers (what Gpt binds, and tests verify
// against).
//
// The plan is a pure function of (shape, part, tp, max_batch, sequence_parallel, activation dtype): Gpt lays its
// buffers out from it and `mindspeed-train plan` (engine/train/plan.cpp) reports the same bytes from it.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model/gpt.h"
#include "memory/planner.h"

namespace ms {

// Every activation buffer of Gpt (engine/model/gpt.cpp, struct Gpt::Activations).
enum class GptBuf : uint8_t {
    // per layer, slot
    kLn1,
    kLn1Mean,
    kLn1Rstd,
    kQkv,
    kAtty,
    kLse,
    kRes2,
    kLn2,
    kLn2Mean,
    kLn2Rstd,
    kFch,
    kFchGelu,
    kRes3,
    // per layer, scratch
    kDfch,
    kDatty,
    kDqkv,
    // per chunk, slot
    kEncoded,
    kLnf,
    kLnfMean,
    kLnfRstd,
    kLogits,
    kLosses,
    kRowMax,
    kSumExp,
    kTokens,
    kTargets,
    kDout,
    kDinp,
    // per chunk, scratch
    kProjOut,
    kDres,
    kDln,
    kDloss,
    kSpLocal,
    kSpFull,
};
const char* gpt_buf_name(GptBuf buf);  // "ln1", "dfch", ...
// True for the buffers held in the activation dtype (activations and their gradients); false for the fp32
// statistics (LayerNorm mean/rstd, lse, losses, cross-entropy sums, dloss) and the int32 tokens and targets.
bool gpt_buf_is_activation(GptBuf buf);

enum class GptBufGroup : uint8_t { kSlot, kScratch };

struct GptBuffer {
    GptBuf id;
    int layer = -1;  // local layer index for per-layer buffers, else -1
    GptBufGroup group;
    int request = 0;  // index into the group's requests (and its Plan's offsets)
};

// The two-level plan (see the top of this file): a few dozen requests whatever the layer count.
struct GptActivationLayout {
    int layers = 0;                                       // the chunk's layers
    std::vector<BufferRequest> layer_slot_requests;       // one layer's saved activations ("h.0.qkv", ...)
    std::vector<BufferRequest> layer_scratch_requests;    // one layer's backward scratch ("h.0.dfch", ...)
    Plan layer_slot, layer_scratch;                       // offsets inside one layer's share of the blocks
    std::vector<BufferRequest> slot_requests;             // the chunk's slot buffers and the "layers" block
    std::vector<BufferRequest> scratch_requests;          // the chunk's scratch buffers and the "layer_scratch" block
    Plan slot, scratch;                                   // offsets inside one slot block / the scratch block
    int layers_request = -1, layer_scratch_request = -1;  // the blocks in slot_requests / scratch_requests; -1: none
    // For each GptBuf: its request, in the layer lists for per-layer buffers, else in the chunk lists; -1: not held.
    std::vector<int> request_of;

    int64_t slot_bytes() const { return static_cast<int64_t>(slot.total_bytes); }
    int64_t scratch_bytes() const { return static_cast<int64_t>(scratch.total_bytes); }
    // What a chunk with num_slots activation slots allocates.
    int64_t bytes(int num_slots) const { return num_slots * slot_bytes() + scratch_bytes(); }
    // Byte offset of `buf` (layer: the local layer index) inside its slot block or the scratch block.
    size_t offset(const GptBuffer& buf) const;
};

// Every buffer of a chunk, laid out by its GptActivationLayout.
struct GptActivationPlan {
    std::vector<GptBuffer> buffers;            // only those the chunk holds (e.g. no logits without the head)
    std::vector<BufferRequest> slot_requests;  // bytes and exact lifetimes; names like "h.3.qkv", "encoded"
    std::vector<BufferRequest> scratch_requests;
    Plan slot, scratch;  // byte offsets inside one slot block / the scratch block
    int num_ops = 0;     // length of the op sequence

    int64_t slot_bytes() const { return static_cast<int64_t>(slot.total_bytes); }
    int64_t scratch_bytes() const { return static_cast<int64_t>(scratch.total_bytes); }
    // What a chunk with num_slots activation slots allocates.
    int64_t bytes(int num_slots) const { return num_slots * slot_bytes() + scratch_bytes(); }
};

// Offsets are multiples of kGptActivationAlign bytes (16 floats: Gpt's parameter alignment).
inline constexpr size_t kGptActivationAlign = 64;

// act: the activation dtype (mixed_precision.dtype): fp32, bf16 or fp16. Cost independent of the layer count.
GptActivationLayout plan_gpt_activation_layout(const GptShape& shape, const GptPart& part, int tp_size, int max_batch,
                                               bool sequence_parallel, DType act = DType::kF32);
// The layout expanded to every buffer of every layer: linear in the layer count.
GptActivationPlan plan_gpt_activations(const GptShape& shape, const GptPart& part, int tp_size, int max_batch,
                                       bool sequence_parallel, DType act = DType::kF32);

}  // namespace ms
