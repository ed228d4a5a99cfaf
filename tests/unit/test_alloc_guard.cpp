// test_alloc_guard.cpp: the step allocation guard (memory/alloc_guard.h) counts what the replaced operator new
// hands out while armed, and nothing while disarmed. The trainer's use of it (MS_CHECK_ALLOCS=1 over real training
// steps) is checked end to end in tests/e2e/test_memory.cpp.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "memory/alloc_guard.h"

namespace {

TEST(AllocGuard, CountsEveryFormOfOperatorNewWhileArmed) {
    ms::alloc_guard::arm();
    auto one = std::make_unique<int>(7);
    std::vector<double> v(100);
    auto aligned = std::make_unique<std::max_align_t[]>(3);
    struct alignas(64) Wide {
        char c[64];
    };
    auto wide = std::make_unique<Wide>();  // operator new(size_t, align_val_t)
    const ms::alloc_guard::Counts c = ms::alloc_guard::disarm();
    EXPECT_EQ(c.allocations, 4u);
    EXPECT_EQ(c.bytes, sizeof(int) + 100 * sizeof(double) + 3 * sizeof(std::max_align_t) + sizeof(Wide));
    EXPECT_EQ(*one, 7);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(wide.get()) % 64, 0u);
}

TEST(AllocGuard, CountsNothingWhenNothingIsAllocatedOrWhenDisarmed) {
    std::vector<int> reserved;
    reserved.reserve(16);
    ms::alloc_guard::arm();
    for (int i = 0; i < 16; ++i) reserved.push_back(i);  // within capacity: no allocation
    EXPECT_EQ(ms::alloc_guard::disarm().allocations, 0u);
    std::string s(1000, 'x');  // disarmed: not counted by the next arm()
    ms::alloc_guard::arm();
    EXPECT_EQ(ms::alloc_guard::disarm().allocations, 0u);
}

TEST(AllocGuard, StepGuardIsInertUnlessTheEnvironmentEnablesIt) {
    // This test binary runs without MS_CHECK_ALLOCS=1, so a step guard must not fail on an allocation.
    ASSERT_FALSE(ms::alloc_guard::enabled());
    ms::StepAllocGuard guard(5, /*arm=*/true);
    std::vector<int> v(10);
    guard.check();  // fatal if it were armed
    SUCCEED();
}

}  // namespace
