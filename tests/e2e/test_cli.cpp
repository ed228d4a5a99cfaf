// test_cli.cpp: the command line through the built binary -- --version and --help exit 0; a bad config (unknown
// key, wrong type, contradictory values) or a bad command line exits 2 with one sentence naming the problem.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "tests/e2e/run_cli.h"

namespace {

using ms::test::make_temp_dir;
using ms::test::run_cli;

// A config file in a fresh temp dir; small synthetic data so that `train` gets to validation quickly.
std::string write_config(const std::string& body) {
    const std::string path = make_temp_dir() + "/config.yaml";
    std::ofstream(path) << "data:\n  synthetic:\n    num_tokens: 4096\n" << body;
    return path;
}

bool contains(const std::string& haystack, const std::string& needle) {
    return haystack.find(needle) != std::string::npos;
}

TEST(CliE2E, VersionExitsZero) {
    const auto r = run_cli("--version");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "mindspeed-train " MS_VERSION)) << r.output;
}

TEST(CliE2E, EverySubcommandHasHelp) {
    const struct {
        const char* cmd;
        const char* option;
    } cases[] = {{"train", "--print-config"}, {"plan", "--world-size"}, {"preprocess", "--output-prefix"}};
    for (const auto& c : cases) {
        const auto r = run_cli(std::string(c.cmd) + " --help");
        EXPECT_EQ(r.exit_code, 0) << c.cmd << "\n" << r.output;
        EXPECT_TRUE(contains(r.output, c.option)) << c.cmd << "\n" << r.output;
    }
    for (const char* cmd : {"train", "plan"}) {
        const auto r = run_cli(std::string(cmd) + " --help");
        EXPECT_TRUE(contains(r.output, "--config")) << r.output;
        EXPECT_TRUE(contains(r.output, "--set")) << r.output;
    }
}

TEST(CliE2E, UnknownKeyExitsTwoWithDidYouMean) {
    const std::string path = write_config("model:\n  num_layer: 2\n");
    for (const char* cmd : {"train", "plan"}) {
        const auto r = run_cli(std::string(cmd) + " --config " + path);
        EXPECT_EQ(r.exit_code, 2) << r.output;
        EXPECT_TRUE(contains(r.output, "config error: " + path +
                                           ":5:3: unknown key 'model.num_layer'; did you mean "
                                           "'num_layers'?"))
            << r.output;
    }
}

TEST(CliE2E, BadTypeExitsTwo) {
    const std::string path = write_config("training:\n  micro_batch_size: abc\n");
    const auto r = run_cli("train --config " + path);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "training.micro_batch_size: expected an integer, got 'abc'")) << r.output;
}

TEST(CliE2E, ContradictoryBatchSizesExitTwo) {
    const std::string path = write_config(
        "model:\n  num_layers: 1\n  hidden_size: 32\n  num_attention_heads: 2\n  seq_length: 16\n"
        "training:\n  micro_batch_size: 3\n  global_batch_size: 8\n");
    for (const char* cmd : {"train", "plan"}) {
        const auto r = run_cli(std::string(cmd) + " --config " + path);
        EXPECT_EQ(r.exit_code, 2) << r.output;
        EXPECT_TRUE(contains(r.output,
                             "training.global_batch_size(8) is not divisible by training.micro_batch_size(3) "
                             "* data-parallel size(1) = 3"))
            << r.output;
    }
}

TEST(CliE2E, SetOverridesAreCheckedToo) {
    auto r = run_cli("train --set training.train_iters");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "has no '='")) << r.output;
    r = run_cli("train --set parallel.zero_stage=3");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "--set: parallel.zero_stage = 3 is not supported (0 or 1)")) << r.output;
}

TEST(CliE2E, PrintConfigPrintsResolvedYamlThatLoadsAgain) {
    const std::string dir = make_temp_dir();
    const auto r = run_cli("train --set run.name=cli --set model.num_layers=3 --print-config");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "output_dir: runs/cli")) << r.output;
    EXPECT_TRUE(contains(r.output, "num_layers: 3")) << r.output;
    std::ofstream(dir + "/resolved.yaml") << r.output;
    const auto again = run_cli("plan --config " + dir + "/resolved.yaml --print-config");
    ASSERT_EQ(again.exit_code, 0) << again.output;
    EXPECT_EQ(again.output, r.output);
}

TEST(CliE2E, BadCommandLinesExitTwo) {
    EXPECT_EQ(run_cli("").exit_code, 2);
    EXPECT_EQ(run_cli("frobnicate").exit_code, 2);
    EXPECT_EQ(run_cli("train --no-such-flag").exit_code, 2);
    EXPECT_EQ(run_cli("train --config /nonexistent/config.yaml").exit_code, 2);
    EXPECT_EQ(run_cli("plan --world-size 0").exit_code, 2);
    EXPECT_EQ(run_cli("preprocess --output-prefix /tmp/x").exit_code, 2);  // --input is required
}

}  // namespace
