// sharded_grads.h: zero_stage 2 -- the gradients sharded over data parallelism (DeepSpeed's ZeRO stage 2).
//
// No rank holds its stage's whole gradient. Each rank keeps
//   - its dp shard of the averaged gradients, [d * S, (d + 1) * S) of the flat range as with zero_stage 1 (S = padded
//     / dp), which the optimizer reads: shard(), accumulated over the step's micro-batches;
//   - K bucket slots. The gradients one backward op writes once (graph::grad_writes' `once`) are cut, chunk by chunk
//     and never across two, into buckets of at least bucket_elems elements (bucket_ranges: from the end down, the
//     order the backward finishes them), and bucket b lives in slot b mod K. Before the backward first writes a
//     bucket its slot is readied: the reduction of the bucket that used it last is waited for, this rank's part of
//     it added to the shard, and the slot zeroed. Once the backward has written the whole bucket, its sum of squares
//     is taken (the step boundary's NaN check) and each owner's part of it is reduced (averaged) into that owner,
//     without waiting. This happens in every micro-batch's backward.
//     K is the most buckets a chunk's backward has open at once (written in part), plus one: a bucket's reduction
//     then has the next bucket's backward to finish in. A chunk's backward is one action of the pipeline schedule,
//     so no bucket stays open between two, whatever the schedule or the virtual stages.
//   - the `kept` gradients in a buffer of their own, accumulated over the step and reduced into their owners in
//     finish(): those a micro-batch's backward does not make alone (written by several ops or by the forward: a tied
//     embedding's, the fused LM head's) and those reduced once per step (sequence parallelism's LayerNorm gradients
//     summed over tp, the tied embedding summed over the pipeline's first and last stage).
// Per rank that is K x (the longest bucket) + the kept gradients + S elements of the gradient dtype, where
// zero_stage 1 holds the whole padded range. What it costs: one reduction per bucket per micro-batch instead of per
// step. The shard is the micro-batches' dp averages added up, rather than the average of their sum: the same value
// up to rounding, so zero_stage 2 matches zero_stage 1 within a tolerance, not bit for bit.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "engine/backends/backend.h"
#include "engine/graph/grad_placement.h"
#include "engine/graph/program.h"
#include "engine/optim/grad_buckets.h"

namespace ms {

// One local chunk's gradients as its backward writes them, in the chunk's own offsets (gpt_grad_writes), and where
// the chunk starts in the stage's flat range.
struct ChunkGradWrites {
    int64_t base = 0;
    graph::GradWrites writes;
};

// Where a stage's gradients live under zero_stage 2 (flat offsets of the stage's range).
struct ShardedGradLayout {
    std::vector<std::pair<int64_t, int64_t>> buckets;  // [begin, end) of each bucket's gradients, in bucket order
    std::vector<std::vector<graph::GradRange>> bucket_grads;  // per bucket: its gradients (holes between are unused)
    int slots = 0;                                            // K
    int64_t slot_elems = 0;                                   // the longest bucket
    std::vector<graph::GradRange> kept;                       // sorted, adjacent ones merged
    int64_t kept_elems = 0;
    int64_t padded = 0, shard_elems = 0;  // the flat range's length and S
    // The gradient buffer: the slots, then the kept gradients back to back.
    int64_t buffer_elems() const { return int64_t{slots} * slot_elems + kept_elems; }
};
// extra_kept: gradients the pipeline completes once per step (the tied embedding summed over the embd group).
ShardedGradLayout sharded_grad_layout(std::span<const ChunkGradWrites> chunks,
                                      std::span<const graph::GradRange> extra_kept, int64_t padded,
                                      int64_t bucket_elems, int dp);
// The layout's placement over `buffer` (buffer_elems() elements of dtype).
graph::GradPlacement sharded_grad_placement(const ShardedGradLayout& layout, void* buffer, DType dtype);

class ShardedGrads {
  public:
    // buffer: layout.buffer_elems() elements, shard: layout.shard_elems (both dtype); dp: the data-parallel group.
    ShardedGrads(ShardedGradLayout layout, void* buffer, void* shard, DType dtype, Communicator& dp, Backend& backend);
    ShardedGrads(const ShardedGrads&) = delete;
    ShardedGrads& operator=(const ShardedGrads&) = delete;

    const ShardedGradLayout& layout() const { return layout_; }
    const graph::GradPlacement& placement() const { return placement_; }
    Tensor shard() const { return shard_; }  // this rank's S averaged gradients, after finish()
    Tensor buffer() const { return buffer_; }

    // Before the step's first backward: zeroes the shard and the kept gradients.
    void begin_step();
    // Before a backward step first writes these gradients (a chunk's, which starts `base` into the flat range).
    void writing(std::span<const graph::GradRange> ranges, int64_t base);
    // After the backward step that last writes these.
    void final(std::span<const graph::GradRange> ranges, int64_t base);
    // After the last micro-batch and the per-step reductions of the kept gradients: reduces those, waits for every
    // reduction and adds this rank's parts into the shard.
    void finish();
    // The sum of squares of every gradient before its reduction, over the step's micro-batches (finish() done).
    double squares_before_reduction() const { return squares_; }

  private:
    struct Bucket {
        int64_t begin, end;
        int slot;
        int64_t elems;        // of its gradients
        int64_t written = 0;  // this micro-batch
        bool open = false;
        std::vector<OwnerPart> parts;
        std::vector<Handle> handles;
    };
    int bucket_of(const graph::GradRange& r) const;  // fatal for a range that is not one of the buckets' gradients
    void settle(int slot);  // wait for its last bucket's reduction and add this rank's part; fatal if still written
    void add_owned(const Tensor& from, const OwnerPart& part);
    Tensor slot_tensor(const Bucket& k) const;  // the bucket's [begin, end) in its slot (holes included)

    ShardedGradLayout layout_;
    graph::GradPlacement placement_;
    Tensor buffer_, shard_;
    Communicator& dp_;
    Backend& backend_;
    int64_t shard_begin_;
    std::vector<Bucket> buckets_;
    std::vector<std::pair<graph::GradRange, int>> grad_bucket_;  // sorted by begin
    std::vector<int> occupant_;  // per slot: the bucket being written in it or reduced from it (until settled), or -1
    std::vector<OwnerPart> kept_parts_;  // the kept gradients cut at the shard boundaries
    std::vector<Handle> kept_handles_;
    double squares_ = 0;
};

}  // namespace ms
