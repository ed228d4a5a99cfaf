// test_memory_budget.cpp: engine/train/plan.h's per-rank memory budget, which the trainer checks the plan against
// before it allocates: run.memory_limit_gb when set; the device's memory shared by the ranks on it, less a reserve,
// when the arena lives on a GPU; physical memory shared by the node's ranks otherwise.
#include <gtest/gtest.h>

#include <unistd.h>

#include <string>

#include "engine/config/config.h"
#include "engine/train/plan.h"

namespace ms {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

TEST(MemoryBudget, ADeviceIsSharedByTheRanksOnItLessTheReserve) {
    const Config cfg;
    const DeviceMemory h100{static_cast<size_t>(80 * kGiB), 8};
    // 8 ranks on 8 GPUs: one each
    EXPECT_EQ(memory_budget_bytes(cfg, 8, h100), 80 * kGiB - kDeviceReserveBytes);
    EXPECT_EQ(memory_budget_source(cfg, 8, h100),
              "GPU memory 80.0 GiB / 1 rank(s) per device, less 1.5 GiB for the CUDA context, cuBLAS and NCCL");
    // 8 ranks on one GPU (the GPU tests' tp2 x pp2 x dp2): an eighth each; 9 ranks on 8 GPUs: two on device 0
    EXPECT_EQ(memory_budget_bytes(cfg, 8, DeviceMemory{h100.total_bytes, 1}), 10 * kGiB - kDeviceReserveBytes);
    EXPECT_EQ(memory_budget_bytes(cfg, 9, h100), 40 * kGiB - kDeviceReserveBytes);
    // a device too small for its reserve has nothing left
    EXPECT_EQ(memory_budget_bytes(cfg, 1, DeviceMemory{static_cast<size_t>(kGiB), 1}), 0.0);
}

TEST(MemoryBudget, TheConfiguredLimitWinsAndHostMemoryIsTheDefault) {
    Config cfg;
    const DeviceMemory gpu{static_cast<size_t>(80 * kGiB), 8};
    const double host = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    EXPECT_EQ(memory_budget_bytes(cfg, 4), host / 4);
    EXPECT_EQ(memory_budget_source(cfg, 4), "physical memory / 4 rank(s) on a node");
    cfg.run.memory_limit_gb = 2.5;
    EXPECT_EQ(memory_budget_bytes(cfg, 4), 2.5 * kGiB);
    EXPECT_EQ(memory_budget_bytes(cfg, 4, gpu), 2.5 * kGiB);
    EXPECT_EQ(memory_budget_source(cfg, 4, gpu), "run.memory_limit_gb");
}

}  // namespace
}  // namespace ms
