// grad_placement.h: where each element of a stage's flat gradient range lives in memory.
//
// Gradients are addressed by their parameters' flat offsets (the parameter table's layout). With zero_stage 0 and 1
// that range is one buffer: one segment. With zero_stage 2 (engine/optim/sharded_grads.h) no buffer holds the whole
// range: each bucket's gradients live in one of a few rotating bucket slots, and the gradients a micro-batch's
// backward does not finish alone in a buffer of their own, so the range is many segments, each mapped to its own
// memory. A gradient tensor lies in one segment; asking for elements that straddle two is fatal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/core/tensor.h"

namespace ms::graph {

class GradPlacement {
  public:
    struct Segment {
        int64_t begin = 0, end = 0;  // flat elements
        std::byte* data = nullptr;   // where element `begin` lives; the rest follow contiguously
    };
    GradPlacement() = default;
    // One buffer of `elems` elements holding [0, elems).
    GradPlacement(void* flat, DType dtype, int64_t elems);
    // Segments in any order, not overlapping.
    GradPlacement(std::vector<Segment> segments, DType dtype);

    bool empty() const { return segments_.empty(); }
    DType dtype() const { return dtype_; }
    // Elements [begin, begin + n) as one tensor (dtype()): fatal unless they lie in one segment.
    Tensor tensor(int64_t begin, int64_t n) const;
    std::byte* at(int64_t begin, int64_t n) const { return static_cast<std::byte*>(tensor(begin, n).data); }
    // The same memory addressed from `base`: element i here is element base + i of this placement (a pipeline
    // chunk's view of its stage's range).
    GradPlacement from(int64_t base) const;
    const std::vector<Segment>& segments() const { return segments_; }  // sorted by begin

  private:
    std::vector<Segment> segments_;
    DType dtype_ = DType::kF32;
};

}  // namespace ms::graph
