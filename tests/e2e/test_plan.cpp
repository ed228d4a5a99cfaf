// test_plan.cpp: `mindspeed-train plan` through the built binary -- the rank layout follows tp-dp-pp order, the
// bubble is the closed form of 1F1B, ZeRO-1 divides the optimizer state by dp, a bad world size exits 2 -- and the
// planner's arithmetic (plan.h): activation slot bytes worked out by hand and against Gpt's own buffer layout.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/model/gpt.h"
#include "engine/train/plan.h"
#include "tests/e2e/run_cli.h"

namespace {

using ms::test::run_cli;

// demo.yaml at tp 2, pp 2 (dp = world / 4)
std::string demo_plan(int world_size, const std::string& extra) {
    return std::string("plan --config ") + MS_SOURCE_DIR + "/configs/demo.yaml --world-size " +
           std::to_string(world_size) +
           " --set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2 " + extra;
}

// The rows of the table whose header line starts with `first_column`: cells split at runs of two or more spaces.
std::vector<std::vector<std::string>> table_rows(const std::string& output, const std::string& first_column) {
    std::istringstream in(output);
    std::string line;
    std::vector<std::vector<std::string>> rows;
    bool in_table = false;
    const std::regex sep(" {2,}");
    while (std::getline(in, line)) {
        if (!in_table) {
            in_table = line.rfind(first_column + "  ", 0) == 0;
            if (in_table) std::getline(in, line);  // the rule
            continue;
        }
        if (line.empty() || line.rfind("...", 0) == 0) break;
        std::vector<std::string> cells;
        for (std::sregex_token_iterator it(line.begin(), line.end(), sep, -1), end; it != end; ++it)
            if (!it->str().empty()) cells.push_back(*it);
        rows.push_back(cells);
    }
    return rows;
}

// "146.38 KiB" -> bytes (to the 2 printed decimals)
double parse_bytes(const std::string& cell) {
    char unit[8] = {};
    double value = 0;
    EXPECT_EQ(std::sscanf(cell.c_str(), "%lf %7s", &value, unit), 2) << cell;
    const std::string u = unit;
    const double scale = u == "B" ? 1 : u == "KiB" ? 1024.0 : u == "MiB" ? 1048576.0 : 1073741824.0;
    return value * scale;
}

TEST(PlanE2E, RankLayoutFollowsTpDpPpOrder) {
    const auto r = run_cli(demo_plan(8, "--set parallel.zero_stage=1"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto rows = table_rows(r.output, "rank");
    ASSERT_EQ(rows.size(), 8u) << r.output;
    for (int rank = 0; rank < 8; ++rank) {
        const auto& row = rows[static_cast<size_t>(rank)];
        ASSERT_EQ(row.size(), 5u) << r.output;
        // rank = tp + 2 * (dp + 2 * pp); columns rank, tp, pp, dp, node (8 ranks per node by default)
        EXPECT_EQ(std::stoi(row[0]), rank);
        EXPECT_EQ(std::stoi(row[1]), rank % 2) << "rank " << rank;
        EXPECT_EQ(std::stoi(row[2]), rank / 4) << "rank " << rank;
        EXPECT_EQ(std::stoi(row[3]), rank / 2 % 2) << "rank " << rank;
        EXPECT_EQ(std::stoi(row[4]), 0) << "rank " << rank;
    }
    EXPECT_EQ(rows[5][1] + rows[5][2] + rows[5][3], "110");  // rank 5: tp 1, pp 1, dp 0
}

TEST(PlanE2E, BubbleIsTheClosedFormOf1F1B) {
    // demo: micro batch 8; global batch 16 -> m = 1 at dp 2, global batch 64 -> m = 4
    for (const int global_batch : {16, 64}) {
        const int pp = 2, m = global_batch / (8 * 2);
        const auto r = run_cli(demo_plan(8, "--set training.global_batch_size=" + std::to_string(global_batch)));
        ASSERT_EQ(r.exit_code, 0) << r.output;
        char expected[128];
        std::snprintf(expected, sizeof(expected), "bubble: 1f1b, pp %d, micro-batches %d, virtual stages 1: %.2f%%", pp,
                      m, 100.0 * (pp - 1) / (m + pp - 1));
        EXPECT_NE(r.output.find(expected), std::string::npos) << expected << "\n" << r.output;
    }
}

TEST(PlanE2E, ZeroOneHalvesTheOptimizerStateAtDp2) {
    std::vector<std::vector<std::string>> stages[2];
    for (int zero = 0; zero < 2; ++zero) {
        const auto r = run_cli(demo_plan(8, "--set parallel.zero_stage=" + std::to_string(zero)));
        ASSERT_EQ(r.exit_code, 0) << r.output;
        stages[zero] = table_rows(r.output, "stage");
        ASSERT_EQ(stages[zero].size(), 2u) << r.output;
        EXPECT_NE(r.output.find("fits"), std::string::npos) << r.output;
    }
    for (size_t s = 0; s < 2; ++s) {
        // columns: stage, layers, parameters, param bytes, grad bytes, optimizer, activations, total
        EXPECT_EQ(stages[0][s][1], s == 0 ? "0" : "1");
        const double zero0 = parse_bytes(stages[0][s][5]), zero1 = parse_bytes(stages[1][s][5]);
        // the padded buffer is the same at both stages, so the halving is exact up to the printed 2 decimals
        EXPECT_NEAR(zero1 * 2, zero0, zero0 * 1e-3) << stages[0][s][5] << " vs " << stages[1][s][5];
        EXPECT_EQ(stages[0][s][3], stages[1][s][3]);  // parameters unchanged
    }
}

TEST(PlanE2E, WorldSizeThatTpTimesPpDoesNotDivideExitsTwo) {
    const auto r = run_cli(demo_plan(6, ""));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("config error: parallel.tensor_model_parallel_size(2) * pipeline_model_parallel_size(2) "
                            "= 4 does not divide the world size 6"),
              std::string::npos)
        << r.output;
}

TEST(PlanE2E, LongLayoutsAreCutAndBudgetsAreChecked) {
    const auto r = run_cli(demo_plan(128, "--set training.global_batch_size=256 --ranks-per-node 4 --memory-gb 0.001"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto rows = table_rows(r.output, "rank");
    ASSERT_EQ(rows.size(), 64u) << r.output;
    EXPECT_EQ(rows[63][4], "15");  // node = rank / 4
    EXPECT_NE(r.output.find("... 64 more"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("does not fit"), std::string::npos) << r.output;  // ~3 MiB > 1 MB
}

// The tiny shape below: N = B * T = 4 tokens, so most buffers round up to the 16-element alignment.
ms::GptShape hand_shape() {
    ms::GptShape s;
    s.L = 1, s.C = 8, s.NH = 2, s.T = 4, s.V = 10, s.Vp = 16, s.F = 32;
    return s;
}

TEST(PlanArithmetic, ActivationSlotBytesByHand) {
    const ms::GptShape s = hand_shape();
    // elements in Gpt's layout order, each rounded up to 16; N = 4, C = 8
    // tp 1 (C/tp 8, NH/tp 2, F/tp 32, Vp/tp 16):
    //   layer: ln1 32, mean 16, rstd 16, qkv 96, atty 32, lse 16, res2 32, ln2 32, mean 16, rstd 16, fch 128,
    //          fch_gelu 128, res3 32
    //   rest:  encoded 32, lnf 32, mean 16, rstd 16, logits 64, losses 16, row_max 16, sum_exp 16, dloss 16,
    //          tokens 16, targets 16, proj_out 32, dres 32, dln 32, datty 32, dqkv 96, dfch 128, dout 32, dinp 32
    const int64_t layer1 = 32 + 16 + 16 + 96 + 32 + 16 + 32 + 32 + 16 + 16 + 128 + 128 + 32;
    const int64_t rest1 = 32 + 32 + 16 + 16 + 64 + 16 + 16 + 16 + 16 + 16 + 16 + 32 + 32 + 32 + 32 + 96 + 128 + 32 + 32;
    EXPECT_EQ(ms::gpt_activation_slot_bytes(s, {}, 1, 1), 4 * (layer1 + rest1));
    // without the head there are no logits
    EXPECT_EQ(ms::gpt_activation_slot_bytes(s, {0, 1, true, false}, 1, 1), 4 * (layer1 + rest1 - 64));
    // tp 2 (C/tp 4, NH/tp 1, F/tp 16, Vp/tp 8): qkv 48, atty 16, lse 16, fch 64, fch_gelu 64; logits 32, datty 16,
    // dqkv 48, dfch 64
    const int64_t layer2 = 32 + 16 + 16 + 48 + 16 + 16 + 32 + 32 + 16 + 16 + 64 + 64 + 32;
    const int64_t rest2 = 32 + 32 + 16 + 16 + 32 + 16 + 16 + 16 + 16 + 16 + 16 + 32 + 32 + 32 + 16 + 48 + 64 + 32 + 32;
    EXPECT_EQ(ms::gpt_activation_slot_bytes(s, {}, 2, 1), 4 * (layer2 + rest2));
    // sequence parallelism adds two (N, C) staging buffers: 2 x 32
    EXPECT_EQ(ms::gpt_activation_slot_bytes(s, {}, 2, 1, true), 4 * (layer2 + rest2 + 64));
    // micro batch 4: N = 16, every buffer a multiple of 16 already
    EXPECT_EQ(ms::gpt_activation_slot_bytes(s, {}, 1, 4),
              4 * (16 * (8 + 1 + 1 + 24 + 8 + 2 + 8 + 8 + 1 + 1 + 32 + 32 + 8) +
                   16 * (8 + 8 + 1 + 1 + 16 + 1 + 1 + 2 + 1 + 1 + 1 + 8 + 8 + 8 + 8 + 24 + 32 + 8 + 8)));
}

TEST(PlanArithmetic, ActivationSlotMatchesGptLayout) {
    // Gpt exposes two pointers into one slot: input = encoded (the first buffer after the layers) and grad_input =
    // dinp (the last). Their distance is the slot's non-layer part less dinp's (N, C).
    ms::GptShape s = hand_shape();
    s.L = 2, s.C = 48, s.NH = 4, s.T = 16, s.V = 61, s.Vp = 128, s.F = 192;
    const int B = 3;
    ms::SelfCommunicator tp("tp");
    std::unique_ptr<ms::Backend> backend = ms::make_backend(ms::BackendOptions{});
    ms::Gpt model(s, *backend, tp, B);
    const int64_t distance = model.grad_input(0) - model.input(0);
    const int64_t globals = ms::gpt_activation_slot_bytes(s, {0, 0, true, true}, 1, B) / 4;
    EXPECT_EQ(distance, globals - int64_t{B} * s.T * s.C);
}

TEST(PlanArithmetic, VirtualStagesInterleaveLayersAndShareOneFlatBuffer) {
    ms::GptShape s = hand_shape();
    s.L = 8;
    ms::PlanShape p;
    p.pp = 2, p.virtual_stages = 2, p.kind = ms::ScheduleKind::kInterleaved1F1B, p.num_microbatches = 4, p.dp = 2;
    p.zero_stage = 1;
    const auto stages = ms::plan_stages(s, p);
    ASSERT_EQ(stages.size(), 2u);
    EXPECT_EQ(stages[0].layers, "0-1,4-5");
    EXPECT_EQ(stages[1].layers, "2-3,6-7");
    for (const auto& st : stages) {
        EXPECT_EQ(st.padded % (16 * p.dp), 0);
        EXPECT_GE(st.padded, st.params);
        EXPECT_EQ(st.optimizer_bytes * p.dp, 8 * st.padded);
        ASSERT_EQ(st.slots.size(), 2u);
    }
}

}  // namespace
