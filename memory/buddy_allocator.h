// buddy_allocator.h: a binary buddy allocator over byte offsets [0, capacity); it hands out offsets, never
// touches memory, so the same allocator serves a host arena (memory/arena.h) and, later, a cudaMalloc'd one.
//
// Blocks: order k is min_block << k bytes, naturally aligned (offset % size == 0). The capacity is any multiple of
// min_block; it starts as its binary decomposition into maximal aligned blocks (one block when capacity is
// min_block times a power of two). allocate() takes the lowest-addressed free block of the smallest order that
// fits (size and alignment) and splits it; free() coalesces a block with its buddy (offset ^ size) as long as the
// buddy is free, so freeing everything always restores the initial decomposition.
//
// Three fits, chosen per call:
//   kPowerOfTwo  the classic buddy: the request gets the whole 2^k block (internal fragmentation up to ~50%).
//   kTrimmed     the request gets the 2^k block's offset and alignment, but only round_up(bytes, min_block) of
//                it: the tail is split off and returned to the free lists at once (Linux's alloc_pages_exact).
//                The allocation is then the binary decomposition of its size; free() releases each part.
//   kPacked      round_up(bytes, min_block) at the lowest offset (aligned as asked) where that much contiguous
//                memory is free, across free blocks of any orders: no free 2^k block is needed, so allocations
//                made once and never freed pack from offset 0 without gaps, and a capacity of the sum of their
//                rounded sizes holds them (a trimmed 5.5 MiB block needs a free 8 MiB block; a packed one does
//                not). The allocation is the aligned decomposition of its range; free() releases each part.
//                Costs O(capacity / min_block / 64) per call (a scan of the free bitmaps): for setup-time use.
//
// Costs: every operation is O(orders) = O(log(capacity / min_block)) bit operations. The free lists are one
// bitmap per order with a 64-ary summary tree, so "lowest free block of order k" is a few count-trailing-zeros;
// a mask of non-empty orders finds the order in O(1). Metadata: ~2 bits per min_block of capacity
// (capacity / 1024 bytes for 256-byte blocks) plus a hash map entry per live allocation.
//
// Invariants (validate() checks them all): free and allocated blocks tile [0, capacity) exactly; every block is
// aligned to its size; no two free buddies of one order coexist (fully coalesced); the statistics match the live
// allocations. Not thread-safe: arenas allocate at setup, on one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ms {

enum class BlockFit : uint8_t {
    kPowerOfTwo,  // the whole power-of-two block
    kTrimmed,     // the block's start, trimmed to round_up(bytes, min_block); the tail is freed at once
    kPacked,      // round_up(bytes, min_block) at the lowest offset with that much contiguous free memory
};

struct BuddyStats {
    size_t capacity = 0;
    size_t live_allocations = 0;
    size_t live_bytes = 0;              // sum of requested sizes of live allocations
    size_t live_block_bytes = 0;        // sum of the block bytes they hold
    size_t peak_live_bytes = 0;         // max over time of live_bytes
    size_t peak_block_bytes = 0;        // max over time of live_block_bytes
    size_t high_water_bytes = 0;        // max over time of the end offset of any handed-out block
    size_t free_bytes = 0;              // capacity - live_block_bytes
    size_t largest_free_block = 0;      // bytes of the largest free block (the largest allocation that can succeed)
    size_t failed_allocations = 0;      // allocate() calls that returned nullopt
    double internal_fragmentation = 0;  // 1 - live_bytes / live_block_bytes (0 when nothing is live)
    double external_fragmentation = 0;  // 1 - largest_free_block / free_bytes (0 when nothing is free)
};

class BuddyAllocator {
  public:
    // capacity: a positive multiple of min_block; min_block: a power of two (256 suits AVX-512 and CUDA).
    explicit BuddyAllocator(size_t capacity, size_t min_block = 256);

    // Offset of a block of at least `bytes` (0 counts as 1), aligned to `alignment` (a power of two; any
    // alignment up to the block size is free), or nullopt when no free block fits.
    std::optional<size_t> allocate(size_t bytes, size_t alignment = 1, BlockFit fit = BlockFit::kPowerOfTwo);
    // Releases a live allocation; anything else (unknown offset, double free) is a fatal MS_CHECK.
    void free(size_t offset);

    bool is_live(size_t offset) const { return live_.count(offset) != 0; }
    // Block bytes a live allocation holds (a power of two for kPowerOfTwo, round_up(bytes, min_block) trimmed).
    size_t block_bytes(size_t offset) const;

    BuddyStats stats() const;
    void reset_peaks();  // peaks := current values (e.g. to measure one training step)

    size_t capacity() const { return capacity_; }
    size_t min_block() const { return min_block_; }
    int num_orders() const { return static_cast<int>(free_.size()); }
    // Bytes of the smallest block that serves (bytes, alignment, kPowerOfTwo); 0 if larger than any block.
    size_t block_size_for(size_t bytes, size_t alignment = 1) const;

    // The free blocks as (offset, bytes), ascending by offset. O(capacity / min_block / 64): for tests and reports.
    std::vector<std::pair<size_t, size_t>> free_blocks() const;
    // The blocks of a fresh allocator of this capacity (its binary decomposition), ascending by offset.
    std::vector<std::pair<size_t, size_t>> initial_blocks() const;
    // Checks every invariant listed above; returns a description of the first violation. Same cost as free_blocks().
    std::optional<std::string> validate() const;

  private:
    // The free blocks of one order: bit i = block [i << order, (i + 1) << order) in min_block units is free.
    // levels_[0] holds the bits, levels_[l + 1] has bit w set iff word w of levels_[l] is non-zero.
    class FreeBitmap {
      public:
        explicit FreeBitmap(size_t blocks);
        size_t size() const { return size_; }
        bool any() const { return levels_.back()[0] != 0; }
        bool test(size_t i) const { return i < size_ && ((levels_[0][i >> 6] >> (i & 63)) & 1) != 0; }
        void set(size_t i);
        void clear(size_t i);
        size_t find_first() const;  // requires any()
        const std::vector<uint64_t>& bits() const { return levels_[0]; }
        bool summary_consistent() const;

      private:
        size_t size_;
        std::vector<std::vector<uint64_t>> levels_;
    };

    struct Allocation {
        size_t requested;  // bytes asked for
        size_t units;      // min_blocks held
        uint8_t order;     // order of the block it was carved from (its alignment); 0 for kPacked
        BlockFit fit;
    };

    void add_free(int order, size_t index);
    void remove_free(int order, size_t index);
    // Frees the block of `order` at unit offset `unit`, coalescing with free buddies.
    void release(size_t unit, int order);
    std::optional<size_t> allocate_packed(size_t bytes, size_t alignment);
    // Calls f(unit, order) for the maximal aligned blocks that tile the units [begin, end), left to right.
    template <typename F>
    static void for_each_aligned_block(size_t begin, size_t end, F&& f);
    // The parts (unit offset, order) of an allocation: one block, or the binary decomposition of a trimmed size.
    template <typename F>
    static void for_each_part(size_t unit, const Allocation& a, F&& f);

    size_t capacity_;
    size_t min_block_;
    int min_shift_;                                // log2(min_block)
    std::vector<FreeBitmap> free_;                 // one per order
    uint64_t nonempty_ = 0;                        // bit k: order k has a free block
    std::unordered_map<size_t, Allocation> live_;  // key: byte offset
    BuddyStats stats_;
};

}  // namespace ms
