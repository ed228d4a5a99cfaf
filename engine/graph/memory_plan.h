// memory_plan.h: where a chunk's planned tensors live, from the liveness of the final graph (memory/planner.h packs
// them: best fit, largest first).
//
// Steps: the forward ops, one hand-off step (the pipeline copies the output out and the output gradient in), the
// backward ops, and one end step (what the host reads after the backward). A tensor lives from the first op that
// touches it to the last; host-written inputs from step 0, outputs at least to the hand-off, the losses and a
// stage's input gradient to the end. Two groups, as a rank runs one call at a time but keeps several micro-batches'
// activations between their forward and backward (pipeline schedules):
//   kSlot     what a micro-batch keeps from its forward to its backward, and the host's inputs and outputs: one
//             block per activation slot;
//   kScratch  what lives inside one forward or one backward call: one block per chunk, shared by its slots.
// Tensors no op touches (a gradient a fusion made unnecessary) and parameters and gradients (flat buffers) get no
// memory here.
//
// Two levels, so that planning costs the same for 2 layers as for 2000 (the planner is quadratic in its buffers),
// made from a representative graph of the chunk with its first one or two layers (every layer makes the same
// tensors, named h.<l>.<what>; the chunk's own tensors either span all the layers' ops or lie outside them):
//   layer  the first layer's tensors. Its slot tensors are all live from its forward to its backward, so they sit
//          side by side, and every layer has its own copy ("layers": num_layers of them, living from the layers'
//          first forward op to their last backward op). Its scratch tensors live inside its forward or inside its
//          backward, which no other layer's overlap: one copy of each phase's ("layer_scratch.forward", living over
//          the layers' forward ops; "layer_scratch.backward", over their backward ops), planned over their lifetimes.
//   chunk  the chunk's own tensors and those blocks, planned over the representative graph's steps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/graph/graph.h"
#include "memory/planner.h"

namespace ms::graph {

enum class MemGroup : uint8_t { kNone, kSlot, kScratch };

// Offsets are multiples of kMemoryAlign bytes (16 floats: the parameters' alignment).
inline constexpr size_t kMemoryAlign = 64;

struct MemoryPlan {
    struct Place {
        MemGroup group = MemGroup::kNone;
        size_t offset = 0;  // bytes, in the slot block or the scratch block
    };
    // One kind of layer (all layers alike, or, with activation recomputation of a block of layers, the recomputed
    // ones and the rest): its tensors by their name without "h.<l>." ("h.*.qkv", "d.h.*.qkv").
    struct LayerKind {
        std::unordered_map<std::string, size_t> own;  // each layer's copy: the offset inside its share of "layers"
        // the one copy every layer of the kind uses in turn: in the scratch block (in the slot block with one_block)
        std::unordered_map<std::string, Place> shared;
        size_t slot_bytes = 0;
    };
    int first_layer = 0, num_layers = 0;
    int leading = 0;               // the chunk's first `leading` layers are of kinds[0], the rest of kinds[1]
    std::vector<LayerKind> kinds;  // 1 or 2
    // the layers' scratch tensors of every kind, planned together: [forward, backward]
    std::vector<BufferRequest> layer_scratch_requests[2];
    Plan layer_scratch[2];
    // chunk level: the chunk's own tensors by name, and the blocks "layers", "layer_scratch.{forward,backward}"
    std::unordered_map<std::string, Place> chunk_places;
    std::vector<BufferRequest> slot_requests, scratch_requests;
    Plan slot, scratch;
    size_t layers_offset = 0;  // in the slot block
    // Where the graph of a forward without the loss lives when it differs from this one's (the fused LM head has no
    // logits; a forward for the logits has): a plan of its own over the same blocks, which are sized for both.
    std::shared_ptr<const MemoryPlan> logits_only;

    size_t slot_bytes() const { return slot.total_bytes; }
    size_t scratch_bytes() const { return scratch.total_bytes; }
    // Where tensor t of g lives: g is a graph of this chunk from the same builder, for any batch up to the one
    // planned; {kNone} for parameters, gradients and tensors no op touches.
    Place place(const Graph& g, TensorId t) const;
    // Bytes of the slot the layers before the chunk's index-th hold.
    size_t layer_slot_offset(int index) const;
};

// representative: the chunk's graph with its first min(num_layers, 2) layers, from first_layer. leading: how many of
// the chunk's first layers are like the representative's first (kinds[0]); the others are like its second.
// one_block: everything in the slot block (scratch_bytes() 0): a forward that keeps nothing for a backward and may
// use its slot's whole block (the logits-only forward beside the fused LM head).
MemoryPlan plan_graph_memory(const Graph& representative, int first_layer, int num_layers, int leading,
                             bool one_block = false);

// "h.*.<what>" for a tensor of layer l named "[d.]h.<l>.<what>"; the name itself for the chunk's own tensors.
std::string layer_key(const TensorInfo& t);

}  // namespace ms::graph
