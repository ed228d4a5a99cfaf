// param_gather.h: the distributed optimizer's gather of the updated parameters in buckets that the next step's
// forward waits for one by one (Megatron's overlap_param_gather, parallel.overlap_param_gather; zero_stage 1 and 2).
//
// After AdamW has updated this rank's dp shard, start() issues, for every gradient bucket (grad_buckets.h's
// param_bucket_ranges: zero_stage 1's own [begin, end) ranges), one broadcast per dp shard the bucket intersects, from
// the shard's owner (owner_parts()), and returns without waiting. The buckets are issued from the flat buffer's start
// up, the order in which the forward reads them. need() is what a forward step calls before it reads parameters: it
// waits for the buckets holding them and, in mixed precision, casts those buckets' fp32 parameters into the 16-bit
// weights the ops read. With sharded master weights (distributed_optimizer.h: the model keeps no fp32 copy) the 16-bit
// weights themselves are gathered, half the bytes, and nothing is cast. finish() waits for every bucket still in
// flight: whatever reads the parameters outside the training step's forward (evaluation, checkpoints, generation, the
// next optimizer step) goes through it (PipelineModel's accessors, DistributedOptimizer::step, save_checkpoint).
//
// A gather moves bytes only, and the cast is elementwise, so the parameters and weights each forward reads are bit
// for bit those of one all-gather and one cast after the update. Every rank issues the same broadcasts in the same
// order (the buckets are the same on every dp rank), as collectives on one communicator must be.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "engine/backends/backend.h"
#include "engine/graph/program.h"
#include "engine/optim/grad_buckets.h"

namespace ms {

class ParamGather {
  public:
    // buckets: [begin, end) ranges covering [0, padded) in gradient-bucket order, from the end down
    // (param_bucket_ranges), over params (padded elements, shards of padded / dp.size()). params nullptr: the
    // weights given to set_weights() are gathered instead (sharded master weights).
    ParamGather(std::span<const std::pair<int64_t, int64_t>> buckets, int64_t padded, float* params, Communicator& dp,
                Backend& backend);
    ParamGather(const ParamGather&) = delete;
    ParamGather& operator=(const ParamGather&) = delete;

    // Mixed precision: the 16-bit weights (params' layout) each gathered bucket is cast into, or (params nullptr)
    // gathered.
    void set_weights(void* weights, DType dtype) {
        weights_ = weights;
        weights_dtype_ = dtype;
    }
    // After this rank's shard is updated: issues every bucket's gather, without waiting.
    void start();
    // Before a forward step reads these parameters (ranges of a chunk whose parameters start `base` elements into
    // the flat buffer): their buckets are gathered (and cast) once this returns.
    void need(std::span<const graph::GradRange> ranges, int64_t base);
    // Every bucket gathered (and cast).
    void finish();
    bool in_flight() const { return in_flight_ > 0; }

  private:
    struct Bucket {
        int64_t begin, end;
        std::vector<OwnerPart> parts;
        std::vector<Handle> handles;  // one broadcast per part
        bool pending = false;
    };
    void complete(Bucket& b);

    std::vector<Bucket> buckets_;  // in flat-buffer order: buckets_[0] begins at element 0
    int in_flight_ = 0;
    float* params_;
    Communicator& dp_;
    Backend& backend_;
    void* weights_ = nullptr;
    DType weights_dtype_ = DType::kF32;
};

}  // namespace ms
