// fuzz_buddy.cpp: libFuzzer target for memory/buddy_allocator. The input bytes are a program:
//
//   byte 0        min_block = 16 << (b % 5)                      (16 .. 256 bytes)
//   bytes 1-2     capacity  = (1 + u16 % 1024) * min_block      (any multiple, powers of two or not)
//   then 4 bytes per op:
//     op & 1 == 0 (or nothing live)   allocate(u16 % (capacity + capacity / 8), 1 << (b3 % 16),
//                                              (op & 2) ? kTrimmed : kPowerOfTwo)
//     op & 1 == 1                     free(the (u16 % live)-th live allocation by offset)
//
// After every op the allocator's validate() (tiling, alignment, coalescing, statistics) and a reference model of
// the live blocks (inside the capacity, aligned, no overlap; a failed allocate means no naturally aligned free
// range of the needed size exists) must agree; at the end, freeing everything must restore the initial blocks.
// Any violation is __builtin_trap().
//
// Build and run (Clang only; see the top-level CMakeLists.txt):
//   CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DMS_BUILD_FUZZERS=ON -DMS_ENABLE_CUDA=OFF
//   ninja -C build-fuzz fuzz_buddy && ./build-fuzz/fuzz_buddy -max_total_time=20
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>

#include "memory/buddy_allocator.h"

namespace {

#define FUZZ_CHECK(cond)               \
    do {                               \
        if (!(cond)) __builtin_trap(); \
    } while (0)

// True if some naturally aligned range of `size` bytes in [0, capacity) touches no live block.
bool has_free_range(const std::map<size_t, size_t>& live, size_t capacity, size_t size) {
    for (size_t start = 0; start + size <= capacity; start += size) {
        auto it = live.lower_bound(start + size);
        if (it == live.begin()) return true;
        --it;
        if (it->first + it->second <= start) return true;
    }
    return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 3) return 0;
    const size_t min_block = size_t{16} << (data[0] % 5);
    const size_t capacity = (1 + ((size_t{data[1]} << 8 | data[2]) % 1024)) * min_block;
    ms::BuddyAllocator b(capacity, min_block);
    std::map<size_t, size_t> live;  // offset -> block bytes
    for (size_t pos = 3; pos + 4 <= size; pos += 4) {
        const uint8_t op = data[pos];
        const size_t arg = size_t{data[pos + 1]} << 8 | data[pos + 2];
        if ((op & 1) == 0 || live.empty()) {
            const size_t bytes = arg % (capacity + capacity / 8);
            const size_t alignment = size_t{1} << (data[pos + 3] % 16);
            const ms::BlockFit fit = (op & 2) ? ms::BlockFit::kTrimmed : ms::BlockFit::kPowerOfTwo;
            const size_t pow2_block = b.block_size_for(bytes, alignment);
            const auto got = b.allocate(bytes, alignment, fit);
            if (!got) {
                FUZZ_CHECK(pow2_block == 0 || !has_free_range(live, capacity, pow2_block));
            } else {
                const size_t offset = *got, block = b.block_bytes(offset);
                FUZZ_CHECK(pow2_block != 0 && offset % pow2_block == 0 && offset % alignment == 0);
                FUZZ_CHECK(block >= bytes && block <= pow2_block && offset + block <= capacity);
                auto next = live.lower_bound(offset);
                FUZZ_CHECK(next == live.end() || next->first >= offset + block);
                FUZZ_CHECK(next == live.begin() || std::prev(next)->first + std::prev(next)->second <= offset);
                live[offset] = block;
            }
        } else {
            auto it = live.begin();
            std::advance(it, static_cast<long>(arg % live.size()));
            b.free(it->first);
            FUZZ_CHECK(!b.is_live(it->first));
            live.erase(it);
        }
        FUZZ_CHECK(b.stats().live_allocations == live.size());
        FUZZ_CHECK(!b.validate());
    }
    for (const auto& [offset, block] : live) b.free(offset);
    FUZZ_CHECK(b.free_blocks() == b.initial_blocks());
    FUZZ_CHECK(b.stats().live_bytes == 0 && b.stats().live_block_bytes == 0);
    FUZZ_CHECK(!b.validate());
    return 0;
}
