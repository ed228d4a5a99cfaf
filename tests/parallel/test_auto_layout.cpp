// test_auto_layout.cpp: parallel.auto (engine/train/run_layout.h resolve_auto_layout, docs/planner.md
// "parallel.auto"): tests/parallel/tiny.yaml on 4 ranks under mpiexec trains with the layout `plan --search` ranks
// first on the same profile, records it in config.resolved.yaml, `plan` plans it, and a resume from the run's
// checkpoint chooses it again; the inputs it cannot search with are refused with a sentence.
//
// The profile is hand-written (a CPU-like one: every family at one rate, the link model's default links), so the
// ranking does not depend on this machine; the memory limit leaves out the layouts that keep whole replicas, so the
// choice is one that splits the model.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/sim/profile.h"
#include "engine/sim/search.h"
#include "tests/common/job_run.h"
#include "tests/e2e/run_cli.h"

namespace {

constexpr const char* kTiny = MS_SOURCE_DIR "/tests/parallel/tiny.yaml";
// 6 MiB per rank: tiny.yaml's 406144 parameters as fp32 weights, gradients and both moments take 6.2 MiB before any
// activation, so a layout that fits shards them (tp, pp or ZeRO 1)
constexpr const char* kLimit = "--set run.memory_limit_gb=0.005859375";

std::string write_hand_profile(const std::string& dir) {
    using ms::sim::OpFamily;
    ms::sim::Profile p;
    p.name = "hand";
    p.device = "hand-written (tests/parallel/test_auto_layout.cpp)";
    p.backend = "cpu";
    p.threads = 1;
    p.date = "2026-12-02T00:00:00Z";
    p.source = "hand-written for the test";
    p.memory_bytes_per_s = 1e10;
    p.intra_node = {1e-5, 1e9};
    p.inter_node = {1e-4, 1.25e8};
    p.links_source = "hand-written: the link model's defaults";
    ms::sim::DTypeTable t;
    t.dtype = ms::DType::kF32;
    t.matmul_peak_flops = 5e10;
    t.peak_source = "hand-written";
    for (size_t i = 0; i < ms::sim::kNumFamilies; ++i) {
        const auto f = static_cast<OpFamily>(i);
        const double best = ms::sim::family_bound(f) == ms::sim::Bound::kCompute ? 2e10 : 5e9;
        t.of(f) = {.overhead_s = 2e-6, .points = {{1e3, best / 10}, {1e9, best}}};
    }
    p.tables.push_back(t);
    const std::string path = dir + "/hand.json";
    ms::sim::save_profile(p, path);
    return path;
}

// The line of `output` that starts (after spaces) with `prefix`, or "".
std::string line_starting(const std::string& output, const std::string& prefix) {
    size_t begin = 0;
    while (begin < output.size()) {
        size_t end = output.find('\n', begin);
        if (end == std::string::npos) end = output.size();
        const std::string line = output.substr(begin, end - begin);
        const size_t first = line.find_first_not_of(' ');
        if (first != std::string::npos && line.compare(first, prefix.size(), prefix) == 0) return line;
        begin = end + 1;
    }
    return "";
}

ms::test::JobRun train4(const std::string& dir, const std::string& sets) {
    const std::string cmd =
        "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive timeout 180 mpiexec -n 4 --oversubscribe --allow-run-as-root "
        "'" MS_BINARY_PATH "' train --config " +
        std::string(kTiny) + " --set run.output_dir=" + dir + " --set parallel.auto=true " + sets + " 2>&1";
    ms::test::JobRun job = ms::test::run_command(cmd, dir);
    EXPECT_EQ(job.code, 0) << cmd << "\n" << job.output;
    return job;
}

TEST(AutoLayout, TrainsWithPlanSearchsFirstChoiceAndResumes) {
    const std::string dir = ms::test::make_temp_dir();
    const std::string profile = write_hand_profile(dir);
    const std::string sets = "--set parallel.auto_profile=" + profile + " " + kLimit + " --set checkpoint.save=" + dir +
                             "/ckpt --set checkpoint.load=" + dir + "/ckpt";
    const ms::test::JobRun first = train4(dir + "/run", sets + " --set training.train_iters=6");

    // plan --search on the same config, profile, ranks and nodes (one host: 4 ranks a node)
    const ms::test::CliResult plan = ms::test::run_cli(
        "plan --config " + std::string(kTiny) + " --set parallel.auto=true --set parallel.auto_profile=" + profile +
        " " + kLimit + " --search --profile " + profile + " --world-size 4 --gpus-per-node 4 --top 1");
    ASSERT_EQ(plan.exit_code, 0) << plan.output;
    const std::string ranked_first = line_starting(plan.output, "1  tp ");
    ASSERT_FALSE(ranked_first.empty()) << plan.output;
    // the same row: the same layout, simulated to the same numbers
    EXPECT_EQ(line_starting(first.output, "1  tp "), ranked_first) << first.output;

    // what the run recorded and ran: the chosen keys in config.resolved.yaml, the layout in the derived line
    const ms::Config resolved = ms::load_config(dir + "/run/config.resolved.yaml", {});
    EXPECT_TRUE(resolved.parallel.auto_layout);
    EXPECT_EQ(resolved.parallel.auto_profile, profile);
    EXPECT_NE(first.output.find("parallel.auto: chosen layout: " + ms::sim::layout_overrides(resolved)),
              std::string::npos)
        << first.output;
    const ms::ParallelConfig& p = resolved.parallel;
    EXPECT_NE(
        ranked_first.find("tp " + std::to_string(p.tensor_model_parallel_size) + (p.sequence_parallel ? " sp" : "") +
                          " pp " + std::to_string(p.pipeline_model_parallel_size) + " vpp " +
                          std::to_string(p.virtual_pipeline_model_parallel_size) + " dp " +
                          std::to_string(p.data_parallel_size)),
        std::string::npos)
        << ranked_first;
    EXPECT_NE(first.output.find("derived: world size 4 = tp " + std::to_string(p.tensor_model_parallel_size) +
                                " x pp " + std::to_string(p.pipeline_model_parallel_size) + " x dp " +
                                std::to_string(p.data_parallel_size)),
              std::string::npos)
        << first.output;
    // tiny.yaml sets the micro-batch: kept as set
    EXPECT_EQ(resolved.training.micro_batch_size, 2);
    EXPECT_NE(first.output.find("keeping training.micro_batch_size as set"), std::string::npos) << first.output;
    // the memory limit leaves no whole replica: the model is split
    EXPECT_GT(p.tensor_model_parallel_size * p.pipeline_model_parallel_size * (p.zero_stage + 1), 1) << ranked_first;

    // plan (without --search) plans what train chose
    const ms::test::CliResult planned = ms::test::run_cli(
        "plan --config " + std::string(kTiny) + " --set parallel.auto=true --set parallel.auto_profile=" + profile +
        " " + kLimit + " --world-size 4 --ranks-per-node 4");
    ASSERT_EQ(planned.exit_code, 0) << planned.output;
    EXPECT_NE(planned.output.find("parallel.auto: chosen layout: " + ms::sim::layout_overrides(resolved)),
              std::string::npos)
        << planned.output;

    // a resume searches again, chooses the same, and continues from the checkpoint
    const ms::test::JobRun resumed = train4(dir + "/run", sets + " --set training.train_iters=8");
    EXPECT_NE(resumed.output.find("checkpoint: resumed from"), std::string::npos) << resumed.output;
    EXPECT_EQ(line_starting(resumed.output, "1  tp "), ranked_first) << resumed.output;
}

TEST(AutoLayout, RefusesWhatItCannotSearchWith) {
    const std::string dir = ms::test::make_temp_dir();
    const std::string train = "train --config " + std::string(kTiny) + " --set run.output_dir=" + dir + " ";
    // on the CPU there is no built-in estimate: calibrate first
    ms::test::CliResult r = ms::test::run_cli(train + "--set parallel.auto=true");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("run `mindspeed-train calibrate --output cpu.json`"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("parallel.auto_profile: cpu.json"), std::string::npos) << r.output;
    // neither a file nor an estimate
    r = ms::test::run_cli(train + "--set parallel.auto=true --set parallel.auto_profile=" + dir + "/missing.json");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("is neither a profile file (there is no such file) nor a built-in estimate (a100-80g"),
              std::string::npos)
        << r.output;
    // a GPU's estimate for a CPU run
    r = ms::test::run_cli(train + "--set parallel.auto=true --set parallel.auto_profile=h200");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("holds the costs of the cuda backend"), std::string::npos) << r.output;
    // auto_profile alone would be ignored
    r = ms::test::run_cli(train + "--set parallel.auto_profile=h200");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("parallel.auto_profile = 'h200' is set but parallel.auto is false"), std::string::npos)
        << r.output;
    // nothing fits in 1 MiB per rank on one rank: the sentence says what needs how much
    const std::string profile = write_hand_profile(dir);
    r = ms::test::run_cli(train + "--set parallel.auto=true --set parallel.auto_profile=" + profile +
                          " --set run.memory_limit_gb=0.0009765625");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("over the memory budget of 1.00 MiB per rank, the smallest (tp 1 pp 1 vpp 1 dp 1"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("hint: more ranks"), std::string::npos) << r.output;
}

}  // namespace
