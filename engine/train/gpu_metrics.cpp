// gpu_metrics.cpp: NVML through dlopen, the packing of a sample for the gather, and the record fields
// (gpu_metrics.h).
//
// NVML's types and entry points are declared here, not taken from nvml.h, which not every CUDA toolkit installs and
// a CPU-only build has none of: the functions below are NVML's stable C ABI (the _v2 names where NVML versions one),
// with these constants: NVML_SUCCESS 0, NVML_CLOCK_SM 1, NVML_CLOCK_MEM 2, NVML_TEMPERATURE_GPU 0.
#include "engine/train/gpu_metrics.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <vector>

#include "comm/communicator.h"
#include "engine/backends/backend.h"
#include "engine/core/log.h"

namespace ms {

namespace {

using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlMemory_t {
    unsigned long long total, free, used;  // bytes
};
struct nvmlUtilization_t {
    unsigned int gpu, memory;  // percent
};
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1, kNvmlClockMem = 2;
constexpr int kNvmlTemperatureGpu = 0;

// The NVML functions the sampler calls, looked up by name in the loaded library.
struct NvmlApi {
    nvmlReturn_t (*init)() = nullptr;                                            // nvmlInit_v2
    nvmlReturn_t (*shutdown)() = nullptr;                                        // nvmlShutdown
    const char* (*error_string)(nvmlReturn_t) = nullptr;                         // nvmlErrorString
    nvmlReturn_t (*handle_by_pci_bus_id)(const char*, nvmlDevice_t*) = nullptr;  // nvmlDeviceGetHandleByPciBusId_v2
    nvmlReturn_t (*memory_info)(nvmlDevice_t, nvmlMemory_t*) = nullptr;          // nvmlDeviceGetMemoryInfo
    nvmlReturn_t (*clock_info)(nvmlDevice_t, int, unsigned int*) = nullptr;      // nvmlDeviceGetClockInfo
    nvmlReturn_t (*power_usage)(nvmlDevice_t, unsigned int*) = nullptr;          // nvmlDeviceGetPowerUsage
    nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;     // nvmlDeviceGetUtilizationRates
    nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned int*) = nullptr;     // nvmlDeviceGetTemperature
};

bool has_any(const GpuSample& s) {
    return s.mem_used_bytes || s.sm_clock_mhz || s.mem_clock_mhz || s.power_mw || s.util_pct || s.mem_bw_util_pct ||
           s.temperature_c;
}

// Looks up `name` into `fn`; false (with the name in `missing`) when the library lacks it.
template <typename Fn>
bool bind(void* lib, const char* name, Fn& fn, std::string& missing) {
    fn = reinterpret_cast<Fn>(dlsym(lib, name));
    if (fn == nullptr && missing.empty()) missing = name;
    return fn != nullptr;
}
// A counter's function: null when the library lacks it, and that counter is left out like an unsupported one (NVML
// 13 deprecates nvmlDeviceGetTemperature; a driver without it should lose the temperature, not every counter).
template <typename Fn>
void bind_counter(void* lib, const char* name, Fn& fn) {
    fn = reinterpret_cast<Fn>(dlsym(lib, name));
}

class NvmlSource final : public GpuMetricsSource {
  public:
    NvmlSource(void* lib, const NvmlApi& api, nvmlDevice_t device) : lib_(lib), api_(api), device_(device) {}
    ~NvmlSource() override {
        api_.shutdown();
        dlclose(lib_);
    }
    NvmlSource(const NvmlSource&) = delete;
    NvmlSource& operator=(const NvmlSource&) = delete;

    std::optional<GpuSample> sample() override {
        GpuSample s;
        const NvmlApi& a = api_;
        if (nvmlMemory_t m{}; a.memory_info && a.memory_info(device_, &m) == kNvmlSuccess) s.mem_used_bytes = m.used;
        if (unsigned int v = 0; a.clock_info && a.clock_info(device_, kNvmlClockSm, &v) == kNvmlSuccess) {
            s.sm_clock_mhz = v;
        }
        if (unsigned int v = 0; a.clock_info && a.clock_info(device_, kNvmlClockMem, &v) == kNvmlSuccess) {
            s.mem_clock_mhz = v;
        }
        if (unsigned int v = 0; a.power_usage && a.power_usage(device_, &v) == kNvmlSuccess) s.power_mw = v;
        if (nvmlUtilization_t u{}; a.utilization && a.utilization(device_, &u) == kNvmlSuccess) {
            s.util_pct = u.gpu;
            s.mem_bw_util_pct = u.memory;
        }
        if (unsigned int v = 0; a.temperature && a.temperature(device_, kNvmlTemperatureGpu, &v) == kNvmlSuccess) {
            s.temperature_c = v;
        }
        return has_any(s) ? std::optional<GpuSample>(s) : std::nullopt;
    }

  private:
    void* lib_;
    NvmlApi api_;
    nvmlDevice_t device_;
};

int32_t word_of(const std::optional<uint32_t>& v) { return v ? static_cast<int32_t>(*v) : -1; }
std::optional<uint32_t> field_of(int32_t w) {
    return w >= 0 ? std::optional<uint32_t>(static_cast<uint32_t>(w)) : std::nullopt;
}

}  // namespace

NvmlOpen open_nvml(const std::string& pci_bus_id, const char* library) {
    void* lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        const char* why = dlerror();
        return {nullptr, fmt::format("dlopen: {}", why != nullptr ? why : library)};
    }
    NvmlApi api;
    std::string missing;
    const bool bound = bind(lib, "nvmlInit_v2", api.init, missing) & bind(lib, "nvmlShutdown", api.shutdown, missing) &
                       bind(lib, "nvmlErrorString", api.error_string, missing) &
                       bind(lib, "nvmlDeviceGetHandleByPciBusId_v2", api.handle_by_pci_bus_id, missing);
    bind_counter(lib, "nvmlDeviceGetMemoryInfo", api.memory_info);
    bind_counter(lib, "nvmlDeviceGetClockInfo", api.clock_info);
    bind_counter(lib, "nvmlDeviceGetPowerUsage", api.power_usage);
    bind_counter(lib, "nvmlDeviceGetUtilizationRates", api.utilization);
    bind_counter(lib, "nvmlDeviceGetTemperature", api.temperature);
    if (!bound) {
        dlclose(lib);
        return {nullptr, fmt::format("{} has no function {}: not NVML, or an NVML without it", library, missing)};
    }
    if (const nvmlReturn_t rc = api.init(); rc != kNvmlSuccess) {
        const std::string why = api.error_string(rc);
        dlclose(lib);
        return {nullptr, fmt::format("nvmlInit_v2 failed: {}", why)};
    }
    nvmlDevice_t device = nullptr;
    if (const nvmlReturn_t rc = api.handle_by_pci_bus_id(pci_bus_id.c_str(), &device); rc != kNvmlSuccess) {
        const std::string why = api.error_string(rc);
        api.shutdown();
        dlclose(lib);
        return {nullptr, fmt::format("NVML finds no device at PCI bus id {}: {}", pci_bus_id, why)};
    }
    return {std::make_unique<NvmlSource>(lib, api, device), {}};
}

GpuSampleWords pack_gpu_sample(const std::optional<GpuSample>& sample) {
    GpuSampleWords w;
    w.fill(-1);
    if (!sample) return w;
    if (sample->mem_used_bytes) {
        w[0] = static_cast<int32_t>(*sample->mem_used_bytes >> 32);
        w[1] = static_cast<int32_t>(static_cast<uint32_t>(*sample->mem_used_bytes));  // the low word, as its bits
    }
    w[2] = word_of(sample->sm_clock_mhz);
    w[3] = word_of(sample->mem_clock_mhz);
    w[4] = word_of(sample->power_mw);
    w[5] = word_of(sample->util_pct);
    w[6] = word_of(sample->mem_bw_util_pct);
    w[7] = word_of(sample->temperature_c);
    return w;
}

std::optional<GpuSample> unpack_gpu_sample(std::span<const int32_t, kGpuSampleWords> w) {
    GpuSample s;
    if (w[0] >= 0) s.mem_used_bytes = (static_cast<uint64_t>(w[0]) << 32) | static_cast<uint32_t>(w[1]);
    s.sm_clock_mhz = field_of(w[2]);
    s.mem_clock_mhz = field_of(w[3]);
    s.power_mw = field_of(w[4]);
    s.util_pct = field_of(w[5]);
    s.mem_bw_util_pct = field_of(w[6]);
    s.temperature_c = field_of(w[7]);
    return has_any(s) ? std::optional<GpuSample>(s) : std::nullopt;
}

nlohmann::json gpu_sample_json(const GpuSample& s) {
    nlohmann::json j = nlohmann::json::object();
    if (s.mem_used_bytes) j["mem_used_bytes"] = *s.mem_used_bytes;
    if (s.sm_clock_mhz) j["sm_clock_mhz"] = *s.sm_clock_mhz;
    if (s.mem_clock_mhz) j["mem_clock_mhz"] = *s.mem_clock_mhz;
    if (s.power_mw) j["power_w"] = *s.power_mw / 1e3;
    if (s.util_pct) j["util_pct"] = *s.util_pct;
    if (s.mem_bw_util_pct) j["mem_bw_util_pct"] = *s.mem_bw_util_pct;
    if (s.temperature_c) j["temperature_c"] = *s.temperature_c;
    return j;
}

nlohmann::json gpu_metrics_json(std::span<const int32_t> gathered) {
    nlohmann::json gpu;  // null until a rank has a sample
    for (size_t r = 0; r * kGpuSampleWords < gathered.size(); ++r) {
        const auto words = gathered.subspan(r * kGpuSampleWords).first<kGpuSampleWords>();
        if (const std::optional<GpuSample> s = unpack_gpu_sample(words))
            gpu[fmt::format("rank{}", r)] = gpu_sample_json(*s);
    }
    return gpu;
}

nlohmann::json GpuMetrics::gather(Communicator& world) {
    const GpuSampleWords own = pack_gpu_sample(source_ ? source_->sample() : std::nullopt);
    std::vector<int32_t> all(kGpuSampleWords * static_cast<size_t>(world.size()));
    world.all_gather(std::span<const int32_t>(own), std::span<int32_t>(all)).wait();
    return gpu_metrics_json(all);
}

std::optional<GpuMetrics> open_gpu_metrics(BackendKind backend, const std::string& pci_bus_id,
                                           const char* nvml_library) {
    if (backend != BackendKind::kCUDA || pci_bus_id.empty()) return std::nullopt;
    NvmlOpen nvml = open_nvml(pci_bus_id, nvml_library);
    if (nvml.source) {
        log_info("gpu metrics: NVML samples the GPU at {} (rank 0) every log interval: metrics.jsonl \"gpu\"",
                 pci_bus_id);
    } else {
        log_warn("gpu metrics: none from this rank's GPU ({}); metrics.jsonl and TensorBoard go without them",
                 nvml.error);
    }
    return GpuMetrics(std::move(nvml.source));
}

}  // namespace ms
