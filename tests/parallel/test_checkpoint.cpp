// test_checkpoint.cpp: checkpoints through the real binary (engine/ckpt/checkpoint.h) -- exact resume on one rank
// and on tp2 x pp2 x dp2 ZeRO-1, resume under other layouts (resharding), fallback from a corrupted checkpoint,
// config mismatches, retention, injected failures at each save phase, and the save directory's hazards found at
// startup (unwritable, no room, a stale tracker, a newer checkpoint, a second run, crashed saves' leftovers).
//
// Every run trains tests/parallel/tiny.yaml (8 layers, hidden 64, 8 sequences of 32 tokens per step) with the lr
// schedule pinned to lr_decay_iters = 14, so a run stopped at iteration 4 follows the same schedule as the 14-step
// run it is compared with. Final weights and optimizer state are compared through CheckpointReader, tensor by tensor.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "engine/ckpt/atomic_dir.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/save_dir.h"
#include "engine/core/check.h"
#include "tests/common/checkpoint_files.h"
#include "tests/common/temp_dir.h"
#include "tests/e2e/run_cli.h"

namespace {

namespace fs = std::filesystem;
using ms::CheckpointReader;
using ms::test::ckpt_sets;
using ms::test::iter_dir;
using ms::test::read_file;
using ms::test::TempDir;

constexpr const char* kTp2Pp2Dp2 =
    "--set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2 "
    "--set parallel.zero_stage=1";
constexpr int kTotalIters = 14;  // = N + 10: the resharded resumes compare 10 losses
constexpr int kSplitAt = 4;      // N

struct TrainRun {
    int exit_code = -1;
    std::string output;
};

// Trains tests/parallel/<config> on `ranks` processes (mpiexec when > 1) with output in `out`; `sets` are more --set
// options.
TrainRun train(int ranks, const std::string& out, int iters, const std::string& sets, const std::string& env = "",
               const std::string& config = "tiny.yaml") {
    const std::string binary = std::string("'") + MS_BINARY_PATH + "'";
    const std::string launcher =
        ranks == 1 ? binary : "mpiexec -n " + std::to_string(ranks) + " --oversubscribe --allow-run-as-root " + binary;
    const std::string cmd = env + " OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive timeout 120 " + launcher +
                            " train --config " MS_SOURCE_DIR "/tests/parallel/" + config +
                            " --set run.output_dir=" + out + " --set training.train_iters=" + std::to_string(iters) +
                            " --set lr_schedule.lr_decay_iters=" + std::to_string(kTotalIters) + " " + sets + " 2>&1";
    TrainRun r;
    FILE* p = popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
    const int status = pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

struct Metrics {
    std::map<int64_t, double> loss, grad_norm, loss_scale;  // a non-finite grad norm (a skipped step) reads -1
};

// metrics.jsonl of a run directory; a resumed run appends to it, so one file holds both halves.
Metrics read_metrics(const std::string& dir) {
    Metrics m;
    std::ifstream f(dir + "/metrics.jsonl");
    std::string line;
    while (std::getline(f, line)) {
        const auto j = nlohmann::json::parse(line);
        if (!j.contains("lm loss")) continue;
        const int64_t it = j["iteration"].get<int64_t>();
        EXPECT_FALSE(m.loss.count(it)) << "iteration " << it << " logged twice in " << dir;
        m.loss[it] = j["lm loss"].get<double>();
        m.grad_norm[it] = j["grad-norm"].is_null() ? -1.0 : j["grad-norm"].get<double>();
        if (j.contains("loss-scale")) m.loss_scale[it] = j["loss-scale"].get<double>();
    }
    return m;
}

// Every model tensor of tiny.yaml's 8 layers and both optimizer states of two checkpoints agree bit for bit.
void expect_same_state(const std::string& a_dir, const std::string& b_dir) {
    const CheckpointReader a(a_dir), b(b_dir);
    ASSERT_EQ(a.names().size(), 2u + 12u * 8u + 2u);
    ms::test::expect_same_state(a, b);
}

void copy_checkpoint(const std::string& from_save, int64_t it, const std::string& to_save) {
    fs::create_directories(to_save);
    fs::copy(iter_dir(from_save, it), iter_dir(to_save, it), fs::copy_options::recursive);
    std::ofstream(to_save + "/" + ms::kTrackerFile) << it;
}

// 2N steps straight vs N, save, auto-resume, N: the same losses, grad norms, final weights and optimizer state,
// bit for bit (same layout, fp32 CPU, no RNG state outside Philox).
TEST(CheckpointResume, OneRankContinuesBitIdentically) {
    TempDir straight("ckpt_straight"), split("ckpt_split");
    const TrainRun s = train(1, straight.path(), 6, ckpt_sets(straight / "ckpt", ""));
    ASSERT_EQ(s.exit_code, 0) << s.output;
    const TrainRun a = train(1, split.path(), 3, ckpt_sets(split / "ckpt", split / "ckpt"));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    EXPECT_NE(a.output.find("starting from scratch"), std::string::npos) << a.output;
    const TrainRun b = train(1, split.path(), 6, ckpt_sets(split / "ckpt", split / "ckpt"));
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_NE(b.output.find("resumed from " + iter_dir(split / "ckpt", 3)), std::string::npos) << b.output;

    const Metrics straight_m = read_metrics(straight.path()), resumed_m = read_metrics(split.path());
    ASSERT_EQ(straight_m.loss.size(), 6u);
    EXPECT_EQ(resumed_m.loss, straight_m.loss);
    EXPECT_EQ(resumed_m.grad_norm, straight_m.grad_norm);
    expect_same_state(iter_dir(straight / "ckpt", 6), iter_dir(split / "ckpt", 6));
    const CheckpointReader r(iter_dir(split / "ckpt", 6));
    EXPECT_EQ(r.train_state().optimizer_step, 6);
    EXPECT_EQ(r.train_state().consumed_samples, 6 * 8);
    EXPECT_EQ(r.manifest()["tp"], 1);
}

// Mixed precision resumes bit for bit too: the model files hold the fp32 master weights, the 16-bit weights are
// rounded from them on load, and train_state.json keeps fp16's loss scaler (scale, growth and hysteresis
// trackers). fp16 starts at Megatron's 2^32 with a window of 2, so the 6 steps see overflows (skipped steps, the
// scale halving) and growth, on both sides of the split. bf16 also runs tp2 x pp2 x dp2 ZeRO-1, whose 16-bit weights
// come from a cast after the fp32 all-gather, and dp2 ZeRO-1 with overlap_param_gather from casts bucket by bucket.
// A run's name, its number of ranks and its --set flags (the parameters of the resume and reshard suites below).
struct Layout {
    const char* name;
    int ranks;
    const char* sets;
};
class CheckpointResumeMixed : public ::testing::TestWithParam<Layout> {};

TEST_P(CheckpointResumeMixed, ContinuesBitIdentically) {
    const Layout& c = GetParam();
    const std::string sets = std::string(c.sets) + " --set mixed_precision.loss_scale_window=2";
    TempDir straight("ckpt_mixed_straight"), split("ckpt_mixed_split");
    const TrainRun s = train(c.ranks, straight.path(), 6, sets + " " + ckpt_sets(straight / "ckpt", ""));
    ASSERT_EQ(s.exit_code, 0) << s.output;
    const TrainRun a = train(c.ranks, split.path(), 3, sets + " " + ckpt_sets(split / "ckpt", split / "ckpt"));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    const TrainRun b = train(c.ranks, split.path(), 6, sets + " " + ckpt_sets(split / "ckpt", split / "ckpt"));
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_NE(b.output.find("resumed from " + iter_dir(split / "ckpt", 3)), std::string::npos) << b.output;
    const Metrics straight_m = read_metrics(straight.path()), resumed_m = read_metrics(split.path());
    ASSERT_EQ(straight_m.loss.size(), 6u);
    EXPECT_EQ(resumed_m.loss, straight_m.loss);
    EXPECT_EQ(resumed_m.grad_norm, straight_m.grad_norm);
    EXPECT_EQ(resumed_m.loss_scale, straight_m.loss_scale);
    expect_same_state(iter_dir(straight / "ckpt", 6), iter_dir(split / "ckpt", 6));
    const CheckpointReader r(iter_dir(split / "ckpt", 6));
    const CheckpointReader r3(iter_dir(split / "ckpt", 3));
    EXPECT_EQ(r.manifest()["dtype"], std::string(c.name).substr(0, 4));
    if (std::string(c.name).starts_with("fp16")) {
        // 2^32 overflows at first: skipped steps, the scale halving; then growth. Both halves saw some of it.
        ASSERT_EQ(straight_m.loss_scale.size(), 6u);
        EXPECT_LT(straight_m.loss_scale.rbegin()->second, 4294967296.0);
        EXPECT_GT(r.train_state().skipped_iterations, 0);
        EXPECT_EQ(r.train_state().nan_iterations, 0);
        EXPECT_EQ(r.train_state().optimizer_step, 6 - r.train_state().skipped_iterations);
        EXPECT_NE(r3.train_state().loss_scaler.scale, 4294967296.0);
        EXPECT_EQ(r.train_state().loss_scaler.scale, straight_m.loss_scale.rbegin()->second);
    } else {
        EXPECT_TRUE(straight_m.loss_scale.empty());
        EXPECT_EQ(r.train_state().optimizer_step, 6);
    }
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, CheckpointResumeMixed,
    ::testing::Values(Layout{"bf16_one_rank", 1, "--set mixed_precision.dtype=bf16"},
                      Layout{"fp16_one_rank", 1, "--set mixed_precision.dtype=fp16"},
                      // 16-bit gradients: the fp32 masters of the load and the save pass through staging memory
                      Layout{"bf16_dp2_zero1_bf16_grads", 2,
                             "--set mixed_precision.dtype=bf16 --set parallel.zero_stage=1 "
                             "--set mixed_precision.grad_reduce_in_fp32=false"},
                      Layout{"fp16_dp2_zero1_fp16_grads", 2,
                             "--set mixed_precision.dtype=fp16 --set parallel.zero_stage=1 "
                             "--set mixed_precision.grad_reduce_in_fp32=false"},
                      Layout{"bf16_tp2_pp2_dp2_zero1", 8,
                             "--set mixed_precision.dtype=bf16 --set parallel.tensor_model_parallel_size=2 "
                             "--set parallel.pipeline_model_parallel_size=2 --set parallel.zero_stage=1"},
                      // zero_stage 2: the fp32 masters of the load and the save pass through staging memory (the
                      // gradient slots are too small to lend); fp16's skipped steps leave the slots settled
                      Layout{"bf16_dp2_zero2", 2,
                             "--set mixed_precision.dtype=bf16 --set parallel.zero_stage=2 "
                             "--set parallel.bucket_size=3000"},
                      Layout{"fp16_dp2_zero2_fp16_grads", 2,
                             "--set mixed_precision.dtype=fp16 --set parallel.zero_stage=2 "
                             "--set parallel.bucket_size=3000 --set mixed_precision.grad_reduce_in_fp32=false"},
                      Layout{"bf16_dp2_zero2_overlap_param_gather", 2,
                             "--set mixed_precision.dtype=bf16 --set parallel.zero_stage=2 "
                             "--set parallel.bucket_size=3000 --set parallel.overlap_param_gather=true"},
                      // the save at 3 waits for the gathers overlap_param_gather left in flight
                      Layout{"bf16_dp2_zero1_overlap_param_gather", 2,
                             "--set mixed_precision.dtype=bf16 --set parallel.zero_stage=1 "
                             "--set parallel.overlap_grad_reduce=true --set parallel.bucket_size=5000 "
                             "--set parallel.overlap_param_gather=true"}),
    [](const auto& info) { return std::string(info.param.name); });

// Sharded master weights (bf16 ZeRO-1: each dp rank holds a shard of the fp32 masters) save the same files as whole
// masters: the iteration-3 checkpoint of a bf16 dp2 ZeRO-1 run resumed under zero_stage 0 (whole masters on every
// rank, the same arithmetic at dp 2) continues bit for bit, and resumed at dp 4 ZeRO-1 (shards of another size), at
// dp 4 ZeRO-2 (sharded gradients too) and on one rank it continues within rounding of the straight run (measured,
// printed: worst relative loss difference over iterations 4..6 of 6.7e-8 at dp 4 (6.5e-8 with ZeRO-2, on an AMD
// host) and 6.2e-8 on one rank with AVX-512's sgemm, 4.4e-5 for both with
// OPENBLAS_CORETYPE=Haswell, where one fp32 rounding step flipped a bf16 weight; bound 1e-3, the bf16 layouts'
// tolerance in test_equivalence.cpp; a wrongly loaded shard is O(1)).
TEST(CheckpointResume, ShardedMasterWeightsReshardAcrossDataParallelSizes) {
    const std::string bf16 = "--set mixed_precision.dtype=bf16 ";
    TempDir straight("ckpt_sharded_straight");
    const TrainRun s =
        train(2, straight.path(), 6, bf16 + "--set parallel.zero_stage=1 " + ckpt_sets(straight / "ckpt", "", 3));
    ASSERT_EQ(s.exit_code, 0) << s.output;
    ASSERT_NE(s.output.find("(sharded over dp 2"), std::string::npos) << s.output;
    const Metrics base = read_metrics(straight.path());
    ASSERT_EQ(base.loss.size(), 6u);
    struct Resume {
        const char* name;
        int ranks;
        std::string sets;
        bool exact;
    };
    for (const Resume& r :
         {Resume{"dp2_zero0", 2, "--set parallel.zero_stage=0", true},
          Resume{"dp4_zero1", 4, "--set parallel.zero_stage=1", false},
          Resume{"dp4_zero2", 4, "--set parallel.zero_stage=2 --set parallel.bucket_size=3000", false},
          Resume{"one_rank", 1, "", false}}) {
        TempDir dir("ckpt_sharded_resume");
        copy_checkpoint(straight / "ckpt", 3, dir / "ckpt");
        const TrainRun t = train(r.ranks, dir.path(), 6, bf16 + r.sets + " " + ckpt_sets(dir / "out", dir / "ckpt"));
        ASSERT_EQ(t.exit_code, 0) << t.output;
        EXPECT_NE(t.output.find("resumed from " + iter_dir(dir / "ckpt", 3)), std::string::npos) << t.output;
        const Metrics m = read_metrics(dir.path());
        ASSERT_EQ(m.loss.size(), 3u) << r.name;
        double worst = 0;
        for (const auto& [it, loss] : m.loss) {
            if (r.exact) {
                EXPECT_EQ(loss, base.loss.at(it)) << r.name << " iteration " << it;
            }
            worst = std::max(worst, std::abs(loss - base.loss.at(it)) / std::abs(base.loss.at(it)));
        }
        EXPECT_LE(worst, 1e-3) << r.name;
        std::printf("sharded masters resumed as %s: worst relative loss difference over iterations 4..6: %.3g\n",
                    r.name, worst);
        if (r.exact) expect_same_state(iter_dir(straight / "ckpt", 6), iter_dir(dir / "out", 6));
    }
}

// A model-only checkpoint (what `convert --from hf-gpt2` writes: no optim/ files) resumes the weights and starts
// AdamW from zero moments: the first loss after it equals the full resume's (the loss depends on the weights only),
// the next one does not.
TEST(CheckpointResume, ModelOnlyCheckpointStartsTheOptimizerFresh) {
    TempDir d("ckpt_model_only");
    ASSERT_EQ(train(1, d / "first", 2, ckpt_sets(d / "full", "")).exit_code, 0);
    copy_checkpoint(d / "full", 2, d / "model_only");
    const std::string dir = iter_dir(d / "model_only", 2);
    fs::remove_all(dir + "/optim");
    auto manifest = nlohmann::json::parse(read_file(dir + "/" + ms::kManifestFile));
    const std::vector<std::string> optim_files = ms::test::manifest_files(manifest, "optim/");
    ASSERT_EQ(optim_files.size(), 1u);
    for (const std::string& rel : optim_files) manifest["files"].erase(rel);
    std::ofstream(dir + "/" + ms::kManifestFile) << manifest.dump(2);
    ASSERT_NO_THROW(ms::verify_checkpoint(dir, true));

    const TrainRun full = train(1, d / "full_run", 4, ckpt_sets("", d / "full"));
    ASSERT_EQ(full.exit_code, 0) << full.output;
    const TrainRun model_only = train(1, d / "model_only_run", 4, ckpt_sets("", d / "model_only"));
    ASSERT_EQ(model_only.exit_code, 0) << model_only.output;
    EXPECT_NE(model_only.output.find("is model-only (no optimizer state)"), std::string::npos) << model_only.output;
    const Metrics a = read_metrics(d / "full_run"), b = read_metrics(d / "model_only_run");
    ASSERT_TRUE(a.loss.count(3) && a.loss.count(4) && b.loss.count(3) && b.loss.count(4));
    EXPECT_EQ(b.loss.at(3), a.loss.at(3));
    EXPECT_NE(b.loss.at(4), a.loss.at(4));
}

// The tp2 x pp2 x dp2 ZeRO-1 run the multi-rank tests compare with: 14 iterations straight, saving every 4
// (iterations 4, 8, 12, 14 kept). Once per process (ctest runs each test in a process of its own).
struct Straight3d {
    TempDir dir{"ckpt3d_straight"};
    TrainRun run;
    Straight3d() {
        run = train(8, dir.path(), kTotalIters,
                    std::string(kTp2Pp2Dp2) + " " + ckpt_sets(dir / "ckpt", "", kSplitAt) +
                        " --set checkpoint.keep_latest_k=0");
    }
};
const Straight3d& straight_3d() {
    static const Straight3d r;
    return r;
}

TEST(CheckpointResume, Tp2Pp2Dp2Zero1ContinuesBitIdentically) {
    const Straight3d& s = straight_3d();
    ASSERT_EQ(s.run.exit_code, 0) << s.run.output;
    TempDir split("ckpt3d_split");
    const TrainRun a =
        train(8, split.path(), kSplitAt, std::string(kTp2Pp2Dp2) + " " + ckpt_sets(split / "ckpt", split / "ckpt"));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    const TrainRun b =
        train(8, split.path(), kTotalIters, std::string(kTp2Pp2Dp2) + " " + ckpt_sets(split / "ckpt", split / "ckpt"));
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_NE(b.output.find("resumed from " + iter_dir(split / "ckpt", kSplitAt)), std::string::npos) << b.output;
    const Metrics straight_m = read_metrics(s.dir.path()), resumed_m = read_metrics(split.path());
    ASSERT_EQ(straight_m.loss.size(), static_cast<size_t>(kTotalIters));
    EXPECT_EQ(resumed_m.loss, straight_m.loss);
    EXPECT_EQ(resumed_m.grad_norm, straight_m.grad_norm);
    expect_same_state(iter_dir(s.dir / "ckpt", kTotalIters), iter_dir(split / "ckpt", kTotalIters));
    // The layout is in the manifest; 4 model files (tp x pp) and 8 optimizer files (one per rank).
    const CheckpointReader r(iter_dir(s.dir / "ckpt", kSplitAt));
    EXPECT_EQ(r.manifest()["tp"], 2);
    EXPECT_EQ(r.manifest()["pp"], 2);
    EXPECT_EQ(r.manifest()["dp"], 2);
    EXPECT_EQ(r.manifest()["zero_stage"], 1);
    EXPECT_EQ(ms::test::manifest_files(r.manifest(), "model/").size(), 4u);
    EXPECT_EQ(ms::test::manifest_files(r.manifest(), "optim/").size(), 8u);
}

// Resharding: the iteration-4 checkpoint of the tp2 x pp2 x dp2 ZeRO-1 run resumed under other layouts continues like
// the un-resharded run, and the weights it saves at iteration 14 match that run's. The differences come only from
// summation order (TP all-reduces, the dp reduction), as in test_equivalence.cpp, whose loss tolerance (2e-6
// relative, ~10x the worst of its equivalence matrix) is reused. Measured here (printed by each case): worst relative
// loss difference over the 10 steps 7.2e-8 (one rank), 7.0e-8 (tp1 x pp4 x dp2 ZeRO-0, tp4 x pp1 x dp2 ZeRO-1), 0
// (interleaved: same tp and dp, so the same arithmetic); worst final weight 3.2e-7 of the tensor's largest entry,
// bound 3e-6 (~10x). Excluded from the weight comparison: the K third of c_attn.bias, whose gradient is zero up to
// rounding (softmax ignores a per-row constant), so AdamW's m / sqrt(v) turns rounding noise into lr-sized steps and
// those entries differ by 2e-4 between layouts -- a property of the model, not of the checkpoint.
constexpr double kLossTolerance = 2e-6;
constexpr double kWeightTolerance = 3e-6;

class CheckpointReshard : public ::testing::TestWithParam<Layout> {};

TEST_P(CheckpointReshard, NextTenLossesMatchTheUnreshardedRun) {
    const Layout& l = GetParam();
    const Straight3d& s = straight_3d();
    ASSERT_EQ(s.run.exit_code, 0) << s.run.output;
    TempDir dir("ckpt_reshard");
    copy_checkpoint(s.dir / "ckpt", kSplitAt, dir / "ckpt");
    const TrainRun r =
        train(l.ranks, dir.path(), kTotalIters, std::string(l.sets) + " " + ckpt_sets(dir / "out", dir / "ckpt"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("saved at tp 2 pp 2 dp 2 zero_stage 1"), std::string::npos) << r.output;
    const Metrics base = read_metrics(s.dir.path()), m = read_metrics(dir.path());
    ASSERT_EQ(m.loss.size(), static_cast<size_t>(kTotalIters - kSplitAt)) << r.output;
    double worst = 0;
    for (const auto& [it, loss] : m.loss) {
        ASSERT_TRUE(base.loss.count(it)) << it;
        const double e = std::abs(loss - base.loss.at(it)) / std::abs(base.loss.at(it));
        worst = std::max(worst, e);
        EXPECT_LE(e, kLossTolerance) << l.name << ": loss at iteration " << it;
    }
    // The final weights, saved by this layout and read back as canonical tensors, against the un-resharded run's:
    // this also covers saving under the layout (e.g. interleaved chunks) and a padded vocabulary that changed.
    const CheckpointReader mine(iter_dir(dir / "out", kTotalIters)), theirs(iter_dir(s.dir / "ckpt", kTotalIters));
    ASSERT_EQ(mine.names(), theirs.names());
    double worst_weight = 0;
    std::string worst_name;
    for (const std::string& name : theirs.names()) {
        const std::vector<float> a = mine.tensor(name).data, b = theirs.tensor(name).data;
        const size_t n = name == "wte.weight" ? static_cast<size_t>(theirs.vocab_size()) * 64 : b.size();
        ASSERT_GE(a.size(), n) << name;
        double diff = 0, ref = 0;
        const bool k_bias = name.ends_with("attn.c_attn.bias");
        for (size_t i = 0; i < n; ++i) {
            if (k_bias && i >= 64 && i < 128) continue;
            diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
            ref = std::max(ref, std::abs(static_cast<double>(b[i])));
        }
        for (size_t i = n; i < a.size(); ++i) EXPECT_EQ(a[i], 0.0f) << name << " padding row element " << i;
        if (diff / ref > worst_weight) worst_weight = diff / ref, worst_name = name;
    }
    EXPECT_LE(worst_weight, kWeightTolerance) << l.name << ": " << worst_name;
    std::printf(
        "%s: worst relative loss difference over iterations %d..%d: %.3g; worst final-weight difference "
        "%.3g of the tensor's largest entry (%s)\n",
        l.name, kSplitAt + 1, kTotalIters, worst, worst_weight, worst_name.c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, CheckpointReshard,
    ::testing::Values(
        Layout{"one_rank", 1, ""},
        Layout{"tp1_pp4_dp2_zero0", 8, "--set parallel.pipeline_model_parallel_size=4 --set parallel.zero_stage=0"},
        Layout{"tp4_pp1_dp2_zero1", 8, "--set parallel.tensor_model_parallel_size=4 --set parallel.zero_stage=1"},
        Layout{"tp2_pp2_dp2_interleaved_v2", 8,
               "--set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2"
               " --set parallel.pipeline_schedule=interleaved_1f1b"
               " --set parallel.virtual_pipeline_model_parallel_size=2 --set parallel.zero_stage=1"}),
    [](const auto& info) { return std::string(info.param.name); });

// Context parallelism's checkpoints are ZeRO-1 shards over dp x cp like any data-parallel run's: the iteration-12
// checkpoint of a Llama cp2 x dp2 run at seq 256 resumed on one rank and on cp4 continues as the straight run does,
// within the resharding tolerance above (measured: the same losses to the 7 digits the log prints).
TEST(CheckpointResume, ContextParallelCheckpointResumesUnderOtherLayouts) {
    const std::string llama = "--set model.seq_length=256 --set parallel.zero_stage=1 ";
    TempDir straight("ckpt_cp_straight");
    const TrainRun s = train(4, straight.path(), kTotalIters,
                             llama + "--set parallel.context_parallel_size=2 " + ckpt_sets(straight / "ckpt", "", 4),
                             "", "tiny-llama.yaml");
    ASSERT_EQ(s.exit_code, 0) << s.output;
    const Metrics base = read_metrics(straight.path());
    for (const auto& [name, ranks, sets] : {std::tuple<const char*, int, const char*>{"one rank", 1, ""},
                                            {"cp4", 4, "--set parallel.context_parallel_size=4"}}) {
        TempDir dir("ckpt_cp_resume");
        copy_checkpoint(straight / "ckpt", 12, dir / "ckpt");
        const TrainRun r = train(ranks, dir.path(), kTotalIters,
                                 llama + sets + " " + ckpt_sets(dir / "out", dir / "ckpt"), "", "tiny-llama.yaml");
        ASSERT_EQ(r.exit_code, 0) << r.output;
        EXPECT_NE(r.output.find("resumed from " + iter_dir(dir / "ckpt", 12)), std::string::npos) << r.output;
        EXPECT_NE(r.output.find("saved at tp 1 pp 1 dp 4 (of them cp 2) zero_stage 1"), std::string::npos) << r.output;
        const Metrics m = read_metrics(dir.path());
        ASSERT_EQ(m.loss.size(), 2u) << name;
        for (const auto& [it, loss] : m.loss)
            EXPECT_LE(std::abs(loss - base.loss.at(it)) / std::abs(base.loss.at(it)), kLossTolerance)
                << name << " " << it;
    }
}

// A byte flipped inside the newest checkpoint: the resume names the file, falls back to the previous checkpoint
// and replays the lost iterations exactly.
TEST(CheckpointFailures, CorruptedFileFallsBackToThePreviousCheckpoint) {
    TempDir d("ckpt_corrupt");
    const std::string save = d / "ckpt";
    const TrainRun a = train(1, d.path(), 4, ckpt_sets(save, save, 2));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    const Metrics first = read_metrics(d.path());
    const std::string victim = iter_dir(save, 4) + "/model/tp00_pp000.safetensors";
    ms::test::flip_byte(victim);
    fs::remove(d / "metrics.jsonl");
    const TrainRun b = train(1, d.path(), 6, ckpt_sets(save, save));
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_NE(b.output.find(victim), std::string::npos) << b.output;
    EXPECT_NE(b.output.find("corrupted on disk"), std::string::npos) << b.output;
    EXPECT_NE(b.output.find("resumed from " + iter_dir(save, 2)), std::string::npos) << b.output;
    const Metrics again = read_metrics(d.path());
    ASSERT_TRUE(again.loss.count(3) && again.loss.count(4)) << b.output;
    EXPECT_EQ(again.loss.at(3), first.loss.at(3));
    EXPECT_EQ(again.loss.at(4), first.loss.at(4));
    EXPECT_EQ(read_file(save + "/" + ms::kTrackerFile), "6");
}

// A config whose model disagrees with the checkpoint: a config error (2) naming the first differing tensor with
// both shapes, or the first missing tensor.
TEST(CheckpointFailures, ModelMismatchNamesTheFirstDifferingTensor) {
    TempDir d("ckpt_shape");
    const std::string save = d / "ckpt";
    ASSERT_EQ(train(1, d.path(), 2, ckpt_sets(save, "")).exit_code, 0);
    const TrainRun wide = train(1, d.path(), 3, ckpt_sets("", save) + " --set model.hidden_size=32");
    EXPECT_EQ(wide.exit_code, 2) << wide.output;
    EXPECT_NE(wide.output.find("tensor 'wte.weight' has global shape [64,64]"), std::string::npos) << wide.output;
    EXPECT_NE(wide.output.find("expects [64,32]"), std::string::npos) << wide.output;
    const TrainRun deep = train(1, d.path(), 3, ckpt_sets("", save) + " --set model.num_layers=10");
    EXPECT_EQ(deep.exit_code, 2) << deep.output;
    EXPECT_NE(deep.output.find("has no tensor 'h.8.ln_1.weight'"), std::string::npos) << deep.output;
}

TEST(CheckpointFailures, KeepLatestKRemovesOlderCheckpoints) {
    TempDir d("ckpt_keep");
    const std::string save = d / "ckpt";
    const TrainRun r = train(1, d.path(), 5, ckpt_sets(save, "", 1) + " --set checkpoint.keep_latest_k=2");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(save)) left.push_back(e.path().filename().string());
    std::sort(left.begin(), left.end());
    EXPECT_EQ(left, (std::vector<std::string>{"iter_0000004", "iter_0000005", ms::kTrackerFile}));
    const TrainRun one = train(1, d.path(), 2, ckpt_sets(save, "", 1) + " --set checkpoint.keep_latest_k=1");
    EXPECT_EQ(one.exit_code, 2) << one.output;
    EXPECT_NE(one.output.find("checkpoint.keep_latest_k"), std::string::npos) << one.output;
}

// A save that fails at any phase leaves no iter_* directory that is not a complete checkpoint, and the tracker
// names the previous one; the run exits 19.
TEST(CheckpointFailures, InjectedSaveFailuresNeverExposeAPartialCheckpoint) {
    TempDir d("ckpt_inject");
    const std::string base = d / "base";
    ASSERT_EQ(train(1, d.path(), 2, ckpt_sets(base, "")).exit_code, 0);
    for (const std::string phase : {"write", "manifest", "rename", "tracker"}) {
        const std::string save = d / phase;
        copy_checkpoint(base, 2, save);
        const TrainRun r = train(1, d / (phase + "_run"), 3, ckpt_sets(save, save), "MS_INJECT_CKPT_FAIL=" + phase);
        EXPECT_EQ(r.exit_code, 19) << phase << "\n" << r.output;
        EXPECT_NE(r.output.find("injected failure (MS_INJECT_CKPT_FAIL) at phase '" + phase + "'"), std::string::npos)
            << r.output;
        EXPECT_EQ(read_file(save + "/" + ms::kTrackerFile), "2") << phase;
        for (const auto& e : fs::directory_iterator(save)) {
            const std::string name = e.path().filename().string();
            if (name.rfind("iter_", 0) != 0 || name.ends_with(".tmp")) continue;
            EXPECT_NO_THROW(ms::verify_checkpoint(e.path().string(), true)) << phase << ": " << name;
        }
        EXPECT_EQ(fs::exists(iter_dir(save, 3)), phase == "tracker") << phase;
        // The next run resumes from the newest committed checkpoint: the tracker's, or after a failure between the
        // directory rename and the tracker, the renamed one (the tracker is stale).
        const TrainRun again = train(1, d / (phase + "_run"), 4, ckpt_sets(save, save));
        EXPECT_EQ(again.exit_code, 0) << again.output;
        EXPECT_NE(again.output.find("resumed from " + iter_dir(save, phase == "tracker" ? 3 : 2)), std::string::npos)
            << again.output;
        EXPECT_EQ(again.output.find("the tracker is stale") != std::string::npos, phase == "tracker") << again.output;
    }
    // On two ranks a failure on one reaches the other: both stop (no hang), the other naming it.
    const std::string save = d / "dp2";
    const TrainRun r =
        train(2, d / "dp2_run", 2, ckpt_sets(save, "") + " --set parallel.zero_stage=1", "MS_INJECT_CKPT_FAIL=write@1");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("another rank failed while writing its checkpoint files"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(iter_dir(save, 2)));
}

// ---- the save directory's hazards, found at startup (checkpoint.h open_save_dir, check_no_newer_checkpoint) ----

ino_t inode(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// A save directory that cannot be written is refused before the first step (exit 2, naming it), not at the first save
// after save_interval iterations. We run as root, whom permissions do not stop: a path under a regular file cannot
// be created, and sysfs refuses new files to root too.
TEST(CheckpointDir, UnwritableSaveIsRefusedBeforeTraining) {
    TempDir d("ckpt_unwritable");
    std::ofstream(d / "plain") << "a file, not a directory";
    std::vector<std::string> saves = {d / "plain/ckpt"};
    if (std::ofstream(std::string("/sys/ms_write_test")).fail()) saves.push_back("/sys");
    for (const std::string& save : saves) {
        const TrainRun r = train(1, d / "run", 3, ckpt_sets(save, "", 2));
        EXPECT_EQ(r.exit_code, 2) << save << "\n" << r.output;
        EXPECT_NE(r.output.find("checkpoint.save '" + save + "' is not writable"), std::string::npos) << r.output;
        EXPECT_TRUE(read_metrics(d / "run").loss.empty()) << "trained before refusing:\n" << r.output;
    }
    // On two ranks (dp 2, ZeRO-1: both write) both stop with exit 2, neither waiting for the other.
    const TrainRun r = train(2, d / "run2", 3, ckpt_sets(d / "plain/ckpt", "", 2) + " --set parallel.zero_stage=1");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("is not writable"), std::string::npos) << r.output;
}

// Unmounts the tmpfs at `dir` (if mounted) when the test ends, however it ends.
struct Tmpfs {
    std::string dir;
    bool mounted = false;
    Tmpfs(const std::string& d, const std::string& size) : dir(d) {
        fs::create_directories(dir);
        mounted = std::system(("mount -t tmpfs -o size=" + size + " tmpfs '" + dir + "' 2>/dev/null").c_str()) == 0;
    }
    ~Tmpfs() {
        if (mounted) (void)std::system(("umount '" + dir + "'").c_str());
    }
};

// A save directory without room for one checkpoint is refused before the first step, with the bytes needed (12 per
// parameter: the plan's parameter count) and free; the bytes needed are what a real checkpoint of the model holds,
// less its headers and JSON files.
TEST(CheckpointDir, SaveWithoutRoomIsRefusedBeforeTraining) {
    TempDir d("ckpt_room");
    const Tmpfs small(d / "small", "1m");
    if (!small.mounted) GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN)";
    const TrainRun r = train(1, d / "run", 3, ckpt_sets(small.dir, "", 2));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("checkpoint.save '" + small.dir + "' has no room for a checkpoint"), std::string::npos)
        << r.output;
    EXPECT_TRUE(read_metrics(d / "run").loss.empty()) << "trained before refusing:\n" << r.output;
    const size_t at = r.output.find("needs at least ");
    ASSERT_NE(at, std::string::npos) << r.output;
    const uint64_t need = std::stoull(r.output.substr(at + 15));
    EXPECT_NE(r.output.find("bytes (1.0 MiB) are free there"), std::string::npos) << r.output;

    const TrainRun real = train(1, d / "real_run", 2, ckpt_sets(d / "real", ""));
    ASSERT_EQ(real.exit_code, 0) << real.output;
    uint64_t bytes = 0;
    for (const auto& e : fs::recursive_directory_iterator(iter_dir(d / "real", 2)))
        if (e.is_regular_file()) bytes += e.file_size();
    EXPECT_LE(need, bytes);
    EXPECT_GE(need, bytes * 9 / 10) << "headers and JSON files are more than a tenth of the checkpoint";
}

// latest_checkpointed_iteration.txt says 2 while 4 and 6 are committed and verify: the resume takes 6, says the
// tracker is stale, and leaves 4 and 6 where they are (same directories, not rewritten).
TEST(CheckpointDir, StaleTrackerResumesFromTheNewestCheckpoint) {
    TempDir d("ckpt_stale_tracker");
    const std::string save = d / "ckpt";
    const TrainRun a = train(1, d.path(), 6, ckpt_sets(save, save, 2) + " --set checkpoint.keep_latest_k=0");
    ASSERT_EQ(a.exit_code, 0) << a.output;
    std::ofstream(save + "/" + ms::kTrackerFile) << "2";
    const ino_t four = inode(iter_dir(save, 4)), six = inode(iter_dir(save, 6));
    const TrainRun b = train(1, d.path(), 8, ckpt_sets(save, save, 2) + " --set checkpoint.keep_latest_k=0");
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_NE(b.output.find("the tracker is stale"), std::string::npos) << b.output;
    EXPECT_NE(b.output.find("resumed from " + iter_dir(save, 6)), std::string::npos) << b.output;
    EXPECT_EQ(inode(iter_dir(save, 4)), four);
    EXPECT_EQ(inode(iter_dir(save, 6)), six);
    EXPECT_EQ(read_file(save + "/" + ms::kTrackerFile), "8");
}

// A run whose saves would replace a committed checkpoint is refused before its first step (exit 2, naming it): one
// from scratch into a directory holding a run's checkpoints, or one resumed elsewhere at an older iteration. The
// directory is left as it was.
TEST(CheckpointDir, NewerCommittedCheckpointIsNeverReplaced) {
    TempDir d("ckpt_newer");
    const std::string save = d / "ckpt";
    ASSERT_EQ(train(1, d / "first", 4, ckpt_sets(save, "", 2)).exit_code, 0);
    copy_checkpoint(save, 2, d / "older");
    const ino_t four = inode(iter_dir(save, 4));
    for (const auto& [load, start] : {std::pair<std::string, std::string>{"", "from scratch"},
                                      {d / "older", "iteration 2, resumed from '" + d / "older" + "'"}}) {
        const TrainRun r = train(1, d / "second", 6, ckpt_sets(save, load, 2));
        EXPECT_EQ(r.exit_code, 2) << r.output;
        EXPECT_NE(r.output.find("checkpoint.save '" + save +
                                "' holds iter_0000004, a committed checkpoint newer than "
                                "where this run starts (" +
                                start + ")"),
                  std::string::npos)
            << r.output;
        EXPECT_TRUE(read_metrics(d / "second").loss.empty()) << "trained before refusing:\n" << r.output;
        EXPECT_EQ(inode(iter_dir(save, 4)), four);
        EXPECT_EQ(read_file(save + "/" + ms::kTrackerFile), "4");
    }
}

// A second run saving into a directory in use is refused (exit 2 on every rank, naming the holder); a lock left by a
// run that died on this host is taken over with a warning; a run removes its lock when it ends, also after a failed
// save.
TEST(CheckpointDir, LockRefusesASecondWriterAndTakesOverADeadOnesLock) {
    TempDir d("ckpt_lock");
    const std::string save = d / "ckpt", lock = save + "/" + ms::kLockFile;
    fs::create_directories(save);
    const std::string live =
        nlohmann::json{{"host", ms::host_name()}, {"pid", ::getpid()}, {"started", "2026-01-01T00:00:00Z"}}.dump();
    std::ofstream(lock) << live;
    const TrainRun r = train(2, d / "run", 2, ckpt_sets(save, save) + " --set parallel.zero_stage=1");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("checkpoint.save '" + save + "' is in use by another run: its lock '" + lock +
                            "' is held by pid " + std::to_string(::getpid()) + " on host " + ms::host_name() +
                            " (started 2026-01-01T00:00:00Z)"),
              std::string::npos)
        << r.output;
    EXPECT_TRUE(read_metrics(d / "run").loss.empty()) << "trained before refusing:\n" << r.output;
    EXPECT_EQ(read_file(lock), live);

    const pid_t child = ::fork();  // a pid that is surely gone: a child that exited and was reaped
    if (child == 0) ::_exit(0);
    ASSERT_GT(child, 0);
    ::waitpid(child, nullptr, 0);
    std::ofstream(lock) << nlohmann::json{{"host", ms::host_name()}, {"pid", child}, {"started", "then"}}.dump();
    const TrainRun dead = train(2, d / "run", 2, ckpt_sets(save, save) + " --set parallel.zero_stage=1");
    EXPECT_EQ(dead.exit_code, 0) << dead.output;
    EXPECT_NE(dead.output.find("taking over the lock '" + lock + "' of pid " + std::to_string(child)),
              std::string::npos)
        << dead.output;
    EXPECT_FALSE(fs::exists(lock));
    const TrainRun failed = train(1, d / "run", 3, ckpt_sets(save, save), "MS_INJECT_CKPT_FAIL=write");
    EXPECT_EQ(failed.exit_code, 19) << failed.output;
    EXPECT_FALSE(fs::exists(lock));
}

// A save that died (a full disk, a kill) leaves iter_X.tmp; the next start removes it, saying so.
TEST(CheckpointDir, LeftoversOfACrashedSaveAreRemovedAtTheNextStart) {
    TempDir d("ckpt_leftovers");
    const std::string save = d / "ckpt";
    ASSERT_EQ(train(1, d.path(), 2, ckpt_sets(save, "")).exit_code, 0);
    const std::string leftover = save + "/" + ms::checkpoint_dir_name(9) + ".tmp";
    fs::create_directories(leftover + "/model");
    std::ofstream(leftover + "/model/tp00_pp000.safetensors") << "half";
    const TrainRun r = train(1, d.path(), 3, ckpt_sets(save, save));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("removed " + leftover + ", left by an interrupted save"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(leftover));
}

}  // namespace
