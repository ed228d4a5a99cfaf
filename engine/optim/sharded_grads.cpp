// sharded_grads.cpp: zero_stage 2's gradient buckets, slots and shard (sharded_grads.h).
#include "engine/optim/sharded_grads.h"

#include <algorithm>

#include "engine/core/check.h"

namespace ms {
namespace {

// Sorted, with touching or overlapping ranges merged.
std::vector<graph::GradRange> merged(std::vector<graph::GradRange> ranges) {
    std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
    std::vector<graph::GradRange> out;
    for (const graph::GradRange& r : ranges) {
        if (!out.empty() && r.begin <= out.back().end)
            out.back().end = std::max(out.back().end, r.end);
        else
            out.push_back(r);
    }
    return out;
}

bool contains(std::span<const graph::GradRange> sorted, const graph::GradRange& r) {
    const auto it = std::upper_bound(sorted.begin(), sorted.end(), r.begin,
                                     [](int64_t b, const graph::GradRange& k) { return b < k.begin; });
    return it != sorted.begin() && r.end <= std::prev(it)->end;
}

}  // namespace

ShardedGradLayout sharded_grad_layout(std::span<const ChunkGradWrites> chunks,
                                      std::span<const graph::GradRange> extra_kept, int64_t padded,
                                      int64_t bucket_elems, int dp) {
    MS_CHECK(dp >= 1 && padded % dp == 0 && bucket_elems >= 1,
             "sharded gradients: {} elements over dp {}, buckets of {}", padded, dp, bucket_elems);
    ShardedGradLayout l;
    l.padded = padded;
    l.shard_elems = padded / dp;
    std::vector<graph::GradRange> kept(extra_kept.begin(), extra_kept.end());
    for (const ChunkGradWrites& c : chunks)
        for (const graph::GradRange& r : c.writes.kept) kept.push_back({r.begin + c.base, r.end + c.base});
    l.kept = merged(std::move(kept));
    for (const graph::GradRange& r : l.kept) l.kept_elems += r.end - r.begin;

    int max_open = 1;
    for (const ChunkGradWrites& c : chunks) {
        // this chunk's once-written gradients, flat, minus any the pipeline keeps
        std::vector<std::vector<graph::GradRange>> groups;
        std::vector<graph::GradRange> grads;
        for (const auto& group : c.writes.once) {
            groups.emplace_back();
            for (const graph::GradRange& r : group) {
                const graph::GradRange f{r.begin + c.base, r.end + c.base};
                if (contains(l.kept, f)) continue;
                groups.back().push_back(f);
                grads.push_back(f);
            }
        }
        if (grads.empty()) continue;
        std::sort(grads.begin(), grads.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
        std::vector<std::pair<int64_t, int64_t>> spans;
        for (const graph::GradRange& r : grads) spans.emplace_back(r.begin, r.end);
        const int first = static_cast<int>(l.buckets.size());
        size_t i = grads.size();  // the gradients not yet in a bucket: [0, i)
        for (const auto& [begin, end] : bucket_ranges(spans, grads.back().end, bucket_elems)) {
            std::vector<graph::GradRange> in;
            for (; i > 0 && grads[i - 1].begin >= begin; --i) in.push_back(grads[i - 1]);
            std::reverse(in.begin(), in.end());
            l.buckets.emplace_back(in.front().begin, in.back().end);  // no padding, no gap before the first
            l.slot_elems = std::max(l.slot_elems, in.back().end - in.front().begin);
            l.bucket_grads.push_back(std::move(in));
        }
        // the most buckets open at once in this chunk's backward: from its first write to its last
        std::vector<int64_t> left(l.buckets.size() - static_cast<size_t>(first), 0);
        for (size_t b = 0; b < left.size(); ++b)
            for (const graph::GradRange& r : l.bucket_grads[static_cast<size_t>(first) + b]) left[b] += r.end - r.begin;
        const auto bucket_of = [&](const graph::GradRange& r) {
            for (size_t b = 0; b < left.size(); ++b)
                if (r.begin >= l.buckets[static_cast<size_t>(first) + b].first &&
                    r.end <= l.buckets[static_cast<size_t>(first) + b].second)
                    return b;
            MS_UNREACHABLE("sharded gradients: [{}, {}) in no bucket", r.begin, r.end);
        };
        std::vector<char> open(left.size(), 0);
        for (const auto& group : groups) {
            for (const graph::GradRange& r : group) open[bucket_of(r)] = 1;
            size_t lo = left.size(), hi = 0;
            for (size_t b = 0; b < open.size(); ++b)
                if (open[b]) lo = std::min(lo, b), hi = std::max(hi, b);
            if (lo <= hi) max_open = std::max(max_open, static_cast<int>(hi - lo + 1));
            for (const graph::GradRange& r : group) {
                const size_t b = bucket_of(r);
                left[b] -= r.end - r.begin;
                if (left[b] == 0) open[b] = 0;
            }
        }
    }
    l.slots = std::min(static_cast<int>(l.buckets.size()), max_open + 1);
    return l;
}

graph::GradPlacement sharded_grad_placement(const ShardedGradLayout& l, void* buffer, DType dtype) {
    auto* base = static_cast<std::byte*>(buffer);
    const size_t es = dtype_size(dtype);
    std::vector<graph::GradPlacement::Segment> segments;
    for (size_t b = 0; b < l.buckets.size(); ++b) {
        std::byte* slot = base + static_cast<size_t>(int64_t{static_cast<int>(b) % l.slots} * l.slot_elems) * es;
        for (const graph::GradRange& r : l.bucket_grads[b])
            segments.push_back({r.begin, r.end, slot + static_cast<size_t>(r.begin - l.buckets[b].first) * es});
    }
    std::byte* kept = base + static_cast<size_t>(int64_t{l.slots} * l.slot_elems) * es;
    for (const graph::GradRange& r : l.kept) {
        segments.push_back({r.begin, r.end, kept});
        kept += static_cast<size_t>(r.end - r.begin) * es;
    }
    return graph::GradPlacement(std::move(segments), dtype);
}

ShardedGrads::ShardedGrads(ShardedGradLayout layout, void* buffer, void* shard, DType dtype, Communicator& dp,
                           Backend& backend)
    : layout_(std::move(layout)),
      placement_(sharded_grad_placement(layout_, buffer, dtype)),
      buffer_(buffer, dtype, {layout_.buffer_elems()}),
      shard_(shard, dtype, {layout_.shard_elems}),
      dp_(dp),
      backend_(backend),
      shard_begin_(dp.rank() * layout_.shard_elems) {
    MS_CHECK(layout_.shard_elems * dp.size() == layout_.padded,
             "sharded gradients: shards of {} over dp {}, {} elements", layout_.shard_elems, dp.size(), layout_.padded);
    for (size_t b = 0; b < layout_.buckets.size(); ++b) {
        const auto [begin, end] = layout_.buckets[b];
        Bucket k{begin, end,   static_cast<int>(b) % layout_.slots,          0,
                 0,     false, owner_parts(begin, end, layout_.shard_elems), {}};
        for (const graph::GradRange& r : layout_.bucket_grads[b]) {
            k.elems += r.end - r.begin;
            grad_bucket_.emplace_back(r, static_cast<int>(b));
        }
        k.handles.resize(k.parts.size());
        buckets_.push_back(std::move(k));
    }
    std::sort(grad_bucket_.begin(), grad_bucket_.end(),
              [](const auto& a, const auto& b) { return a.first.begin < b.first.begin; });
    occupant_.assign(static_cast<size_t>(layout_.slots), -1);
    for (const graph::GradRange& r : layout_.kept)
        for (const OwnerPart& p : owner_parts(r.begin, r.end, layout_.shard_elems)) kept_parts_.push_back(p);
    kept_handles_.resize(kept_parts_.size());
}

int ShardedGrads::bucket_of(const graph::GradRange& r) const {
    const auto it = std::lower_bound(grad_bucket_.begin(), grad_bucket_.end(), r.begin,
                                     [](const auto& g, int64_t b) { return g.first.begin < b; });
    MS_CHECK(it != grad_bucket_.end() && it->first == r, "sharded gradients: [{}, {}) is not a gradient of the buckets",
             r.begin, r.end);
    return it->second;
}

Tensor ShardedGrads::slot_tensor(const Bucket& k) const {
    return buffer_.slice(int64_t{k.slot} * layout_.slot_elems, k.end - k.begin);
}

void ShardedGrads::add_owned(const Tensor& from, const OwnerPart& part) {
    if (part.owner != dp_.rank()) return;
    const Tensor into = shard_.slice(part.begin - shard_begin_, part.end - part.begin);
    backend_.residual_forward({.a = into, .b = from, .out = into, .bias = {}});
}

void ShardedGrads::settle(int slot) {
    const int b = occupant_[static_cast<size_t>(slot)];
    if (b < 0) return;
    MS_CHECK(!buckets_[static_cast<size_t>(b)].open,
             "sharded gradients: bucket [{}, {}) in slot {} is still being written",
             buckets_[static_cast<size_t>(b)].begin, buckets_[static_cast<size_t>(b)].end, slot);
    Bucket& k = buckets_[static_cast<size_t>(b)];
    const Tensor grads = slot_tensor(k);
    for (size_t i = 0; i < k.parts.size(); ++i) {
        k.handles[i].wait();
        add_owned(grads.slice(k.parts[i].begin - k.begin, k.parts[i].end - k.parts[i].begin), k.parts[i]);
    }
    occupant_[static_cast<size_t>(slot)] = -1;
}

void ShardedGrads::begin_step() {
    for (int s = 0; s < layout_.slots; ++s)
        MS_CHECK(occupant_[static_cast<size_t>(s)] < 0, "sharded gradients: slot {} not settled by finish()", s);
    backend_.zero(shard_);
    backend_.zero(buffer_.slice(int64_t{layout_.slots} * layout_.slot_elems, layout_.kept_elems));
    squares_ = 0;
}

void ShardedGrads::writing(std::span<const graph::GradRange> ranges, int64_t base) {
    for (const graph::GradRange& c : ranges) {
        const graph::GradRange r{c.begin + base, c.end + base};
        if (contains(layout_.kept, r)) continue;
        Bucket& k = buckets_[static_cast<size_t>(bucket_of(r))];
        if (k.open) continue;
        settle(k.slot);  // fatal while the bucket before in the slot is still being written
        backend_.zero(slot_tensor(k));
        k.open = true;
        k.written = 0;
        occupant_[static_cast<size_t>(k.slot)] = bucket_of(r);
    }
}

void ShardedGrads::final(std::span<const graph::GradRange> ranges, int64_t base) {
    for (const graph::GradRange& c : ranges) {
        const graph::GradRange r{c.begin + base, c.end + base};
        if (contains(layout_.kept, r)) continue;
        const int b = bucket_of(r);
        Bucket& k = buckets_[static_cast<size_t>(b)];
        MS_CHECK(k.open, "sharded gradients: [{}, {}) final before it was written", r.begin, r.end);
        k.written += r.end - r.begin;
        if (k.written < k.elems) continue;
        const Tensor grads = slot_tensor(k);
        squares_ += backend_.sum_squares(grads);  // synchronizes the backend
        for (size_t i = 0; i < k.parts.size(); ++i) {
            const OwnerPart& o = k.parts[i];
            const Tensor part = grads.slice(o.begin - k.begin, o.end - o.begin);
            k.handles[i] = dp_.reduce(part.data, static_cast<size_t>(part.numel()), part.dtype, o.owner, ReduceOp::kAvg,
                                      Priority::kLow);
        }
        k.open = false;  // its slot's occupant, reduced from now on
    }
    // MPI progresses a non-blocking collective only inside MPI calls: polling lets the reductions move while the
    // backward goes on
    for (int b : occupant_)
        if (b >= 0 && !buckets_[static_cast<size_t>(b)].open)
            for (Handle& h : buckets_[static_cast<size_t>(b)].handles) h.test();
}

void ShardedGrads::finish() {
    for (const Bucket& k : buckets_)
        MS_CHECK(!k.open, "sharded gradients: bucket [{}, {}) was written in part only", k.begin, k.end);
    const Tensor kept = buffer_.slice(int64_t{layout_.slots} * layout_.slot_elems, layout_.kept_elems);
    squares_ += backend_.sum_squares(kept);
    for (size_t i = 0; i < kept_parts_.size(); ++i) {
        const OwnerPart& o = kept_parts_[i];
        const Tensor part = placement_.tensor(o.begin, o.end - o.begin);
        kept_handles_[i] = dp_.reduce(part.data, static_cast<size_t>(part.numel()), part.dtype, o.owner, ReduceOp::kAvg,
                                      Priority::kLow);
    }
    for (int s = 0; s < layout_.slots; ++s) settle(s);
    for (size_t i = 0; i < kept_parts_.size(); ++i) {
        kept_handles_[i].wait();
        add_owned(placement_.tensor(kept_parts_[i].begin, kept_parts_[i].end - kept_parts_[i].begin), kept_parts_[i]);
    }
}

}  // namespace ms
