#include "engine/optim/distributed_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "engine/optim/adamw.h"

namespace ms {
namespace {
constexpr int64_t kShardAlign = 16;  // shards start on 64-byte boundaries
}  // namespace

int64_t padded_flat_size(int64_t flat, int dp) {
    const int64_t unit = kShardAlign * dp;
    return (flat + unit - 1) / unit * unit;
}

template <class Same>
void DistributedOptimizer::coalesce(std::vector<Segment>& segments, Same same) {
    std::vector<Segment> merged;
    for (const Segment& s : segments) {
        if (!merged.empty() && merged.back().end == s.begin && same(merged.back(), s)) {
            merged.back().end = s.end;
        } else {
            merged.push_back(s);
        }
    }
    segments = std::move(merged);
}

DistributedOptimizer::DistributedOptimizer(const std::vector<ParamInfo>& table, int64_t flat, float* params,
                                           float* grads, const OptimizerConfig& cfg, int zero_stage, Backend& backend,
                                           Communicator& dp, Communicator& mp, int tp_rank, Arena* arena)
    : padded_(padded_flat_size(flat, dp.size())),
      params_(params),
      grads_(grads),
      cfg_(cfg),
      zero_stage_(zero_stage),
      backend_(backend),
      dp_(dp),
      mp_(mp) {
    MS_CHECK(zero_stage == 0 || zero_stage == 1, "zero_stage {} (0 or 1)", zero_stage);
    shard_size_ = padded_ / dp.size();
    shard_begin_ = dp.rank() * shard_size_;
    const int64_t lo = shard_begin_, hi = shard_begin_ + shard_size_;
    for (const ParamInfo& p : table) {
        const int64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
        const bool counted = (tp_rank == 0 || !p.tp_duplicate()) && !p.pp_duplicate;
        if (b < e) norm_segments_.push_back({b, e, p.weight_decay, counted});
        if (zero_stage == 0) update_segments_.push_back({p.offset, p.offset + p.numel, p.weight_decay, true});
    }
    if (zero_stage == 1) update_segments_ = norm_segments_;
    // One op per run of neighbouring parameters that share what the op needs, not one per parameter: on a GPU each
    // sum_squares waits for its result (a GPT-2 124M step had ~150 of those waits), and AdamW is elementwise, so the
    // merged updates are bit-identical. The norm needs only count_in_norm (the sum of squares of a merged run is the
    // same sum, grouped differently in double), the update only weight_decay.
    coalesce(norm_segments_, [](const Segment& a, const Segment& b) { return a.count_in_norm == b.count_in_norm; });
    coalesce(update_segments_, [](const Segment& a, const Segment& b) { return a.weight_decay == b.weight_decay; });
    state_base_ = zero_stage == 1 ? shard_begin_ : 0;
    state_len_ = static_cast<size_t>(zero_stage == 1 ? shard_size_ : padded_);
    m_ = MemoryBlock(state_len_ * sizeof(float), arena, MemCategory::kOptimizer, "exp_avg");
    v_ = MemoryBlock(state_len_ * sizeof(float), arena, MemCategory::kOptimizer, "exp_avg_sq");
}

GradBuckets& DistributedOptimizer::overlap_grad_reduce(int64_t bucket_elems, const std::vector<ParamInfo>& table) {
    MS_CHECK(dp_.size() > 1, "overlapped gradient buckets need dp > 1");
    const GradReduction reduction = zero_stage_ == 0 ? GradReduction::kAllReduce : GradReduction::kToShardOwners;
    buckets_ = std::make_unique<GradBuckets>(table, padded_, bucket_elems, grads_, dp_, backend_, reduction);
    return *buckets_;
}

ParamGather& DistributedOptimizer::overlap_param_gather() {
    MS_CHECK(zero_stage_ == 1 && buckets_, "overlapped parameter gathers need zero_stage 1 and gradient buckets");
    gather_ = std::make_unique<ParamGather>(*buckets_, padded_, params_, dp_, backend_);
    gather_->set_weights(weights_, weights_dtype_);
    return *gather_;
}

GradSquares DistributedOptimizer::local_grad_squares() const {
    GradSquares r;
    if (buckets_) {
        r.all = buckets_->squares_before_reduction();
        return r;
    }
    if (dp_.size() > 1) {
        r.all = backend_.sum_squares(Tensor::f32(grads_, {padded_}));
        return r;
    }
    double uncounted = 0;
    for (const Segment& s : norm_segments_) {
        const double sq = backend_.sum_squares(Tensor::f32(grads_ + s.begin, {s.end - s.begin}));
        (s.count_in_norm ? r.counted : uncounted) += sq;
    }
    r.all = r.counted + uncounted;
    return r;
}

OptimizerStepResult DistributedOptimizer::step(float lr, float clip_grad, float unscale, const GradSquares* local) {
    OptimizerStepResult r;
    finish_param_gather();  // AdamW writes this rank's shard, which the last step's gathers send from
    const std::span<float> all(grads_, static_cast<size_t>(padded_));
    const std::span<float> shard(grads_ + shard_begin_, static_cast<size_t>(shard_size_));
    if (buckets_) {
        // the pipeline's backward and finish() did it
    } else if (zero_stage_ == 0) {
        dp_.all_reduce(all, ReduceOp::kAvg, Priority::kLow).wait();
    } else {
        // in place: this rank's shard is its own block of the gradient buffer (mpi_communicator.h)
        dp_.reduce_scatter(std::span<const float>(all), shard, ReduceOp::kAvg, Priority::kLow).wait();
    }

    double sq = 0;
    if (local != nullptr && dp_.size() == 1) {
        sq = local->counted;
    } else {
        for (const Segment& s : norm_segments_) {
            if (s.count_in_norm) sq += backend_.sum_squares(Tensor::f32(grads_ + s.begin, {s.end - s.begin}));
        }
    }
    // in double first: squares of loss-scaled gradients may exceed fp32's range where their unscaled sum does not
    float partial = static_cast<float>(sq * static_cast<double>(unscale) * static_cast<double>(unscale));
    dp_.all_reduce(std::span<float>(&partial, 1), ReduceOp::kSum, Priority::kHigh).wait();
    mp_.all_reduce(std::span<float>(&partial, 1), ReduceOp::kSum, Priority::kHigh).wait();
    r.grad_norm = std::sqrt(static_cast<double>(partial));
    if (!std::isfinite(r.grad_norm)) return r;

    ++step_;
    const float scale = clip_coefficient(r.grad_norm, clip_grad) * unscale;
    float* m = m_.as<float>();
    float* v = v_.as<float>();
    const bool mixed = weights_ != nullptr && weights_dtype_ != DType::kF32;
    const size_t ws = dtype_size(weights_dtype_);
    for (const Segment& s : update_segments_) {
        const int64_t n = s.end - s.begin, k = s.begin - state_base_;
        // zero_stage 0 writes the 16-bit weights in the same pass; zero_stage 1 casts once the params are gathered
        const Tensor copy =
            mixed && zero_stage_ == 0
                ? Tensor(static_cast<std::byte*>(weights_) + static_cast<size_t>(s.begin) * ws, weights_dtype_, {n})
                : Tensor();
        backend_.adamw({Tensor::f32(params_ + s.begin, {n}), Tensor::f32(grads_ + s.begin, {n}),
                        Tensor::f32(m + k, {n}), Tensor::f32(v + k, {n}), lr, cfg_.adam_beta1, cfg_.adam_beta2,
                        cfg_.adam_eps, s.weight_decay ? cfg_.weight_decay : 0.0f, scale, step_, copy});
    }
    if (gather_) {
        gather_->start();  // waited bucket by bucket by the next forward's reads (and cast there)
    } else if (zero_stage_ == 1) {
        // The fp32 params, not the 16-bit weights, are gathered: every rank keeps whole master weights, which the
        // checkpoint writes (twice the bytes of gathering the weights: Megatron's distributed optimizer gathers
        // the 16-bit ones and keeps only its shard of the master).
        dp_.all_gather(std::span<const float>(params_ + shard_begin_, static_cast<size_t>(shard_size_)),
                       std::span<float>(params_, static_cast<size_t>(padded_)), Priority::kLow)
            .wait();
        if (mixed) backend_.cast({Tensor::f32(params_, {padded_}), Tensor(weights_, weights_dtype_, {padded_})});
    }
    r.stepped = true;
    return r;
}

}  // namespace ms
