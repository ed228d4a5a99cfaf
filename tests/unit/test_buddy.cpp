// test_buddy.cpp: memory/buddy_allocator -- hand-worked splits, trims, packing and coalescing, then random
// allocate/free sequences (all three fits) checked op by op against a reference model of the live blocks.
//
// The reference model is a std::map offset -> (requested, block bytes). After every allocate it checks: inside the
// capacity, aligned to the requested alignment and to the block's own size, block bytes as the fit promises, no
// overlap with any live block. After every failed allocate it checks that no naturally aligned range of the needed
// block size is free in its own view (a fully coalescing buddy allocator can always serve such a request). A packed
// allocation must land exactly at the reference's lowest aligned free run, and fail only when there is none. At the
// end, freeing everything must restore the initial decomposition (one block for a power-of-two capacity).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "memory/buddy_allocator.h"

namespace {

using ms::BlockFit;
using ms::BuddyAllocator;
using Blocks = std::vector<std::pair<size_t, size_t>>;

TEST(BuddyTest, SplitsLowestBlockAndCoalescesBack) {
    BuddyAllocator b(16 * 256, 256);  // orders 0..4
    EXPECT_EQ(b.num_orders(), 5);
    EXPECT_EQ(b.free_blocks(), (Blocks{{0, 4096}}));
    const auto a = b.allocate(100);  // one 256-byte block: splits 4096 -> 2048 + 1024 + 512 + 256 + [256]
    ASSERT_TRUE(a);
    EXPECT_EQ(*a, 0u);
    EXPECT_EQ(b.free_blocks(), (Blocks{{256, 256}, {512, 512}, {1024, 1024}, {2048, 2048}}));
    const auto c = b.allocate(600);  // 1024: the free 1024 at 1024, not a split of 2048
    ASSERT_TRUE(c);
    EXPECT_EQ(*c, 1024u);
    const auto d = b.allocate(256);  // the lowest free 256
    ASSERT_TRUE(d);
    EXPECT_EQ(*d, 256u);
    EXPECT_EQ(b.validate(), std::nullopt);
    b.free(*a);
    b.free(*d);  // 0 and 256 coalesce, then with 512 into [0, 1024)
    EXPECT_EQ(b.free_blocks(), (Blocks{{0, 1024}, {2048, 2048}}));
    b.free(*c);
    EXPECT_EQ(b.free_blocks(), (Blocks{{0, 4096}}));
    EXPECT_EQ(b.validate(), std::nullopt);
}

TEST(BuddyTest, TrimmedAllocationFreesItsTail) {
    BuddyAllocator b(16 * 256, 256);
    const auto a = b.allocate(5 * 256 - 10, 1, BlockFit::kTrimmed);  // 5 units from an 8-unit block at 0
    ASSERT_TRUE(a);
    EXPECT_EQ(*a, 0u);
    EXPECT_EQ(b.block_bytes(*a), 5u * 256);
    EXPECT_EQ(b.free_blocks(), (Blocks{{5 * 256, 256}, {6 * 256, 512}, {8 * 256, 2048}}));
    const auto c = b.allocate(200);  // the freed tail serves small requests
    ASSERT_TRUE(c);
    EXPECT_EQ(*c, 5u * 256);
    EXPECT_EQ(b.stats().live_block_bytes, 6u * 256);
    EXPECT_EQ(b.validate(), std::nullopt);
    b.free(*a);  // its parts: 4 units at 0 and 1 unit at 4 (whose buddy, unit 5, is still live)
    EXPECT_EQ(b.free_blocks(), (Blocks{{0, 1024}, {4 * 256, 256}, {6 * 256, 512}, {8 * 256, 2048}}));
    b.free(*c);
    EXPECT_EQ(b.free_blocks(), (Blocks{{0, 4096}}));
}

TEST(BuddyTest, PackedAllocationsNeedNoPowerOfTwoBlock) {
    BuddyAllocator b(24 * 256, 256);                            // blocks of 16 and 8 units
    EXPECT_FALSE(b.allocate(17 * 256, 1, BlockFit::kTrimmed));  // trimmed: 17 units need a free 32-unit block
    const auto a = b.allocate(5 * 256 - 3, 1, BlockFit::kPacked);
    const auto c = b.allocate(17 * 256, 1, BlockFit::kPacked);  // across the 16- and 8-unit blocks
    const auto d = b.allocate(2 * 256, 1, BlockFit::kPacked);
    ASSERT_TRUE(a && c && d);
    EXPECT_EQ(*a, 0u);
    EXPECT_EQ(*c, 5u * 256);
    EXPECT_EQ(*d, 22u * 256);  // no gaps: the capacity is exactly the sum
    EXPECT_EQ(b.block_bytes(*c), 17u * 256);
    EXPECT_EQ(b.free_blocks(), Blocks{});
    EXPECT_EQ(b.validate(), std::nullopt);
    EXPECT_FALSE(b.allocate(1, 1, BlockFit::kPacked));
    b.free(*c);  // its parts go back coalesced: [5, 6) [6, 8) [8, 16) [16, 20) [20, 22)
    EXPECT_EQ(b.free_blocks(),
              (Blocks{{5 * 256, 256}, {6 * 256, 512}, {8 * 256, 2048}, {16 * 256, 1024}, {20 * 256, 512}}));
    EXPECT_EQ(b.validate(), std::nullopt);
    const auto e = b.allocate(4 * 256, 2048, BlockFit::kPacked);  // first fit at an 8-unit-aligned start
    ASSERT_TRUE(e);
    EXPECT_EQ(*e, 8u * 256);
    const auto f = b.allocate(9 * 256, 1, BlockFit::kPacked);  // the lowest free run of 9 units: [12, 21)
    ASSERT_TRUE(f);
    EXPECT_EQ(*f, 12u * 256);
    EXPECT_EQ(b.validate(), std::nullopt);
    for (size_t offset : {*a, *d, *e, *f}) b.free(offset);
    EXPECT_EQ(b.free_blocks(), b.initial_blocks());
    EXPECT_EQ(b.validate(), std::nullopt);
}

TEST(BuddyTest, AlignmentAboveBlockSizeUsesALargerBlock) {
    BuddyAllocator b(64 * 256, 256);
    const auto a = b.allocate(256);
    const auto c = b.allocate(256, 4096);  // a 256-byte request aligned to 4096 takes a 4096 block
    ASSERT_TRUE(a && c);
    EXPECT_EQ(*c % 4096, 0u);
    EXPECT_EQ(*c, 4096u);
    EXPECT_EQ(b.block_bytes(*c), 4096u);
    const auto t = b.allocate(300, 2048, BlockFit::kTrimmed);  // trimmed keeps the alignment, not the size
    ASSERT_TRUE(t);
    EXPECT_EQ(*t % 2048, 0u);
    EXPECT_EQ(b.block_bytes(*t), 512u);
    EXPECT_FALSE(b.allocate(256, size_t{1} << 20));  // larger than the capacity
    EXPECT_EQ(b.validate(), std::nullopt);
}

TEST(BuddyTest, NonPowerOfTwoCapacityStartsAsItsDecomposition) {
    BuddyAllocator b(13 * 256, 256);  // 13 = 8 + 4 + 1
    EXPECT_EQ(b.free_blocks(), (Blocks{{0, 2048}, {2048, 1024}, {3072, 256}}));
    EXPECT_EQ(b.initial_blocks(), b.free_blocks());
    EXPECT_EQ(b.stats().largest_free_block, 2048u);
    EXPECT_FALSE(b.allocate(2049));  // 13 units are free but no 16-unit block exists
    const auto a = b.allocate(2048);
    const auto c = b.allocate(1024);
    const auto d = b.allocate(1);
    ASSERT_TRUE(a && c && d);
    EXPECT_EQ(*d, 3072u);
    EXPECT_FALSE(b.allocate(1));
    EXPECT_EQ(b.stats().free_bytes, 0u);
    b.free(*c);
    b.free(*a);
    b.free(*d);
    EXPECT_EQ(b.free_blocks(), b.initial_blocks());
    EXPECT_EQ(b.validate(), std::nullopt);
}

TEST(BuddyTest, StatsAndFragmentation) {
    BuddyAllocator b(16 * 256, 256);
    const auto a = b.allocate(300);  // 512-byte block
    const auto c = b.allocate(1024);
    ASSERT_TRUE(a && c);
    ms::BuddyStats s = b.stats();
    EXPECT_EQ(s.live_allocations, 2u);
    EXPECT_EQ(s.live_bytes, 1324u);
    EXPECT_EQ(s.live_block_bytes, 1536u);
    EXPECT_DOUBLE_EQ(s.internal_fragmentation, 1.0 - 1324.0 / 1536.0);
    EXPECT_EQ(s.free_bytes, 4096u - 1536u);
    EXPECT_EQ(s.largest_free_block, 2048u);  // free: [512, 1024) and [2048, 4096)
    EXPECT_DOUBLE_EQ(s.external_fragmentation, 1.0 - 2048.0 / 2560.0);
    b.free(*c);
    s = b.stats();
    EXPECT_EQ(s.peak_live_bytes, 1324u);
    EXPECT_EQ(s.peak_block_bytes, 1536u);
    EXPECT_EQ(s.high_water_bytes, 2048u);
    EXPECT_EQ(s.live_bytes, 300u);
    b.reset_peaks();
    EXPECT_EQ(b.stats().peak_live_bytes, 300u);
    EXPECT_EQ(b.stats().high_water_bytes, 512u);
    b.free(*a);
    EXPECT_DOUBLE_EQ(b.stats().internal_fragmentation, 0.0);
    EXPECT_DOUBLE_EQ(b.stats().external_fragmentation, 0.0);
}

TEST(BuddyTest, InvalidFreeIsFatal) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    BuddyAllocator b(16 * 256, 256);
    const auto a = b.allocate(256);
    ASSERT_TRUE(a);
    EXPECT_DEATH(b.free(*a + 256), "not a live allocation");
    b.free(*a);
    EXPECT_DEATH(b.free(*a), "double free");
    EXPECT_DEATH(BuddyAllocator(1000, 256), "not a positive multiple");
}

// The reference: live blocks by offset, and the requests they serve.
struct RefBlock {
    size_t requested, block;
};

// True if some naturally aligned range of `size` bytes inside [0, capacity) touches no live block.
bool reference_has_free_range(const std::map<size_t, RefBlock>& live, size_t capacity, size_t size) {
    for (size_t start = 0; start + size <= capacity; start += size) {
        auto it = live.lower_bound(start + size);  // first block starting at or after the range's end
        bool free = true;
        if (it != live.begin()) {
            --it;  // the last block starting before the end: the only one that can reach into the range
            free = it->first + it->second.block <= start;
        }
        if (free) return true;
    }
    return false;
}

// The lowest offset, a multiple of `align`, from which `bytes` are free in the reference's view, or nullopt.
std::optional<size_t> lowest_free_run(const std::map<size_t, RefBlock>& live, size_t capacity, size_t bytes,
                                      size_t align) {
    size_t start = 0;  // the free gap [start, end) before each live block, then before the capacity's end
    for (auto it = live.begin();; ++it) {
        const size_t end = it == live.end() ? capacity : it->first;
        const size_t s = (start + align - 1) / align * align;
        if (s + bytes <= end) return s;
        if (it == live.end()) return std::nullopt;
        start = it->first + it->second.block;
    }
}

struct RandomCase {
    size_t capacity, min_block;
    uint32_t seed;
};

void run_random_sequence(const RandomCase& rc, int ops) {
    SCOPED_TRACE(::testing::Message() << "capacity " << rc.capacity << " min_block " << rc.min_block << " seed "
                                      << rc.seed);
    BuddyAllocator b(rc.capacity, rc.min_block);
    std::map<size_t, RefBlock> live;
    std::mt19937_64 rng(rc.seed);
    size_t live_bytes = 0, block_bytes = 0, peak_live = 0, peak_block = 0, failures = 0;
    for (int op = 0; op < ops; ++op) {
        // Allocate more often than free while small, so the allocator is driven into failures near capacity.
        const bool do_alloc = live.empty() || rng() % 100 < 55;
        if (do_alloc) {
            // Sizes from 0 to capacity/4, log-uniform so that every order is exercised.
            const int max_bits = std::bit_width(rc.capacity / 4);
            const size_t bytes = (rng() % 16 == 0) ? 0 : (size_t{1} << (rng() % max_bits)) + rng() % 97;
            const size_t alignment = size_t{1} << (rng() % 4 == 0 ? rng() % 13 : 0);
            const BlockFit fit = static_cast<BlockFit>(rng() % 3);  // kPowerOfTwo, kTrimmed, kPacked
            const size_t pow2_block = b.block_size_for(bytes, alignment);
            const size_t units = std::max<size_t>(1, (bytes + rc.min_block - 1) / rc.min_block);
            // kPacked: first fit over contiguous free memory, aligned to max(alignment, min_block)
            const std::optional<size_t> packed_at =
                fit == BlockFit::kPacked
                    ? lowest_free_run(live, rc.capacity, units * rc.min_block, std::max(alignment, rc.min_block))
                    : std::nullopt;
            const std::optional<size_t> got = b.allocate(bytes, alignment, fit);
            if (fit == BlockFit::kPacked) {
                ASSERT_EQ(got, packed_at) << "not the lowest free run";
            }
            if (!got) {
                ++failures;
                if (pow2_block != 0 && fit != BlockFit::kPacked) {
                    ASSERT_FALSE(reference_has_free_range(live, rc.capacity, pow2_block))
                        << "allocate(" << bytes << ", " << alignment << ") failed with a free aligned range of "
                        << pow2_block << " bytes";
                    ASSERT_LT(b.stats().largest_free_block, pow2_block);
                }
                continue;
            }
            const size_t offset = *got;
            const size_t block = b.block_bytes(offset);
            ASSERT_EQ(block, fit == BlockFit::kPowerOfTwo ? pow2_block : units * rc.min_block);
            ASSERT_LE(offset + block, rc.capacity);
            ASSERT_EQ(offset % alignment, 0u);
            if (fit != BlockFit::kPacked) {
                ASSERT_EQ(offset % pow2_block, 0u) << "not naturally aligned";
            }
            auto next = live.lower_bound(offset);
            if (next != live.end()) {
                ASSERT_GE(next->first, offset + block) << "overlaps the next live block";
            }
            if (next != live.begin()) {
                auto prev = std::prev(next);
                ASSERT_LE(prev->first + prev->second.block, offset) << "overlaps the previous live block";
            }
            live[offset] = {bytes, block};
            live_bytes += bytes;
            block_bytes += block;
        } else {
            auto it = live.begin();
            std::advance(it, static_cast<long>(rng() % live.size()));
            b.free(it->first);
            live_bytes -= it->second.requested;
            block_bytes -= it->second.block;
            live.erase(it);
        }
        peak_live = std::max(peak_live, live_bytes);
        peak_block = std::max(peak_block, block_bytes);
        const ms::BuddyStats s = b.stats();
        ASSERT_EQ(s.live_allocations, live.size());
        ASSERT_EQ(s.live_bytes, live_bytes);
        ASSERT_EQ(s.live_block_bytes, block_bytes);
        ASSERT_EQ(s.free_bytes, rc.capacity - block_bytes);
        ASSERT_EQ(s.peak_live_bytes, peak_live);
        ASSERT_EQ(s.peak_block_bytes, peak_block);
        if (op % 64 == 0) {
            ASSERT_EQ(b.validate(), std::nullopt) << "after op " << op;
        }
    }
    EXPECT_GT(failures, 0u) << "the sequence never filled the allocator";
    EXPECT_EQ(b.validate(), std::nullopt);
    // Free everything in random order: full coalescing restores the initial blocks.
    std::vector<size_t> offsets;
    for (const auto& [offset, r] : live) offsets.push_back(offset);
    std::shuffle(offsets.begin(), offsets.end(), rng);
    for (size_t offset : offsets) b.free(offset);
    EXPECT_EQ(b.free_blocks(), b.initial_blocks());
    if (std::has_single_bit(rc.capacity / rc.min_block)) {
        EXPECT_EQ(b.free_blocks(), (Blocks{{0, rc.capacity}}));
    }
    EXPECT_EQ(b.stats().live_block_bytes, 0u);
    EXPECT_EQ(b.stats().largest_free_block, b.initial_blocks().front().second);
    EXPECT_EQ(b.validate(), std::nullopt);
}

TEST(BuddyTest, RandomSequencesAgainstReference) {
    const RandomCase cases[] = {
        {size_t{1} << 20, 256, 1},  // 4096 units, orders 0..12
        {size_t{1} << 20, 256, 2},
        {size_t{1} << 16, 64, 3},
        {(size_t{1} << 20) + 3 * 4096 + 256, 256, 4},  // not a power of two: decomposition 4096 + 32 + 16 + 1 units
        {4800 * 256, 256, 5},
        {size_t{1} << 24, 4096, 6},
    };
    for (const RandomCase& rc : cases) run_random_sequence(rc, 20000);
}

}  // namespace
