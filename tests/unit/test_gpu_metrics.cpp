// test_gpu_metrics.cpp: the GPU counters of a CUDA run (engine/train/gpu_metrics.h) -- a fake source's samples in a
// metrics.jsonl record and in the TensorBoard scalars the trainer writes for it, the packing every rank's sample
// takes through the gather, NVML's loader where there is no NVML (no driver on the machine, or a library without
// NVML's functions): a sentence, no source, no crash; and the loader end to end (dlopen, dlsym, the calls through
// NVML's C ABI) against a fake NVML library, tests/unit/fake_nvml.c, whose known values must arrive unchanged.
#include "engine/train/gpu_metrics.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/train/tensorboard.h"
#include "tests/common/temp_dir.h"

namespace ms {
namespace {

using nlohmann::json;

// Hands out the samples it was given, one per call (nullopt once they run out).
class FakeSource final : public GpuMetricsSource {
  public:
    explicit FakeSource(std::vector<std::optional<GpuSample>> samples) : samples_(std::move(samples)) {}
    std::optional<GpuSample> sample() override { return next_ < samples_.size() ? samples_[next_++] : std::nullopt; }

  private:
    std::vector<std::optional<GpuSample>> samples_;
    size_t next_ = 0;
};

// An H200-sized sample: memory past 2^32 bytes with the low word's top bit set, so both words of the packing matter.
GpuSample full_sample() {
    GpuSample s;
    s.mem_used_bytes = (uint64_t{33} << 32) | 0x80000001u;
    s.sm_clock_mhz = 1980;
    s.mem_clock_mhz = 3201;
    s.power_mw = 612345;
    s.util_pct = 97;
    s.mem_bw_util_pct = 41;
    s.temperature_c = 63;
    return s;
}

std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

TEST(GpuMetrics, AFakeSourcesSamplesReachMetricsJsonlAndTensorBoard) {
    const test::TempDir dir("ms_gpu_metrics");
    GpuSample partial;  // a device that reports no utilisation (MIG) and no power
    partial.mem_used_bytes = 1000;
    partial.sm_clock_mhz = 1410;
    partial.mem_clock_mhz = 1593;
    partial.temperature_c = 40;
    GpuMetrics metrics(std::make_unique<FakeSource>(std::vector<std::optional<GpuSample>>{full_sample(), partial}));
    SelfCommunicator world;
    TensorBoardWriter tb(dir / "tb", 10);
    std::ofstream jsonl(dir / "metrics.jsonl");
    for (int64_t it : {10, 20, 30}) {  // as the trainer's log_interval adds them to its record
        json record = {{"iteration", it}, {"time", 1000.0 + static_cast<double>(it)}, {"lm loss", 2.5}};
        if (json gpu = metrics.gather(world); !gpu.is_null()) record["gpu"] = std::move(gpu);
        jsonl << record.dump() << '\n';
        tb.add_record(record);
    }
    jsonl.close();

    std::vector<json> lines;
    std::ifstream in(dir / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
    ASSERT_EQ(lines.size(), 3u);
    const json want_full = {{"mem_used_bytes", 143881404417ull},
                            {"sm_clock_mhz", 1980},
                            {"mem_clock_mhz", 3201},
                            {"power_w", 612.345},
                            {"util_pct", 97},
                            {"mem_bw_util_pct", 41},
                            {"temperature_c", 63}};
    EXPECT_EQ(lines[0]["gpu"], json({{"rank0", want_full}}));
    EXPECT_EQ(
        lines[1]["gpu"],
        json({{"rank0",
               {{"mem_used_bytes", 1000}, {"sm_clock_mhz", 1410}, {"mem_clock_mhz", 1593}, {"temperature_c", 40}}}}));
    EXPECT_FALSE(lines[2].contains("gpu"));  // the source had no sample: no field, the record as before

    // TensorBoard: every field of the first record under gpu/rank0/<field>, at its step and time, exactly as the
    // writer encodes a scalar; the second record's four; nothing gpu/ in the third.
    const std::string body = read_bytes(tb.path());
    for (const auto& [field, value] : want_full.items()) {
        const std::string event = tfrecord(scalar_event(1010.0, 10, "gpu/rank0/" + field, value.get<float>()));
        EXPECT_NE(body.find(event), std::string::npos) << field;
    }
    for (const std::string field : {"mem_used_bytes", "sm_clock_mhz", "mem_clock_mhz", "temperature_c"}) {
        const float value = lines[1]["gpu"]["rank0"][field].get<float>();
        EXPECT_NE(body.find(tfrecord(scalar_event(1020.0, 20, "gpu/rank0/" + field, value))), std::string::npos)
            << field;
    }
    int gpu_scalars = 0;
    for (const json& record : lines) {
        for (const TensorBoardScalar& s : tensorboard_scalars(record)) gpu_scalars += s.tag.starts_with("gpu/");
    }
    EXPECT_EQ(gpu_scalars, 7 + 4);
}

TEST(GpuMetrics, PackingKeepsEverySetFieldAndTheUnsetOnesUnset) {
    const GpuSample full = full_sample();
    const std::optional<GpuSample> back = unpack_gpu_sample(pack_gpu_sample(full));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(gpu_sample_json(*back), gpu_sample_json(full));
    EXPECT_EQ(back->mem_used_bytes, full.mem_used_bytes);

    GpuSample only_power;
    only_power.power_mw = 0;  // zero is a value, not "unset"
    const std::optional<GpuSample> p = unpack_gpu_sample(pack_gpu_sample(only_power));
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(gpu_sample_json(*p), json({{"power_w", 0.0}}));
    EXPECT_FALSE(unpack_gpu_sample(pack_gpu_sample(std::nullopt)).has_value());
    EXPECT_FALSE(unpack_gpu_sample(pack_gpu_sample(GpuSample{})).has_value());
}

TEST(GpuMetrics, TheGatheredRecordNamesEachRankWithASample) {
    // Three ranks' words as the all_gather lays them out: rank 1 has no sample (NVML failed there).
    GpuSample r2;
    r2.util_pct = 5;
    std::vector<int32_t> gathered;
    for (const std::optional<GpuSample>& s :
         {std::optional<GpuSample>(full_sample()), std::optional<GpuSample>(), std::optional<GpuSample>(r2)}) {
        const GpuSampleWords w = pack_gpu_sample(s);
        gathered.insert(gathered.end(), w.begin(), w.end());
    }
    const json gpu = gpu_metrics_json(gathered);
    EXPECT_EQ(gpu, json({{"rank0", gpu_sample_json(full_sample())}, {"rank2", {{"util_pct", 5}}}}));
    const GpuSampleWords none = pack_gpu_sample(std::nullopt);
    std::vector<int32_t> all_none(none.begin(), none.end());
    all_none.insert(all_none.end(), none.begin(), none.end());
    EXPECT_TRUE(gpu_metrics_json(all_none).is_null());
}

TEST(GpuMetrics, WithoutNvmlTheLoaderSaysWhyAndGivesNoSource) {
    // This machine has no NVIDIA driver, so no libnvidia-ml.so.1; where one is installed, no GPU sits at this bus id.
    // Either way: no source and a sentence.
    const NvmlOpen absent = open_nvml("ffff:ff:1f.7");
    EXPECT_EQ(absent.source, nullptr);
    EXPECT_FALSE(absent.error.empty());

    const NvmlOpen missing = open_nvml("0000:3b:00.0", "libms-no-such-nvml.so.1");
    EXPECT_EQ(missing.source, nullptr);
    EXPECT_TRUE(missing.error.starts_with("dlopen: libms-no-such-nvml.so.1")) << missing.error;

    const NvmlOpen not_nvml = open_nvml("0000:3b:00.0", "libc.so.6");  // loads, but is not NVML
    EXPECT_EQ(not_nvml.source, nullptr);
    EXPECT_EQ(not_nvml.error, "libc.so.6 has no function nvmlInit_v2: not NVML, or an NVML without it");
}

// The fake NVML held open by the test as well, so that its count of nvmlInit_v2 calls not yet shut down outlives
// the loader's dlclose (dlopen of the same path shares the one loaded copy).
class FakeNvml {
  public:
    explicit FakeNvml(const char* path) : lib_(dlopen(path, RTLD_NOW | RTLD_LOCAL)) {}
    ~FakeNvml() {
        if (lib_ != nullptr) dlclose(lib_);
    }
    FakeNvml(const FakeNvml&) = delete;
    FakeNvml& operator=(const FakeNvml&) = delete;
    bool loaded() const { return lib_ != nullptr; }
    int live_inits() const { return reinterpret_cast<int (*)()>(dlsym(lib_, "fake_nvml_live_inits"))(); }

  private:
    void* lib_;
};

// What fake_nvml.c reports for its device at 0000:3b:00.0, in the record: 1234 MiB, 512345 mW as watts.
const json kFakeDeviceRecord = {{"mem_used_bytes", 1293942784}, {"sm_clock_mhz", 1980}, {"mem_clock_mhz", 3201},
                                {"power_w", 512.345},           {"util_pct", 87},       {"mem_bw_util_pct", 41},
                                {"temperature_c", 55}};

TEST(NvmlLoader, EveryCounterArrivesAsTheLibraryGaveIt) {
    FakeNvml fake(MS_FAKE_NVML);
    ASSERT_TRUE(fake.loaded()) << dlerror();
    {
        const NvmlOpen nvml = open_nvml("0000:3b:00.0", MS_FAKE_NVML);
        ASSERT_NE(nvml.source, nullptr) << nvml.error;
        EXPECT_EQ(nvml.error, "");
        EXPECT_EQ(fake.live_inits(), 1);
        const std::optional<GpuSample> s = nvml.source->sample();
        ASSERT_TRUE(s.has_value());
        EXPECT_EQ(s->mem_used_bytes, uint64_t{1234} << 20);
        EXPECT_EQ(s->sm_clock_mhz, 1980u);  // NVML_CLOCK_SM, not the graphics clock (1755 in the fake)
        EXPECT_EQ(s->mem_clock_mhz, 3201u);
        EXPECT_EQ(s->power_mw, 512345u);
        EXPECT_EQ(s->util_pct, 87u);
        EXPECT_EQ(s->mem_bw_util_pct, 41u);
        EXPECT_EQ(s->temperature_c, 55u);
    }
    EXPECT_EQ(fake.live_inits(), 0);  // the source's end shut NVML down

    // As the trainer opens it: no warning, and the record line carries the values.
    testing::internal::CaptureStderr();
    std::optional<GpuMetrics> metrics = open_gpu_metrics(BackendKind::kCUDA, "0000:3B:00.0", MS_FAKE_NVML);
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
    ASSERT_TRUE(metrics.has_value());
    SelfCommunicator world;
    const json record = {{"iteration", 10}, {"gpu", metrics->gather(world)}};
    EXPECT_EQ(json::parse(record.dump())["gpu"], json({{"rank0", kFakeDeviceRecord}}));
    metrics.reset();
    EXPECT_EQ(fake.live_inits(), 0);
}

TEST(NvmlLoader, ACounterTheDeviceDoesNotReportIsLeftOut) {
    // The fake's 0000:86:00.0 answers NVML_ERROR_NOT_SUPPORTED for utilisation, as a MIG instance does.
    const NvmlOpen nvml = open_nvml("0000:86:00.0", MS_FAKE_NVML);
    ASSERT_NE(nvml.source, nullptr) << nvml.error;
    const std::optional<GpuSample> s = nvml.source->sample();
    ASSERT_TRUE(s.has_value());
    EXPECT_FALSE(s->util_pct.has_value());
    EXPECT_FALSE(s->mem_bw_util_pct.has_value());
    json want = kFakeDeviceRecord;
    want.erase("util_pct");
    want.erase("mem_bw_util_pct");
    EXPECT_EQ(gpu_sample_json(*s), want);
}

TEST(NvmlLoader, AnUnknownBusIdIsOneWarningWithTheReasonAndNoCounters) {
    FakeNvml fake(MS_FAKE_NVML);
    ASSERT_TRUE(fake.loaded()) << dlerror();
    testing::internal::CaptureStderr();
    std::optional<GpuMetrics> metrics = open_gpu_metrics(BackendKind::kCUDA, "0000:af:00.0", MS_FAKE_NVML);
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("warning: gpu metrics: none from this rank's GPU (NVML finds no device at PCI bus id "
                       "0000:af:00.0: Not Found)"),
              std::string::npos)
        << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_EQ(fake.live_inits(), 0);  // nvmlInit_v2 succeeded, so the failure shut NVML down again
    ASSERT_TRUE(metrics.has_value());
    SelfCommunicator world;
    EXPECT_TRUE(metrics->gather(world).is_null());
}

// A library without one counter's function (NVML 13 deprecates nvmlDeviceGetTemperature): that counter is left out,
// silently, and every other one arrives. (A library without NVML's own functions is refused: libc.so.6 above.)
TEST(NvmlLoader, ALibraryWithoutACountersFunctionLeavesThatCounterOut) {
    const std::string path = MS_FAKE_NVML_NO_TEMPERATURE;
    testing::internal::CaptureStderr();
    std::optional<GpuMetrics> metrics = open_gpu_metrics(BackendKind::kCUDA, "0000:3b:00.0", path.c_str());
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(err, "");
    ASSERT_TRUE(metrics.has_value());
    const NvmlOpen nvml = open_nvml("0000:3b:00.0", path.c_str());
    ASSERT_NE(nvml.source, nullptr) << nvml.error;
    const std::optional<GpuSample> s = nvml.source->sample();
    ASSERT_TRUE(s.has_value());
    EXPECT_FALSE(s->temperature_c.has_value());
    json want = kFakeDeviceRecord;
    want.erase("temperature_c");
    EXPECT_EQ(gpu_sample_json(*s), want);
}

TEST(GpuMetrics, OnlyACudaRunOnADeviceOpensNvml) {
    EXPECT_FALSE(open_gpu_metrics(BackendKind::kCPU, "0000:3b:00.0").has_value());
    EXPECT_FALSE(open_gpu_metrics(BackendKind::kCUDA, "").has_value());  // the CPU emulation of the CUDA kernels
    // A CUDA run whose NVML fails still gathers (every rank takes part), and adds nothing.
    std::optional<GpuMetrics> m = open_gpu_metrics(BackendKind::kCUDA, "ffff:ff:1f.7");
    ASSERT_TRUE(m.has_value());
    SelfCommunicator world;
    EXPECT_TRUE(m->gather(world).is_null());
}

}  // namespace
}  // namespace ms
