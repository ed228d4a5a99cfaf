// test_memory.cpp: the trainer's memory through the binary. Every buffer of a step comes from one arena per rank,
// sized by the plan (engine/train/plan.h); after the first step the log says "memory: planned X (N B), arena peak Y
// (M B)". For the demo (1 rank), demo-3d (tp 2 x pp 2 x dp 2 on 8 ranks) and GPT-2 124M (1 rank) the peak is
// within 2% of the plan -- and of what `plan` prints for the same config. The runs take three steps, with the arena
// frozen and MS_CHECK_ALLOCS=1: an arena allocation inside a step, or any heap allocation in step 3, aborts them. A
// config that does not fit exits 2 with the table and a hint.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "tests/e2e/run_cli.h"

namespace {

using ms::test::make_temp_dir;
using ms::test::run_cli;

// The issue's bound: the arena's peak within 2% of the plan. Measured: 100.00% (demo, 124M) and 100.02% (demo-3d:
// each allocation is rounded up to the arena's 256-byte blocks).
constexpr double kTolerance = 0.02;

struct MemoryLine {
    double planned = 0, peak = 0, lowest = 0, highest = 0;  // bytes; all ranks' peak / plan in percent
};

// Parses "memory: planned 7.01 MiB (7352320 B), arena peak 7.01 MiB (7352320 B) (100.00% of planned) | all ranks:
// 100.00% to 100.00% of their plans".
bool parse_memory_line(const std::string& output, MemoryLine& m) {
    const std::regex re(R"(memory: planned [^(]+\((\d+) B\), arena peak [^(]+\((\d+) B\) \([0-9.]+% of planned\) )"
                        R"(\| all ranks: ([0-9.]+)% to ([0-9.]+)% of their plans)");
    std::smatch match;
    if (!std::regex_search(output, match, re)) return false;
    m.planned = std::stod(match[1]), m.peak = std::stod(match[2]);
    m.lowest = std::stod(match[3]), m.highest = std::stod(match[4]);
    return true;
}

// The total of pipeline stage 0 (rank 0's stage) in `plan`'s per-stage table, e.g. "2.64 MiB" -> bytes (to the
// printed two decimals), or -1.
double plan_stage0_total(const std::string& output) {
    const std::regex re(R"(\n +0  .*  ([0-9.]+) (B|KiB|MiB|GiB)\n)");
    std::smatch match;
    if (!std::regex_search(output, match, re)) return -1;
    const std::string u = match[2];
    return std::stod(match[1]) * (u == "B" ? 1.0 : u == "KiB" ? 1024.0 : u == "MiB" ? 1048576.0 : 1073741824.0);
}

const char* kShortRun =
    " --set training.train_iters=3 --set lr_schedule.lr_warmup_iters=0 --set logging.log_interval=1"
    " --set eval.eval_interval=0 --set eval.sample_tokens=0";

// Trains `config` + `sets` (on `ranks` ranks through mpiexec when > 1) and checks the memory line and metrics
// against the plan; returns the output.
std::string check_peak_matches_plan(const std::string& config, const std::string& sets, int ranks) {
    const std::string dir = make_temp_dir();
    const std::string args = "--config " MS_SOURCE_DIR "/configs/" + config + " " + sets;
    std::string output;
    int exit_code = -1;
    // Every run also checks that its third step makes no heap allocation at all (memory/alloc_guard.h): the child
    // processes inherit MS_CHECK_ALLOCS from this one (mpiexec passes it on with -x).
    setenv("MS_CHECK_ALLOCS", "1", 1);
    if (ranks == 1) {
        const auto r = run_cli("train " + args + " --set run.output_dir=" + dir + kShortRun);
        output = r.output, exit_code = r.exit_code;
    } else {
        const std::string cmd = "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive mpiexec -n " + std::to_string(ranks) +
                                " -x MS_CHECK_ALLOCS --oversubscribe --allow-run-as-root '" + MS_BINARY_PATH +
                                "' train " + args + " --set run.output_dir=" + dir + kShortRun + " 2>&1";
        FILE* p = popen(cmd.c_str(), "r");
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output.append(buf, n);
        const int status = pclose(p);
        exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    unsetenv("MS_CHECK_ALLOCS");
    EXPECT_EQ(exit_code, 0) << output;
    EXPECT_EQ(output.find("heap allocation"), std::string::npos) << output;
    MemoryLine m;
    EXPECT_TRUE(parse_memory_line(output, m)) << output;
    EXPECT_GT(m.planned, 0) << output;
    EXPECT_NEAR(m.peak / m.planned, 1.0, kTolerance) << output;
    EXPECT_GE(m.lowest, 100.0 * (1 - kTolerance)) << output;  // every rank against its own stage's plan
    EXPECT_LE(m.highest, 100.0 * (1 + kTolerance)) << output;

    // `plan` for the same config and world size says the same for rank 0's stage (to its two printed decimals)
    const auto plan = run_cli("plan " + args + " --world-size " + std::to_string(ranks));
    EXPECT_EQ(plan.exit_code, 0) << plan.output;
    EXPECT_NEAR(plan_stage0_total(plan.output), m.planned, 0.005 * m.planned) << plan.output << "\n" << output;

    std::ifstream metrics(dir + "/metrics.jsonl");
    std::string line;
    int records = 0;
    while (std::getline(metrics, line)) {
        const auto j = nlohmann::json::parse(line);
        if (!j.contains("lm loss")) continue;
        EXPECT_EQ(j["memory_planned_bytes"].get<double>(), m.planned) << line;
        EXPECT_EQ(j["memory_peak_bytes"].get<double>(), m.peak) << line;
        ++records;
    }
    EXPECT_EQ(records, 3) << output;
    return output;
}

TEST(MemoryE2E, DemoPeakMatchesThePlan) { check_peak_matches_plan("demo.yaml", "", 1); }

TEST(MemoryE2E, Demo3dOnEightRanksPeakMatchesThePlan) { check_peak_matches_plan("demo-3d.yaml", "", 8); }

// With overlapped buckets the first stage also holds the buffer the last stage's average of the tied output layer's
// gradient arrives in (GptGraphOptions::tied_head_received); the exchange allocates nothing per step either.
TEST(MemoryE2E, Demo3dWithOverlappedBucketsPeakMatchesThePlan) {
    const std::string out = check_peak_matches_plan(
        "demo-3d.yaml", "--set parallel.overlap_grad_reduce=true --set parallel.bucket_size=20000", 8);
    EXPECT_NE(out.find("the tied embedding's gradient in two parts"), std::string::npos) << out;
}

TEST(MemoryE2E, Gpt2SmallShapePeakMatchesThePlan) {
    // GPT-2 124M's parameters, gradients and Adam state (about 1.9 GiB) at a short sequence on synthetic data.
    check_peak_matches_plan("gpt2-124m.yaml",
                            "--set data.source=synthetic --set data.synthetic.vocab_size=50257"
                            " --set data.synthetic.num_tokens=200000 --set model.seq_length=64"
                            " --set training.micro_batch_size=1 --set training.global_batch_size=1"
                            " --set logging.peak_flops=1e11",
                            1);
}

// A position table longer than the trained sequence (max_position_embeddings 256, seq_length 64) adds its rows to the
// parameters and nothing to the activations, which are sized by seq_length; the run's peak still equals the plan.
TEST(MemoryE2E, ActivationsAreSizedBySeqLengthNotByThePositionTable) {
    auto stage0 = [](const std::string& sets) {
        const auto plan = run_cli("plan --config " MS_SOURCE_DIR "/configs/demo.yaml " + sets);
        EXPECT_EQ(plan.exit_code, 0) << plan.output;
        std::smatch m;  // "    0     0-1      112384   ...   4.55 MiB x 1 + 768.00 KiB  7.01 MiB"
        const std::regex row(R"(\n +0 +0-1 +(\d+) .* ([\d.]+ \w?i?B x \d+ \+ [\d.]+ \w?i?B) )");
        EXPECT_TRUE(std::regex_search(plan.output, m, row)) << plan.output;
        return std::make_pair(std::stoll(m[1].str()), m[2].str());
    };
    const auto [params64, act64] = stage0("--set model.max_position_embeddings=0");
    const auto [params256, act256] = stage0("--set model.max_position_embeddings=256");
    EXPECT_EQ(params256 - params64, (256 - 64) * 64);  // the extra wpe rows (hidden 64)
    EXPECT_EQ(act256, act64);
    check_peak_matches_plan("demo.yaml", "--set model.max_position_embeddings=256", 1);
}

TEST(MemoryE2E, ConfigThatDoesNotFitExitsTwoWithTheTableAndAHint) {
    const auto r =
        run_cli("train --config " MS_SOURCE_DIR "/configs/demo.yaml --set run.output_dir=" + make_temp_dir() +
                " --set run.memory_limit_gb=0.001");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    // demo needs 6.79 MiB per rank (the fused LM head holds a chunk of its logits; one fp32 stage on the CPU keeps the
    // tied head's gradient apart, 32 KiB); 0.001 GiB is 1.02 MiB
    EXPECT_NE(r.output.find("memory error: pipeline stage 0 needs 6.79 MiB per rank, but 1.02 MiB is available per "
                            "rank (run.memory_limit_gb)"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("activations (slot x n + scratch)"), std::string::npos) << r.output;  // the table
    for (const char* hint : {"training.micro_batch_size", "parallel.pipeline_model_parallel_size",
                             "parallel.zero_stage: 1", "recomputation is not available yet"}) {
        EXPECT_NE(r.output.find(hint), std::string::npos) << hint << "\n" << r.output;
    }
    EXPECT_EQ(r.output.find("iteration"), std::string::npos) << "nothing may run: " << r.output;
}

}  // namespace
