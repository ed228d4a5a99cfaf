// test_clip_checkpoint.cpp: CLIP (model.arch: clip) through the training checkpoint format (engine/ckpt/checkpoint.h,
// engine/clip/clip_checkpoint.h), with the real binary: exact resume on one rank and on tp2 x dp2 ZeRO-1, resume of
// a tp2 x dp2 checkpoint on one rank and on dp2, `convert --to hf-clip` from any layout, the refusal of another
// family's checkpoint, and a corrupted checkpoint.
//
// Every run trains tests/parallel/tiny-clip.yaml (a global batch of 8 image-text pairs) with the lr schedule pinned to
// lr_decay_iters = 8, so a run stopped at iteration 4 follows the schedule of the 8-step run it is compared with.
// Each run's losses are the steps it trained (run_train gives it a fresh run.output_dir); its checkpoints go to a
// directory of the test's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/ckpt/atomic_dir.h"
#include "engine/ckpt/checkpoint.h"
#include "tests/common/checkpoint_files.h"
#include "tests/common/clip_train.h"
#include "tests/common/temp_dir.h"
#include "tests/common/train_run.h"
#include "tests/e2e/run_cli.h"

namespace ms::test {
namespace {

namespace fs = std::filesystem;

constexpr int kTotalIters = 8;
constexpr int kSplitAt = 4;
constexpr const char* kTp2Dp2 =
    "--set parallel.tensor_model_parallel_size=2 --set training.micro_batch_size=4 --set parallel.zero_stage=1";
constexpr const char* kDp2 = "--set training.micro_batch_size=4";

// tiny-clip.yaml for `iters` steps on `ranks` processes; `sets` are more --set options.
TrainRun run_clip(int ranks, int iters, const std::string& sets) {
    return run_tiny_clip(ranks, "--set training.train_iters=" + std::to_string(iters) +
                                    " --set lr_schedule.lr_decay_iters=" + std::to_string(kTotalIters) + " " + sets);
}

// The same on one rank through run_cli, for runs that are meant to fail: their exit code and output.
CliResult run_clip_cli(int iters, const std::string& out, const std::string& sets) {
    return run_cli("train --config " MS_SOURCE_DIR "/tests/parallel/tiny-clip.yaml --set run.output_dir=" + out +
                   " --set training.train_iters=" + std::to_string(iters) +
                   " --set lr_schedule.lr_decay_iters=" + std::to_string(kTotalIters) + " " + sets);
}

std::vector<double> tail(const std::vector<double>& v, size_t from) {
    return from <= v.size() ? std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(from), v.end())
                            : std::vector<double>{};
}

// Every model tensor of a CLIP model (both towers and the logit scale) and both optimizer states of two checkpoints
// agree bit for bit.
void expect_same_clip_state(const std::string& a_dir, const std::string& b_dir) {
    const CheckpointReader a(a_dir), b(b_dir);
    ASSERT_TRUE(a.contains("logit_scale"));
    ASSERT_TRUE(a.contains("text_model.encoder.layers.1.mlp.fc2.weight"));
    expect_same_state(a, b);
}

// 8 steps straight vs 4, save, auto-resume, 4 more under the same layout: the same losses and the same final
// weights and optimizer state, bit for bit (fp32 on the CPU, no RNG state outside Philox, the sample order a function
// of the global sample index).
// The checkpoints are left in d/straight and d/split.
void expect_resume_is_exact(const TempDir& d, int ranks, const std::string& layout) {
    const TrainRun straight = run_clip(ranks, kTotalIters, layout + " " + ckpt_sets(d / "straight", ""));
    ASSERT_EQ(straight.losses.size(), static_cast<size_t>(kTotalIters)) << straight.output;
    const TrainRun first = run_clip(ranks, kSplitAt, layout + " " + ckpt_sets(d / "split", d / "split"));
    EXPECT_NE(first.output.find("starting from scratch"), std::string::npos) << first.output;
    const TrainRun second = run_clip(ranks, kTotalIters, layout + " " + ckpt_sets(d / "split", d / "split"));
    EXPECT_NE(second.output.find("resumed from " + iter_dir(d / "split", kSplitAt)), std::string::npos)
        << second.output;

    EXPECT_EQ(first.losses, std::vector<double>(straight.losses.begin(), straight.losses.begin() + kSplitAt));
    EXPECT_EQ(second.losses, tail(straight.losses, kSplitAt));
    expect_same_clip_state(iter_dir(d / "straight", kTotalIters), iter_dir(d / "split", kTotalIters));
    const CheckpointReader r(iter_dir(d / "split", kTotalIters));
    EXPECT_EQ(r.train_state().optimizer_step, kTotalIters);
    EXPECT_EQ(r.train_state().consumed_samples, kTotalIters * 8);
    EXPECT_EQ(r.manifest()["model"]["arch"], "clip");
}

TEST(ClipCheckpointResume, OneRankContinuesBitIdentically) {
    const TempDir d("clip_ckpt_exact");
    expect_resume_is_exact(d, 1, "");
}

TEST(ClipCheckpointResume, Tp2Dp2Zero1ContinuesBitIdentically) {
    const TempDir d("clip_ckpt_exact");
    expect_resume_is_exact(d, 4, kTp2Dp2);
    // The layout is the manifest's; 2 model files (one per tp rank) and 4 optimizer files (one per rank).
    const CheckpointReader r(iter_dir(d / "split", kSplitAt));
    EXPECT_EQ(r.manifest()["tp"], 2);
    EXPECT_EQ(r.manifest()["dp"], 2);
    EXPECT_EQ(r.manifest()["zero_stage"], 1);
    EXPECT_EQ(manifest_files(r.manifest(), "model/").size(), 2u);
    EXPECT_EQ(manifest_files(r.manifest(), "optim/").size(), 4u);
}

// With cross-modal layers the resume is exact too (the hard negatives are Philox draws of (seed, step, sample), no
// state), the checkpoint holds the fusion's tensors and says how many layers it has, and `convert --to hf-clip`
// exports the towers alone (CLIPModel has no cross-modal layers), the same bytes as a run without them would.
TEST(ClipCheckpointResume, CrossModalLayersContinueBitIdentically) {
    const TempDir d("clip_ckpt_itm");
    expect_resume_is_exact(d, 1, "--set clip.cross_modal_layers=1");
    const CheckpointReader r(iter_dir(d / "split", kTotalIters));
    EXPECT_EQ(r.manifest()["model"]["cross_modal_layers"], 1);
    EXPECT_TRUE(r.contains("fusion.layers.0.cross_attn.k_proj.weight"));
    EXPECT_TRUE(r.contains("itm_head.weight"));
    const CliResult c = run_cli("convert --to hf-clip --load " + (d / "split") + " --out " + (d / "hf"));
    ASSERT_EQ(c.exit_code, 0) << c.output;
    EXPECT_NE(c.output.find("the 1 layers and the matching head"), std::string::npos) << c.output;
    const std::string weights = read_file(d / "hf/model.safetensors");
    EXPECT_EQ(weights.find("fusion."), std::string::npos);
    EXPECT_EQ(weights.find("itm_head"), std::string::npos);
    EXPECT_NE(weights.find("text_model.encoder.layers.1.mlp.fc2.weight"), std::string::npos);
}

// Resharding: the iteration-4 checkpoint of a tp2 x dp2 ZeRO-1 run, resumed on one rank and on dp2, continues as the
// straight one-rank run does. The layouts differ in the order of fp32 sums only (tensor-parallel all-reduces, the
// data-parallel reduction of the gradients and of the features' gradients): over iterations 5..8 the largest loss
// difference measured was 0 for the one-rank resume and 2.4e-7 (one fp32 ulp of a loss near 2) for the dp2 one, with
// OpenBLAS's own kernel and with OPENBLAS_CORETYPE=Haswell (test_clip_run.cpp measures the same between layouts
// trained from scratch); 1e-5 leaves room for other BLAS kernels.
constexpr double kReshardTolerance = 1e-5;

TEST(ClipCheckpointReshard, Tp2Dp2CheckpointResumesOnOneRankAndOnDp2) {
    TempDir d("clip_ckpt_reshard");
    const TrainRun one = run_clip(1, kTotalIters, "");
    ASSERT_EQ(one.losses.size(), static_cast<size_t>(kTotalIters)) << one.output;
    const TrainRun saved = run_clip(4, kSplitAt, std::string(kTp2Dp2) + " " + ckpt_sets(d / "tp2dp2", ""));
    ASSERT_TRUE(fs::exists(iter_dir(d / "tp2dp2", kSplitAt))) << saved.output;
    struct Resume {
        const char* name;
        int ranks;
        const char* sets;
    };
    for (const Resume& l : {Resume{"one rank", 1, ""}, Resume{"dp2", 2, kDp2}}) {
        SCOPED_TRACE(l.name);
        const TrainRun r = run_clip(l.ranks, kTotalIters, std::string(l.sets) + " " + ckpt_sets("", d / "tp2dp2"));
        EXPECT_NE(r.output.find("saved at tp 2 pp 1 dp 2 zero_stage 1"), std::string::npos) << r.output;
        const std::vector<double> want = tail(one.losses, kSplitAt);
        ASSERT_EQ(r.losses.size(), want.size()) << r.output;
        double worst = 0;
        for (size_t i = 0; i < want.size(); ++i) {
            worst = std::max(worst, std::abs(r.losses[i] - want[i]));
            EXPECT_LE(std::abs(r.losses[i] - want[i]), kReshardTolerance) << "iteration " << kSplitAt + 1 + i;
        }
        std::printf("%s: largest loss difference from the straight one-rank run over iterations %d..%d: %.3g\n", l.name,
                    kSplitAt + 1, kTotalIters, worst);
    }
}

// `convert --to hf-clip` of a tp2 x dp2 checkpoint writes the same files, byte for byte, as of a one-rank checkpoint
// of the same weights: that checkpoint resumed on one rank for a step with optimizer.lr = 0 (AdamW then leaves every
// weight as it is) and saved there.
TEST(ClipCheckpointConvert, Tp2CheckpointExportsAsTheOneRankCheckpointOfTheSameWeights) {
    TempDir d("clip_ckpt_convert");
    run_clip(4, kSplitAt, std::string(kTp2Dp2) + " " + ckpt_sets(d / "tp2", ""));
    run_clip(1, kSplitAt + 1, "--set optimizer.lr=0 --set optimizer.min_lr=0 " + ckpt_sets(d / "tp1", d / "tp2"));
    ASSERT_TRUE(fs::exists(iter_dir(d / "tp1", kSplitAt + 1)));
    for (const auto& [from, to] :
         {std::pair<std::string, std::string>{d / "tp2", d / "hf_tp2"}, {d / "tp1", d / "hf_tp1"}}) {
        const CliResult c = run_cli("convert --to hf-clip --load " + from + " --out " + to);
        ASSERT_EQ(c.exit_code, 0) << c.output;
        EXPECT_NE(c.output.find("convert: wrote model.safetensors, config.json into " + to), std::string::npos)
            << c.output;
    }
    const std::string weights = read_file(d / "hf_tp2/model.safetensors");
    EXPECT_GT(weights.size(), 200'000u);  // 63137 fp32 parameters
    EXPECT_TRUE(weights == read_file(d / "hf_tp1/model.safetensors")) << "the two exports' weights differ";
    EXPECT_EQ(read_file(d / "hf_tp2/config.json"), read_file(d / "hf_tp1/config.json"));
    const auto config = nlohmann::json::parse(read_file(d / "hf_tp2/config.json"));
    EXPECT_EQ(config["model_type"], "clip");
    EXPECT_EQ(config["vision_config"]["image_size"], 16);
    EXPECT_EQ(config["text_config"]["max_position_embeddings"], 24);
}

// A checkpoint of the other family is refused with a sentence naming the --to (or the tensor) that fits, before
// anything is written.
TEST(ClipCheckpointConvert, OtherFamiliesAreRefused) {
    TempDir d("clip_ckpt_family");
    run_clip(1, 1, ckpt_sets(d / "clip", ""));
    for (const char* to : {"hf-gpt2", "hf-llama"}) {
        const CliResult r =
            run_cli(std::string("convert --to ") + to + " --load " + (d / "clip") + " --out " + (d / "x"));
        EXPECT_EQ(r.exit_code, kExitConfigError) << r.output;
        EXPECT_NE(
            r.output.find(std::string("holds a CLIP model (model.arch clip), which --to ") + to + " does not export"),
            std::string::npos)
            << r.output;
        EXPECT_NE(r.output.find("export it with --to hf-clip"), std::string::npos) << r.output;
    }
    // A GPT-2 model-only checkpoint, written here.
    write_tiny_gpt2_checkpoint(d / "gpt");
    const CliResult r = run_cli("convert --to hf-clip --load " + (d / "gpt") + " --out " + (d / "x"));
    EXPECT_EQ(r.exit_code, kExitConfigError) << r.output;
    EXPECT_NE(r.output.find("holds a GPT-2 model (model.arch gpt), which --to hf-clip does not export"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("export it with --to hf-gpt2"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(d / "x"));
    // ... and a CLIP run resuming from it names the first tensor it lacks.
    const CliResult resume = run_clip_cli(2, d / "run", ckpt_sets("", d / "gpt"));
    EXPECT_EQ(resume.exit_code, kExitConfigError) << resume.output;
    EXPECT_NE(resume.output.find("has no tensor 'vision_model.embeddings.class_embedding', which the configured "
                                 "model has"),
              std::string::npos)
        << resume.output;
}

// A byte flipped in a model file, found by verify_on_load: full. With an older checkpoint the resume names the file,
// falls back to it and replays the lost iterations exactly; with none left the run stops (19) instead of starting
// from scratch, as a GPT run does.
TEST(ClipCheckpointFailures, CorruptedModelFileIsRefused) {
    TempDir d("clip_ckpt_corrupt");
    const std::string save = d / "ckpt";
    const TrainRun first = run_clip(1, kSplitAt, ckpt_sets(save, save, 2));
    ASSERT_EQ(first.losses.size(), static_cast<size_t>(kSplitAt)) << first.output;
    const std::string newest = iter_dir(save, 4) + "/model/tp00_pp000.safetensors";
    flip_byte(newest);
    const TrainRun again = run_clip(1, kSplitAt, ckpt_sets(save, save) + " --set checkpoint.verify_on_load=full");
    EXPECT_NE(again.output.find(newest), std::string::npos) << again.output;
    EXPECT_NE(again.output.find("corrupted on disk"), std::string::npos) << again.output;
    EXPECT_NE(again.output.find("resumed from " + iter_dir(save, 2)), std::string::npos) << again.output;
    EXPECT_EQ(again.losses, tail(first.losses, 2));
    EXPECT_EQ(read_file(save + "/" + kTrackerFile), "4");

    for (const int it : {2, 4}) flip_byte(iter_dir(save, it) + "/model/tp00_pp000.safetensors");
    const CliResult refused =
        run_clip_cli(kTotalIters, d / "run", ckpt_sets(save, save) + " --set checkpoint.verify_on_load=full");
    EXPECT_EQ(refused.exit_code, kExitCheckpoint) << refused.output;
    EXPECT_NE(refused.output.find("no checkpoint in '" + save + "' passes verification"), std::string::npos)
        << refused.output;
    EXPECT_EQ(refused.output.find("starting from scratch"), std::string::npos) << refused.output;
    EXPECT_EQ(refused.output.find("iteration       1/"), std::string::npos) << refused.output;
}

}  // namespace
}  // namespace ms::test
