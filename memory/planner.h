// planner.h: static memory planning for a step's activations and workspaces.
//
// The step is a fixed sequence of ops, indexed 0, 1, 2, ... A buffer lives from the op that first writes it
// (first_use) to the last op that reads it (last_use), both inclusive: two buffers whose lifetimes share an op
// are live together and must not share memory -- except for an in-place pair: an op that reads input `i` for the
// last time (i.last_use == j.first_use) may write its output `j` over it (j.inplace_of = i). The planner packs
// the buffers into one block of total_bytes so that buffers live at the same time never overlap; buffers with
// disjoint lifetimes reuse each other's memory.
//
// Algorithm (greedy by size, as in TFLite's arena planner and Pisarchyk & Lee 2020): in-place chains are merged
// into one item (offset shared; size = the largest member; lifetime = the union); items are placed largest first,
// each into the smallest gap between already-placed items whose lifetimes intersect its own (best fit), or above
// them all. O(n^2 log n) for n buffers: milliseconds for the thousands of buffers of a 48-layer step.
//
// Errors: a malformed request (first_use > last_use, inplace_of out of range) or an illegal in-place request
// (the input is still read after the output is written, was dead before it, or two outputs claim the same
// input) throws ms::UserError naming both buffers.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace ms {

struct BufferRequest {
    std::string name;
    size_t bytes = 0;
    int first_use = 0;  // the op that first writes it
    int last_use = 0;   // the last op that reads it (>= first_use)
    // Index of an input buffer this one may overwrite; legal only if that input's last_use == this first_use.
    int inplace_of = -1;
};

struct Plan {
    std::vector<size_t> offsets;  // one per request, multiples of the alignment
    size_t total_bytes = 0;       // the block the plan needs: max over buffers of offset + round_up(bytes)
    size_t peak_live_bytes = 0;   // max over ops of the bytes live at that op (an in-place pair counts once)
};

Plan plan_buffers(const std::vector<BufferRequest>& requests, size_t alignment);

// The lower bound any placement must reserve: max over ops of the sum of live bytes, an in-place pair counted once
// at the op they share. Throws like plan_buffers() on malformed requests.
size_t peak_live_bytes(const std::vector<BufferRequest>& requests);

// A description of the first broken rule, naming the buffers, or nullopt: offsets aligned and inside total_bytes;
// in-place pairs at the same offset; no two buffers live at the same op overlapping in memory unless they are an
// in-place pair. O(n^2).
std::optional<std::string> find_plan_violation(const std::vector<BufferRequest>& requests, const Plan& plan,
                                               size_t alignment);
// find_plan_violation() as a fatal MS_CHECK.
void verify_plan(const std::vector<BufferRequest>& requests, const Plan& plan, size_t alignment);

}  // namespace ms
