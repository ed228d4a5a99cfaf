// test_train_deferred.cpp: the trainer's host accesses to device memory are synchronized on every path, checked on
// the CPU. With MS_DEFER_OPS=1 the trainer wraps its backend in a DeferredBackend (engine/backends/deferred_backend.h):
// ops run only when the host synchronizes, as late as a GPU may run them, so a host read that misses a
// synchronize() sees the memory from before the op and a host write that misses one reaches an op called before it.
// Each test runs a layout with and without it and expects the same bits: the gradients of every parameter after step
// 1 (MS_DUMP_GRADS) and the loss of every step (metrics.jsonl). A missing synchronization gives a different loss or
// gradient at once, where on a GPU it is a race that a kernel usually wins: deleting the synchronize() before the
// model reads its cross-entropy statistics (gpt.cpp) makes every test here fail but the two with tp2, where the
// tensor-parallel all-reduce just before it synchronizes.
// Layouts: one rank in fp32 (with validation and the sample), bf16 and fp16 (with Megatron's initial loss scale, so
// steps overflow and are skipped); tp2 x pp2 x dp2 with ZeRO-1 and sequence parallelism in fp32 (with validation) and
// in bf16 (every collective kind, pipeline sends and receives, the optimizer's shards); interleaved pp2 x v2; an
// injected NaN skipped under tp2 x dp2 (with validation and the sample); a checkpoint saved and resumed under ZeRO-1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"
#include "tests/common/train_run.h"

namespace {

using ms::test::TrainRun;

constexpr int kSteps = 4;
const std::string kSets = " --set training.train_iters=" + std::to_string(kSteps);
const std::string k3d =
    " --set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2"
    " --set parallel.zero_stage=1 --set parallel.sequence_parallel=true";

TrainRun run_tiny(int ranks, const std::string& sets, bool deferred, const std::string& env = "") {
    ms::test::TrainCommand c;
    c.binary = MS_BINARY_PATH;
    c.config = MS_SOURCE_DIR "/tests/parallel/tiny.yaml";
    c.sets = kSets + " " + sets;
    c.ranks = ranks;
    c.launcher = "mpiexec --oversubscribe --allow-run-as-root";
    c.env = "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive " + env + (deferred ? " MS_DEFER_OPS=1" : "");
    c.timeout_s = 150;
    return ms::test::run_train(c);
}

// The validation-loss lines and the generated sample of a run's output.
std::string validation_and_sample(const std::string& output) {
    std::istringstream in(output);
    std::string line, kept;
    bool sample = false;
    while (std::getline(in, line)) {
        if (sample || line.find("validation loss at iteration") != std::string::npos) kept += line + "\n";
        sample = line.rfind("sample (", 0) == 0;  // the sample is the line after this one
    }
    return kept;
}

// a and b hold the same bits (NaN and infinity included: an fp16 overflow's gradients).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// The same bits with and without deferral -- every step's loss and loss scale, every gradient after step 1, the
// skipped-step count -- and the deferred run says it is one.
void expect_deferral_changes_nothing(int ranks, const std::string& sets, const std::string& what,
                                     int64_t* skipped = nullptr, const std::string& env = "") {
    const TrainRun eager = run_tiny(ranks, sets, false, env);
    const TrainRun deferred = run_tiny(ranks, sets, true, env);
    EXPECT_NE(deferred.output.find("MS_DEFER_OPS=1: ops run only when the host synchronizes"), std::string::npos)
        << deferred.output;
    ASSERT_EQ(eager.losses.size(), static_cast<size_t>(kSteps)) << eager.output;
    ASSERT_FALSE(eager.grads.empty()) << eager.output;
    EXPECT_TRUE(same_bits(deferred.losses, eager.losses)) << what << "\n" << deferred.output;
    EXPECT_TRUE(same_bits(deferred.loss_scales, eager.loss_scales)) << what;
    EXPECT_EQ(deferred.skipped_iterations, eager.skipped_iterations) << what;
    EXPECT_EQ(deferred.grads.size(), eager.grads.size()) << what;
    for (const auto& [name, g] : eager.grads) {
        const auto it = deferred.grads.find(name);
        EXPECT_TRUE(it != deferred.grads.end() && same_bits(it->second, g)) << what << ": gradient of " << name;
    }
    EXPECT_EQ(validation_and_sample(deferred.output), validation_and_sample(eager.output)) << what;
    if (sets.find("sample_tokens") != std::string::npos) {  // both were there to compare
        const std::string v = validation_and_sample(eager.output);
        EXPECT_NE(v.find("validation loss at iteration 4"), std::string::npos) << eager.output;
        // 2 validations and, without pipeline parallelism (the trainer samples from a whole model only), the sample
        const bool pipeline = sets.find("pipeline_model_parallel_size") != std::string::npos;
        EXPECT_EQ(std::count(v.begin(), v.end(), '\n'), pipeline ? 2 : 3) << v;
    }
    std::printf("%s: deferred == eager over %d steps (%zu gradients), losses %.7f .. %.7f\n", what.c_str(), kSteps,
                eager.grads.size(), eager.losses.front(), eager.losses.back());
    if (skipped != nullptr) *skipped = eager.skipped_iterations;
}

// With validation every 2 steps and the sample at the end (the forward without targets, logits read on the host).
const std::string kEvalSample = " --set eval.eval_interval=2 --set eval.eval_iters=2 --set eval.sample_tokens=24";

TEST(TrainDeferred, OneRankFp32) { expect_deferral_changes_nothing(1, kEvalSample, "1 rank fp32"); }

TEST(TrainDeferred, OneRankBf16) {
    expect_deferral_changes_nothing(1, "--set mixed_precision.dtype=bf16", "1 rank bf16");
}

// Megatron's initial scale 2^32 overflows in the first steps: the skip path (no optimizer step, the scale halved)
// reads the gradient norm on the host.
TEST(TrainDeferred, OneRankFp16WithSkippedSteps) {
    int64_t skipped = 0;
    expect_deferral_changes_nothing(1, "--set mixed_precision.dtype=fp16", "1 rank fp16", &skipped);
    EXPECT_GT(skipped, 0) << "no overflow: the skip path is not exercised";
}

TEST(TrainDeferred, Tp2Pp2Dp2Zero1SequenceParallel) {
    expect_deferral_changes_nothing(8, k3d + kEvalSample, "tp2 x pp2 x dp2 ZeRO-1 sp, fp32");
    EXPECT_NE(run_tiny(8, k3d, true).output.find("world size 8 = tp 2 x pp 2 x dp 2"), std::string::npos);
}

TEST(TrainDeferred, Tp2Pp2Dp2Zero1SequenceParallelBf16) {
    expect_deferral_changes_nothing(8, k3d + " --set mixed_precision.dtype=bf16", "tp2 x pp2 x dp2 ZeRO-1 sp, bf16");
}

TEST(TrainDeferred, InterleavedPp2V2) {
    expect_deferral_changes_nothing(2,
                                    "--set parallel.pipeline_model_parallel_size=2 --set "
                                    "parallel.pipeline_schedule=interleaved_1f1b "
                                    "--set parallel.virtual_pipeline_model_parallel_size=2",
                                    "interleaved pp2 x v2");
}

// A NaN injected into rank 1's gradients at step 3 under reliability.nan_policy: skip (the host writes the gradient,
// every rank skips the step): tp2 x dp2, with validation and the sample (its logits all-gathered over tp).
TEST(TrainDeferred, InjectedNanSkippedTp2Dp2) {
    int64_t skipped = 0;
    expect_deferral_changes_nothing(
        4, "--set parallel.tensor_model_parallel_size=2 --set reliability.nan_policy=skip" + kEvalSample,
        "tp2 x dp2, NaN at step 3 skipped", &skipped, "MS_INJECT=nan@step=3,rank=1");
    EXPECT_EQ(skipped, 1);
}

// Save after step 2 and resume to step 4, both deferred, under dp2 ZeRO-1 (the optimizer's shards are saved and
// loaded): the resumed steps' losses are the uninterrupted eager run's.
TEST(TrainDeferred, CheckpointSaveAndResumeZero1) {
    const ms::test::TempDir d("ms_deferred_ckpt");
    const std::string ckpt = " --set parallel.zero_stage=1 --set checkpoint.save=" + d / "ckpt" +
                             " --set checkpoint.load=" + d / "ckpt" + " --set checkpoint.save_interval=2";
    const TrainRun eager = run_tiny(2, "--set parallel.zero_stage=1", false);
    ASSERT_EQ(eager.losses.size(), static_cast<size_t>(kSteps)) << eager.output;
    const TrainRun first = run_tiny(2, ckpt + " --set training.train_iters=2", true);
    ASSERT_EQ(first.losses.size(), 2u) << first.output;
    EXPECT_EQ(first.losses[0], eager.losses[0]);
    EXPECT_EQ(first.losses[1], eager.losses[1]);
    const TrainRun resumed = run_tiny(2, ckpt, true);
    ASSERT_EQ(resumed.losses.size(), 2u) << resumed.output;  // steps 3 and 4
    EXPECT_NE(resumed.output.find("iter_0000002"), std::string::npos) << resumed.output;
    EXPECT_EQ(resumed.losses[0], eager.losses[2]) << resumed.output;
    EXPECT_EQ(resumed.losses[1], eager.losses[3]) << resumed.output;
}

}  // namespace
