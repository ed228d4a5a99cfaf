// hf_checks.h: what the Hugging Face interop tests (test_hf_interop.cpp for GPT-2, test_hf_llama.cpp for Llama) share:
// running the Python references, `eval --json`, comparing checkpoints bit for bit, and writing edited copies of an
// exported directory (F32, or BF16 by truncation, which the tests compare with the truncated values), and the suites'
// fixture: a model trained and exported once per suite.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/safetensors.h"
#include "engine/core/dtype.h"
#include "tests/common/temp_dir.h"
#include "tests/e2e/run_cli.h"

namespace ms::test {

inline std::string quoted(const std::string& s) { return "'" + s + "'"; }

// Runs a Python script; 77 means "cannot import what it needs" (the test skips).
inline int run_python(const std::string& python, const std::string& args) {
    const std::string cmd = "OMP_NUM_THREADS=2 " + python + " " + args + " 2>&1";
    const int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// `eval --json ARGS`'s result line (an empty object, and a failure, when eval fails).
inline nlohmann::json eval_json(const std::string& args) {
    const auto r = run_cli("eval --json " + args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const size_t brace = r.output.rfind("\n{");
    if (r.exit_code != 0 || brace == std::string::npos) return nlohmann::json::object();
    return nlohmann::json::parse(r.output.substr(brace + 1));
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every tensor of two checkpoints, compared bit for bit through CheckpointReader.
inline void expect_same_tensors(const std::string& dir_a, const std::string& dir_b) {
    const CheckpointReader a(dir_a), b(dir_b);
    ASSERT_EQ(a.names(), b.names());
    EXPECT_EQ(a.vocab_size(), b.vocab_size());
    for (const std::string& name : a.names()) {
        const CanonicalTensor ta = a.tensor(name), tb = b.tensor(name);
        EXPECT_EQ(ta.shape, tb.shape) << name;
        EXPECT_TRUE(same_bits(ta.data, tb.data)) << name << " differs";
    }
}

// x with the low 16 bits of its mantissa cleared: what a BF16 copy by truncation holds, exactly.
inline float bf16_truncated(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    bits &= 0xFFFF0000u;
    std::memcpy(&x, &bits, 4);
    return x;
}

// A copy of the HF directory `from` (config.json + an F32 model.safetensors) at `to`, its tensors (name -> fp32 data
// and shape) edited by `edit_tensors` and its config.json by `edit_config` (copied byte for byte without one), written
// F32 or BF16 (by truncation: bf16_truncated's values).
struct HfTensor {
    std::vector<int64_t> shape;
    std::vector<float> data;
};
using EditHfTensors = std::function<void(std::map<std::string, HfTensor>&)>;
using EditHfConfig = std::function<void(nlohmann::json&)>;
inline void write_hf_copy(const std::string& from, const std::string& to, const EditHfTensors& edit_tensors,
                          const EditHfConfig& edit_config = {}, DType dtype = DType::kF32) {
    namespace fs = std::filesystem;
    fs::create_directories(to);
    if (edit_config) {
        nlohmann::json config = nlohmann::json::parse(read_file(from + "/config.json"));
        edit_config(config);
        std::ofstream(to + "/config.json") << config.dump(2);
    } else {
        fs::copy_file(from + "/config.json", to + "/config.json", fs::copy_options::overwrite_existing);
    }
    const SafetensorsFile f = SafetensorsFile::open(from + "/model.safetensors");
    std::map<std::string, HfTensor> tensors;
    for (const std::string& name : f.names()) {
        HfTensor t{f.info(name).shape, std::vector<float>(static_cast<size_t>(f.info(name).numel()))};
        std::memcpy(t.data.data(), f.data(name), t.data.size() * sizeof(float));
        tensors[name] = std::move(t);
    }
    if (edit_tensors) edit_tensors(tensors);
    std::vector<std::vector<uint16_t>> halves;  // bf16 copies, alive for the writer
    halves.reserve(tensors.size());
    std::vector<TensorEntry> entries;
    for (const auto& [name, t] : tensors) {
        if (dtype == DType::kBF16) {
            std::vector<uint16_t> h(t.data.size());
            for (size_t i = 0; i < h.size(); ++i) {
                uint32_t bits;
                std::memcpy(&bits, &t.data[i], 4);
                h[i] = static_cast<uint16_t>(bits >> 16);
            }
            halves.push_back(std::move(h));
            entries.push_back({name, DType::kBF16, t.shape, halves.back().data()});
        } else {
            entries.push_back({name, DType::kF32, t.shape, t.data.data()});
        }
    }
    write_safetensors(to + "/model.safetensors", entries, {{"format", "pt"}});
}

// A suite's shared setup, once: Suite::kConfigYaml written to Suite::kConfigName in a temporary directory named
// Suite::kTempName, trained with checkpoints to <dir>/ckpt, exported with `convert --to Suite::kFormat` to <dir>/hf.
// Every test fails with the setup's log when that failed.
template <class Suite>
class HfTrainedSuite : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = new TempDir(Suite::kTempName);
        std::ofstream(config()) << Suite::kConfigYaml;
        const auto train = run_cli("train --config " + config() + " --set run.output_dir=" + path("run") +
                                   " --set checkpoint.save=" + path("ckpt"));
        setup_log_ = new std::string(train.output);
        if (train.exit_code != 0) return;
        const auto out =
            run_cli(std::string("convert --to ") + Suite::kFormat + " --load " + path("ckpt") + " --out " + path("hf"));
        *setup_log_ += out.output;
        ready_ = out.exit_code == 0;
    }
    static void TearDownTestSuite() {
        delete dir_;
        delete setup_log_;
    }
    void SetUp() override { ASSERT_TRUE(ready_) << "training or the export failed:\n" << *setup_log_; }

    static std::string path(const std::string& name) { return *dir_ / name; }
    static std::string config() { return path(Suite::kConfigName); }
    static std::string trained() { return path("ckpt") + "/iter_0000012"; }

    static inline TempDir* dir_ = nullptr;
    static inline std::string* setup_log_ = nullptr;
    static inline bool ready_ = false;
};

}  // namespace ms::test
