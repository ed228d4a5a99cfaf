// grad_buckets.cpp: buckets of the flat gradient buffer reduced as the backward finishes them (grad_buckets.h).
#include "engine/optim/grad_buckets.h"

#include <algorithm>

#include "engine/core/check.h"

namespace ms {

int64_t default_bucket_elems(int dp) { return std::max<int64_t>(40'000'000, 1'000'000 * int64_t{dp}); }

std::vector<OwnerPart> owner_parts(int64_t begin, int64_t end, int64_t shard) {
    MS_CHECK(shard >= 1 && begin <= end, "owner parts of [{}, {}) with shards of {}", begin, end, shard);
    std::vector<OwnerPart> parts;
    for (int64_t b = begin; b < end;) {
        const int64_t owner = b / shard, e = std::min(end, (owner + 1) * shard);
        parts.push_back({static_cast<int>(owner), b, e});
        b = e;
    }
    return parts;
}

std::vector<std::pair<int64_t, int64_t>> bucket_ranges(std::span<const std::pair<int64_t, int64_t>> params,
                                                       int64_t padded, int64_t bucket_elems) {
    MS_CHECK(!params.empty() && bucket_elems >= 1, "gradient buckets: {} parameters, buckets of {} elements",
             params.size(), bucket_elems);
    // from the end down: a bucket closes once it holds bucket_elems, at the start of a parameter
    std::vector<std::pair<int64_t, int64_t>> buckets;
    int64_t end = padded;
    for (size_t i = params.size(); i-- > 0;) {
        if (end - params[i].first >= bucket_elems || i == 0) {
            const int64_t begin = i == 0 ? 0 : params[i].first;
            buckets.emplace_back(begin, end);
            end = begin;
        }
    }
    return buckets;
}

std::vector<std::pair<int64_t, int64_t>> param_bucket_ranges(const std::vector<ParamInfo>& table, int64_t padded,
                                                             int64_t bucket_elems) {
    std::vector<std::pair<int64_t, int64_t>> spans;
    spans.reserve(table.size());
    for (const ParamInfo& p : table) spans.emplace_back(p.offset, p.offset + p.numel);
    std::sort(spans.begin(), spans.end());
    return bucket_ranges(spans, padded, bucket_elems);
}

GradBuckets::GradBuckets(const std::vector<ParamInfo>& table, int64_t padded, int64_t bucket_elems, void* grads,
                         Communicator& dp, Backend& backend, GradReduction reduction, DType grads_dtype)
    : reduction_(reduction), grads_(grads, grads_dtype, {padded}), dp_(dp), backend_(backend) {
    MS_CHECK(reduction == GradReduction::kAllReduce || padded % dp.size() == 0,
             "gradient buckets: {} elements do not split into {} shards", padded, dp.size());
    MS_CHECK(bucket_elems >= 1, "gradient buckets of {} elements", bucket_elems);
    for (const ParamInfo& p : table) params_.push_back({p.offset, p.offset + p.numel});
    std::sort(params_.begin(), params_.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
    MS_CHECK(!params_.empty() && params_.back().end <= padded, "gradient buckets: parameters end at {} of {}",
             params_.empty() ? 0 : params_.back().end, padded);
    bucket_of_.assign(params_.size(), -1);
    size_t i = params_.size();  // the parameters not yet in a bucket: [0, i)
    for (const auto& [begin, end] : param_bucket_ranges(table, padded, bucket_elems)) {
        int64_t elems = 0;
        for (; i > 0 && params_[i - 1].begin >= begin; --i) {
            bucket_of_[i - 1] = static_cast<int>(buckets_.size());
            elems += params_[i - 1].end - params_[i - 1].begin;
        }
        Bucket b{begin, end, elems, 0, 0.0, {}, {}};
        if (reduction == GradReduction::kToShardOwners) b.parts = owner_parts(begin, end, padded / dp.size());
        b.handles.resize(std::max<size_t>(1, b.parts.size()));
        buckets_.push_back(std::move(b));
    }
    deferred_.assign(params_.size(), 0);
    done_.assign(params_.size(), 0);
    issued_.reserve(buckets_.size());  // a step allocates nothing
}

std::pair<size_t, size_t> GradBuckets::params_in(const graph::GradRange& r) const {
    const auto it = std::lower_bound(params_.begin(), params_.end(), r,
                                     [](const auto& a, const auto& b) { return a.begin < b.begin; });
    size_t last = static_cast<size_t>(it - params_.begin());
    const size_t first = last;
    bool whole = it != params_.end() && it->begin == r.begin;
    while (whole && params_[last].end < r.end) {
        ++last;
        whole = last < params_.size() && params_[last].begin == params_[last - 1].end;
    }
    MS_CHECK(whole && params_[last].end == r.end,
             "gradient buckets: [{}, {}) is not a parameter, nor parameters packed back to back", r.begin, r.end);
    return {first, last + 1};
}

void GradBuckets::defer(std::span<const graph::GradRange> ranges) {
    for (const graph::GradRange& r : ranges) {
        const auto [first, last] = params_in(r);
        for (size_t i = first; i < last; ++i) deferred_[i] = 1;
        deferred_ranges_.push_back(r);
    }
}

void GradBuckets::begin_step() {
    for (Bucket& b : buckets_) {
        for (Handle& h : b.handles) h.wait();
        b.final_elems = 0;
        b.squares = 0.0;
    }
    std::fill(done_.begin(), done_.end(), 0);
    issued_.clear();
}

void GradBuckets::final(std::span<const graph::GradRange> ranges, int64_t base) { mark(ranges, base, false); }

void GradBuckets::mark(std::span<const graph::GradRange> chunk_ranges, int64_t base, bool deferred_too) {
    for (const graph::GradRange& c : chunk_ranges) {
        const auto [first, last] = params_in({c.begin + base, c.end + base});
        for (size_t i = first; i < last; ++i) {
            if (done_[i] || (deferred_[i] && !deferred_too)) continue;
            done_[i] = 1;
            Bucket& b = buckets_[static_cast<size_t>(bucket_of_[i])];
            b.final_elems += params_[i].end - params_[i].begin;
            if (b.final_elems == b.param_elems) issue(bucket_of_[i]);
        }
    }
    // MPI progresses a non-blocking collective only inside MPI calls: polling the earlier buckets here lets them
    // move while the backward goes on
    for (int b : issued_)
        for (Handle& h : buckets_[static_cast<size_t>(b)].handles) h.test();
}

void GradBuckets::issue(int index) {
    Bucket& b = buckets_[static_cast<size_t>(index)];
    const Tensor grads = grads_.slice(b.begin, b.end - b.begin);
    b.squares = backend_.sum_squares(grads);  // synchronizes the backend
    if (reduction_ == GradReduction::kAllReduce) {
        b.handles[0] =
            dp_.all_reduce(grads.data, static_cast<size_t>(grads.numel()), grads.dtype, ReduceOp::kAvg, Priority::kLow);
    } else {
        for (size_t i = 0; i < b.parts.size(); ++i) {
            const OwnerPart& o = b.parts[i];
            const Tensor part = grads_.slice(o.begin, o.end - o.begin);
            b.handles[i] = dp_.reduce(part.data, static_cast<size_t>(part.numel()), part.dtype, o.owner, ReduceOp::kAvg,
                                      Priority::kLow);
        }
    }
    issued_.push_back(index);
}

void GradBuckets::finish() {
    mark(deferred_ranges_, 0, true);
    for (int b = 0; b < num_buckets(); ++b) {
        if (std::find(issued_.begin(), issued_.end(), b) == issued_.end()) issue(b);
    }
    for (Bucket& b : buckets_)
        for (Handle& h : b.handles) h.wait();
}

double GradBuckets::squares_before_reduction() const {
    double sq = 0.0;
    for (const Bucket& b : buckets_) sq += b.squares;
    return sq;
}

}  // namespace ms
