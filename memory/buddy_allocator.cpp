// buddy_allocator.cpp: split, trim and coalesce over per-order free bitmaps (design in buddy_allocator.h).
#include "memory/buddy_allocator.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "engine/core/check.h"

namespace ms {

// ---- FreeBitmap ----

BuddyAllocator::FreeBitmap::FreeBitmap(size_t blocks) : size_(blocks) {
    size_t bits = blocks;
    do {
        const size_t words = (bits + 63) / 64;
        levels_.emplace_back(words, 0);
        bits = words;
    } while (bits > 1);
}

void BuddyAllocator::FreeBitmap::set(size_t i) {
    for (auto& level : levels_) {
        uint64_t& word = level[i >> 6];
        const bool was_empty = word == 0;
        word |= uint64_t{1} << (i & 63);
        if (!was_empty) return;  // the summary above already says "non-empty"
        i >>= 6;
    }
}

void BuddyAllocator::FreeBitmap::clear(size_t i) {
    for (auto& level : levels_) {
        uint64_t& word = level[i >> 6];
        word &= ~(uint64_t{1} << (i & 63));
        if (word != 0) return;  // the word stays non-empty: the summary above is unchanged
        i >>= 6;
    }
}

size_t BuddyAllocator::FreeBitmap::find_first() const {
    size_t i = 0;
    for (size_t l = levels_.size(); l-- > 0;) i = (i << 6) | static_cast<size_t>(std::countr_zero(levels_[l][i]));
    return i;
}

bool BuddyAllocator::FreeBitmap::summary_consistent() const {
    for (size_t l = 0; l + 1 < levels_.size(); ++l) {
        for (size_t w = 0; w < levels_[l].size(); ++w) {
            const bool bit = ((levels_[l + 1][w >> 6] >> (w & 63)) & 1) != 0;
            if (bit != (levels_[l][w] != 0)) return false;
        }
    }
    return true;
}

// ---- BuddyAllocator ----

BuddyAllocator::BuddyAllocator(size_t capacity, size_t min_block) : capacity_(capacity), min_block_(min_block) {
    MS_CHECK(std::has_single_bit(min_block), "buddy allocator: min_block {} is not a power of two", min_block);
    MS_CHECK(capacity > 0 && capacity % min_block == 0,
             "buddy allocator: capacity {} is not a positive multiple of min_block {}", capacity, min_block);
    min_shift_ = std::countr_zero(min_block);
    const size_t units = capacity >> min_shift_;
    const int orders = std::bit_width(units);  // the largest order k has 2^k <= units
    for (int k = 0; k < orders; ++k) free_.emplace_back(units >> k);
    for (const auto& [offset, bytes] : initial_blocks()) {
        const int k = std::countr_zero(bytes >> min_shift_);
        add_free(k, (offset >> min_shift_) >> k);
    }
    stats_.capacity = capacity;
}

std::vector<std::pair<size_t, size_t>> BuddyAllocator::initial_blocks() const {
    std::vector<std::pair<size_t, size_t>> blocks;
    const size_t units = capacity_ >> min_shift_;
    size_t unit = 0;
    for (int k = std::bit_width(units) - 1; k >= 0; --k) {
        if ((units >> k) & 1) {
            blocks.emplace_back(unit << min_shift_, (size_t{1} << k) << min_shift_);
            unit += size_t{1} << k;
        }
    }
    return blocks;
}

void BuddyAllocator::add_free(int order, size_t index) {
    free_[order].set(index);
    nonempty_ |= uint64_t{1} << order;
}

void BuddyAllocator::remove_free(int order, size_t index) {
    free_[order].clear(index);
    if (!free_[order].any()) nonempty_ &= ~(uint64_t{1} << order);
}

size_t BuddyAllocator::block_size_for(size_t bytes, size_t alignment) const {
    if (bytes > capacity_ || alignment > capacity_) return 0;
    const size_t units = std::max<size_t>(1, (bytes + min_block_ - 1) >> min_shift_);
    const size_t align_units = std::max<size_t>(1, alignment >> min_shift_);
    const int order = std::max(static_cast<int>(std::bit_width(units - 1)), std::countr_zero(align_units));
    if (order >= num_orders()) return 0;
    return min_block_ << order;
}

std::optional<size_t> BuddyAllocator::allocate(size_t bytes, size_t alignment, BlockFit fit) {
    MS_CHECK(std::has_single_bit(alignment), "buddy allocator: alignment {} is not a power of two", alignment);
    if (fit == BlockFit::kPacked) return allocate_packed(bytes, alignment);
    const size_t block = block_size_for(bytes, alignment);
    const int order = block == 0 ? num_orders() : std::countr_zero(block >> min_shift_);
    const uint64_t candidates = order < 64 ? nonempty_ & (~uint64_t{0} << order) : 0;
    if (block == 0 || candidates == 0) {
        ++stats_.failed_allocations;
        return std::nullopt;
    }
    // The smallest order with a free block; its lowest-addressed block.
    int k = std::countr_zero(candidates);
    const size_t index = free_[k].find_first();
    remove_free(k, index);
    size_t unit = index << k;
    const size_t offset_unit = unit;
    // Split down to `order`: the right halves become free blocks.
    while (k > order) {
        --k;
        add_free(k, (unit >> k) + 1);
    }
    // Trim: keep the first `want` units of the 2^order block, free the rest as its binary decomposition.
    size_t want = size_t{1} << order;
    if (fit == BlockFit::kTrimmed) {
        want = std::max<size_t>(1, (bytes + min_block_ - 1) >> min_shift_);
        size_t remaining = want;
        while (remaining != (size_t{1} << k)) {
            --k;
            const size_t half = size_t{1} << k;
            if (remaining <= half) {
                add_free(k, (unit >> k) + 1);  // the right half is unused
            } else {
                unit += half;  // the left half is wholly used; go on in the right half
                remaining -= half;
            }
        }
    }

    const size_t offset = offset_unit << min_shift_;
    live_.emplace(offset, Allocation{bytes, want, static_cast<uint8_t>(order), fit});
    stats_.live_allocations += 1;
    stats_.live_bytes += bytes;
    stats_.live_block_bytes += want << min_shift_;
    stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
    stats_.peak_block_bytes = std::max(stats_.peak_block_bytes, stats_.live_block_bytes);
    stats_.high_water_bytes = std::max(stats_.high_water_bytes, offset + (want << min_shift_));
    return offset;
}

template <typename F>
void BuddyAllocator::for_each_aligned_block(size_t begin, size_t end, F&& f) {
    for (size_t unit = begin; unit < end;) {
        int k = std::bit_width(end - unit) - 1;
        if (unit != 0) k = std::min(k, std::countr_zero(unit));
        f(unit, k);
        unit += size_t{1} << k;
    }
}

std::optional<size_t> BuddyAllocator::allocate_packed(size_t bytes, size_t alignment) {
    const size_t want = std::max<size_t>(1, (bytes + min_block_ - 1) >> min_shift_);
    const size_t align_units = std::max<size_t>(1, alignment >> min_shift_);
    // The lowest aligned start of `want` contiguous free units: free blocks in offset order, merged into runs.
    const std::vector<std::pair<size_t, size_t>> blocks = free_blocks();
    std::optional<size_t> start;
    size_t run_begin = 0, run_end = 0;
    for (const auto& [offset, size] : blocks) {
        const size_t unit = offset >> min_shift_;
        if (unit != run_end) run_begin = unit;  // a gap: a new run starts here
        run_end = unit + (size >> min_shift_);
        const size_t s = (run_begin + align_units - 1) / align_units * align_units;
        if (s + want <= run_end) {
            start = s;
            break;
        }
    }
    if (!start) {
        ++stats_.failed_allocations;
        return std::nullopt;
    }
    // Take [start, end) out of the free blocks it overlaps; what of them lies outside goes back, coalesced.
    const size_t end = *start + want;
    for (const auto& [offset, size] : blocks) {
        const size_t unit = offset >> min_shift_, units = size >> min_shift_;
        if (unit + units <= *start) continue;
        if (unit >= end) break;
        const int k = std::countr_zero(units);
        remove_free(k, unit >> k);
        for_each_aligned_block(unit, std::max(unit, *start), [&](size_t u, int j) { release(u, j); });
        for_each_aligned_block(std::min(unit + units, end), unit + units, [&](size_t u, int j) { release(u, j); });
    }
    const size_t offset = *start << min_shift_;
    live_.emplace(offset, Allocation{bytes, want, 0, BlockFit::kPacked});
    stats_.live_allocations += 1;
    stats_.live_bytes += bytes;
    stats_.live_block_bytes += want << min_shift_;
    stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
    stats_.peak_block_bytes = std::max(stats_.peak_block_bytes, stats_.live_block_bytes);
    stats_.high_water_bytes = std::max(stats_.high_water_bytes, offset + (want << min_shift_));
    return offset;
}

template <typename F>
void BuddyAllocator::for_each_part(size_t unit, const Allocation& a, F&& f) {
    if (a.fit == BlockFit::kPowerOfTwo) {
        f(unit, static_cast<int>(a.order));
        return;
    }
    if (a.fit == BlockFit::kPacked) {
        for_each_aligned_block(unit, unit + a.units, f);
        return;
    }
    for (int k = a.order; k >= 0; --k) {
        if ((a.units >> k) & 1) {
            f(unit, k);
            unit += size_t{1} << k;
        }
    }
}

void BuddyAllocator::release(size_t unit, int order) {
    int k = order;
    while (k + 1 < num_orders()) {
        const size_t buddy = (unit >> k) ^ 1;
        if (!free_[k].test(buddy)) break;
        remove_free(k, buddy);
        unit &= ~(size_t{1} << k);
        ++k;
    }
    add_free(k, unit >> k);
}

void BuddyAllocator::free(size_t offset) {
    const auto it = live_.find(offset);
    MS_CHECK(it != live_.end(),
             "buddy allocator: free of offset {} that is not a live allocation (double free or foreign offset)",
             offset);
    const Allocation a = it->second;
    live_.erase(it);
    for_each_part(offset >> min_shift_, a, [&](size_t unit, int k) { release(unit, k); });
    stats_.live_allocations -= 1;
    stats_.live_bytes -= a.requested;
    stats_.live_block_bytes -= a.units << min_shift_;
}

size_t BuddyAllocator::block_bytes(size_t offset) const {
    const auto it = live_.find(offset);
    MS_CHECK(it != live_.end(), "buddy allocator: offset {} is not a live allocation", offset);
    return it->second.units << min_shift_;
}

BuddyStats BuddyAllocator::stats() const {
    BuddyStats s = stats_;
    s.free_bytes = capacity_ - s.live_block_bytes;
    s.largest_free_block = nonempty_ == 0 ? 0 : min_block_ << (63 - std::countl_zero(nonempty_));
    s.internal_fragmentation = s.live_block_bytes == 0
                                   ? 0.0
                                   : 1.0 - static_cast<double>(s.live_bytes) / static_cast<double>(s.live_block_bytes);
    s.external_fragmentation =
        s.free_bytes == 0 ? 0.0 : 1.0 - static_cast<double>(s.largest_free_block) / static_cast<double>(s.free_bytes);
    return s;
}

void BuddyAllocator::reset_peaks() {
    stats_.peak_live_bytes = stats_.live_bytes;
    stats_.peak_block_bytes = stats_.live_block_bytes;
    stats_.high_water_bytes = 0;
    for (const auto& [offset, a] : live_) {
        stats_.high_water_bytes = std::max(stats_.high_water_bytes, offset + (a.units << min_shift_));
    }
    stats_.failed_allocations = 0;
}

std::vector<std::pair<size_t, size_t>> BuddyAllocator::free_blocks() const {
    std::vector<std::pair<size_t, size_t>> blocks;
    for (int k = 0; k < num_orders(); ++k) {
        const auto& words = free_[k].bits();
        for (size_t w = 0; w < words.size(); ++w) {
            for (uint64_t bits = words[w]; bits != 0; bits &= bits - 1) {
                const size_t index = (w << 6) | static_cast<size_t>(std::countr_zero(bits));
                blocks.emplace_back((index << k) << min_shift_, min_block_ << k);
            }
        }
    }
    std::sort(blocks.begin(), blocks.end());
    return blocks;
}

std::optional<std::string> BuddyAllocator::validate() const {
    // Every block, free and allocated, as (offset, bytes, free?).
    struct Block {
        size_t offset, bytes;
        bool is_free;
    };
    std::vector<Block> blocks;
    for (int k = 0; k < num_orders(); ++k) {
        if (!free_[k].summary_consistent()) return fmt::format("order {}: summary bits disagree with the bitmap", k);
        if (free_[k].any() != (((nonempty_ >> k) & 1) != 0)) {
            return fmt::format("order {}: non-empty mask says {}, bitmap says {}", k, (nonempty_ >> k) & 1,
                               free_[k].any());
        }
    }
    for (const auto& [offset, bytes] : free_blocks()) {
        const int k = std::countr_zero(bytes >> min_shift_);
        const size_t index = (offset >> min_shift_) >> k;
        if (free_[k].test(index ^ 1)) {
            return fmt::format("free blocks at {} and {} of {} bytes are buddies but not coalesced", offset,
                               ((index ^ 1) << k) << min_shift_, bytes);
        }
        blocks.push_back({offset, bytes, true});
    }
    size_t live_bytes = 0, live_units = 0;
    for (const auto& [offset, a] : live_) {
        live_bytes += a.requested;
        live_units += a.units;
        if (a.requested > (a.units << min_shift_)) {
            return fmt::format("allocation at {} holds {} bytes for a request of {}", offset, a.units << min_shift_,
                               a.requested);
        }
        for_each_part(offset >> min_shift_, a, [&](size_t unit, int k) {
            blocks.push_back({unit << min_shift_, min_block_ << k, false});
        });
    }
    std::sort(blocks.begin(), blocks.end(), [](const Block& x, const Block& y) { return x.offset < y.offset; });
    size_t cursor = 0;
    for (const Block& b : blocks) {
        if (b.offset % b.bytes != 0) {
            return fmt::format("{} block at {} is not aligned to its size {}", b.is_free ? "free" : "allocated",
                               b.offset, b.bytes);
        }
        if (b.offset != cursor) {
            return fmt::format("{} block at {} (+{}) does not start where the previous block ends ({}): {}",
                               b.is_free ? "free" : "allocated", b.offset, b.bytes, cursor,
                               b.offset < cursor ? "overlap" : "gap");
        }
        cursor += b.bytes;
    }
    if (cursor != capacity_) return fmt::format("blocks cover [0, {}) of a capacity of {}", cursor, capacity_);
    if (live_bytes != stats_.live_bytes || (live_units << min_shift_) != stats_.live_block_bytes ||
        live_.size() != stats_.live_allocations) {
        return fmt::format("statistics say {} allocations, {} bytes in {} block bytes; the live set has {}, {}, {}",
                           stats_.live_allocations, stats_.live_bytes, stats_.live_block_bytes, live_.size(),
                           live_bytes, live_units << min_shift_);
    }
    return std::nullopt;
}

}  // namespace ms
