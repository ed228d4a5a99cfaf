// gpu_metrics.h: what the GPU each rank runs on is doing, sampled once per log interval for metrics.jsonl and
// TensorBoard -- memory used, SM and memory clocks, power, GPU and memory-bandwidth utilisation, temperature: the
// counters nvidia-smi and DCGM show, read through NVML.
//
// NVML (libnvidia-ml.so.1, installed with the driver) is opened at run time with dlopen and never linked, so
// CPU-only binaries, and machines without a driver, run as before. The trainer opens it on CUDA runs only
// (run.backend: cuda), for the device its backend selected, found by PCI bus id (Backend::pci_bus_id): CUDA's device
// order and CUDA_VISIBLE_DEVICES make a CUDA device index differ from NVML's. When NVML cannot be opened the rank
// logs one warning saying why and trains without these fields.
//
// Every rank samples its own device at each log interval, and the samples are gathered (an all_gather of
// kGpuSampleWords int32 per rank over world, every rank of a CUDA run taking part) to the logging rank, which adds
//   "gpu": {"rank0": {"mem_used_bytes": ..., "sm_clock_mhz": ..., ...}, "rank1": {...}, ...}
// to the interval's metrics.jsonl record; TensorBoard gets them as gpu/rank<N>/<field> (tensorboard_scalars). A
// field NVML does not report on a device (utilisation under MIG, say) is left out, a rank without a sample is left
// out, and a record without any has no "gpu".
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>

namespace ms {

class Communicator;                // comm/communicator.h
enum class BackendKind : uint8_t;  // engine/backends/backend.h

// One device's counters at one moment; each field unset when NVML does not report it for the device.
struct GpuSample {
    std::optional<uint64_t> mem_used_bytes;   // device memory in use, by every process (nvmlDeviceGetMemoryInfo)
    std::optional<uint32_t> sm_clock_mhz;     // current SM clock (nvmlDeviceGetClockInfo)
    std::optional<uint32_t> mem_clock_mhz;    // current memory clock
    std::optional<uint32_t> power_mw;         // board power draw in milliwatts (nvmlDeviceGetPowerUsage)
    std::optional<uint32_t> util_pct;         // % of the last sample period in which a kernel ran
    std::optional<uint32_t> mem_bw_util_pct;  // % of it in which device memory was read or written
    std::optional<uint32_t> temperature_c;    // GPU core temperature
};

// Where the samples come from: NVML (open_nvml) or, in tests, a fake.
class GpuMetricsSource {
  public:
    virtual ~GpuMetricsSource() = default;
    // This rank's device now; nullopt when it could not be read at all.
    virtual std::optional<GpuSample> sample() = 0;
};

// NVML opened for one device: `source`, or the sentence why not in `error`.
struct NvmlOpen {
    std::unique_ptr<GpuMetricsSource> source;
    std::string error;
};
inline constexpr const char* kNvmlLibrary = "libnvidia-ml.so.1";
// `pci_bus_id` as CUDA spells it ("0000:3b:00.0"); `library` the file to dlopen (tests name a missing one, or the
// fake NVML in tests/unit/fake_nvml.c by its path).
NvmlOpen open_nvml(const std::string& pci_bus_id, const char* library = kNvmlLibrary);

// A sample as kGpuSampleWords int32 for the gather (an unset field, or no sample, as -1; memory as two words), and
// back. unpack(pack(s)) == s for every field of at most 2^31 - 1 (memory: any).
inline constexpr size_t kGpuSampleWords = 8;
using GpuSampleWords = std::array<int32_t, kGpuSampleWords>;
GpuSampleWords pack_gpu_sample(const std::optional<GpuSample>& sample);
std::optional<GpuSample> unpack_gpu_sample(std::span<const int32_t, kGpuSampleWords> words);

// The record fields of one sample: mem_used_bytes, sm_clock_mhz, mem_clock_mhz, power_w, util_pct,
// mem_bw_util_pct, temperature_c (the ones set).
nlohmann::json gpu_sample_json(const GpuSample& sample);
// The record's "gpu" value from every rank's packed sample (rank r's at words r * kGpuSampleWords): "rank<r>" ->
// gpu_sample_json for each rank that has one; null when none has.
nlohmann::json gpu_metrics_json(std::span<const int32_t> gathered);

// The per-interval sampling of a CUDA run, on every rank (the gather is collective over world).
class GpuMetrics {
  public:
    explicit GpuMetrics(std::unique_ptr<GpuMetricsSource> source) : source_(std::move(source)) {}
    // Samples this rank's device (none without a source) and gathers every rank's: the "gpu" value of
    // gpu_metrics_json, on every rank.
    nlohmann::json gather(Communicator& world);

  private:
    std::unique_ptr<GpuMetricsSource> source_;  // null: this rank has no sample
};

// The trainer's GpuMetrics on a CUDA run, the same on every rank: engaged when `backend` is kCUDA and the backend
// selected a device (`pci_bus_id`, "" for the CPU emulation of the CUDA kernels); nullopt otherwise, and NVML is not
// opened. When NVML cannot be opened for the device, logs one warning with the reason and samples nothing on this
// rank. `nvml_library` as open_nvml's `library`.
std::optional<GpuMetrics> open_gpu_metrics(BackendKind backend, const std::string& pci_bus_id,
                                           const char* nvml_library = kNvmlLibrary);

}  // namespace ms
