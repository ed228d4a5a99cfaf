// checkpoint_files.h: a training checkpoint's directories and files for the tests that save and resume through the
// real binary (tests/parallel/test_checkpoint.cpp, test_clip_checkpoint.cpp): the --set options that save and load,
// an iteration's directory, the manifest's files under a folder, a byte flipped on disk, the bit-for-bit comparison
// of two checkpoints' state, and a tiny GPT-2 model-only checkpoint. Header-only.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/ckpt/atomic_dir.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/checkpoint_model.h"
#include "engine/config/config.h"
#include "engine/model/gpt.h"

namespace ms::test {

// --set options saving to `save` and loading from `load` (either may be empty), every `interval` iterations (0: at
// the end only).
inline std::string ckpt_sets(const std::string& save, const std::string& load, int interval = 0) {
    return "--set checkpoint.save=" + save + " --set checkpoint.load=" + load +
           " --set checkpoint.save_interval=" + std::to_string(interval);
}

// <save>/iter_XXXXXXX: iteration `it`'s checkpoint.
inline std::string iter_dir(const std::string& save, int64_t it) { return save + "/" + checkpoint_dir_name(it); }

// The manifest's files under `prefix` ("model/", "optim/"), by their path in the checkpoint directory.
inline std::vector<std::string> manifest_files(const nlohmann::json& manifest, const std::string& prefix) {
    std::vector<std::string> files;
    for (const auto& [rel, entry] : manifest["files"].items())
        if (rel.starts_with(prefix)) files.push_back(rel);
    return files;
}

// Flips the bits of one byte 64 bytes before the end of `path` (inside the data of a safetensors file), leaving
// its size: what only a checksum finds.
inline void flip_byte(const std::string& path) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-64, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(-64, std::ios::end);
    f.write(&c, 1);
    ASSERT_TRUE(f.good()) << "cannot flip a byte of " << path;
}

// Every model tensor and both optimizer states of two checkpoints agree bit for bit, and so does the progress of
// their train state.
inline void expect_same_state(const CheckpointReader& a, const CheckpointReader& b) {
    ASSERT_EQ(a.names(), b.names());
    for (const std::string& name : a.names()) {
        EXPECT_EQ(a.tensor(name).data, b.tensor(name).data) << name;
        for (const OptimState s : {OptimState::kExpAvg, OptimState::kExpAvgSq})
            EXPECT_EQ(a.optimizer_state(name, s).data, b.optimizer_state(name, s).data)
                << optim_state_name(s) << " of " << name;
    }
    EXPECT_EQ(a.train_state().consumed_samples, b.train_state().consumed_samples);
    EXPECT_EQ(a.train_state().optimizer_step, b.train_state().optimizer_step);
}

// A GPT-2 model-only checkpoint (what `convert --from hf-gpt2` writes) into `save_dir`: one layer of width 16, 2
// heads, 8 positions, a vocabulary of 32, every weight 0. For the refusals of another family's checkpoint.
inline void write_tiny_gpt2_checkpoint(const std::string& save_dir) {
    const GptShape shape{.L = 1, .C = 16, .NH = 2, .T = 8, .V = 32, .Vp = 128, .F = 64};
    Config cfg;
    cfg.model.num_layers = shape.L;
    cfg.model.hidden_size = shape.C;
    cfg.model.num_attention_heads = shape.NH;
    cfg.model.seq_length = shape.T;
    cfg.model.vocab_size = shape.V;
    const std::vector<ParamInfo> table = gpt_param_table(shape);
    const std::vector<float> zeros(static_cast<size_t>(table.back().offset + table.back().numel), 0.0f);
    write_model_checkpoint(save_dir, cfg, shape, zeros.data(), TrainState{}, nlohmann::json::object());
}

}  // namespace ms::test
