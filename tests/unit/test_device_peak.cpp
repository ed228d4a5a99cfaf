// test_device_peak.cpp: the MFU peak table (engine/train/device_peak.h) finds the entry for the names CUDA reports,
// the more specific name first, and nothing for an unknown device.
#include <gtest/gtest.h>

#include "engine/train/device_peak.h"

namespace ms {
namespace {

TEST(DevicePeak, FindsTheDeviceInTheNameCudaReports) {
    const DevicePeak* h200 = find_device_peak("NVIDIA H200 (device 0 of 1, sm_90, 139.8 GiB)");
    ASSERT_NE(h200, nullptr);
    EXPECT_STREQ(h200->device, "H200");
    EXPECT_DOUBLE_EQ(h200->fp32, 66.9e12);
    EXPECT_DOUBLE_EQ(h200->bf16, 989.4e12);
    const DevicePeak* sxm = find_device_peak("NVIDIA H100 80GB HBM3");
    ASSERT_NE(sxm, nullptr);
    EXPECT_STREQ(sxm->device, "H100");
    const DevicePeak* pcie = find_device_peak("NVIDIA H100 PCIe");
    ASSERT_NE(pcie, nullptr);
    EXPECT_STREQ(pcie->device, "H100 PCIe");  // not the SXM part's "H100"
    const DevicePeak* nvl = find_device_peak("NVIDIA H200 NVL");
    ASSERT_NE(nvl, nullptr);
    EXPECT_STREQ(nvl->device, "H200 NVL");
    EXPECT_NE(find_device_peak("NVIDIA A100-SXM4-80GB"), nullptr);
}

TEST(DevicePeak, AnUnknownDeviceHasNoPeak) {
    EXPECT_EQ(find_device_peak("NVIDIA GeForce RTX 4090"), nullptr);
    EXPECT_EQ(find_device_peak(""), nullptr);
}

}  // namespace
}  // namespace ms
