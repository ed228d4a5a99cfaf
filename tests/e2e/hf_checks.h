// hf_checks.h: what the Hugging Face interop tests (test_hf_interop.cpp for GPT-2, test_hf_llama.cpp for Llama) share:
// running the Python references, `eval --json`, comparing checkpoints bit for bit, and writing edited copies of an
// exported directory (F32, or BF16 by truncation, which the tests compare with the truncated values), the torch
// references against a checkpoint, and the suites' fixture: a model trained and exported once per suite.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/checkpoint_model.h"
#include "engine/ckpt/safetensors.h"
#include "engine/config/config.h"
#include "engine/core/dtype.h"
#include "engine/data/dataset.h"
#include "engine/model/gpt.h"
#include "engine/train/run_layout.h"
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

// The torch model of an HF directory (tests/e2e/<script>: hf_gpt2_reference.py, hf_llama_reference.py, which write
// micro-batch 0's logits and the loss) against the checkpoint `ckpt` of the same model, on the samples `eval --split
// valid` reads with the config and `overrides`.
struct TorchComparison {
    bool skipped = false;
    double logits = 0, loss = 0;           // worst row's max |dlogit| / max |logit|; |eval loss - torch loss|
    std::string torch_logits, torch_loss;  // the script's output files
};
inline TorchComparison compare_with_torch(const std::string& script, const std::string& config_path,
                                          const std::string& hf_dir, const std::string& ckpt,
                                          const std::vector<std::string>& overrides = {}) {
    TorchComparison out;
    const std::string python = MS_SYSTEM_PYTHON;
    out.skipped = python.empty();
    if (out.skipped) return out;
    // The samples `eval --split valid` reads: the trainer's sampler, as eval builds it (one rank).
    Config cfg = load_config(config_path, overrides);
    const std::unique_ptr<TokenSource> source = open_token_source(cfg.data, cfg.model.vocab_size);
    const DerivedConfig d = validate_config(cfg, 1);
    const GptShape shape = gpt_shape(cfg, d);
    const int B = cfg.training.micro_batch_size, T = cfg.model.seq_length;
    const int M = static_cast<int>(cfg.eval.eval_iters * d.num_microbatches);
    const Sampler sampler(*source, cfg.data.split, Split::kValid, T, cfg.run.seed);
    std::vector<int32_t> tokens(static_cast<size_t>(M) * B * T), targets(tokens.size());
    for (int i = 0; i < M; ++i)
        sampler.fill(static_cast<int64_t>(i) * B, B, tokens.data() + static_cast<size_t>(i) * B * T,
                     targets.data() + static_cast<size_t>(i) * B * T);
    const TempDir work("ms_hf_torch");
    std::ofstream(work / "shape.json") << nlohmann::json{{"B", B}, {"T", T}, {"micro_batches", M}}.dump();
    std::ofstream(work / "tokens.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 4));
    std::ofstream(work / "targets.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(targets.data()), static_cast<std::streamsize>(targets.size() * 4));
    const int rc = run_python(python, quoted(std::string(MS_SOURCE_DIR "/tests/e2e/") + script) + " " + quoted(hf_dir) +
                                          " " + quoted(work.path()));
    out.skipped = rc == 77;
    if (out.skipped) return out;
    EXPECT_EQ(rc, 0) << script << " failed on " << hf_dir;
    out.torch_logits = read_file(work / "logits.bin");
    out.torch_loss = read_file(work / "loss.txt");
    if (rc != 0) return out;

    // Logits of micro-batch 0 from the checkpoint, through the path eval and generate use.
    const CheckpointReader reader(resolve_checkpoint(ckpt));
    const std::unique_ptr<Backend> backend = make_backend(BackendOptions{});
    SelfCommunicator tp;
    Gpt model(shape, *backend, tp, B);
    read_whole_model(reader, model);
    model.forward(tokens.data(), targets.data(), B, T);
    std::vector<float> torch_logits(static_cast<size_t>(B) * T * shape.V);
    EXPECT_EQ(out.torch_logits.size(), torch_logits.size() * sizeof(float));
    std::memcpy(torch_logits.data(), out.torch_logits.data(),
                std::min(out.torch_logits.size(), torch_logits.size() * 4));
    for (int row = 0; row < B * T; ++row) {
        const float* ours = model.logits() + static_cast<size_t>(row) * shape.Vp;  // padded columns beyond V
        const float* theirs = torch_logits.data() + static_cast<size_t>(row) * shape.V;
        double err = 0, scale = 0;
        for (int v = 0; v < shape.V; ++v) {
            err = std::max(err, std::abs(static_cast<double>(ours[v]) - theirs[v]));
            scale = std::max(scale, std::abs(static_cast<double>(theirs[v])));
        }
        out.logits = std::max(out.logits, err / scale);
    }
    std::string sets;
    for (const std::string& o : overrides) sets += " --set " + o;
    const nlohmann::json ev = eval_json("--config " + config_path + sets + " --load " + ckpt);
    EXPECT_TRUE(ev.contains("eval loss"));
    const double eval_loss = ev.value("eval loss", NAN), torch_loss = std::stod(out.torch_loss);
    out.loss = std::abs(eval_loss - torch_loss);
    std::printf("C++ vs torch (%s) from %s: logits %.3g (relative, worst row), eval loss %.9g vs %.9g (%.3g)\n",
                script.c_str(), hf_dir.c_str(), out.logits, eval_loss, torch_loss, out.loss);
    return out;
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
