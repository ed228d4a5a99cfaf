// device_peak.cpp: the peak table (device_peak.h). More specific names come first: "H100" would match "H100 NVL".
#include "engine/train/device_peak.h"

namespace ms {
namespace {

constexpr double kT = 1e12;
constexpr DevicePeak kPeaks[] = {
    {"H200 NVL", 60.0 * kT, 417.5 * kT, 835.5 * kT},
    {"H200", 66.9 * kT, 494.7 * kT, 989.4 * kT},  // H200 SXM: the H100 SXM's compute with more memory
    {"H100 NVL", 60.0 * kT, 417.5 * kT, 835.5 * kT},
    {"H100 PCIe", 51.2 * kT, 378.0 * kT, 756.0 * kT},
    {"H100", 66.9 * kT, 494.7 * kT, 989.4 * kT},  // SXM5
    {"A100", 19.5 * kT, 156.0 * kT, 312.0 * kT},
};

}  // namespace

const DevicePeak* find_device_peak(std::string_view device_name) {
    for (const DevicePeak& p : kPeaks) {
        if (device_name.find(p.device) != std::string_view::npos) return &p;
    }
    return nullptr;
}

}  // namespace ms
