// test_arena_memory.cpp: an Arena over memory a backend supplies (memory/arena_memory.h), as the trainer's arena is
// on the CUDA backend: allocations land in that memory, MemoryBlock clears blocks through the memory's own zero()
// (a device memset there, never a host memset), prefetch_to_device() reaches it, and memory smaller than the
// capacity is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "memory/arena.h"
#include "memory/memory_block.h"

namespace ms {
namespace {

// Host bytes standing in for device memory; records what the arena asks of it.
struct Calls {
    std::vector<std::pair<size_t, size_t>> zeroed;  // (offset, bytes)
    int prefetches = 0;
};

class RecordingMemory final : public ArenaMemory {
  public:
    RecordingMemory(size_t bytes, Calls* calls) : bytes_(bytes, std::byte{0x5a}), calls_(calls) {}
    void* data() const override { return const_cast<std::byte*>(bytes_.data()); }
    size_t size() const override { return bytes_.size(); }
    void zero(void* p, size_t bytes) override {
        calls_->zeroed.emplace_back(static_cast<std::byte*>(p) - bytes_.data(), bytes);
        std::memset(p, 0, bytes);
    }
    void prefetch_to_device() override { ++calls_->prefetches; }
    const char* describe() const override { return "recording memory"; }

  private:
    std::vector<std::byte> bytes_;
    Calls* calls_;
};

TEST(ArenaMemory, AllocationsLiveInTheSuppliedMemoryAndAreClearedByIt) {
    Calls calls;
    auto memory = std::make_unique<RecordingMemory>(4096, &calls);
    const std::byte* base = static_cast<const std::byte*>(memory->data());
    Arena arena(4096, 256, 0, BlockFit::kPacked, std::move(memory));
    EXPECT_EQ(arena.base(), base);
    EXPECT_STREQ(arena.memory().describe(), "recording memory");
    {
        MemoryBlock a(1000, &arena, MemCategory::kParameter, "a");
        MemoryBlock b(300, &arena, MemCategory::kActivation, "b");
        ASSERT_EQ(calls.zeroed.size(), 2u);
        EXPECT_EQ(calls.zeroed[0], std::make_pair(size_t{0}, size_t{1000}));  // packed: a at 0, b at 1024
        EXPECT_EQ(calls.zeroed[1], std::make_pair(size_t{1024}, size_t{300}));
        EXPECT_EQ(a.data(), base);
        EXPECT_EQ(b.data(), base + 1024);
        for (size_t i = 0; i < 300; ++i) ASSERT_EQ(b.as<std::byte>()[i], std::byte{0});  // 0x5a before
    }
    arena.memory().prefetch_to_device();
    EXPECT_EQ(calls.prefetches, 1);
}

TEST(ArenaMemory, WithoutSuppliedMemoryTheArenaIsHostMemory) {
    Arena arena(4096, 256, 0, BlockFit::kPacked);
    EXPECT_STREQ(arena.memory().describe(), "host memory");
    arena.memory().prefetch_to_device();  // a no-op
    MemoryBlock a(100, &arena, MemCategory::kParameter, "a");
    EXPECT_EQ(a.as<std::byte>()[99], std::byte{0});
}

TEST(ArenaMemoryDeathTest, MemorySmallerThanTheCapacityIsRefused) {
    Calls calls;
    EXPECT_DEATH(Arena(8192, 256, 0, BlockFit::kPacked, std::make_unique<RecordingMemory>(4096, &calls)),
                 "arena: its memory \\(recording memory\\) holds 4096 bytes, less than the capacity of 8192 bytes");
}

}  // namespace
}  // namespace ms
