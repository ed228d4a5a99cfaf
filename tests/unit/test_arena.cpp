// test_arena.cpp: memory/arena -- categories and report text, the out-of-memory error, the frozen-step guard
// (a fatal MS_CHECK, so a death test), invalid frees, and the leak list.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "memory/arena.h"

namespace {

using ms::Arena;
using ms::MemCategory;

constexpr size_t kMiB = size_t{1} << 20;

TEST(ArenaTest, AllocationsAreAlignedWritableAndCountedByCategory) {
    Arena arena(8 * kMiB);
    void* w = arena.allocate(3 * kMiB / 2, MemCategory::kParameter, "wte.weight");
    void* g = arena.allocate(3 * kMiB / 2, MemCategory::kGradient, "wte.grad");
    void* a = arena.allocate(1000, MemCategory::kActivation, "h.0.ln1");
    for (void* p : {w, g, a}) {
        ASSERT_NE(p, nullptr);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    }
    std::memset(w, 1, 3 * kMiB / 2);  // the whole allocation is ours
    std::memset(a, 2, 1000);
    EXPECT_EQ(static_cast<unsigned char*>(w)[3 * kMiB / 2 - 1], 1);
    EXPECT_EQ(arena.live_bytes(MemCategory::kParameter), 3 * kMiB / 2);
    EXPECT_EQ(arena.live_bytes(MemCategory::kActivation), 1000u);
    EXPECT_EQ(arena.live_bytes(MemCategory::kOptimizer), 0u);
    // >= 1 MiB is trimmed: 1.5 MiB holds 1.5 MiB, not 2; 1000 bytes hold a 1024-byte block.
    EXPECT_EQ(arena.stats().live_block_bytes, 3 * kMiB + 1024);
    arena.free(a);
    EXPECT_EQ(arena.live_bytes(MemCategory::kActivation), 0u);
    EXPECT_EQ(arena.peak_live_bytes(MemCategory::kActivation), 1000u);
    arena.free(w);
    arena.free(g);
    arena.free(nullptr);
    EXPECT_EQ(arena.stats().live_bytes, 0u);
    EXPECT_TRUE(arena.leaks().empty());
}

TEST(ArenaTest, ReportListsCategoriesAndLargestAllocations) {
    Arena arena(8 * kMiB);
    void* p = arena.allocate(2 * kMiB, MemCategory::kParameter, "h.0.mlp.c_fc.weight");
    void* o = arena.allocate(kMiB, MemCategory::kOptimizer, "adam.m");
    const std::string r = arena.report();
    EXPECT_NE(r.find("capacity 8.00 MiB"), std::string::npos) << r;
    EXPECT_NE(r.find("live 3.00 MiB in 2 allocation(s)"), std::string::npos) << r;
    EXPECT_NE(r.find("parameter     2.00 MiB in 1 allocation(s)"), std::string::npos) << r;
    EXPECT_NE(r.find("optimizer     1.00 MiB in 1 allocation(s)"), std::string::npos) << r;
    EXPECT_NE(r.find("comm"), std::string::npos) << r;
    EXPECT_NE(r.find("fragmentation: internal 0.0%"), std::string::npos) << r;
    // The largest allocation is listed first.
    EXPECT_LT(r.find("'h.0.mlp.c_fc.weight'"), r.find("'adam.m'")) << r;
    arena.free(p);
    arena.free(o);
}

TEST(ArenaTest, OutOfMemoryThrowsUserErrorWithReportAndHint) {
    Arena arena(4 * kMiB);
    void* p = arena.allocate(3 * kMiB, MemCategory::kParameter, "params");
    try {
        arena.allocate(2 * kMiB, MemCategory::kActivation, "h.3.fch");
        FAIL() << "expected an out-of-memory UserError";
    } catch (const ms::UserError& e) {
        const std::string m = e.what();
        EXPECT_EQ(e.exit_code(), ms::kExitConfigError);
        EXPECT_NE(m.find("out of memory: the arena cannot hold 'h.3.fch' (activation, 2.00 MiB)"), std::string::npos)
            << m;
        EXPECT_NE(m.find("1.00 MiB of 4.00 MiB is free"), std::string::npos) << m;
        EXPECT_NE(m.find("'params'"), std::string::npos) << m;  // the report: what holds the memory
        EXPECT_NE(m.find("HINT"), std::string::npos) << m;
    }
    // The failed call changed nothing.
    EXPECT_EQ(arena.stats().live_bytes, 3 * kMiB);
    EXPECT_EQ(arena.leaks().size(), 1u);
    arena.free(p);
}

TEST(ArenaTest, AllocationWhileFrozenIsFatal) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    Arena arena(kMiB);
    arena.set_frozen(true);
    EXPECT_TRUE(arena.frozen());
    EXPECT_DEATH(arena.allocate(4096, MemCategory::kWorkspace, "attn.scratch"),
                 "allocation inside a training step: 'attn.scratch' \\(workspace, 4.00 KiB\\)");
    arena.set_frozen(false);
    void* p = arena.allocate(4096, MemCategory::kWorkspace, "attn.scratch");
    arena.set_frozen(true);
    arena.free(p);  // freeing is allowed while frozen
}

TEST(ArenaTest, InvalidFreeIsFatal) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    Arena arena(kMiB);
    char* p = static_cast<char*>(arena.allocate(4096, MemCategory::kComm, "bucket"));
    int outside = 0;
    EXPECT_DEATH(arena.free(&outside), "outside the arena");
    EXPECT_DEATH(arena.free(p + 256), "not a live allocation");
    arena.free(p);
    EXPECT_DEATH(arena.free(p), "double free");
}

TEST(ArenaTest, LeaksListsLiveAllocationsLargestFirst) {
    Arena arena(4 * kMiB);
    void* a = arena.allocate(512, MemCategory::kActivation, "small");
    void* b = arena.allocate(kMiB, MemCategory::kGradient, "big");
    void* c = arena.allocate(4096, MemCategory::kOptimizer, "mid");
    arena.free(c);
    EXPECT_EQ(arena.leaks(), (std::vector<std::string>{"'big' (gradient, 1.00 MiB)", "'small' (activation, 512 B)"}));
    arena.free(a);
    arena.free(b);
    EXPECT_TRUE(arena.leaks().empty());
}

TEST(ArenaTest, DestructorWarnsAboutLeaks) {
    testing::internal::CaptureStderr();
    {
        Arena arena(kMiB);
        arena.allocate(4096, MemCategory::kComm, "grad_bucket.0");
    }
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("arena: 1 allocation(s) still live at destruction (leaks), 4.00 KiB in all:"), std::string::npos)
        << err;
    EXPECT_NE(err.find("'grad_bucket.0' (comm, 4.00 KiB)"), std::string::npos) << err;
}

}  // namespace

namespace {

TEST(ArenaTest, CapacityForPackedAllocationsIsTheirSum) {
    // Four 498 MiB blocks (GPT-2 124M's parameters, gradients, exp_avg, exp_avg_sq) and a 40 MiB one: trimmed, each
    // is carved from a free 512 MiB block, so the dry run needs 2048 MiB + room for the last; packed, the sum.
    const std::vector<size_t> sizes = {498 * kMiB, 498 * kMiB, 40 * kMiB + 100, 498 * kMiB, 498 * kMiB};
    const size_t sum = 4 * 498 * kMiB + 40 * kMiB + 256;  // 100 bytes round up to one 256-byte block
    EXPECT_EQ(ms::arena_capacity_for(sizes, 256, 0, ms::BlockFit::kPacked), sum);
    EXPECT_GT(ms::arena_capacity_for(sizes, 256, 0, ms::BlockFit::kTrimmed), 2048 * kMiB);
    // and an arena of that capacity serves them, in that order, with nothing left over
    Arena arena(ms::arena_capacity_for({kMiB + 1, 3 * kMiB, 700}, 256, 0, ms::BlockFit::kPacked), 256, 0,
                ms::BlockFit::kPacked);
    std::vector<void*> p;
    for (size_t b : {kMiB + 1, 3 * kMiB, size_t{700}}) p.push_back(arena.allocate(b, MemCategory::kActivation, "x"));
    EXPECT_EQ(arena.stats().free_bytes, 0u);
    EXPECT_EQ(arena.stats().peak_block_bytes, arena.capacity());
    for (void* q : p) arena.free(q);
}

}  // namespace
