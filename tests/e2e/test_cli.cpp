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
    EXPECT_TRUE(contains(r.output, "--set: parallel.zero_stage = 3 is not supported (0, 1 or 2)")) << r.output;
}

// An empty or model-less config would train the default 86M-parameter model for 100 iterations without a word.
TEST(CliE2E, AConfigMustNameItsModel) {
    const std::string empty = make_temp_dir() + "/empty.yaml";
    std::ofstream(empty) << "";
    for (const char* cmd : {"train", "plan"}) {
        const auto r = run_cli(std::string(cmd) + " --config " + empty + " --print-config");
        EXPECT_EQ(r.exit_code, 2) << r.output;
        EXPECT_TRUE(contains(r.output, "config error: config file '" + empty +
                                           "' sets nothing: a config must name "
                                           "its model"))
            << r.output;
        EXPECT_TRUE(contains(r.output, "configs/demo.yaml")) << r.output;
    }
    const auto none = run_cli("train --print-config");
    EXPECT_EQ(none.exit_code, 2) << none.output;
    EXPECT_TRUE(contains(none.output, "no config file was given")) << none.output;
    const auto modelless = run_cli("plan --config " + write_config("training:\n  train_iters: 5\n"));
    EXPECT_EQ(modelless.exit_code, 2) << modelless.output;
    EXPECT_TRUE(contains(modelless.output,
                         "model.num_layers, model.hidden_size, model.num_attention_heads are not set: a config must "
                         "name its model"))
        << modelless.output;
}

// std::bad_alloc anywhere (here: the synthetic language's 1e17 tokens) is a sentence and exit code 2, not an
// uncaught exception (134).
TEST(CliE2E, AnAllocationFailureIsASentence) {
    const auto r =
        run_cli("plan --config " MS_SOURCE_DIR "/configs/demo.yaml --set data.synthetic.num_tokens=100000000000000000");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "memory error: an allocation failed (std::bad_alloc)")) << r.output;
    EXPECT_TRUE(contains(r.output, "HINT: run `mindspeed-train plan`")) << r.output;
}

// Validation past one pass over the split only repeats samples: eval.eval_iters is held to one pass (2e9 iterations
// never finished).
TEST(CliE2E, EvalItersStopAtTheEndOfTheValidationSplit) {
    const auto r = run_cli("train --config " MS_SOURCE_DIR
                           "/configs/demo.yaml --set data.synthetic.num_tokens=65536 --set training.train_iters=1 "
                           "--set lr_schedule.lr_warmup_iters=0 --set eval.eval_interval=1 "
                           "--set eval.eval_iters=2000000000 --set eval.sample_tokens=0 --set logging.peak_flops=1e9 "
                           "--set run.output_dir=" +
                           make_temp_dir());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "eval.eval_iters = 2000000000 iterations of 16 samples is more than the"))
        << r.output;
    EXPECT_TRUE(contains(r.output, "every sample once")) << r.output;
    EXPECT_TRUE(contains(r.output, "validation loss at iteration 1")) << r.output;
}

TEST(CliE2E, PrintConfigPrintsResolvedYamlThatLoadsAgain) {
    const std::string dir = make_temp_dir();
    const auto r = run_cli(
        "train --set run.name=cli --set model.num_layers=3 --set model.hidden_size=64 "
        "--set model.num_attention_heads=4 --print-config");
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
