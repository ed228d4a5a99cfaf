// test_train.cpp: the trainer end to end through the binary: the demo config learns, runs are reproducible
// bit for bit, preprocess -> train works on Megatron data, and bad data files stop the run with exit code 2.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "tests/e2e/run_cli.h"

namespace {

using ms::test::make_temp_dir;
using ms::test::read_file;
using ms::test::run_cli;

std::vector<double> metric_series(const std::string& path, const std::string& key) {
    std::vector<double> out;
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line)) {
        const auto j = nlohmann::json::parse(line);
        if (j.contains(key) && j[key].is_number()) out.push_back(j[key].get<double>());
    }
    return out;
}

std::string demo_args(const std::string& dir, int iters) {
    return "train --config " MS_SOURCE_DIR "/configs/demo.yaml --set run.output_dir=" + dir +
           " --set training.train_iters=" + std::to_string(iters) +
           " --set lr_schedule.lr_warmup_iters=5 --set logging.log_interval=5 --set eval.eval_interval=0"
           " --set eval.sample_tokens=20";
}

TEST(TrainE2E, DemoLossFallsFromLnVocabTowardTheFloor) {
    const std::string dir = make_temp_dir();
    const auto r = run_cli(demo_args(dir, 60));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("entropy rate"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("iteration       60/      60"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("sample"), std::string::npos) << r.output;
    const auto losses = metric_series(dir + "/metrics.jsonl", "lm loss");
    ASSERT_EQ(losses.size(), 12u);
    // The first interval averages iterations 1-5, mostly untrained: close to ln(32) = 3.47 (measured 3.3-3.5).
    EXPECT_NEAR(losses.front(), std::log(32.0), 0.3);
    // 60 steps are enough to fall well below the uniform loss (measured: about 2.2 at iteration 60).
    EXPECT_LT(losses.back(), losses.front() - 0.8);
}

// MS_PROFILE_OPS=1: the run trains as usual (the same losses: the decorator only times) and ends with the op table
// over the steps after the first, printed and written to op_profile_rank0.txt; the demo's 2 layers x 2 micro-batches
// give each Linear layer's forward 2 x 2 calls per step.
TEST(TrainE2E, ProfileOpsPrintsATableOfEveryOpAndChangesNoResult) {
    const std::string plain = make_temp_dir(), profiled = make_temp_dir();
    const auto rp = run_cli(demo_args(plain, 6));
    ASSERT_EQ(rp.exit_code, 0) << rp.output;
    setenv("MS_PROFILE_OPS", "1", 1);
    const auto r = run_cli(demo_args(profiled, 6));
    unsetenv("MS_PROFILE_OPS");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(metric_series(profiled + "/metrics.jsonl", "lm loss"),
              metric_series(plain + "/metrics.jsonl", "lm loss"));
    EXPECT_NE(r.output.find("op profile over 5 step(s)"), std::string::npos) << r.output;
    for (const char* row : {"matmul forward N 512 K 64 M 192 +bias", "attention backward B 8 T 64 NH 4 HS 16", "adamw",
                            "(rest: host work, communication, waits)"}) {
        EXPECT_NE(r.output.find(row), std::string::npos) << row << "\n" << r.output;
    }
    const std::regex qkv(R"(matmul forward N 512 K 64 M 192 \+bias +20 )");  // 2 layers x 2 micro-batches x 5 steps
    EXPECT_TRUE(std::regex_search(r.output, qkv)) << r.output;
    std::ifstream file(profiled + "/op_profile_rank0.txt");
    std::string first;
    EXPECT_TRUE(std::getline(file, first) && first.rfind("op profile over 5 step(s)", 0) == 0) << first;
}

TEST(TrainE2E, TwoRunsOfTheSameConfigAreBitIdentical) {
    const std::string a = make_temp_dir(), b = make_temp_dir();
    const auto ra = run_cli(demo_args(a, 15));
    const auto rb = run_cli(demo_args(b, 15));
    ASSERT_EQ(ra.exit_code, 0) << ra.output;
    ASSERT_EQ(rb.exit_code, 0) << rb.output;
    const auto la = metric_series(a + "/metrics.jsonl", "lm loss");
    const auto lb = metric_series(b + "/metrics.jsonl", "lm loss");
    const auto ga = metric_series(a + "/metrics.jsonl", "grad-norm");
    const auto gb = metric_series(b + "/metrics.jsonl", "grad-norm");
    ASSERT_EQ(la.size(), 3u);
    EXPECT_EQ(la, lb);  // exact: same seed, same data order, deterministic ops
    EXPECT_EQ(ga, gb);
}

TEST(TrainE2E, PreprocessThenTrainOnMegatronData) {
    const std::string dir = make_temp_dir();
    {
        std::ofstream text(dir + "/corpus.txt");
        for (int doc = 0; doc < 40; ++doc) {
            for (int line = 0; line < 20; ++line)
                text << "the quick brown fox " << doc << " jumps over " << line << "\n";
            text << "\n";
        }
    }
    const auto pre = run_cli("preprocess --input " + dir + "/corpus.txt --output-prefix " + dir + "/corpus");
    ASSERT_EQ(pre.exit_code, 0) << pre.output;
    const auto r = run_cli(
        "train --config " MS_SOURCE_DIR "/configs/demo.yaml --set data.source=megatron --set data.data_path=" + dir +
        "/corpus_text_document --set model.vocab_size=257 --set run.output_dir=" + dir +
        "/run --set training.train_iters=10 --set lr_schedule.lr_warmup_iters=2 --set logging.log_interval=1 --set "
        "eval.eval_interval=5"
        " --set eval.sample_tokens=16 --set data.split=90,10,0");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto losses = metric_series(dir + "/run/metrics.jsonl", "lm loss");
    ASSERT_EQ(losses.size(), 10u);
    // Iteration 1 is untrained: ln(257) = 5.55 over the real vocabulary (padded columns are masked, not counted)
    // plus C * std^2 / 2 = 0.013 from the random logits; measured 5.56.
    EXPECT_NEAR(losses.front(), std::log(257.0), 0.05);
    EXPECT_LT(losses.back(), losses.front() - 0.5);  // this corpus is very repetitive: measured 3.9 at iteration 10
    EXPECT_EQ(metric_series(dir + "/run/metrics.jsonl", "validation lm loss").size(), 2u);
}

TEST(TrainE2E, CorruptDataFileExitsTwoAndNamesTheFile) {
    const std::string dir = make_temp_dir();
    {
        std::ofstream idx(dir + "/bad.idx", std::ios::binary);
        idx << "NOTMMIDX-garbage-garbage-garbage-garbage";
        std::ofstream bin(dir + "/bad.bin", std::ios::binary);
        bin << "xx";
    }
    const auto r = run_cli(
        "train --config " MS_SOURCE_DIR "/configs/demo.yaml --set data.source=megatron --set data.data_path=" + dir +
        "/bad --set model.vocab_size=257 --set run.output_dir=" + dir + "/run");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(dir + "/bad.idx"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("magic"), std::string::npos) << r.output;
}

TEST(TrainE2E, MissingDataFileExitsTwo) {
    const std::string dir = make_temp_dir();
    const auto r = run_cli(
        "train --config " MS_SOURCE_DIR "/configs/demo.yaml --set data.source=nanogpt --set data.data_path=" + dir +
        "/nope.bin --set run.output_dir=" + dir + "/run");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("nope.bin"), std::string::npos) << r.output;
}

}  // namespace

// training.recompute_granularity through the config: the same losses and grad norms, bit for bit, as keeping every
// activation, with less activation memory planned (and held: the arena peak is the plan).
TEST(TrainE2E, RecomputationTrainsBitIdenticallyWithLessMemory) {
    const std::string none = make_temp_dir();
    const auto r0 = run_cli(demo_args(none, 10));
    ASSERT_EQ(r0.exit_code, 0) << r0.output;
    const double planned0 = metric_series(none + "/metrics.jsonl", "memory_planned_bytes").front();
    for (const char* granularity : {"selective", "full"}) {
        const std::string dir = make_temp_dir();
        const auto r = run_cli(demo_args(dir, 10) + " --set training.recompute_granularity=" + granularity);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        for (const char* key : {"lm loss", "grad-norm"})
            EXPECT_EQ(metric_series(dir + "/metrics.jsonl", key), metric_series(none + "/metrics.jsonl", key))
                << granularity << " " << key;
        const auto planned = metric_series(dir + "/metrics.jsonl", "memory_planned_bytes");
        EXPECT_LT(planned.front(), planned0) << granularity;
        EXPECT_EQ(metric_series(dir + "/metrics.jsonl", "memory_peak_bytes"), planned) << granularity;
    }
}
