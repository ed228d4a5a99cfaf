// distributed_optimizer.h: the data-parallel gradient reduction, global gradient norm, clipping and AdamW step
// over the flat parameter/gradient buffers, for zero_stage 0 and 1 (docs/design.md §5).
//
// Range map (the same on every rank of a dp group, since every DP replica has the same parameter table):
//   flat buffer      [0, padded)      padded = ceil(flat / (dp * 16)) * dp * 16; the tail is zeros
//   dp shard of d    [d * S, (d+1) * S)  with S = padded / dp
//   param p          [p.offset, p.offset + p.numel) -- a shard holds the parts of params intersecting its range
// zero_stage 0: all-reduce (avg) of the whole flat gradient buffer; AdamW on every element, on every DP rank.
// zero_stage 1: reduce-scatter (avg) into this rank's shard; AdamW with exp_avg / exp_avg_sq (fp32, the master
//               weights are the fp32 parameters themselves on the CPU) for the shard only; all-gather the params.
// Both compute the gradient norm the same way, so they give bit-identical results for dp = 2: each DP rank sums
// the squares of its shard (parameters replicated across TP ranks only on tp rank 0), then the partial sums are
// all-reduced over dp and over the model-parallel group.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "engine/backends/backend.h"
#include "engine/config/config.h"
#include "engine/model/gpt.h"
#include "engine/optim/grad_buckets.h"
#include "engine/optim/param_gather.h"
#include "memory/memory_block.h"

namespace ms {

// The flat buffer length for `flat` elements on `dp` data-parallel ranks.
int64_t padded_flat_size(int64_t flat, int dp);

// Sums of squares of this rank's gradients as the backward left them, before any reduction (local_grad_squares).
struct GradSquares {
    double all = 0;      // over every gradient: the step boundary's NaN/Inf check
    double counted = 0;  // over the norm's segments (with one data-parallel rank); 0 with more
};

struct OptimizerStepResult {
    double grad_norm = 0;  // global, before clipping
    bool stepped = false;  // false when the norm was not finite (the step is skipped)
};

class DistributedOptimizer {
  public:
    // params/grads: flat buffers of at least padded_flat_size(flat, dp.size()) elements.
    // mp: the model-parallel group (tp x pp ranks with the same dp rank) over which the norm's partial sums are
    // reduced; tp_rank decides who counts TP-replicated parameters. arena: where exp_avg, exp_avg_sq (kOptimizer)
    // and the zero_stage 1 reduce-scatter buffer (kComm) come from, allocated in that order; nullptr: HostBuffers.
    DistributedOptimizer(const std::vector<ParamInfo>& table, int64_t flat, float* params, float* grads,
                         const OptimizerConfig& cfg, int zero_stage, Backend& backend, Communicator& dp,
                         Communicator& mp, int tp_rank, Arena* arena = nullptr);

    // Mixed precision: the 16-bit weights (flat, the params' layout, dtype bf16 / fp16) that every step refreshes
    // from the updated fp32 params (the master weights): fused into AdamW for zero_stage 0, a cast after the
    // all-gather for zero_stage 1.
    void set_weights(void* weights, DType dtype) {
        weights_ = weights;
        weights_dtype_ = dtype;
        if (gather_) gather_->set_weights(weights, dtype);
    }
    // Reduce the gradients over dp, compute the global norm, clip to clip_grad (0: off) and step with lr.
    // unscale multiplies the gradients first (1 / the loss scale with fp16): the norm reported and clipped is the
    // unscaled one. A non-finite norm (an fp16 overflow, a NaN) skips the update: stepped = false.
    // local: this step's local_grad_squares(). With one data-parallel rank the reduction changes nothing, so the
    // norm takes its counted sum instead of reading every gradient a second time (bit-identical: the same segments
    // summed in the same order).
    OptimizerStepResult step(float lr, float clip_grad, float unscale = 1.0f, const GradSquares* local = nullptr);
    // The sums of squares of this rank's gradients before the reduction. With one data-parallel rank the norm's
    // segments cover every gradient and are summed one by one; with more, the whole buffer in one op, or with
    // overlapped buckets what they took before reducing.
    GradSquares local_grad_squares() const;
    // parallel.overlap_grad_reduce (dp > 1): the reduction moves into buckets that the backward starts
    // (grad_buckets.h: all-reduced for zero_stage 0, reduced into the shards' owners for 1) and step() only checks
    // they are done. Returns them for the pipeline to report to.
    GradBuckets& overlap_grad_reduce(int64_t bucket_elems, const std::vector<ParamInfo>& table);
    // parallel.overlap_param_gather (zero_stage 1, after overlap_grad_reduce): step() leaves the gather of the
    // updated parameters in flight, in the same buckets (param_gather.h). Returns it for the pipeline's forward.
    ParamGather& overlap_param_gather();
    // Completes the gather of the last step's parameters: before anything other than the model's programs reads
    // them (a checkpoint). A no-op without overlap_param_gather.
    void finish_param_gather() {
        if (gather_) gather_->finish();
    }
    int64_t shard_begin() const { return shard_begin_; }
    int64_t shard_size() const { return shard_size_; }
    int64_t steps_taken() const { return step_; }
    int zero_stage() const { return zero_stage_; }
    // The AdamW state this rank holds, for checkpoints: exp_avg()[k] and exp_avg_sq()[k] belong to flat element
    // state_begin() + k, k < state_size() (the dp shard for zero_stage 1, the whole padded buffer for 0).
    int64_t state_begin() const { return state_base_; }
    int64_t state_size() const { return static_cast<int64_t>(state_len_); }
    float* exp_avg() { return m_.as<float>(); }
    float* exp_avg_sq() { return v_.as<float>(); }
    // On resume: the step count that the next step's bias correction continues from.
    void set_steps_taken(int64_t steps) { step_ = steps; }
    // Optimizer state bytes held by this rank (exp_avg + exp_avg_sq).
    int64_t state_bytes() const { return 2 * static_cast<int64_t>(state_len_) * 4; }

  private:
    struct Segment {  // a parameter's part of the range this rank updates
        int64_t begin, end;
        bool weight_decay, count_in_norm;
    };
    // Merges neighbouring segments (one's end the next's begin) for which same(a, b) holds; the first's flags stay.
    template <class Same>
    static void coalesce(std::vector<Segment>& segments, Same same);

    int64_t padded_;
    float* params_;
    float* grads_;
    OptimizerConfig cfg_;
    int zero_stage_;
    Backend& backend_;
    std::unique_ptr<GradBuckets> buckets_;  // overlap_grad_reduce, else null
    std::unique_ptr<ParamGather> gather_;   // overlap_param_gather, else null
    Communicator& dp_;
    Communicator& mp_;
    int64_t shard_begin_ = 0, shard_size_ = 0;
    std::vector<Segment> norm_segments_;    // this rank's shard (both stages)
    std::vector<Segment> update_segments_;  // shard (zero 1) or the whole buffer (zero 0)
    size_t state_len_ = 0;
    int64_t state_base_ = 0;   // flat index of exp_avg[0]
    MemoryBlock m_, v_;        // (state_len) exp_avg, exp_avg_sq
    void* weights_ = nullptr;  // set_weights()
    DType weights_dtype_ = DType::kF32;
    int64_t step_ = 0;
};

}  // namespace ms
