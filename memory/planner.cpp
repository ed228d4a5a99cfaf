// planner.cpp: lifetime-interval packing, greedy by size with best fit (see planner.h).
#include "memory/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>

#include "engine/core/check.h"

namespace ms {
namespace {

size_t round_up(size_t x, size_t multiple) { return (x + multiple - 1) / multiple * multiple; }

bool lifetimes_intersect(const BufferRequest& a, const BufferRequest& b) {
    return a.first_use <= b.last_use && b.first_use <= a.last_use;
}

std::string describe(const BufferRequest& r) {
    return fmt::format("'{}' (ops {}..{}, {} bytes)", r.name, r.first_use, r.last_use, r.bytes);
}

// Checks every request and every in-place claim; throws UserError naming the buffers involved.
void validate_requests(const std::vector<BufferRequest>& requests) {
    const int n = static_cast<int>(requests.size());
    std::vector<int> claimed_by(n, -1);
    for (int j = 0; j < n; ++j) {
        const BufferRequest& out = requests[j];
        if (out.first_use > out.last_use) {
            throw UserError(
                fmt::format("memory plan: buffer '{}' is first used at op {} but last used at op {}, "
                            "before it",
                            out.name, out.first_use, out.last_use));
        }
        if (out.inplace_of == -1) continue;
        if (out.inplace_of < 0 || out.inplace_of >= n || out.inplace_of == j) {
            throw UserError(
                fmt::format("memory plan: buffer '{}' asks to be written in place of buffer #{}, which is "
                            "not another of the {} buffers",
                            out.name, out.inplace_of, n));
        }
        const BufferRequest& in = requests[out.inplace_of];
        if (in.last_use > out.first_use) {
            throw UserError(fmt::format(
                "memory plan: illegal in-place: '{}' would overwrite '{}', which is still read until op {} after "
                "'{}' is written at op {}\n---> HINT: give '{}' its own buffer (inplace_of = -1)",
                out.name, in.name, in.last_use, out.name, out.first_use, out.name));
        }
        if (in.last_use < out.first_use) {
            throw UserError(fmt::format(
                "memory plan: illegal in-place: '{}' (written at op {}) asks to overwrite '{}', whose last read is "
                "at op {}: an in-place output must be written by the op that reads its input for the last time",
                out.name, out.first_use, in.name, in.last_use));
        }
        if (in.first_use >= out.first_use) {
            throw UserError(
                fmt::format("memory plan: illegal in-place: '{}' and '{}' are both written at op {}: "
                            "one cannot overwrite the other",
                            out.name, in.name, out.first_use));
        }
        if (claimed_by[out.inplace_of] != -1) {
            throw UserError(fmt::format(
                "memory plan: illegal in-place: '{}' and '{}' both ask to overwrite '{}' at op {}; they would "
                "overwrite each other",
                requests[claimed_by[out.inplace_of]].name, out.name, in.name, out.first_use));
        }
        claimed_by[out.inplace_of] = j;
    }
}

}  // namespace

size_t peak_live_bytes(const std::vector<BufferRequest>& requests) {
    validate_requests(requests);
    std::map<int, int64_t> delta;  // op -> change of live bytes at that op
    for (const BufferRequest& r : requests) {
        delta[r.first_use] += static_cast<int64_t>(r.bytes);
        delta[r.last_use + 1] -= static_cast<int64_t>(r.bytes);
        if (r.inplace_of != -1) {  // the pair shares its memory at the op where both are live
            const int64_t shared = static_cast<int64_t>(std::min(r.bytes, requests[r.inplace_of].bytes));
            delta[r.first_use] -= shared;
            delta[r.first_use + 1] += shared;
        }
    }
    int64_t live = 0, peak = 0;
    for (const auto& [op, d] : delta) {
        live += d;
        peak = std::max(peak, live);
    }
    return static_cast<size_t>(peak);
}

Plan plan_buffers(const std::vector<BufferRequest>& requests, size_t alignment) {
    MS_CHECK(alignment > 0, "memory plan: alignment must be positive");
    const size_t peak = peak_live_bytes(requests);  // validates
    const int n = static_cast<int>(requests.size());

    // In-place chains -> items. Chains are simple paths: each buffer claims at most one input, each input is
    // claimed at most once, and first_use strictly increases along a chain.
    std::vector<int> root(n);
    for (int j = 0; j < n; ++j) {
        int r = j;
        while (requests[r].inplace_of != -1) r = requests[r].inplace_of;
        root[j] = r;
    }
    struct Item {
        int first, last;
        size_t bytes;  // rounded up to the alignment
        size_t offset = 0;
    };
    std::vector<Item> items;
    std::vector<int> item_of(n, -1);
    for (int j = 0; j < n; ++j) {
        if (root[j] != j) continue;
        item_of[j] = static_cast<int>(items.size());
        items.push_back({requests[j].first_use, requests[j].last_use, 0});
    }
    for (int j = 0; j < n; ++j) {
        Item& it = items[item_of[root[j]]];
        it.first = std::min(it.first, requests[j].first_use);
        it.last = std::max(it.last, requests[j].last_use);
        it.bytes = std::max(it.bytes, round_up(requests[j].bytes, alignment));
    }

    // Largest first; ties: longer lifetime first, then earlier, then input order (deterministic).
    std::vector<int> order(items.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        const Item &x = items[a], &y = items[b];
        if (x.bytes != y.bytes) return x.bytes > y.bytes;
        if (x.last - x.first != y.last - y.first) return x.last - x.first > y.last - y.first;
        return x.first < y.first;
    });
    std::vector<int> placed;
    std::vector<std::pair<size_t, size_t>> busy;  // [offset, end) of placed items live with the current one
    size_t total = 0;
    for (int id : order) {
        Item& it = items[id];
        busy.clear();
        for (int p : placed) {
            const Item& q = items[p];
            if (q.bytes > 0 && it.first <= q.last && q.first <= it.last)
                busy.emplace_back(q.offset, q.offset + q.bytes);
        }
        std::sort(busy.begin(), busy.end());
        size_t best = std::numeric_limits<size_t>::max(), best_gap = best, cursor = 0;
        for (const auto& [offset, end] : busy) {
            if (offset > cursor && offset - cursor >= it.bytes && offset - cursor < best_gap) {
                best = cursor;
                best_gap = offset - cursor;
            }
            cursor = std::max(cursor, end);
        }
        it.offset = best_gap != std::numeric_limits<size_t>::max() ? best : cursor;
        total = std::max(total, it.offset + it.bytes);
        placed.push_back(id);
    }

    Plan plan;
    plan.offsets.resize(n);
    for (int j = 0; j < n; ++j) plan.offsets[j] = items[item_of[root[j]]].offset;
    plan.total_bytes = total;
    plan.peak_live_bytes = peak;
    return plan;
}

std::optional<std::string> find_plan_violation(const std::vector<BufferRequest>& requests, const Plan& plan,
                                               size_t alignment) {
    const size_t n = requests.size();
    if (plan.offsets.size() != n) {
        return fmt::format("the plan has {} offsets for {} buffers", plan.offsets.size(), n);
    }
    for (size_t i = 0; i < n; ++i) {
        const BufferRequest& r = requests[i];
        if (plan.offsets[i] % alignment != 0) {
            return fmt::format("{} is at offset {}, not a multiple of the alignment {}", describe(r), plan.offsets[i],
                               alignment);
        }
        if (plan.offsets[i] + r.bytes > plan.total_bytes) {
            return fmt::format("{} at offset {} ends past the plan's total of {} bytes", describe(r), plan.offsets[i],
                               plan.total_bytes);
        }
        if (r.inplace_of != -1 && plan.offsets[i] != plan.offsets[r.inplace_of]) {
            return fmt::format("{} is in place of {} but at offset {}, not {}", describe(r),
                               describe(requests[r.inplace_of]), plan.offsets[i], plan.offsets[r.inplace_of]);
        }
    }
    for (size_t i = 0; i < n; ++i) {
        for (size_t j = i + 1; j < n; ++j) {
            const BufferRequest &a = requests[i], &b = requests[j];
            if (a.bytes == 0 || b.bytes == 0 || !lifetimes_intersect(a, b)) continue;
            const size_t oa = plan.offsets[i], ob = plan.offsets[j];
            if (oa >= ob + b.bytes || ob >= oa + a.bytes) continue;
            const bool inplace_pair = (b.inplace_of == static_cast<int>(i) && a.last_use == b.first_use) ||
                                      (a.inplace_of == static_cast<int>(j) && b.last_use == a.first_use);
            if (inplace_pair && oa == ob) continue;
            return fmt::format("{} at [{}, {}) and {} at [{}, {}) are live at the same op and overlap in memory",
                               describe(a), oa, oa + a.bytes, describe(b), ob, ob + b.bytes);
        }
    }
    return std::nullopt;
}

void verify_plan(const std::vector<BufferRequest>& requests, const Plan& plan, size_t alignment) {
    const std::optional<std::string> violation = find_plan_violation(requests, plan, alignment);
    MS_CHECK(!violation, "memory plan is unsafe: {}", *violation);
}

}  // namespace ms
