// test_staging_memory.cpp: the fp32 staging of sharded masters with 16-bit gradients (memory/staging_memory.h):
// host memory keeps its address, and release() hands its pages back (they read as zeros after it); a device
// backend's memory is used as given and kept.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "memory/arena_memory.h"
#include "memory/staging_memory.h"

namespace {

TEST(StagingMemory, HostPagesAreHandedBackAtTheSameAddress) {
    const size_t n = 3 * 4096 / sizeof(float) + 5;  // spans several pages, not a multiple of one
    ms::StagingMemory s(n * sizeof(float), nullptr);
    ASSERT_NE(s.data(), nullptr);
    EXPECT_EQ(s.size(), n * sizeof(float));
    auto* f = static_cast<float*>(s.data());
    for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>(i) + 0.5f;
    EXPECT_EQ(f[n - 1], static_cast<float>(n - 1) + 0.5f);
    void* before = s.data();
    s.release();
    EXPECT_EQ(s.data(), before);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(f[i], 0.0f) << i;  // the pages went back: fresh zero pages
    f[7] = 2.0f;                                                // and the memory is usable again
    EXPECT_EQ(f[7], 2.0f);
}

TEST(StagingMemory, DeviceMemoryIsUsedAsGivenAndKept) {
    auto device = std::make_unique<ms::HostArenaMemory>(4096);
    void* p = device->data();
    ms::StagingMemory s(4096, std::move(device));
    EXPECT_EQ(s.data(), p);
    EXPECT_EQ(s.size(), 4096u);
    static_cast<float*>(s.data())[3] = 1.25f;
    s.release();  // not host staging's own mapping: its contents stay
    EXPECT_EQ(static_cast<float*>(s.data())[3], 1.25f);
    ms::StagingMemory moved = std::move(s);
    EXPECT_EQ(moved.data(), p);
    EXPECT_EQ(s.data(), nullptr);  // NOLINT(bugprone-use-after-move): a moved-from staging holds nothing
}

}  // namespace
