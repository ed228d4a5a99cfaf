// test_tensorboard.cpp: logging.tensorboard_dir end to end. The demo trains with a crash at iteration 8 after a
// checkpoint at 5, then resumes to 10; its event files are read back by tests/e2e/read_tfevents.py -- by a reader of
// its own that checks the framing and CRCs (runs everywhere), and by TensorBoard's EventAccumulator (skipped where
// the tensorboard package is not importable). Both must see every iteration once, with metrics.jsonl's values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"
#include "tests/e2e/run_cli.h"

namespace ms {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct PythonResult {
    int exit_code = -1;
    std::string out, err;
};

PythonResult read_events(const std::string& dir, const std::string& flags) {
    const test::TempDir tmp("ms_tb_read");
    const std::string cmd = std::string(MS_SYSTEM_PYTHON) + " " MS_SOURCE_DIR "/tests/e2e/read_tfevents.py '" + dir +
                            "' " + flags + " 2>" + tmp / "err";
    PythonResult r;
    FILE* p = popen(cmd.c_str(), "r");
    if (p == nullptr) return r;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
    const int status = pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.err = test::read_file(tmp / "err");
    return r;
}

class TensorBoardE2E : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = std::make_unique<test::TempDir>("ms_tb_e2e");
        const std::string args =
            "train --config " MS_SOURCE_DIR "/configs/demo.yaml --set run.output_dir=" + dir_->path() +
            " --set training.train_iters=10 --set lr_schedule.lr_warmup_iters=2"
            " --set logging.log_interval=1 --set eval.eval_interval=5 --set eval.eval_iters=1"
            " --set eval.sample_tokens=0 --set checkpoint.save_interval=5"
            " --set checkpoint.save=" +
            (*dir_ / "ckpt") + " --set checkpoint.load=" + (*dir_ / "ckpt") +
            " --set logging.tensorboard_dir=" + (*dir_ / "tb");
        crashed_ = test::run_cli(args + " --set reliability.inject=crash@step=8");
        for (const auto& e : fs::directory_iterator(*dir_ / "tb")) first_file_ = e.path().string();
        if (!first_file_.empty()) first_file_size_ = fs::file_size(first_file_);
        resumed_ = test::run_cli(args);
    }
    static void TearDownTestSuite() { dir_.reset(); }

    // metrics.jsonl's values of `key` by iteration (after the resume trimmed it: each iteration once)
    static std::map<int64_t, double> metrics(const std::string& key) {
        std::map<int64_t, double> out;
        std::ifstream f(*dir_ / "metrics.jsonl");
        for (std::string line; std::getline(f, line);) {
            const json j = json::parse(line);
            if (j.contains(key) && j[key].is_number()) out[j["iteration"].get<int64_t>()] = j[key].get<double>();
        }
        return out;
    }

    // The scalars read back must be metrics.jsonl's, each iteration once, as float32.
    static void expect_scalars_are_the_metrics(const json& scalars) {
        const std::map<std::string, std::string> tag_to_key = {{"lm loss", "lm loss"},
                                                               {"learning-rate", "learning-rate"},
                                                               {"grad-norm", "grad-norm"},
                                                               {"batch-size", "batch-size"},
                                                               {"iteration-time", "iteration-time"},
                                                               {"tokens_per_sec", "tokens_per_sec"},
                                                               {"mfu", "mfu"},
                                                               {"lm loss validation", "validation lm loss"}};
        for (const auto& [tag, key] : tag_to_key) {
            ASSERT_TRUE(scalars.contains(tag)) << tag << " missing: " << scalars.dump();
            const std::map<int64_t, double> want = metrics(key);
            ASSERT_EQ(scalars[tag].size(), want.size()) << tag << ": " << scalars[tag].dump();
            size_t i = 0;
            for (const auto& [it, value] : want) {
                EXPECT_EQ(scalars[tag][i][0].get<int64_t>(), it) << tag;
                EXPECT_EQ(scalars[tag][i][1].get<double>(), static_cast<double>(static_cast<float>(value))) << tag;
                ++i;
            }
        }
        EXPECT_EQ(metrics("lm loss").size(), 10u);            // iterations 1..10, once each
        EXPECT_EQ(metrics("validation lm loss").size(), 2u);  // at 5 and 10
    }

    static std::unique_ptr<test::TempDir> dir_;
    static test::CliResult crashed_, resumed_;
    static std::string first_file_;  // the crashed run's event file
    static uintmax_t first_file_size_;
};

std::unique_ptr<test::TempDir> TensorBoardE2E::dir_;
test::CliResult TensorBoardE2E::crashed_, TensorBoardE2E::resumed_;
std::string TensorBoardE2E::first_file_;
uintmax_t TensorBoardE2E::first_file_size_ = 0;

TEST_F(TensorBoardE2E, OwnReaderChecksFramingAndSeesEveryIterationOnce) {
    ASSERT_NE(crashed_.exit_code, 0) << crashed_.output;  // killed at iteration 8
    ASSERT_EQ(resumed_.exit_code, 0) << resumed_.output;
    EXPECT_NE(resumed_.output.find("tensorboard: " + (*dir_ / "tb") + "/events.out.tfevents."), std::string::npos)
        << resumed_.output;
    const PythonResult r = read_events(*dir_ / "tb", "");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json got = json::parse(r.out);
    // One file per run; the crashed run's is left as it was (the resume writes its own).
    EXPECT_EQ(got["files"], 2);
    ASSERT_FALSE(first_file_.empty());
    EXPECT_EQ(fs::file_size(first_file_), first_file_size_);
    EXPECT_EQ(got["file_versions"], json::array({"brain.Event:2", "brain.Event:2"}));
    // The START of each run at its first iteration: the resume's drops what the crashed run logged at 6 and 7.
    ASSERT_EQ(got["starts"].size(), 2u);
    EXPECT_EQ(got["starts"][0][1], 1);
    EXPECT_EQ(got["starts"][1][1], 6);
    expect_scalars_are_the_metrics(got["scalars"]);
    EXPECT_TRUE(got["scalars"].contains("lm loss validation ppl"));
    EXPECT_TRUE(got["scalars"].contains("memory_peak_bytes"));
}

TEST_F(TensorBoardE2E, TensorBoardsEventAccumulatorReadsTheSameScalars) {
    ASSERT_EQ(resumed_.exit_code, 0) << resumed_.output;
    const PythonResult tb = read_events(*dir_ / "tb", "--tensorboard");
    if (tb.exit_code == 77) {
        GTEST_SKIP() << "the tensorboard package is not importable by " << MS_SYSTEM_PYTHON
                     << " (pip install tensorboard, or PYTHONPATH to one that has it): " << tb.err;
    }
    ASSERT_EQ(tb.exit_code, 0) << tb.err;
    const json got = json::parse(tb.out);
    expect_scalars_are_the_metrics(got["scalars"]);
    const PythonResult own = read_events(*dir_ / "tb", "");
    ASSERT_EQ(own.exit_code, 0) << own.err;
    EXPECT_EQ(got["scalars"], json::parse(own.out)["scalars"]);
}

}  // namespace
}  // namespace ms
