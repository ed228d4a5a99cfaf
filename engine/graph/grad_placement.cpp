// grad_placement.cpp: the flat gradient range's segments (grad_placement.h).
#include "engine/graph/grad_placement.h"

#include <algorithm>

#include "engine/core/check.h"

namespace ms::graph {

GradPlacement::GradPlacement(void* flat, DType dtype, int64_t elems)
    : segments_{{0, elems, static_cast<std::byte*>(flat)}}, dtype_(dtype) {}

GradPlacement::GradPlacement(std::vector<Segment> segments, DType dtype)
    : segments_(std::move(segments)), dtype_(dtype) {
    std::sort(segments_.begin(), segments_.end(), [](const Segment& a, const Segment& b) { return a.begin < b.begin; });
    for (size_t i = 0; i < segments_.size(); ++i) {
        MS_CHECK(segments_[i].begin < segments_[i].end && segments_[i].data != nullptr,
                 "gradient placement: segment [{}, {}) is empty or has no memory", segments_[i].begin,
                 segments_[i].end);
        MS_CHECK(i == 0 || segments_[i - 1].end <= segments_[i].begin,
                 "gradient placement: segments [{}, {}) and [{}, {}) overlap", segments_[i - 1].begin,
                 segments_[i - 1].end, segments_[i].begin, segments_[i].end);
    }
}

Tensor GradPlacement::tensor(int64_t begin, int64_t n) const {
    // the last segment that begins at or before `begin`
    const auto it = std::upper_bound(segments_.begin(), segments_.end(), begin,
                                     [](int64_t b, const Segment& s) { return b < s.begin; });
    MS_CHECK(it != segments_.begin() && begin + n <= std::prev(it)->end,
             "gradient placement: elements [{}, {}) are not in one segment", begin, begin + n);
    const Segment& s = *std::prev(it);
    return Tensor(s.data + static_cast<size_t>(begin - s.begin) * dtype_size(dtype_), dtype_, {n});
}

GradPlacement GradPlacement::from(int64_t base) const {
    GradPlacement out = *this;
    for (Segment& s : out.segments_) {
        s.begin -= base;
        s.end -= base;
    }
    return out;
}

}  // namespace ms::graph
