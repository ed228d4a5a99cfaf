// grad_buckets.cpp: buckets of the flat gradient buffer reduced as the backward finishes them (grad_buckets.h).
#include "engine/optim/grad_buckets.h"

#include <algorithm>
#include <array>

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
        Bucket b{begin, end, elems, 0, 0.0, {{begin, end}}, {}, {}};
        set_parts(b);
        buckets_.push_back(std::move(b));
    }
    deferred_.assign(params_.size(), 0);
    done_.assign(params_.size(), 0);
    issued_.reserve(buckets_.size());  // a step allocates nothing
}

std::vector<OwnerPart> GradBuckets::parts_of(int64_t begin, int64_t end) const {
    if (reduction_ == GradReduction::kToShardOwners) return owner_parts(begin, end, grads_.numel() / dp_.size());
    return begin < end ? std::vector<OwnerPart>{{-1, begin, end}} : std::vector<OwnerPart>{};
}

void GradBuckets::set_parts(Bucket& b) const {
    b.parts.clear();
    for (const auto& [begin, end] : b.dense)
        for (const OwnerPart& o : parts_of(begin, end)) b.parts.push_back(o);
    b.handles.clear();
    b.handles.resize(b.parts.size());
}

void GradBuckets::tie(const TiedEmbedding& tied) {
    const graph::GradRange& r = tied.range;
    const auto [first, last] = params_in(r);
    MS_CHECK(tied_param_ < 0 && last == first + 1 && tied.row_elems > 0 && (r.end - r.begin) % tied.row_elems == 0 &&
                 (tied.max_tokens > 0 || !tied.lookup) && grads_.dtype == DType::kF32 &&
                 grads_.device == DeviceType::kCPU,
             "gradient buckets: a tied embedding of [{}, {}) in rows of {} (fp32 in host memory, once)", r.begin, r.end,
             tied.row_elems);
    MS_CHECK(tied.head.data == nullptr || (tied.lookup && tied.head.numel() == r.end - r.begin),
             "gradient buckets: the head's gradient kept apart has {} elements, the embedding's {}", tied.head.numel(),
             r.end - r.begin);
    const int64_t numel = r.end - r.begin;
    const graph::GradRange& f = tied.first_stage_range;
    MS_CHECK(tied.stages == nullptr ||
                 (tied.stages->size() == 2 && tied.max_tokens > 0 && f.end - f.begin == numel &&
                  tied.first_stage_padded >= f.end && tied.first_stage_padded % dp_.size() == 0 &&
                  (!tied.lookup || (f == r && tied.first_stage_padded == grads_.numel() && tied.head.data != nullptr))),
             "gradient buckets: a tied embedding across the stages of a pipeline needs a group of its two ends, the "
             "embedding's place in the first stage's buffer [{}, {}) of {}, and there a buffer the head's arrives in",
             f.begin, f.end, tied.first_stage_padded);
    tied_ = tied;
    tied_param_ = static_cast<int>(first);
    Bucket& b = buckets_[static_cast<size_t>(bucket_of_[first])];
    b.param_elems -= numel;
    b.dense = {{b.begin, r.begin}, {r.end, b.end}};
    set_parts(b);
    if (!tied.lookup) tied_.head = grads_.slice(r.begin, numel);  // the output layer's gradient alone
    if (tied.stages != nullptr) {
        peer_ = 1 - tied.stages->rank();
        // the first stage's optimizer reads its dp shard's part (zero_stage 1) in its own layout, or all of it
        part_begin_ = 0;
        part_end_ = reduction_ == GradReduction::kToShardOwners ? 0 : numel;
        if (reduction_ == GradReduction::kToShardOwners)
            for (const OwnerPart& o : owner_parts(f.begin, f.end, tied.first_stage_padded / dp_.size()))
                if (o.owner == dp_.rank()) part_begin_ = o.begin - f.begin, part_end_ = o.end - f.begin;
    }
    if (tied_.head.data != nullptr && !receives_head()) {
        // the head's parts: the embedding's, at the same places of the head's buffer; a last stage all-reduces it,
        // since the first stage's shard parts lie elsewhere than its own
        head_parts_ = tied.stages != nullptr ? std::vector<OwnerPart>{{-1, r.begin, r.end}} : parts_of(r.begin, r.end);
        for (OwnerPart& o : head_parts_) o = {o.owner, o.begin - r.begin, o.end - r.begin};
        head_handles_.resize(head_parts_.size());
    }
    const auto rows = static_cast<size_t>(numel / tied.row_elems);
    const size_t tokens = static_cast<size_t>(tied.max_tokens) * static_cast<size_t>(dp_.size());
    const size_t union_capacity = std::min(rows, tokens);  // a step allocates nothing
    if (tied.stages != nullptr) stage_ids_.resize(union_capacity);
    if (!tied.lookup) {  // a last stage receives the first stage's rows
        if (tied.stages != nullptr) packed_.reserve(union_capacity * static_cast<size_t>(tied.row_elems));
        return;
    }
    looked_.assign(rows, 0);
    rows_.reserve(static_cast<size_t>(tied.max_tokens));
    row_send_.resize(static_cast<size_t>(tied.max_tokens));
    row_gather_.resize(tokens);
    union_.reserve(union_capacity);
    packed_.reserve(union_capacity * static_cast<size_t>(tied.row_elems));
}

void GradBuckets::look_up(std::span<const int32_t> tokens) {
    if (tied_param_ < 0 || !tied_.lookup) return;
    const auto rows = static_cast<int64_t>(looked_.size());
    for (const int32_t t : tokens) {
        const int64_t row = t - tied_.first_row;
        if (row < 0 || row >= rows || looked_[static_cast<size_t>(row)]) continue;
        looked_[static_cast<size_t>(row)] = 1;
        rows_.push_back(static_cast<int32_t>(row));
    }
    MS_CHECK(static_cast<int64_t>(rows_.size()) <= tied_.max_tokens,
             "gradient buckets: a step looked up {} embedding rows, more than the {} tokens it was sized for",
             rows_.size(), tied_.max_tokens);
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
    for (const int32_t row : rows_) looked_[static_cast<size_t>(row)] = 0;
    rows_.clear();
    head_receive_posted_ = head_sent_ = false;
    gather_issued_ = rows_issued_ = head_issued_ = false;
    rows_squares_ = head_squares_ = 0.0;
}

void GradBuckets::final(std::span<const graph::GradRange> ranges, int64_t base) { mark(ranges, base, false); }

void GradBuckets::mark(std::span<const graph::GradRange> chunk_ranges, int64_t base, bool deferred_too) {
    // every forward of the step is done once its last micro-batch's backward reports
    if (tied_param_ >= 0 && tied_.lookup && !gather_issued_) issue_row_gather();
    if (receives_head() && !head_receive_posted_) {
        head_transfer_ = transfer_head_part(P2POp::Kind::kRecv, Priority::kNormal);
        head_receive_posted_ = true;
    }
    for (const graph::GradRange& c : chunk_ranges) {
        if (c.head_apart) {
            if (tied_.head.data != nullptr && !receives_head() && !head_issued_) issue_head();
            continue;  // else the model adds it to the embedding's itself, which is deferred
        }
        const auto [first, last] = params_in({c.begin + base, c.end + base});
        for (size_t i = first; i < last; ++i) {
            if (done_[i] || (deferred_[i] && !deferred_too)) continue;
            done_[i] = 1;
            if (static_cast<int>(i) == tied_param_) {
                if (tied_.lookup)
                    issue_rows();
                else
                    issue_head();
                continue;
            }
            Bucket& b = buckets_[static_cast<size_t>(bucket_of_[i])];
            b.final_elems += params_[i].end - params_[i].begin;
            if (b.final_elems == b.param_elems) issue(bucket_of_[i]);
        }
    }
    // MPI progresses a non-blocking collective only inside MPI calls: polling the earlier buckets here lets them
    // move while the backward goes on
    for (int b : issued_)
        for (Handle& h : buckets_[static_cast<size_t>(b)].handles) h.test();
    if (tied_.stages == nullptr) return;
    head_transfer_.test();
    if (head_issued_ && !head_sent_ &&
        std::all_of(head_handles_.begin(), head_handles_.end(), [](Handle& h) { return h.test(); })) {
        // the last stage's average is whole: on to the first stage while the backwards go on
        head_transfer_ = transfer_head_part(P2POp::Kind::kSend, Priority::kLow);
        head_sent_ = true;
    }
}

namespace {

// A part's reduction over dp: an all-reduce (owner -1) or a reduce into its owner, averaged.
Handle reduce_part(Communicator& dp, const Tensor& part, int owner) {
    const auto n = static_cast<size_t>(part.numel());
    return owner < 0 ? dp.all_reduce(part.data, n, part.dtype, ReduceOp::kAvg, Priority::kLow)
                     : dp.reduce(part.data, n, part.dtype, owner, ReduceOp::kAvg, Priority::kLow);
}

}  // namespace

void GradBuckets::issue(int index) {
    Bucket& b = buckets_[static_cast<size_t>(index)];
    b.squares = 0.0;
    for (const auto& [begin, end] : b.dense)  // synchronizes the backend
        if (begin < end) b.squares += backend_.sum_squares(grads_.slice(begin, end - begin));
    for (size_t i = 0; i < b.parts.size(); ++i) {
        const OwnerPart& o = b.parts[i];
        b.handles[i] = reduce_part(dp_, grads_.slice(o.begin, o.end - o.begin), o.owner);
    }
    issued_.push_back(index);
}

void GradBuckets::issue_row_gather() {
    std::fill(row_send_.begin(), row_send_.end(), -1);
    std::copy(rows_.begin(), rows_.end(), row_send_.begin());
    gather_handle_ =
        dp_.all_gather(std::span<const int32_t>(row_send_), std::span<int32_t>(row_gather_), Priority::kLow);
    gather_issued_ = true;
}

void GradBuckets::issue_rows() {
    if (!gather_issued_) issue_row_gather();
    gather_handle_.wait();
    // the union of every rank's rows, sorted, so that every rank packs the same rows in the same order
    union_.clear();
    for (const int32_t row : row_gather_) {
        if (row < 0 || (looked_[static_cast<size_t>(row)] & 2) != 0) continue;
        looked_[static_cast<size_t>(row)] |= 2;
        union_.push_back(row);
    }
    std::sort(union_.begin(), union_.end());
    const auto C = static_cast<size_t>(tied_.row_elems);
    packed_.resize(union_.size() * C);
    backend_.synchronize();  // the lookup's backward has written the rows
    const float* grads = grads_.f32() + tied_.range.begin;
    for (size_t u = 0; u < union_.size(); ++u) {
        const auto row = static_cast<size_t>(union_[u]);
        looked_[row] &= 1;
        std::copy_n(grads + row * C, C, packed_.data() + u * C);
    }
    rows_squares_ = backend_.sum_squares(Tensor::f32(packed_.data(), {static_cast<int64_t>(packed_.size())}));
    rows_handle_ = dp_.all_reduce(std::span<float>(packed_), ReduceOp::kAvg, Priority::kLow);
    rows_issued_ = true;
}

void GradBuckets::issue_head() {
    const Tensor& head = tied_.head;
    head_squares_ = backend_.sum_squares(head);  // synchronizes the backend
    for (size_t i = 0; i < head_parts_.size(); ++i) {
        const OwnerPart& o = head_parts_[i];
        head_handles_[i] = reduce_part(dp_, head.slice(o.begin, o.end - o.begin), o.owner);
    }
    head_issued_ = true;
}

Handle GradBuckets::transfer_head_part(P2POp::Kind kind, Priority p) {
    if (part_begin_ == part_end_) return {};
    const Tensor part = tied_.head.slice(part_begin_, part_end_ - part_begin_);
    const P2POp op{kind, peer_, part.data, static_cast<size_t>(part.numel()), part.dtype, kHeadTag};
    return tied_.stages->batch_send_recv(std::span<const P2POp>(&op, 1), p);
}

void GradBuckets::add_received_head() {
    head_transfer_.wait();
    if (part_begin_ == part_end_) return;
    const int64_t n = part_end_ - part_begin_;
    const Tensor embedding = grads_.slice(tied_.range.begin + part_begin_, n);
    backend_.residual_forward({.a = embedding, .b = tied_.head.slice(part_begin_, n), .out = embedding, .bias = {}});
}

void GradBuckets::add_received_rows() {
    tied_.stages
        ->batch_send_recv(std::array{P2POp::recv(std::span<int32_t>(stage_ids_), peer_, kIdsTag)}, Priority::kNormal)
        .wait();
    const auto n = static_cast<size_t>(std::find(stage_ids_.begin(), stage_ids_.end(), -1) - stage_ids_.begin());
    const auto C = static_cast<size_t>(tied_.row_elems);
    packed_.resize(n * C);
    tied_.stages
        ->batch_send_recv(std::array{P2POp::recv(std::span<float>(packed_), peer_, kRowsTag)}, Priority::kNormal)
        .wait();
    head_transfer_.wait();  // the average sent is about to become the sum
    // the first stage's average of the lookup plus this one's of the output layer, as one stage adds them: the
    // union's rows, and 0 + the head's elsewhere (where the lookup's gradient is zero)
    float* sum = tied_.head.f32();
    const auto rows = static_cast<size_t>(tied_.head.numel()) / C;
    for (size_t row = 0, u = 0; row < rows; ++row) {
        float* s = sum + row * C;
        if (u < n && static_cast<size_t>(stage_ids_[u]) == row) {
            const float* looked = packed_.data() + u++ * C;
            for (size_t j = 0; j < C; ++j) s[j] = looked[j] + s[j];
        } else {
            for (size_t j = 0; j < C; ++j) s[j] = 0.0f + s[j];
        }
    }
}

void GradBuckets::finish_tied() {
    if (tied_.head.data != nullptr && !receives_head() && !head_issued_) issue_head();
    if (!tied_.lookup) {
        for (Handle& h : head_handles_) h.wait();
        if (tied_.stages == nullptr) return;
        if (!head_sent_) head_transfer_ = transfer_head_part(P2POp::Kind::kSend, Priority::kLow);
        add_received_rows();
        return;
    }
    if (!rows_issued_) issue_rows();
    rows_handle_.wait();
    float* grads = grads_.f32() + tied_.range.begin;  // the rows no rank looked up are zero on every rank
    const auto C = static_cast<size_t>(tied_.row_elems);
    for (size_t u = 0; u < union_.size(); ++u)
        std::copy_n(packed_.data() + u * C, C, grads + static_cast<size_t>(union_[u]) * C);
    if (tied_.stages != nullptr) {  // the union's rows on to the last stage, then the last stage's average here
        std::fill(std::copy(union_.begin(), union_.end(), stage_ids_.begin()), stage_ids_.end(), -1);
        Handle ids = tied_.stages->batch_send_recv(
            std::array{P2POp::send(std::span<const int32_t>(stage_ids_), peer_, kIdsTag)}, Priority::kNormal);
        Handle rows = tied_.stages->batch_send_recv(
            std::array{P2POp::send(std::span<const float>(packed_), peer_, kRowsTag)}, Priority::kNormal);
        if (!head_receive_posted_) head_transfer_ = transfer_head_part(P2POp::Kind::kRecv, Priority::kNormal);
        add_received_head();
        ids.wait();
        rows.wait();
        return;
    }
    if (tied_.head.data == nullptr) return;
    for (Handle& h : head_handles_) h.wait();
    const Tensor embedding = grads_.slice(tied_.range.begin, tied_.range.end - tied_.range.begin);
    backend_.residual_forward({.a = embedding, .b = tied_.head, .out = embedding, .bias = {}});
    backend_.zero(tied_.head);  // for the next step
}

void GradBuckets::finish() {
    mark(deferred_ranges_, 0, true);
    for (int b = 0; b < num_buckets(); ++b) {
        if (std::find(issued_.begin(), issued_.end(), b) == issued_.end()) issue(b);
    }
    if (tied_param_ >= 0) finish_tied();
    for (Bucket& b : buckets_)
        for (Handle& h : b.handles) h.wait();
}

double GradBuckets::squares_before_reduction() const {
    double sq = 0.0;
    for (const Bucket& b : buckets_) sq += b.squares;
    return sq + rows_squares_ + head_squares_;
}

}  // namespace ms
