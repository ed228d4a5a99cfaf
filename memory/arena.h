// arena.h: one large allocation per device, carved into named tensors by a buddy allocator.
//
// The host arena is one HostBuffer (mmap'd, advised for huge pages, touched once at construction: see
// host_buffer.h for why nothing large is allocated inside a step); a device arena is one allocation a backend
// supplies as an ArenaMemory (memory/arena_memory.h; CUDA: managed memory) behind the same BuddyAllocator. Every
// allocation carries a name and a MemCategory so that an out-of-memory error, a leak or a report says what holds
// the memory, by category and by tensor.
//
// Placement: allocations of at least trim_threshold bytes use `large_fit`, BlockFit::kTrimmed by default (they hold
// round_up(bytes, min_block), not the next power of two); smaller ones use whole power-of-two blocks. The trainer,
// which allocates everything once at setup, uses trim_threshold 0 and BlockFit::kPacked: every allocation holds
// round_up(bytes, min_block), packed without gaps, so a capacity of the planned bytes suffices. Every pointer is
// aligned to min(min_block, page size) at least.
//
// Guards: set_frozen(true) makes any allocate() a fatal MS_CHECK ("allocation inside a training step: ...") --
// the trainer freezes the arena for the duration of each step, where an allocation is a bug (and a first-touch
// stall), not a recoverable condition. An out-of-memory allocate() throws ms::UserError carrying report() and a
// hint. Freeing a pointer the arena did not hand out is fatal. The destructor warns about live allocations.
// Not thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "memory/arena_memory.h"
#include "memory/buddy_allocator.h"

namespace ms {

enum class MemCategory : uint8_t { kParameter, kGradient, kOptimizer, kActivation, kWorkspace, kComm };
inline constexpr int kNumMemCategories = 6;
const char* category_name(MemCategory category);  // "parameter", "gradient", ...

// "1.50 MiB": binary units, two decimals.
std::string format_bytes(size_t bytes);

// The smallest capacity at which Arena(capacity, min_block, trim_threshold, large_fit) serves allocations of
// `sizes`, made in this order and never freed: a dry run of the buddy allocator over offsets (nothing is allocated
// or touched). With kPacked (and trim_threshold 0) that is the sum of the sizes rounded up to min_block. A trimmed
// block is still carved from a free power-of-two block, so with kTrimmed the answer may exceed that sum: four
// 498 MiB blocks need 2048 MiB, not 1992. The candidates tried are the sum rounded up to min_block << k for
// k = 0, 1, ...; throws UserError if none up to four times the sum serves.
size_t arena_capacity_for(const std::vector<size_t>& sizes, size_t min_block = 256,
                          size_t trim_threshold = size_t{1} << 20, BlockFit large_fit = BlockFit::kTrimmed);

class Arena {
  public:
    // capacity: rounded up to a multiple of min_block (a power of two). memory: where the bytes live, at least the
    // rounded capacity (e.g. Backend::make_arena_memory); nullptr: a HostArenaMemory of the rounded capacity.
    explicit Arena(size_t capacity, size_t min_block = 256, size_t trim_threshold = size_t{1} << 20,
                   BlockFit large_fit = BlockFit::kTrimmed, std::unique_ptr<ArenaMemory> memory = nullptr);
    ~Arena();
    Arena(const Arena&) = delete;
    Arena& operator=(const Arena&) = delete;

    // Never nullptr: throws UserError on out-of-memory; fatal when frozen.
    void* allocate(size_t bytes, MemCategory category, std::string name);
    void free(void* p);  // nullptr is a no-op
    // [p, p + bytes) of an allocation = 0, by the memory's own means (MemoryBlock clears every block with it).
    void zero(void* p, size_t bytes) { memory_->zero(p, bytes); }

    void set_frozen(bool frozen) { frozen_ = frozen; }
    bool frozen() const { return frozen_; }

    // Capacity, live/peak/free bytes, fragmentation, live bytes by category and the largest live allocations.
    std::string report() const;
    // One line per live allocation ("'h.3.qkv' (activation, 37.75 MiB)"), largest first: at exit, each is a leak.
    std::vector<std::string> leaks() const;

    BuddyStats stats() const { return buddy_.stats(); }
    size_t live_bytes(MemCategory category) const { return by_category_[static_cast<int>(category)].live_bytes; }
    size_t peak_live_bytes(MemCategory category) const {
        return by_category_[static_cast<int>(category)].peak_live_bytes;
    }
    size_t capacity() const { return buddy_.capacity(); }
    const void* base() const { return memory_->data(); }
    ArenaMemory& memory() { return *memory_; }

  private:
    struct Allocation {
        std::string name;
        MemCategory category;
        size_t bytes;
    };
    struct CategoryStats {
        size_t live_bytes = 0;
        size_t live_allocations = 0;
        size_t peak_live_bytes = 0;
    };
    // Live allocations, largest first (ties by offset).
    std::vector<std::pair<size_t, const Allocation*>> sorted_live() const;

    std::unique_ptr<ArenaMemory> memory_;
    BuddyAllocator buddy_;
    size_t trim_threshold_;
    BlockFit large_fit_;
    bool frozen_ = false;
    std::unordered_map<size_t, Allocation> live_;  // key: offset in memory_
    std::array<CategoryStats, kNumMemCategories> by_category_{};
};

}  // namespace ms
