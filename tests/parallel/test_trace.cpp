// test_trace.cpp: logging.trace_dir (engine/train/trace.h) on real runs: tests/parallel/tiny.yaml at pp 2 x dp 2 under
// mpiexec (micro-batches of 1 sequence, so 4 per step and data-parallel rank, 1F1B), 5 iterations of which 3 and 4 are
// traced with the allocation guard armed (MS_CHECK_ALLOCS=1 checks iterations 3 to 5). The merged trace.json is read
// as a JSON client reads it, and the same run without a trace gives the losses to compare.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "tests/common/job_run.h"
#include "tests/e2e/run_cli.h"

namespace {

constexpr int kRanks = 4, kMicroBatches = 4, kIters = 5;
// one micro-batch's activation between the stages: micro_batch 1 x seq 32 x hidden 64 fp32
constexpr int64_t kActivationBytes = 1 * 32 * 64 * 4;

struct TracedRun {
    int code = -1;
    std::string output, dir;
    std::vector<double> losses;
    nlohmann::json trace;  // trace.json, null without one
};

TracedRun train(bool trace) {
    const std::string dir = ms::test::make_temp_dir();
    const std::string cmd =
        "MS_CHECK_ALLOCS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive timeout 150 mpiexec -n " + std::to_string(kRanks) +
        " --oversubscribe --allow-run-as-root '" MS_BINARY_PATH "' train --config " MS_SOURCE_DIR
        "/tests/parallel/tiny.yaml --set parallel.pipeline_model_parallel_size=2 --set training.micro_batch_size=1 "
        "--set training.train_iters=" +
        std::to_string(kIters) + " --set run.output_dir=" + dir +
        (trace ? " --set logging.trace_dir=" + dir + "/trace --set logging.trace_steps=3:4" : std::string()) + " 2>&1";
    const ms::test::JobRun job = ms::test::run_command(cmd, dir);
    TracedRun r;
    r.code = job.code;
    r.output = job.output;
    r.dir = dir;
    std::ifstream metrics(dir + "/metrics.jsonl");
    std::string line;
    while (std::getline(metrics, line)) r.losses.push_back(nlohmann::json::parse(line)["lm loss"].get<double>());
    if (trace) r.trace = ms::test::read_json(dir + "/trace/trace.json");
    return r;
}

const TracedRun& traced() {
    static const TracedRun r = train(true);
    return r;
}

// pid -> (pp rank, dp rank), from the process rows' names "rank R (tp T, pp P, dp D)".
std::map<int, std::pair<int, int>> stages(const nlohmann::json& trace) {
    std::map<int, std::pair<int, int>> out;
    for (const nlohmann::json& e : trace["traceEvents"]) {
        if (e["ph"] != "M" || e["name"] != "process_name") continue;
        int r = 0, tp = 0, pp = 0, dp = 0;
        const std::string name = e["args"]["name"];
        if (std::sscanf(name.c_str(), "rank %d (tp %d, pp %d, dp %d)", &r, &tp, &pp, &dp) == 4) out[r] = {pp, dp};
    }
    return out;
}

TEST(Trace, MergedFileHasOpsCommunicationAndPipelineOnEveryRank) {
    const TracedRun& r = traced();
    ASSERT_EQ(r.code, 0) << r.output;
    ASSERT_TRUE(r.trace.is_object()) << "trace.json is missing or does not parse\n" << r.output;
    for (int rank = 0; rank < kRanks; ++rank) {  // the per-rank files stay beside the merged one
        EXPECT_TRUE(ms::test::read_json(r.dir + "/trace/rank_0000" + std::to_string(rank) + ".json").is_object());
    }
    ASSERT_EQ(stages(r.trace).size(), static_cast<size_t>(kRanks));
    std::map<int, int> ops, comms, p2p, forwards, backwards;
    std::map<int, std::set<std::string>> rows;
    int pp_with_activation = 0;
    for (const nlohmann::json& e : r.trace["traceEvents"]) {
        const int pid = e["pid"];
        if (e["ph"] == "M") {
            if (e["name"] == "thread_name") rows[pid].insert(e["args"]["name"].get<std::string>());
            continue;
        }
        if (e["ph"] == "s" || e["ph"] == "f") continue;  // the arrows: OnlyTheChosenIterations
        ASSERT_EQ(e["ph"], "X") << e.dump();
        ASSERT_TRUE(e["ts"].is_number() && e["dur"].is_number()) << e.dump();
        const std::string cat = e["cat"];
        if (cat == "op") ++ops[pid];
        if (cat == "p2p") ++p2p[pid];
        if (cat == "compute") ++(e["name"].get<std::string>()[0] == 'F' ? forwards : backwards)[pid];
        if (cat == "comm") {
            ++comms[pid];
            const nlohmann::json& a = e["args"];
            ASSERT_TRUE(a.contains("group") && a["bytes"].is_number_integer() && a.contains("priority") &&
                        a["waited_us"].is_number())
                << e.dump();
            // the pipeline's batches: high priority, whole activations (one or two messages)
            if (a["group"] == "pp" && a["op"] != "all_reduce") {
                EXPECT_EQ(a["priority"], "high") << e.dump();
                EXPECT_EQ(a["bytes"].get<int64_t>() % kActivationBytes, 0) << e.dump();
                ++pp_with_activation;
            }
        }
    }
    EXPECT_GT(pp_with_activation, 0);
    for (int pid = 0; pid < kRanks; ++pid) {
        EXPECT_GT(ops[pid], 0) << "rank " << pid;
        EXPECT_GT(comms[pid], 0) << "rank " << pid;
        EXPECT_GT(p2p[pid], 0) << "rank " << pid;
        EXPECT_EQ(forwards[pid], 2 * kMicroBatches) << "rank " << pid;  // two traced iterations
        EXPECT_EQ(backwards[pid], 2 * kMicroBatches) << "rank " << pid;
        for (const char* row : {"pipeline", "ops", "communication"}) EXPECT_TRUE(rows[pid].count(row)) << row;
    }
}

TEST(Trace, OnlyTheChosenIterations) {
    const TracedRun& r = traced();
    ASSERT_TRUE(r.trace.is_object()) << r.output;
    std::set<int64_t> iterations;
    for (const nlohmann::json& e : r.trace["traceEvents"]) {
        if (e["ph"] == "X") iterations.insert(e["args"]["iteration"].get<int64_t>());
    }
    EXPECT_EQ(iterations, (std::set<int64_t>{3, 4}));
}

// Every pipeline send has an arrow to its receive on the other stage: one start ("s") and one end ("f") per id, on
// two ranks. Per traced iteration and data-parallel rank, 1F1B over 2 stages sends 4 activations and 4 gradients.
TEST(Trace, EverySendHasAnArrowToItsReceive) {
    const TracedRun& r = traced();
    ASSERT_TRUE(r.trace.is_object()) << r.output;
    std::map<uint64_t, std::vector<std::pair<std::string, int>>> ends;  // id -> (ph, pid)
    for (const nlohmann::json& e : r.trace["traceEvents"]) {
        if (e["ph"] == "s" || e["ph"] == "f") ends[e["id"].get<uint64_t>()].push_back({e["ph"], e["pid"]});
    }
    EXPECT_EQ(ends.size(), static_cast<size_t>(2 * 2 * 2 * kMicroBatches));  // iterations x dp x (act, grad) x m
    for (const auto& [id, e] : ends) {
        ASSERT_EQ(e.size(), 2u) << id;
        EXPECT_NE(e[0].first, e[1].first) << id;
        EXPECT_NE(e[0].second, e[1].second) << id;
    }
}

// The picture is the schedule: micro-batch m's forward on stage 1 starts after its forward on stage 0 ends (the
// activation travels between them), and its backward on stage 0 after its backward on stage 1 ends -- across ranks,
// so on the common clock.
TEST(Trace, StagesFollowEachOtherOnTheCommonClock) {
    const TracedRun& r = traced();
    ASSERT_TRUE(r.trace.is_object()) << r.output;
    const std::map<int, std::pair<int, int>> stage = stages(r.trace);
    // (iteration, dp rank, micro-batch, pp rank, 'F' or 'B') -> (start, end) in microseconds
    std::map<std::tuple<int64_t, int, int, int, char>, std::pair<double, double>> spans;
    for (const nlohmann::json& e : r.trace["traceEvents"]) {
        if (e["ph"] != "X" || e["cat"] != "compute") continue;
        const auto [pp, dp] = stage.at(e["pid"].get<int>());
        const double ts = e["ts"], dur = e["dur"];
        spans[{e["args"]["iteration"].get<int64_t>(), dp, e["args"]["microbatch"].get<int>(), pp,
               e["name"].get<std::string>()[0]}] = {ts, ts + dur};
    }
    int checked = 0;
    for (int64_t it : {3, 4}) {
        for (int dp = 0; dp < 2; ++dp) {
            for (int m = 0; m < kMicroBatches; ++m) {
                const auto f0 = spans.at({it, dp, m, 0, 'F'}), f1 = spans.at({it, dp, m, 1, 'F'});
                const auto b0 = spans.at({it, dp, m, 0, 'B'}), b1 = spans.at({it, dp, m, 1, 'B'});
                EXPECT_GE(f1.first, f0.second) << "iteration " << it << " dp " << dp << " micro-batch " << m;
                EXPECT_GE(b0.first, b1.second) << "iteration " << it << " dp " << dp << " micro-batch " << m;
                ++checked;
            }
        }
    }
    EXPECT_EQ(checked, 2 * 2 * kMicroBatches);
}

TEST(Trace, SameLossesBitForBitAsWithout) {
    const TracedRun& on = traced();
    const TracedRun off = train(false);
    ASSERT_EQ(off.code, 0) << off.output;
    ASSERT_EQ(on.losses.size(), static_cast<size_t>(kIters)) << on.output;
    ASSERT_EQ(off.losses.size(), static_cast<size_t>(kIters)) << off.output;
    for (int i = 0; i < kIters; ++i) EXPECT_EQ(on.losses[i], off.losses[i]) << "iteration " << i + 1;
}

TEST(Trace, BadTraceStepsAreRefusedWithASentence) {
    const std::string dir = ms::test::make_temp_dir();
    const std::string base = "train --config " MS_SOURCE_DIR "/tests/parallel/tiny.yaml --set training.train_iters=" +
                             std::to_string(kIters) + " --set run.output_dir=" + dir +
                             " --set logging.trace_dir=" + dir + "/trace ";
    const ms::test::CliResult reversed = ms::test::run_cli(base + "--set logging.trace_steps=4:2");
    EXPECT_EQ(reversed.exit_code, 2) << reversed.output;
    EXPECT_NE(reversed.output.find("logging.trace_steps"), std::string::npos) << reversed.output;
    EXPECT_NE(reversed.output.find("FIRST:LAST"), std::string::npos) << reversed.output;
    const ms::test::CliResult late = ms::test::run_cli(base + "--set logging.trace_steps=9");
    EXPECT_EQ(late.exit_code, 2) << late.output;
    EXPECT_NE(late.output.find("logging.trace_steps('9') starts after training.train_iters(5)"), std::string::npos)
        << late.output;
}

}  // namespace
