// arena.cpp: named, categorised allocations over a HostBuffer and a BuddyAllocator (see arena.h).
#include "memory/arena.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "engine/core/check.h"
#include "engine/core/log.h"

namespace ms {
namespace {

constexpr int kTopAllocations = 10;  // allocations listed by report()

size_t round_up(size_t x, size_t multiple) { return (x + multiple - 1) / multiple * multiple; }

}  // namespace

const char* category_name(MemCategory category) {
    switch (category) {
        case MemCategory::kParameter:
            return "parameter";
        case MemCategory::kGradient:
            return "gradient";
        case MemCategory::kOptimizer:
            return "optimizer";
        case MemCategory::kActivation:
            return "activation";
        case MemCategory::kWorkspace:
            return "workspace";
        case MemCategory::kComm:
            return "comm";
    }
    MS_UNREACHABLE("MemCategory {}", static_cast<int>(category));
}

std::string format_bytes(size_t bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double b = static_cast<double>(bytes);
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, ++u;
    return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", b, units[u]);
}

size_t arena_capacity_for(const std::vector<size_t>& sizes, size_t min_block, size_t trim_threshold,
                          BlockFit large_fit) {
    size_t sum = 0;
    for (size_t b : sizes) sum += round_up(std::max<size_t>(b, 1), min_block);
    sum = std::max(sum, min_block);
    for (size_t unit = min_block; unit / 4 <= sum; unit *= 2) {
        const size_t capacity = round_up(sum, unit);
        BuddyAllocator dry(capacity, min_block);
        bool fits = true;
        for (size_t b : sizes) {
            const BlockFit fit = b >= trim_threshold ? large_fit : BlockFit::kPowerOfTwo;
            if (!dry.allocate(b, 1, fit)) {
                fits = false;
                break;
            }
        }
        if (fits) return capacity;
    }
    throw UserError(fmt::format("arena: no capacity up to 4 x {} serves these {} allocations in their order",
                                format_bytes(sum), sizes.size()));
}

Arena::Arena(size_t capacity, size_t min_block, size_t trim_threshold, BlockFit large_fit,
             std::unique_ptr<ArenaMemory> memory)
    : memory_(memory ? std::move(memory)
                     : std::make_unique<HostArenaMemory>(round_up(std::max<size_t>(capacity, 1), min_block))),
      buddy_(round_up(std::max<size_t>(capacity, 1), min_block), min_block),
      trim_threshold_(trim_threshold),
      large_fit_(large_fit) {
    MS_CHECK(memory_->size() >= buddy_.capacity() && memory_->data() != nullptr,
             "arena: its memory ({}) holds {} bytes, less than the capacity of {} bytes", memory_->describe(),
             memory_->size(), buddy_.capacity());
}

Arena::~Arena() {
    if (live_.empty()) return;
    std::string lines;
    for (const std::string& leak : leaks()) lines += "\n    " + leak;
    log_warn("arena: {} allocation(s) still live at destruction (leaks), {} in all:{}", live_.size(),
             format_bytes(buddy_.stats().live_bytes), lines);
}

void* Arena::allocate(size_t bytes, MemCategory category, std::string name) {
    MS_CHECK(!frozen_,
             "allocation inside a training step: '{}' ({}, {}); allocate every buffer before the first "
             "step",
             name, category_name(category), format_bytes(bytes));
    const BlockFit fit = bytes >= trim_threshold_ ? large_fit_ : BlockFit::kPowerOfTwo;
    const std::optional<size_t> offset = buddy_.allocate(bytes, 1, fit);
    if (!offset) {
        const BuddyStats s = buddy_.stats();
        throw UserError(fmt::format(
            "out of memory: the arena cannot hold '{}' ({}, {}): {} of {} is free but the largest free block is {}\n"
            "{}\n"
            "---> HINT: give the arena more capacity, or lower the micro-batch size (activations scale with it)",
            name, category_name(category), format_bytes(bytes), format_bytes(s.free_bytes), format_bytes(s.capacity),
            format_bytes(s.largest_free_block), report()));
    }
    CategoryStats& c = by_category_[static_cast<int>(category)];
    c.live_bytes += bytes;
    c.live_allocations += 1;
    c.peak_live_bytes = std::max(c.peak_live_bytes, c.live_bytes);
    live_.emplace(*offset, Allocation{std::move(name), category, bytes});
    return static_cast<char*>(memory_->data()) + *offset;
}

void Arena::free(void* p) {
    if (p == nullptr) return;
    const char* base = static_cast<const char*>(memory_->data());
    const char* q = static_cast<const char*>(p);
    MS_CHECK(q >= base && q < base + buddy_.capacity(), "arena: free of {} which is outside the arena [{}, +{})", p,
             memory_->data(), buddy_.capacity());
    const auto it = live_.find(static_cast<size_t>(q - base));
    MS_CHECK(it != live_.end(), "arena: free of {} (offset {}) which is not a live allocation (double free?)", p,
             q - base);
    CategoryStats& c = by_category_[static_cast<int>(it->second.category)];
    c.live_bytes -= it->second.bytes;
    c.live_allocations -= 1;
    buddy_.free(it->first);
    live_.erase(it);
}

std::vector<std::pair<size_t, const Arena::Allocation*>> Arena::sorted_live() const {
    std::vector<std::pair<size_t, const Allocation*>> v;
    v.reserve(live_.size());
    for (const auto& [offset, a] : live_) v.emplace_back(offset, &a);
    std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) {
        return x.second->bytes != y.second->bytes ? x.second->bytes > y.second->bytes : x.first < y.first;
    });
    return v;
}

std::string Arena::report() const {
    const BuddyStats s = buddy_.stats();
    std::string r = fmt::format(
        "arena: capacity {}, live {} in {} allocation(s) holding {} of blocks, peak live {}, free {} "
        "(largest free block {})\n"
        "arena: fragmentation: internal {:.1f}% (1 - live / block bytes), external {:.1f}% "
        "(1 - largest free block / free)\n"
        "arena: live by category:",
        format_bytes(s.capacity), format_bytes(s.live_bytes), s.live_allocations, format_bytes(s.live_block_bytes),
        format_bytes(s.peak_live_bytes), format_bytes(s.free_bytes), format_bytes(s.largest_free_block),
        100.0 * s.internal_fragmentation, 100.0 * s.external_fragmentation);
    for (int c = 0; c < kNumMemCategories; ++c) {
        const CategoryStats& cs = by_category_[c];
        r += fmt::format("\n    {:<10} {:>11} in {} allocation(s), peak {}", category_name(static_cast<MemCategory>(c)),
                         format_bytes(cs.live_bytes), cs.live_allocations, format_bytes(cs.peak_live_bytes));
    }
    const auto live = sorted_live();
    if (!live.empty()) {
        r +=
            fmt::format("\narena: largest live allocations ({} of {}):", std::min<size_t>(live.size(), kTopAllocations),
                        live.size());
        for (size_t i = 0; i < live.size() && i < kTopAllocations; ++i) {
            const auto& [offset, a] = live[i];
            r += fmt::format("\n    {:>11}  {:<10} '{}' at offset {}", format_bytes(a->bytes),
                             category_name(a->category), a->name, offset);
        }
    }
    return r;
}

std::vector<std::string> Arena::leaks() const {
    std::vector<std::string> lines;
    for (const auto& [offset, a] : sorted_live()) {
        lines.push_back(fmt::format("'{}' ({}, {})", a->name, category_name(a->category), format_bytes(a->bytes)));
    }
    return lines;
}

}  // namespace ms
