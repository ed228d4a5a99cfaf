// param_gather.cpp: the updated parameters gathered per bucket, waited by the next forward (param_gather.h).
#include "engine/optim/param_gather.h"

#include <algorithm>

#include "engine/core/check.h"

namespace ms {

ParamGather::ParamGather(std::span<const std::pair<int64_t, int64_t>> buckets, int64_t padded, float* params,
                         Communicator& dp, Backend& backend)
    : params_(params), dp_(dp), backend_(backend) {
    MS_CHECK(padded % dp.size() == 0, "parameter gather: {} elements do not split into {} shards", padded, dp.size());
    for (size_t b = buckets.size(); b-- > 0;) {  // grad buckets run from the end down
        const auto [begin, end] = buckets[b];
        Bucket g{begin, end, owner_parts(begin, end, padded / dp.size()), {}, false};
        g.handles.resize(g.parts.size());
        buckets_.push_back(std::move(g));
    }
    MS_CHECK(!buckets_.empty() && buckets_.front().begin == 0 && buckets_.back().end == padded,
             "parameter gather: the buckets do not cover [0, {})", padded);
}

void ParamGather::start() {
    finish();  // the previous step's, if nothing read them
    for (Bucket& b : buckets_) {
        for (size_t i = 0; i < b.parts.size(); ++i) {
            const OwnerPart& o = b.parts[i];
            const auto n = static_cast<size_t>(o.end - o.begin);
            b.handles[i] = params_ != nullptr
                               ? dp_.broadcast(std::span<float>(params_ + o.begin, n), o.owner, Priority::kLow)
                               : dp_.broadcast(static_cast<std::byte*>(weights_) +
                                                   static_cast<size_t>(o.begin) * dtype_size(weights_dtype_),
                                               n, weights_dtype_, o.owner, Priority::kLow);
        }
        b.pending = true;
        ++in_flight_;
    }
}

void ParamGather::complete(Bucket& b) {
    for (Handle& h : b.handles) h.wait();
    if (params_ != nullptr && weights_ != nullptr && weights_dtype_ != DType::kF32) {
        const int64_t n = b.end - b.begin;
        std::byte* w = static_cast<std::byte*>(weights_) + static_cast<size_t>(b.begin) * dtype_size(weights_dtype_);
        backend_.cast({Tensor::f32(params_ + b.begin, {n}), Tensor(w, weights_dtype_, {n})});
    }
    b.pending = false;
    --in_flight_;
}

void ParamGather::need(std::span<const graph::GradRange> ranges, int64_t base) {
    if (in_flight_ == 0) return;
    for (const graph::GradRange& r : ranges) {
        const int64_t begin = r.begin + base, end = r.end + base;
        // the first bucket ending after begin, up to the last one starting before end
        auto it = std::upper_bound(buckets_.begin(), buckets_.end(), begin,
                                   [](int64_t x, const Bucket& b) { return x < b.end; });
        for (; it != buckets_.end() && it->begin < end; ++it)
            if (it->pending) complete(*it);
    }
    // MPI progresses a non-blocking collective only inside MPI calls: polling the later buckets here lets them move
    // while the forward goes on
    for (Bucket& b : buckets_)
        if (b.pending)
            for (Handle& h : b.handles) h.test();
}

void ParamGather::finish() {
    for (Bucket& b : buckets_)
        if (b.pending) complete(b);
}

}  // namespace ms
