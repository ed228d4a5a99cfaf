// test_plan_simulate.cpp: `mindspeed-train plan --simulate` and `plan --search` from the command line (the numbers
// are test_simulator.cpp's and test_search.cpp's business): the options reach the simulator, the output names its
// cost model, and without one plan says how to get one.
#include <gtest/gtest.h>

#include <string>

#include "tests/common/job_run.h"

namespace {

std::string plan(const std::string& args) {
    return std::string(MS_BINARY_PATH) + " plan --config " + MS_SOURCE_DIR + "/configs/gpt2-124m.yaml " + args +
           " 2>&1";
}

TEST(PlanSimulate, PrintsTheSimulatedStepOnADeviceEstimate) {
    const ms::test::JobRun r = ms::test::run_command(plan("--world-size 8 --simulate --device a100-80g"), "");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("simulated step (cost model: a100-80g"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("ESTIMATE"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("tokens/s, MFU"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("bubble"), std::string::npos) << r.output;
    // an estimate holds no op measured at its own shape: GPT-2's four matmuls forward and backward, attention forward
    // and backward and the fused LM head all cost the curves
    EXPECT_NE(r.output.find("op shapes: 0 of 11 matmul, attention and LM-head shapes priced as the profile measured "
                            "them, 11 by its curves"),
              std::string::npos)
        << r.output;
}

TEST(PlanSimulate, WithoutACostModelSaysToCalibrateOrPassADevice) {
    const ms::test::JobRun r = ms::test::run_command(plan("--simulate"), "");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("mindspeed-train calibrate"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("--device a100-80g"), std::string::npos) << r.output;
}

TEST(PlanSearch, RanksTheLayoutsOfTheWorld) {
    const ms::test::JobRun r = ms::test::run_command(
        plan("--world-size 8 --search --device h100 --gpus-per-node 8 --top 3 --set mixed_precision.dtype=bf16"), "");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("layouts of 8 ranks (1 node(s) of 8 GPUs"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("     1  tp "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("     3  tp "), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("     4  tp "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("pruned for divisibility"), std::string::npos) << r.output;
}

}  // namespace
