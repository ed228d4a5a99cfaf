// distributed_optimizer.h: the data-parallel gradient reduction, global gradient norm, clipping and AdamW step
// over the flat parameter/gradient buffers, for zero_stage 0, 1 and 2 (docs/design.md §5).
//
// Range map (the same on every rank of a dp group, since every DP replica has the same parameter table):
//   flat buffer      [0, padded)      padded = ceil(flat / (dp * 16)) * dp * 16; the tail is zeros
//   dp shard of d    [d * S, (d+1) * S)  with S = padded / dp
//   param p          [p.offset, p.offset + p.numel) -- a shard holds the parts of params intersecting its range
// zero_stage 0: all-reduce (avg) of the whole flat gradient buffer; AdamW on every element, on every DP rank.
// zero_stage 1: reduce-scatter (avg) into this rank's shard; AdamW with exp_avg / exp_avg_sq (fp32, the master
//               weights are the fp32 parameters themselves on the CPU) for the shard only; all-gather the params.
// zero_stage 2: zero_stage 1's state and update, but the gradients it reads are only the shard, which the
//               pipeline's backward reduced bucket by bucket (sharded_grads.h): `grads` is that shard.
// Both compute the gradient norm the same way: each DP rank sums the squares of its shard of the reduced gradients
// (parameters replicated across TP ranks only on tp rank 0), and the partial sums are added over dp and over the
// model-parallel group. With more than one rank the sum is exact, so it does not depend on where the shards, stages
// or tp ranks cut the parameters: every element's square is rounded once, to a fixed point 2^-62 of the largest
// square of the step (whose exponent the ranks agree on first), and the fixed-point integers are added in 128 bits,
// over the ranks as 16-bit limbs of int32 all-reduces (exact_grad_squares). So zero_stage 0 and 1, any pipeline
// layout and the overlapped buckets give the same norm for the same gradients, bit for bit; the rounding is 2^-62 of
// the largest square per element, far below the fp32 the norm is rounded to. One rank keeps the sum in double
// (sum_squares) that its local_grad_squares() took already. The exact sum reads the gradients on the host, so on a
// GPU plain AdamW keeps the device's sums of squares, added in fp32 over dp and mp.
//
// Sharded master weights (zero_stage 1 in bf16 / fp16: shards_master_weights(); Megatron's distributed optimizer):
// the fp32 master weights exist only as this rank's shard, held here beside exp_avg and exp_avg_sq, and the model
// keeps no fp32 copy: per parameter 2 (16-bit weights) + 4 (fp32 gradients) + 12 / dp bytes, against 2 + 4 + 4 +
// 8 / dp when every rank keeps whole masters. AdamW updates the shard and writes its 16-bit weights in the same
// pass; the 16-bit weights are all-gathered, half the bytes of gathering fp32 parameters. The whole fp32 parameters
// exist only where a caller needs them, in a flat buffer it lends (the model's gradient buffer between steps):
// take_loaded_state() takes the shard from it after an init or a checkpoint load, gather_masters() fills it for a save.
// The values are bit for bit those of whole masters: the same AdamW on the same fp32 shard, the same rounding.
//
// optimizer.type onebit_adam (1-bit Adam, Tang et al. 2021; DeepSpeed's OnebitAdam): AdamW, as above, for the first
// optimizer.freeze_step steps; then the variance is frozen and no gradient is reduced. Each rank updates the momentum
// from its own gradient, m = b1 m + (1 - b1) g, over the whole buffer, and the momenta are averaged over dp by
// onebit.h's compressed all-reduce (1 bit per element, a scale per chunk, worker and server error feedback), after
// which m is the same on every dp rank. The update is AdamW's with that m and the frozen v (its bias correction
// frozen at freeze_step): p -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^freeze_step)) + eps) + wd p), on every element
// (zero_stage 0) or on this rank's shard followed by the gather of the weights (zero_stage 1, which composes: the
// compressed all-reduce's first phase is a reduce-scatter, and every rank keeps a whole m, which phase 2 gives it,
// besides its shards of v and the masters). With no reduced gradient there is no global norm: each rank clips its
// own gradient by its own norm (summed over tp and pp), and the norm reported is the root mean square of the dp
// ranks' norms (DeepSpeed clips the local gradients too). The momentum update and the frozen-variance update run on
// the host (arena memory is host-visible), as the compression does.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "engine/backends/backend.h"
#include "engine/config/config.h"
#include "engine/model/gpt.h"
#include "engine/optim/grad_buckets.h"
#include "engine/optim/onebit.h"
#include "engine/optim/param_gather.h"
#include "engine/optim/sharded_grads.h"
#include "memory/memory_block.h"

namespace ms {

// The flat buffer length for `flat` elements on `dp` data-parallel ranks.
int64_t padded_flat_size(int64_t flat, int dp);

// Whether the optimizer holds the fp32 master weights as dp shards, the model none (see the top of this file): the
// one place that decides it, for the optimizer, the model's allocations and the memory plan.
constexpr bool shards_master_weights(int zero_stage, DType weights_dtype) {
    return zero_stage >= 1 && weights_dtype != DType::kF32;
}

// The optimizer's arena allocations, in bytes, in the order it makes them: the master shard (sharded masters),
// exp_avg (whole with onebit_adam, which needs every rank's momentum), exp_avg_sq, and onebit_adam's buffers
// (onebit.h). table is read only for onebit_adam (its chunks); flat: the table's flat length, unpadded. The memory
// plan lists the same.
struct OptimizerBlocks {
    int64_t master = 0, exp_avg = 0, exp_avg_sq = 0;
    std::vector<size_t> onebit;
    int64_t onebit_bytes() const;
    int64_t total() const { return master + exp_avg + exp_avg_sq + onebit_bytes(); }
};
OptimizerBlocks optimizer_blocks(const std::vector<ParamInfo>& table, int64_t flat, const OptimizerConfig& cfg,
                                 int zero_stage, DType weights_dtype, int dp);

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
    // params/grads: flat buffers of at least padded_flat_size(flat, dp.size()) elements; with sharded master weights
    // params is the lent buffer that holds the whole fp32 parameters now (take_loaded_state() is called here) and when
    // a save asks for them (gather_masters()). mp: the model-parallel group (tp x pp ranks with the same dp rank) over
    // which the norm's partial sums are reduced; tp_rank decides who counts TP-replicated parameters. arena: where the
    // master shard (sharded masters only), exp_avg and exp_avg_sq (kOptimizer) come from, allocated in that order;
    // nullptr: HostBuffers. weights: mixed precision's 16-bit weights (flat, the params' layout, dtype bf16 / fp16)
    // that every step refreshes from the updated fp32 master weights: fused into AdamW, then for zero_stage 1
    // all-gathered (sharded masters) or cast after the fp32 all-gather (zero_stage 1 in fp32 has no 16-bit weights).
    // grads_dtype: the gradients' (fp32, or the weights' 16-bit dtype: mixed_precision.grad_reduce_in_fp32 false),
    // in which they are reduced over dp and read by the norm and AdamW.
    DistributedOptimizer(const std::vector<ParamInfo>& table, int64_t flat, float* params, void* grads,
                         const OptimizerConfig& cfg, int zero_stage, Backend& backend, Communicator& dp,
                         Communicator& mp, int tp_rank, Arena* arena = nullptr, void* weights = nullptr,
                         DType weights_dtype = DType::kF32, DType grads_dtype = DType::kF32);

    bool sharded_masters() const { return shards_master_weights(zero_stage_, weights_dtype_); }
    // After the whole parameters were written into the lent buffer and this rank's state into exp_avg() and
    // exp_avg_sq() (an init, a checkpoint load): sharded masters take their shard of the parameters, and onebit_adam
    // gathers the whole momentum again before it next compresses (zero_stage 1 loads only this rank's shard).
    void take_loaded_state();
    // Sharded masters: the whole fp32 master weights gathered into the lent buffer (collective over dp), for a save.
    // Otherwise nothing: the buffer holds them already.
    void gather_masters();
    // Reduce the gradients over dp, compute the global norm, clip to clip_grad (0: off) and step with lr.
    // unscale multiplies the gradients first (1 / the loss scale with fp16): the norm reported and clipped is the
    // unscaled one. A non-finite norm (an fp16 overflow, a NaN) skips the update: stepped = false.
    // local: this step's local_grad_squares(). On one rank (dp and mp) the norm takes its counted sum instead of
    // reading every gradient a second time (bit-identical: the same segments summed in the same order).
    OptimizerStepResult step(float lr, float clip_grad, float unscale = 1.0f, const GradSquares* local = nullptr);
    // The sums of squares of this rank's gradients before the reduction. With one data-parallel rank the norm's
    // segments cover every gradient and are summed one by one; with more, the whole buffer in one op, or with
    // overlapped buckets what they took before reducing.
    GradSquares local_grad_squares() const;
    // parallel.overlap_grad_reduce (dp > 1): the reduction moves into buckets that the backward starts
    // (grad_buckets.h: all-reduced for zero_stage 0, reduced into the shards' owners for 1) and step() only checks
    // they are done. Returns them for the pipeline to report to.
    GradBuckets& overlap_grad_reduce(int64_t bucket_elems, const std::vector<ParamInfo>& table);
    // zero_stage 2: the gradients were reduced by the pipeline's sharded gradients, whose squares before the
    // reduction local_grad_squares() reports. Not owned.
    void use_sharded_grads(const ShardedGrads* grads) { sharded_ = grads; }
    // parallel.overlap_param_gather (zero_stage 1 after overlap_grad_reduce, or 2), in the buckets of bucket_elems
    // that GradBuckets cuts from `table` (param_bucket_ranges): step() leaves the gather of the
    // updated parameters in flight, in the same buckets (param_gather.h). Returns it for the pipeline's forward.
    ParamGather& overlap_param_gather(int64_t bucket_elems, const std::vector<ParamInfo>& table);
    // Completes the gather of the last step's parameters: before anything other than the model's programs reads
    // them (a checkpoint). A no-op without overlap_param_gather.
    void finish_param_gather() {
        if (gather_) gather_->finish();
    }
    int64_t shard_begin() const { return shard_begin_; }
    int64_t shard_size() const { return shard_size_; }
    int64_t steps_taken() const { return step_; }
    int zero_stage() const { return zero_stage_; }
    // Optimizer bytes held by this rank (optimizer_blocks): masters, moments, onebit_adam's buffers.
    int64_t state_bytes() const { return blocks_.total(); }
    // onebit_adam's compressed all-reduce (nullptr for adamw), and whether the next step compresses.
    const OneBitAllReduce* onebit() const { return onebit_.get(); }
    bool compressing() const { return onebit_ != nullptr && step_ >= cfg_.freeze_step; }
    // The AdamW state this rank holds, for checkpoints: exp_avg()[k] and exp_avg_sq()[k] belong to flat element
    // state_begin() + k, k < state_size() (the dp shard for zero_stage 1, the whole padded buffer for 0).
    int64_t state_begin() const { return state_base_; }
    int64_t state_size() const { return static_cast<int64_t>(state_len_); }
    float* exp_avg() { return m_.as<float>() + (state_base_ - m_base_); }
    float* exp_avg_sq() { return v_.as<float>(); }
    // On resume: the step count that the next step's bias correction continues from.
    void set_steps_taken(int64_t steps) { step_ = steps; }

  private:
    struct Segment {  // a parameter's part of the range this rank updates
        int64_t begin, end;
        bool weight_decay, count_in_norm;
    };
    // Merges neighbouring segments (one's end the next's begin) for which same(a, b) holds; the first's flags stay.
    template <class Same>
    static void coalesce(std::vector<Segment>& segments, Same same);
    // onebit_adam after its warm-up (see the top of this file).
    OptimizerStepResult compressed_step(float lr, float clip_grad, float unscale);
    // The sum of squares of the counted gradients of every rank's norm segments (collective over dp and mp), exact
    // up to the rounding of each square to the fixed point (the top of this file): the same bits for every layout.
    double exact_grad_squares();
    // The sum of squares of this rank's own gradients over tp and pp (collective over mp), the same bits for every
    // pipeline layout of the same model.
    double own_grad_squares();
    // The 16-bit weights of AdamW's segment s, when the update writes them (zero_stage 0, sharded masters).
    Tensor weights_copy(const Segment& s) const;
    // After the update of this rank's range: zero_stage 1 gathers the parameters or weights.
    void gather_updated();

    int64_t padded_;
    float* params_;
    Tensor grads_;  // (padded_) flat, or zero_stage 2's shard
    // The reduced gradients of flat elements [begin, begin + n) of this rank's range.
    Tensor grads(int64_t begin, int64_t n) const {
        return zero_stage_ == 2 ? grads_.slice(begin - shard_begin_, n) : grads_.slice(begin, n);
    }
    OptimizerConfig cfg_;
    int zero_stage_;
    Backend& backend_;
    // The norm over several ranks is exact_grad_squares() where its host passes are cheap: the gradients are host
    // memory (the backend has no device memory: the CPU, the deferred checking mode, the CUDA emulation), or
    // onebit_adam works on the host anyway. On a GPU the ranks' fp32 partial sums are added, which depends on the
    // layout in the last bits.
    bool exact_norm_;
    std::unique_ptr<GradBuckets> buckets_;   // overlap_grad_reduce, else null
    const ShardedGrads* sharded_ = nullptr;  // zero_stage 2
    std::unique_ptr<ParamGather> gather_;    // overlap_param_gather, else null
    Communicator& dp_;
    Communicator& mp_;
    int64_t shard_begin_ = 0, shard_size_ = 0;
    std::vector<Segment> norm_segments_;    // this rank's shard (both stages)
    std::vector<Segment> update_segments_;  // shard (zero 1) or the whole buffer (zero 0)
    std::vector<Segment> local_segments_;   // the whole buffer, for onebit_adam's momentum update
    // onebit_adam's own-gradient norm: each counted parameter alone (own_grad_squares), and room for the most any mp
    // rank holds, per rank, in the gather of their sums of squares
    std::vector<Segment> norm_params_;
    size_t norm_slots_ = 0;
    std::vector<double> own_squares_;  // (norm_slots_)
    std::vector<double> mp_squares_;   // (mp size * norm_slots_)
    size_t state_len_ = 0;
    int64_t state_base_ = 0;  // flat index of exp_avg[0]
    void* weights_;           // the 16-bit weights, or nullptr
    DType weights_dtype_;     // their dtype (kF32 without them)
    OptimizerBlocks blocks_;
    MemoryBlock master_;  // (state_len) sharded masters: this rank's fp32 master weights, else empty
    MemoryBlock m_, v_;   // exp_avg (from flat element m_base_), exp_avg_sq (state_len, from state_base_)
    int64_t m_base_ = 0;  // flat index of m_[0]: state_base_, or 0 when m_ is whole (onebit_adam)
    std::unique_ptr<OneBitAllReduce> onebit_;
    bool m_whole_ = true;  // onebit_adam: m_ holds the whole momentum (false after a zero_stage 1 warm-up or load)
    int64_t step_ = 0;
};

}  // namespace ms
