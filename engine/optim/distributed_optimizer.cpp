#include "engine/optim/distributed_optimizer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/core/half.h"
#include "engine/optim/adamw.h"
#include "engine/optim/exact_squares.h"

namespace ms {
namespace {
constexpr int64_t kShardAlign = 16;  // shards start on 64-byte boundaries

// onebit_adam's update with the averaged momentum m and the frozen variance v over n elements (the top of
// distributed_optimizer.h), in fp32 like the AdamW op's fast path; the 16-bit weights in the same pass when copy
// is defined.
template <class T>
void frozen_variance_update(float* param, const float* m, const float* v, int64_t n, float lr, float inv_c1,
                            float inv_c2, float eps, float wd, T* copy) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        param[i] -= lr * ((m[i] * inv_c1) / (std::sqrt(v[i] * inv_c2) + eps) + wd * param[i]);
        if constexpr (!std::is_same_v<T, float>) copy[i] = from_float<T>(param[i]);
    }
}

// The 128-bit sum crosses the ranks as kLimbs limbs of kLimbBits bits, one per int32: the limbs of up to
// 2^(31 - kLimbBits) ranks add up without overflow.
constexpr int kLimbBits = 16, kLimbs = 128 / kLimbBits;
constexpr int64_t kMaxExactRanks = int64_t{1} << (31 - kLimbBits);

// f(static_cast<const T*>(data)) for a gradient buffer's dtype T.
template <class F>
auto with_grads(const Tensor& g, F f) {
    if (g.dtype == DType::kBF16) return f(static_cast<const bf16*>(g.data));
    if (g.dtype == DType::kF16) return f(static_cast<const fp16*>(g.data));
    return f(g.f32());
}

}  // namespace

int64_t padded_flat_size(int64_t flat, int dp) {
    const int64_t unit = kShardAlign * dp;
    return (flat + unit - 1) / unit * unit;
}

int64_t OptimizerBlocks::onebit_bytes() const {
    int64_t n = 0;
    for (size_t b : onebit) n += static_cast<int64_t>(b);
    return n;
}

OptimizerBlocks optimizer_blocks(const std::vector<ParamInfo>& table, int64_t flat, const OptimizerConfig& cfg,
                                 int zero_stage, DType weights_dtype, int dp) {
    const int64_t padded = padded_flat_size(flat, dp);
    const int64_t state = 4 * (zero_stage >= 1 ? padded / dp : padded);
    const bool onebit = cfg.onebit_adam();
    OptimizerBlocks b;
    b.master = shards_master_weights(zero_stage, weights_dtype) ? state : 0;
    b.exp_avg = onebit ? 4 * padded : state;
    b.exp_avg_sq = state;
    if (onebit) b.onebit = onebit_allocation_sizes(table, padded, cfg.onebit_chunk_size, dp);
    return b;
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
                                           void* grads, const OptimizerConfig& cfg, int zero_stage, Backend& backend,
                                           Communicator& dp, Communicator& mp, int tp_rank, Arena* arena, void* weights,
                                           DType weights_dtype, DType grads_dtype)
    : padded_(padded_flat_size(flat, dp.size())),
      params_(params),
      grads_(grads, grads_dtype, {zero_stage == 2 ? padded_ / dp.size() : padded_}),
      cfg_(cfg),
      zero_stage_(zero_stage),
      backend_(backend),
      exact_norm_(backend.device_memory().total_bytes == 0 || cfg.onebit_adam()),
      dp_(dp),
      mp_(mp),
      weights_(weights),
      weights_dtype_(weights == nullptr ? DType::kF32 : weights_dtype),
      blocks_(optimizer_blocks(table, flat, cfg, zero_stage, weights_dtype_, dp.size())) {
    MS_CHECK(zero_stage >= 0 && zero_stage <= 2, "zero_stage {} (0, 1 or 2)", zero_stage);
    MS_CHECK(zero_stage != 2 || !cfg.onebit_adam(), "onebit_adam averages whole momenta: zero_stage 0 or 1");
    MS_CHECK(grads_dtype == DType::kF32 || grads_dtype == weights_dtype_,
             "gradients in {} with {} weights: they are fp32 or the weights' dtype", dtype_name(grads_dtype),
             dtype_name(weights_dtype_));
    MS_CHECK(grads_dtype == DType::kF32 || !cfg.onebit_adam(), "onebit_adam needs fp32 gradients");
    MS_CHECK(!exact_norm_ || static_cast<int64_t>(dp.size()) * mp.size() <= kMaxExactRanks,
             "dp {} x mp {} ranks: the exact gradient norm adds the ranks' 16-bit limbs in int32, which holds at most "
             "{} ranks' (exact_grad_squares)",
             dp.size(), mp.size(), kMaxExactRanks);
    shard_size_ = padded_ / dp.size();
    shard_begin_ = dp.rank() * shard_size_;
    const int64_t lo = shard_begin_, hi = shard_begin_ + shard_size_;
    // Whether the global norm counts this rank's copy of p: one tensor-parallel rank's copy of a replicated
    // parameter, and one pipeline stage's of a tied one.
    const auto counted_in_norm = [&](const ParamInfo& p) {
        return (tp_rank == 0 || !p.tp_duplicate()) && !p.pp_duplicate;
    };
    for (const ParamInfo& p : table) {
        const int64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
        const bool counted = counted_in_norm(p);
        if (b < e) norm_segments_.push_back({b, e, p.weight_decay, counted});
        if (zero_stage == 0) update_segments_.push_back({p.offset, p.offset + p.numel, p.weight_decay, true});
        local_segments_.push_back({p.offset, p.offset + p.numel, p.weight_decay, counted});
    }
    if (zero_stage >= 1) update_segments_ = norm_segments_;
    // One op per run of neighbouring parameters that share what the op needs, not one per parameter: on a GPU each
    // sum_squares waits for its result (a GPT-2 124M step had ~150 of those waits), and AdamW is elementwise, so the
    // merged updates are bit-identical. The norm needs only count_in_norm (the sum of squares of a merged run is the
    // same sum, grouped differently in double), the update only weight_decay.
    coalesce(norm_segments_, [](const Segment& a, const Segment& b) { return a.count_in_norm == b.count_in_norm; });
    coalesce(update_segments_, [](const Segment& a, const Segment& b) { return a.weight_decay == b.weight_decay; });
    coalesce(local_segments_, [](const Segment& a, const Segment& b) { return a.count_in_norm == b.count_in_norm; });
    state_base_ = zero_stage >= 1 ? shard_begin_ : 0;
    state_len_ = static_cast<size_t>(zero_stage >= 1 ? shard_size_ : padded_);
    const bool onebit = cfg.onebit_adam();
    m_base_ = onebit ? 0 : state_base_;
    const auto bytes = [](int64_t b) { return static_cast<size_t>(b); };
    master_ = MemoryBlock(bytes(blocks_.master), arena, MemCategory::kOptimizer, "master weights");
    m_ = MemoryBlock(bytes(blocks_.exp_avg), arena, MemCategory::kOptimizer, "exp_avg");
    v_ = MemoryBlock(bytes(blocks_.exp_avg_sq), arena, MemCategory::kOptimizer, "exp_avg_sq");
    if (onebit) {
        onebit_ = std::make_unique<OneBitAllReduce>(table, padded_, cfg.onebit_chunk_size, dp, arena);
        for (const ParamInfo& p : table)
            if (counted_in_norm(p) && p.numel > 0)
                norm_params_.push_back({p.offset, p.offset + p.numel, p.weight_decay, true});
        int32_t slots = static_cast<int32_t>(norm_params_.size());
        mp.all_reduce(std::span<int32_t>(&slots, 1), ReduceOp::kMax, Priority::kHigh).wait();
        norm_slots_ = static_cast<size_t>(slots);
        own_squares_.assign(norm_slots_, 0.0);  // the slots past this rank's parameters stay 0
        mp_squares_.resize(static_cast<size_t>(mp.size()) * norm_slots_);
    }
    take_loaded_state();
}

void DistributedOptimizer::take_loaded_state() {
    m_whole_ = zero_stage_ == 0;
    if (!sharded_masters()) return;
    backend_.synchronize();  // the host copies: after whatever wrote the lent buffer (once per init or load)
    std::memcpy(master_.data(), params_ + shard_begin_, state_len_ * sizeof(float));
}

void DistributedOptimizer::gather_masters() {
    if (!sharded_masters()) return;
    const auto n = static_cast<size_t>(shard_size_);
    dp_.all_gather(std::span<const float>(master_.as<float>(), n),
                   std::span<float>(params_, static_cast<size_t>(padded_)), Priority::kLow)
        .wait();
}

GradBuckets& DistributedOptimizer::overlap_grad_reduce(int64_t bucket_elems, const std::vector<ParamInfo>& table) {
    MS_CHECK(dp_.size() > 1 && zero_stage_ <= 1, "overlapped gradient buckets need dp > 1 and zero_stage 0 or 1");
    const GradReduction reduction = zero_stage_ == 0 ? GradReduction::kAllReduce : GradReduction::kToShardOwners;
    buckets_ = std::make_unique<GradBuckets>(table, padded_, bucket_elems, grads_.data, dp_, backend_, reduction,
                                             grads_.dtype);
    return *buckets_;
}

ParamGather& DistributedOptimizer::overlap_param_gather(int64_t bucket_elems, const std::vector<ParamInfo>& table) {
    MS_CHECK(zero_stage_ >= 1 && bucket_elems > 0, "overlapped parameter gathers need zero_stage 1 or 2 and buckets");
    gather_ = std::make_unique<ParamGather>(param_bucket_ranges(table, padded_, bucket_elems), padded_,
                                            sharded_masters() ? nullptr : params_, dp_, backend_);
    gather_->set_weights(weights_, weights_dtype_);
    return *gather_;
}

GradSquares DistributedOptimizer::local_grad_squares() const {
    GradSquares r;
    if (buckets_ || sharded_) {
        r.all = buckets_ ? buckets_->squares_before_reduction() : sharded_->squares_before_reduction();
        return r;
    }
    if (dp_.size() > 1) {
        r.all = backend_.sum_squares(grads_);
        return r;
    }
    double uncounted = 0;
    for (const Segment& s : norm_segments_) {
        const double sq = backend_.sum_squares(grads(s.begin, s.end - s.begin));
        (s.count_in_norm ? r.counted : uncounted) += sq;
    }
    r.all = r.counted + uncounted;
    return r;
}

Tensor DistributedOptimizer::weights_copy(const Segment& s) const {
    // The 16-bit weights in the update's pass: all of them for zero_stage 0, this rank's shard to be gathered with
    // sharded masters. zero_stage 1 with whole masters casts once the fp32 params are gathered.
    if (weights_dtype_ == DType::kF32 || !(zero_stage_ == 0 || sharded_masters())) return {};
    const size_t ws = dtype_size(weights_dtype_);
    return Tensor(static_cast<std::byte*>(weights_) + static_cast<size_t>(s.begin) * ws, weights_dtype_,
                  {s.end - s.begin});
}

void DistributedOptimizer::gather_updated() {
    if (gather_) {
        gather_->start();  // waited bucket by bucket by the next forward's reads (and cast there with whole masters)
    } else if (sharded_masters()) {
        const size_t ws = dtype_size(weights_dtype_);
        std::byte* w = static_cast<std::byte*>(weights_);
        dp_.all_gather(w + static_cast<size_t>(shard_begin_) * ws, w, static_cast<size_t>(shard_size_),
                       static_cast<size_t>(padded_), weights_dtype_, Priority::kLow)
            .wait();
    } else if (zero_stage_ >= 1) {
        dp_.all_gather(std::span<const float>(params_ + shard_begin_, static_cast<size_t>(shard_size_)),
                       std::span<float>(params_, static_cast<size_t>(padded_)), Priority::kLow)
            .wait();
        if (weights_dtype_ != DType::kF32)
            backend_.cast({Tensor::f32(params_, {padded_}), Tensor(weights_, weights_dtype_, {padded_})});
    }
}

double DistributedOptimizer::exact_grad_squares() {
    backend_.synchronize();  // the host loops below read the gradients
    // f(g) for each counted gradient segment g of this rank's (no container: a step allocates nothing)
    const auto each_counted = [&](auto f) {
        for (const Segment& s : norm_segments_)
            if (s.count_in_norm) f(grads(s.begin, s.end - s.begin));
    };
    // The exponent of the fixed point: the largest |g| of every rank (a maximum is exact in any order).
    float peak = 0.0f;
    each_counted([&](const Tensor& g) {
        peak = std::max(peak, with_grads(g, [&](const auto* x) { return max_abs(x, g.numel()); }));
    });
    dp_.all_reduce(std::span<float>(&peak, 1), ReduceOp::kMax, Priority::kHigh).wait();
    mp_.all_reduce(std::span<float>(&peak, 1), ReduceOp::kMax, Priority::kHigh).wait();
    if (!std::isfinite(peak)) return peak;  // the same on every rank: all skip the step
    if (peak == 0.0f) return 0.0;
    const FixedPointScale scale = fixed_point_scale(peak);
    u128 sum = 0;
    each_counted([&](const Tensor& g) {
        sum += with_grads(g, [&](const auto* x) { return fixed_point_squares(x, g.numel(), scale.unit); });
    });
    std::array<int32_t, kLimbs> limbs{};
    for (int i = 0; i < kLimbs; ++i)
        limbs[i] = static_cast<int32_t>((sum >> (kLimbBits * i)) & ((u128{1} << kLimbBits) - 1));
    dp_.all_reduce(std::span<int32_t>(limbs), ReduceOp::kSum, Priority::kHigh).wait();
    mp_.all_reduce(std::span<int32_t>(limbs), ReduceOp::kSum, Priority::kHigh).wait();
    u128 total = 0;  // below 2^128: every rank's squares are
    for (int i = 0; i < kLimbs; ++i) total += static_cast<u128>(static_cast<uint32_t>(limbs[i])) << (kLimbBits * i);
    return std::ldexp(static_cast<double>(total), scale.scale_back);
}

double DistributedOptimizer::own_grad_squares() {
    // Each counted parameter's sum of squares (a parameter's bits do not depend on the stage that holds it), gathered
    // over mp and added in ascending order: the total depends on the set of parameters only, so every pipeline layout
    // clips the momentum's input by the one-stage run's coefficient. The stages' partial sums added up would round
    // differently, and one sign bit of the compression turns that last-bit difference into a step of a chunk's scale.
    for (size_t i = 0; i < norm_params_.size(); ++i) {
        const Segment& s = norm_params_[i];
        own_squares_[i] = backend_.sum_squares(grads_.slice(s.begin, s.end - s.begin));
    }
    // as int32 pairs: the typed collectives have no 64-bit type, and a gather only moves the bytes
    mp_.all_gather(std::span<const int32_t>(reinterpret_cast<const int32_t*>(own_squares_.data()), 2 * norm_slots_),
                   std::span<int32_t>(reinterpret_cast<int32_t*>(mp_squares_.data()), 2 * mp_squares_.size()),
                   Priority::kHigh)
        .wait();
    // a NaN has no place in the order: the sum is non-finite however it is taken
    if (std::all_of(mp_squares_.begin(), mp_squares_.end(), [](double x) { return std::isfinite(x); }))
        std::sort(mp_squares_.begin(), mp_squares_.end());
    double sq = 0;
    for (double x : mp_squares_) sq += x;
    return sq;
}

OptimizerStepResult DistributedOptimizer::compressed_step(float lr, float clip_grad, float unscale) {
    OptimizerStepResult r;
    // This rank's own gradient norm (summed over tp and pp), and over dp the sum of the ranks' squares: their root
    // mean square is reported, and a non-finite value on any rank skips the step on all.
    const float own =
        static_cast<float>(own_grad_squares() * static_cast<double>(unscale) * static_cast<double>(unscale));
    float all = own;
    dp_.all_reduce(std::span<float>(&all, 1), ReduceOp::kSum, Priority::kHigh).wait();
    r.grad_norm = std::sqrt(static_cast<double>(all) / dp_.size());
    if (!std::isfinite(r.grad_norm)) return r;

    ++step_;
    float* m = m_.as<float>();
    if (!m_whole_) {  // the whole momentum, once: zero_stage 1's warm-up (or a load) kept this rank's shard only
        dp_.all_gather(std::span<const float>(m + shard_begin_, static_cast<size_t>(shard_size_)),
                       std::span<float>(m, static_cast<size_t>(padded_)), Priority::kLow)
            .wait();
        m_whole_ = true;
    }
    backend_.synchronize();             // the host loops below read the gradients and write the momentum
    const float* grads = grads_.f32();  // fp32: the constructor refused onebit_adam with 16-bit gradients
    const float c = clip_coefficient(std::sqrt(static_cast<double>(own)), clip_grad) * unscale;
    const float b1 = cfg_.adam_beta1;
    for (const Segment& s : local_segments_) {
#pragma omp parallel for schedule(static)
        for (int64_t i = s.begin; i < s.end; ++i) m[i] = b1 * m[i] + (1.0f - b1) * (c * grads[i]);
    }
    onebit_->run(m);

    const float inv_c1 =
        static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(cfg_.adam_beta1), static_cast<double>(step_))));
    const float inv_c2 = static_cast<float>(
        1.0 / (1.0 - std::pow(static_cast<double>(cfg_.adam_beta2), static_cast<double>(cfg_.freeze_step))));
    float* master = sharded_masters() ? master_.as<float>() : params_ + state_base_;
    const float* v = v_.as<float>();
    for (const Segment& s : update_segments_) {
        const int64_t n = s.end - s.begin, k = s.begin - state_base_;
        const float wd = s.weight_decay ? cfg_.weight_decay : 0.0f;
        const Tensor copy = weights_copy(s);
        const auto update = [&]<class T>(T* out) {
            frozen_variance_update(master + k, m + s.begin, v + k, n, lr, inv_c1, inv_c2, cfg_.adam_eps, wd, out);
        };
        if (!copy.defined()) {
            update(static_cast<float*>(nullptr));
        } else if (copy.dtype == DType::kBF16) {
            update(static_cast<bf16*>(copy.data));
        } else {
            update(static_cast<fp16*>(copy.data));
        }
    }
    gather_updated();
    r.stepped = true;
    return r;
}

OptimizerStepResult DistributedOptimizer::step(float lr, float clip_grad, float unscale, const GradSquares* local) {
    finish_param_gather();  // the update writes this rank's shard, which the last step's gathers send from
    if (compressing()) return compressed_step(lr, clip_grad, unscale);
    OptimizerStepResult r;
    if (buckets_ || zero_stage_ == 2) {
        // the pipeline's backward and finish() did it
    } else if (zero_stage_ == 0) {
        dp_.all_reduce(grads_.data, static_cast<size_t>(padded_), grads_.dtype, ReduceOp::kAvg, Priority::kLow).wait();
    } else {
        // in place: this rank's shard is its own block of the gradient buffer (mpi_communicator.h)
        dp_.reduce_scatter(grads_.data, grads_.slice(shard_begin_, shard_size_).data, static_cast<size_t>(shard_size_),
                           static_cast<size_t>(padded_), grads_.dtype, ReduceOp::kAvg, Priority::kLow)
            .wait();
    }

    double sq = 0;
    const bool several = dp_.size() > 1 || mp_.size() > 1;
    if (several && exact_norm_) {
        sq = exact_grad_squares();
    } else if (local != nullptr && dp_.size() == 1) {
        sq = local->counted;
    } else {
        for (const Segment& s : norm_segments_) {
            if (s.count_in_norm) sq += backend_.sum_squares(grads(s.begin, s.end - s.begin));
        }
    }
    // in double first: squares of loss-scaled gradients may exceed fp32's range where their unscaled sum does not
    float squares = static_cast<float>(sq * static_cast<double>(unscale) * static_cast<double>(unscale));
    if (several && !exact_norm_) {  // the ranks' partial sums, added in fp32 over dp and then mp
        dp_.all_reduce(std::span<float>(&squares, 1), ReduceOp::kSum, Priority::kHigh).wait();
        mp_.all_reduce(std::span<float>(&squares, 1), ReduceOp::kSum, Priority::kHigh).wait();
    }
    r.grad_norm = std::sqrt(static_cast<double>(squares));
    if (!std::isfinite(r.grad_norm)) return r;

    ++step_;
    const float scale = clip_coefficient(r.grad_norm, clip_grad) * unscale;
    float* m = m_.as<float>();
    float* v = v_.as<float>();
    // The fp32 values AdamW updates: the sharded masters' own block, else the parameters, both indexed from
    // state_base_ like v (m from m_base_).
    float* master = sharded_masters() ? master_.as<float>() : params_ + state_base_;
    for (const Segment& s : update_segments_) {
        const int64_t n = s.end - s.begin, k = s.begin - state_base_;
        backend_.adamw({Tensor::f32(master + k, {n}), grads(s.begin, n), Tensor::f32(m + (s.begin - m_base_), {n}),
                        Tensor::f32(v + k, {n}), lr, cfg_.adam_beta1, cfg_.adam_beta2, cfg_.adam_eps,
                        s.weight_decay ? cfg_.weight_decay : 0.0f, scale, step_, weights_copy(s)});
    }
    gather_updated();
    r.stepped = true;
    return r;
}

}  // namespace ms
