// test_plan.cpp: `mindspeed-train plan` through the built binary -- the rank layout follows tp-cp-dp-pp order, the
// bubble is the closed form of 1F1B, ZeRO-1 divides the optimizer state by dp, a bad world size exits 2 -- and the
// planner's arithmetic (plan.h): activation bytes worked out by hand and against what a Gpt allocates.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/model/gpt.h"
#include "engine/model/gpt_graph.h"
#include "engine/train/pipeline.h"
#include "engine/train/plan.h"
#include "memory/arena.h"
#include "memory/planner.h"
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
        ASSERT_EQ(row.size(), 6u) << r.output;
        // rank = tp + 2 * (dp + 2 * pp); columns rank, tp, cp, pp, dp, node (8 ranks per node by default)
        EXPECT_EQ(std::stoi(row[0]), rank);
        EXPECT_EQ(std::stoi(row[1]), rank % 2) << "rank " << rank;
        EXPECT_EQ(std::stoi(row[2]), 0) << "rank " << rank;
        EXPECT_EQ(std::stoi(row[3]), rank / 4) << "rank " << rank;
        EXPECT_EQ(std::stoi(row[4]), rank / 2 % 2) << "rank " << rank;
        EXPECT_EQ(std::stoi(row[5]), 0) << "rank " << rank;
    }
    EXPECT_EQ(rows[5][1] + rows[5][3] + rows[5][4], "110");  // rank 5: tp 1, pp 1, dp 0
}

// Context parallelism: tiny-llama at tp 2, cp 2 on 8 ranks (dp 2 replicas): cp is the fastest part of the dp
// coordinate (rank = tp + 2 * (cp + 2 * dp)), its groups are pairs tp apart, ZeRO-1 shards over dp x cp = 4 ranks,
// and each rank's activations are those of seq_length / cp tokens: one rank's plan at seq 128 without cp.
TEST(PlanE2E, ContextParallelRanksAreInsideDpAndHoldSeqOverCpTokens) {
    const std::string llama = std::string("plan --config ") + MS_SOURCE_DIR +
                              "/tests/parallel/tiny-llama.yaml --set model.seq_length=256 --set parallel.zero_stage=1 "
                              "--set parallel.tensor_model_parallel_size=2 ";
    const auto r = run_cli(llama + "--world-size 8 --set parallel.context_parallel_size=2");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto rows = table_rows(r.output, "rank");
    ASSERT_EQ(rows.size(), 8u) << r.output;
    for (int rank = 0; rank < 8; ++rank) {
        const auto& row = rows[static_cast<size_t>(rank)];
        ASSERT_EQ(row.size(), 6u) << r.output;
        EXPECT_EQ(std::stoi(row[1]), rank % 2) << "rank " << rank;      // tp
        EXPECT_EQ(std::stoi(row[2]), rank / 2 % 2) << "rank " << rank;  // cp
        EXPECT_EQ(std::stoi(row[4]), rank / 4) << "rank " << rank;      // dp (the replica)
    }
    EXPECT_NE(r.output.find("world size 8 = tp 2 x pp 1 x cp 2 x dp 2"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("cp   4 group(s) of 2"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("sharded over 4 ranks (dp 2 x cp 2); activations of seq_length / cp = 128 tokens"),
              std::string::npos)
        << r.output;
    // the same rank without context parallelism at seq 128 (dp 4: the same optimizer shards)
    const auto half = run_cli(std::string("plan --config ") + MS_SOURCE_DIR +
                              "/tests/parallel/tiny-llama.yaml --set model.seq_length=128 --set parallel.zero_stage=1 "
                              "--set parallel.tensor_model_parallel_size=2 --world-size 8");
    ASSERT_EQ(half.exit_code, 0) << half.output;
    const auto stage = table_rows(r.output, "stage"), plain = table_rows(half.output, "stage");
    ASSERT_EQ(stage.size(), 1u);
    ASSERT_EQ(plain.size(), 1u);
    ASSERT_EQ(stage[0].size(), plain[0].size());
    // parameters, param bytes, grads, optimizer equal; activations: the ring's scratch besides the same slot
    for (size_t c = 2; c + 2 < stage[0].size(); ++c) EXPECT_EQ(stage[0][c], plain[0][c]) << "column " << c;
    std::printf("cp2 at seq 256: %s | no cp at seq 128: %s\n", stage[0].back().c_str(), plain[0].back().c_str());
}

// Which groups span nodes: tp 4 on nodes of 2 ranks is warned about (its collectives run in every layer); on nodes
// of 4 (here from the config's run.ranks_per_node) tp stays inside and only dp crosses.
TEST(PlanE2E, PlacementSaysWhichGroupsSpanNodesAndWarnsForTp) {
    const std::string tp4 = "--set parallel.tensor_model_parallel_size=4 --set parallel.pipeline_model_parallel_size=1";
    const auto split = run_cli(demo_plan(8, tp4 + " --ranks-per-node 2"));
    ASSERT_EQ(split.exit_code, 0) << split.output;
    EXPECT_NE(split.output.find("placement: 4 node(s) of 2 rank(s)"), std::string::npos) << split.output;
    EXPECT_NE(split.output.find("tp   2 group(s) of 4: 2 span nodes"), std::string::npos) << split.output;
    EXPECT_NE(split.output.find("warning: 2 tensor-parallel group(s) of 4 ranks span nodes"), std::string::npos)
        << split.output;
    const auto inside = run_cli(demo_plan(8, tp4 + " --set run.ranks_per_node=4"));
    ASSERT_EQ(inside.exit_code, 0) << inside.output;
    EXPECT_NE(inside.output.find("tp   2 group(s) of 4: each inside one node"), std::string::npos) << inside.output;
    EXPECT_NE(inside.output.find("dp   4 group(s) of 2: 4 span nodes"), std::string::npos) << inside.output;
    EXPECT_EQ(inside.output.find("tensor-parallel group(s)"), std::string::npos) << inside.output;
    const auto uneven = run_cli(demo_plan(8, tp4 + " --ranks-per-node 3"));
    EXPECT_EQ(uneven.exit_code, 2) << uneven.output;
    EXPECT_NE(uneven.output.find("3 ranks per node do not divide the world size 8"), std::string::npos)
        << uneven.output;
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

// zero_stage 2 with Megatron's default 40M-element buckets on GPT-2 124M at dp 2: two slots of 40M+ and the tied
// embedding kept whole outweigh the 62M elements the shard saves, so plan warns and names a bucket size that fits
// ((zero_stage 1's buffer - the shard - the kept embedding) / 2 slots); with 8M-element buckets it does not warn.
TEST(PlanE2E, ZeroTwoWarnsWhenItsBucketsOutweighTheShard) {
    const std::string plan = std::string("plan --config ") + MS_SOURCE_DIR +
                             "/configs/gpt2-124m.yaml --world-size 2 --set mixed_precision.dtype=bf16 "
                             "--set parallel.zero_stage=2 --set training.global_batch_size=64 ";
    const auto big = run_cli(plan);
    ASSERT_EQ(big.exit_code, 0) << big.output;
    for (const char* s : {"zero_stage 2 keeps 691.23 MiB of gradients per rank on stage 0 (2 bucket slots, 147.38 MiB "
                          "of gradients kept whole, the dp shard), more than zero_stage 1's whole buffer of 474.84 MiB",
                          "HINT: set parallel.bucket_size well below 11802240 elements, or zero_stage: 1"})
        EXPECT_NE(big.output.find(s), std::string::npos) << s << "\n" << big.output;
    const auto small = run_cli(plan + "--set parallel.bucket_size=8000000");
    ASSERT_EQ(small.exit_code, 0) << small.output;
    EXPECT_EQ(small.output.find("zero_stage 2 keeps"), std::string::npos) << small.output;
}

TEST(PlanE2E, WorldSizeThatTpTimesPpDoesNotDivideExitsTwo) {
    const auto r = run_cli(demo_plan(6, ""));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("config error: parallel.tensor_model_parallel_size(2) * pipeline_model_parallel_size(2) "
                            "= 4 does not divide the world size 6"),
              std::string::npos)
        << r.output;
}

// The address space of the commands this test starts: RLIMIT_AS, set here and inherited through run_cli's popen,
// restored on destruction. A size that the plan got wrong then fails in a second instead of growing for minutes
// until the kernel kills it. At least the test process's own size, which the limit binds too.
class ChildAddressSpaceLimit {
  public:
    explicit ChildAddressSpaceLimit(size_t bytes) {
        getrlimit(RLIMIT_AS, &saved_);
        size_t pages = 0;
        if (FILE* f = std::fopen("/proc/self/statm", "r")) {
            if (std::fscanf(f, "%zu", &pages) != 1) pages = 0;
            std::fclose(f);
        }
        const size_t own = pages * static_cast<size_t>(sysconf(_SC_PAGESIZE));
        rlimit limited = saved_;
        limited.rlim_cur = std::min<rlim_t>(saved_.rlim_max, std::max(bytes, own + (size_t{256} << 20)));
        setrlimit(RLIMIT_AS, &limited);
    }
    ~ChildAddressSpaceLimit() { setrlimit(RLIMIT_AS, &saved_); }
    ChildAddressSpaceLimit(const ChildAddressSpaceLimit&) = delete;
    ChildAddressSpaceLimit& operator=(const ChildAddressSpaceLimit&) = delete;

  private:
    rlimit saved_{};
};

// A billion layers: the plan is arithmetic on closed-form sizes (plan_gpt_memory's two levels, the parameter table's
// per-layer step), so it prints in a moment within 3 GiB (it used to build every layer's tables and die of
// std::bad_alloc), and train refuses it with the memory table before building anything per layer.
TEST(PlanE2E, ABillionLayersArePlannedAndRefusedByArithmetic) {
    const std::string config = " --config " MS_SOURCE_DIR "/configs/demo.yaml --set model.num_layers=1000000000";
    // OpenBLAS starts a thread per core when it loads, each allocating a 128 MiB buffer and retrying forever when
    // that fails (a hang at exit under the limit, seen with the CUDA build's larger libraries mapped): one thread
    // keeps the children's address space the same on any host. The limits leave room for the binary's libraries
    // (CUDA's included) and are far below what a per-layer structure of a billion layers needs.
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    {
        const ChildAddressSpaceLimit limit(size_t{3} << 30);
        const auto r = run_cli("plan" + config);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        const auto stages = table_rows(r.output, "stage");
        ASSERT_EQ(stages.size(), 1u) << r.output;
        EXPECT_EQ(stages[0][1], "0-999999999") << r.output;
        EXPECT_NE(r.output.find("does not fit"), std::string::npos) << r.output;
    }
    const ChildAddressSpaceLimit limit(size_t{6} << 30);  // MPI maps more than plan does
    const auto r = run_cli("train" + config + " --set run.output_dir=" + ms::test::make_temp_dir());
    unsetenv("OPENBLAS_NUM_THREADS");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("memory error: pipeline stage 0 needs"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("0-999999999"), std::string::npos) << r.output;
}

TEST(PlanE2E, LongLayoutsAreCutAndBudgetsAreChecked) {
    const auto r = run_cli(demo_plan(128, "--set training.global_batch_size=256 --ranks-per-node 4 --memory-gb 0.001"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto rows = table_rows(r.output, "rank");
    ASSERT_EQ(rows.size(), 64u) << r.output;
    EXPECT_EQ(rows[63][5], "15");  // node = rank / 4
    EXPECT_NE(r.output.find("... 64 more"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("does not fit"), std::string::npos) << r.output;  // ~3 MiB > 1 MB
}

// The tiny shape below: N = B * T = 4 tokens, so most buffers round up to the 16-element alignment.
ms::GptShape hand_shape() {
    ms::GptShape s;
    s.L = 1, s.C = 8, s.NH = 2, s.T = 4, s.V = 10, s.Vp = 16, s.F = 32;
    return s;
}

// Activation bytes by hand. A chunk holds one block per slot plus one scratch block shared by its slots, laid out by
// its op graph's liveness (engine/graph/memory_plan.h), and holds only what its part uses (tokens, targets and the
// head's tensors where used, the received output gradient without the head).
TEST(PlanArithmetic, ActivationBytesByHand) {
    const ms::GptShape s = hand_shape();
    auto plan = [&](ms::GptPart part, int tp, int B, bool sp = false) {
        return ms::plan_gpt_memory(s, part, tp, B, sp, ms::DType::kF32);
    };
    // Elements, each rounded up to 16; N = 4, C = 8. tp 1 (C/tp 8, NH/tp 2, F/tp 32, Vp/tp 16):
    //   layer: ln_1 32, mean 16, rstd 16, qkv 96, atty 32, lse 16, res2 32, ln_2 32, mean 16, rstd 16, fch 128,
    //          fch_gelu 128, res3 32: all kept from the forward to the backward, side by side
    //   slot:  encoded 32, ln_f 32, mean 16, rstd 16, logits 64, losses 16, row_max 16, ce_sums 16, tokens 16,
    //          targets 16 -- all live at the cross-entropy backward, so the slot is their sum
    const int64_t layer1 = 32 + 16 + 16 + 96 + 32 + 16 + 32 + 32 + 16 + 16 + 128 + 128 + 32;
    const int64_t rest1 = 32 + 32 + 16 + 16 + 64 + 16 + 16 + 16 + 16 + 16;
    // scratch: the residual stream's gradient d.output 32 lives through the layers' backward, beside the layer's
    // backward scratch: d.fch 128 then d.ln_2 32 (MLP), or d.atty 32 + d.qkv 96 then d.ln_1 (attention); the
    // forward's c_proj partial sums, dloss and d.ln_f reuse that memory
    const int64_t scratch1 = 32 + 128 + 32;
    const auto whole = plan({}, 1, 1);
    EXPECT_EQ(whole.kinds[0].slot_bytes, static_cast<size_t>(4 * layer1));
    EXPECT_EQ(whole.slot_bytes(), static_cast<size_t>(4 * (layer1 + rest1)));
    EXPECT_EQ(whole.scratch_bytes(), static_cast<size_t>(4 * scratch1));
    // without the head: no ln_f, stats, logits, losses, targets, but dout 32 for the received gradient, which the
    // backward then accumulates into in place (it is the residual stream's gradient: no d.output in the scratch)
    const auto no_head = plan({0, 1, true, false}, 1, 1);
    EXPECT_EQ(no_head.slot_bytes(), static_cast<size_t>(4 * (layer1 + 32 + 16 + 32)));
    EXPECT_EQ(no_head.scratch_bytes(), static_cast<size_t>(4 * (128 + 32)));
    // tp 2 (C/tp 4, NH/tp 1, F/tp 16, Vp/tp 8): qkv 48, atty 16, lse 16, fch 64, fch_gelu 64; logits 32;
    // scratch d.output 32 + max(d.fch 64 + d.ln_2 32, d.atty 16 + d.qkv 48 + d.ln_1 32)
    const int64_t layer2 = 32 + 16 + 16 + 48 + 16 + 16 + 32 + 32 + 16 + 16 + 64 + 64 + 32;
    const int64_t rest2 = 32 + 32 + 16 + 16 + 32 + 16 + 16 + 16 + 16 + 16;
    EXPECT_EQ(plan({}, 2, 1).slot_bytes(), static_cast<size_t>(4 * (layer2 + rest2)));
    EXPECT_EQ(plan({}, 2, 1).scratch_bytes(), static_cast<size_t>(4 * (32 + 96)));
    // sequence parallelism at tp 2: the residual stream holds N/2 rows (res2, res3, encoded: 16 each) and so do the
    // LayerNorm statistics (2 values, still 16 after rounding); the LayerNorms' outputs are gathered to all rows
    // (ln_1, ln_2, ln_f: 32, their local halves scratch). Scratch: d.output 16 rows beside the layer backward's
    // largest moment, d.fch 64 + the gathered gradient of the MLP's output 32
    const int64_t layer2_sp = layer2 - 2 * 16;
    const int64_t rest2_sp = rest2 - 16;
    EXPECT_EQ(plan({}, 2, 1, true).slot_bytes(), static_cast<size_t>(4 * (layer2_sp + rest2_sp)));
    EXPECT_EQ(plan({}, 2, 1, true).scratch_bytes(), static_cast<size_t>(4 * (16 + 64 + 32)));
    // micro batch 4: N = 16, every tensor a multiple of 16 already
    const auto mb4 = plan({}, 1, 4);
    EXPECT_EQ(mb4.slot_bytes(), static_cast<size_t>(4 * 16 *
                                                    ((8 + 1 + 1 + 24 + 8 + 2 + 8 + 8 + 1 + 1 + 32 + 32 + 8) +
                                                     (8 + 8 + 1 + 1 + 16 + 1 + 1 + 2 + 1 + 1))));
    EXPECT_EQ(mb4.scratch_bytes(), static_cast<size_t>(4 * 16 * (8 + 32 + 8)));
}

// Planning a chunk costs the same for any layer count (memory/planner.h packs its n requests in O(n^2), and a layer
// has 20 tensors): the plan is made from the chunk's first two layers, the layers standing as one block, and its
// bytes are the hand-computed ones of ActivationBytesByHand with the layer part times L.
TEST(PlanArithmetic, ThePlanHasTheSameRequestsForAnyLayerCount) {
    ms::GptShape s = hand_shape();
    s.L = 2;
    const ms::graph::MemoryPlan two = ms::plan_gpt_memory(s, {}, 1, 1, false, ms::DType::kF32);
    const int64_t layer = 32 + 16 + 16 + 96 + 32 + 16 + 32 + 32 + 16 + 16 + 128 + 128 + 32;
    const int64_t rest = 32 + 32 + 16 + 16 + 64 + 16 + 16 + 16 + 16 + 16;
    for (const int L : {2, 1000, 1000000000}) {
        s.L = L;
        const ms::graph::MemoryPlan many = ms::plan_gpt_memory(s, {}, 1, 1, false, ms::DType::kF32);
        EXPECT_EQ(many.slot_requests.size(), two.slot_requests.size()) << L;
        EXPECT_EQ(many.scratch_requests.size(), two.scratch_requests.size()) << L;
        EXPECT_EQ(many.kinds[0].own.size(), two.kinds[0].own.size()) << L;
        EXPECT_EQ(many.kinds[0].shared.size(), two.kinds[0].shared.size()) << L;
        EXPECT_EQ(many.slot_bytes(), static_cast<size_t>(4 * (L * layer + rest))) << L;
        EXPECT_EQ(many.scratch_bytes(), two.scratch_bytes()) << L;
    }
}

// The two-level plan against every tensor's exact lifetime in the whole graph of a 5-layer chunk: no two tensors
// live at the same op overlap and every one lies inside its block, for every kind of chunk, tensor and sequence
// parallelism, 16-bit activations and activation recomputation (where the recomputed block's layers and the others
// are laid out differently); with tp 1 also the forward for the logits beside the fused LM head (its own plan).
TEST(PlanArithmetic, ThePlanIsValidForEveryTensorOfEveryLayer) {
    ms::GptShape s = hand_shape();
    s.L = 5;
    const ms::GptPart parts[] = {{}, {0, 2, true, false}, {2, 2, false, false}, {3, 2, false, true}};
    struct Layout {
        int tp;
        bool sp, with_loss;
    };
    const Layout layouts[] = {{2, false, true}, {2, true, true}, {1, false, true}, {1, false, false}};
    for (const ms::GptPart& part : parts) {
        for (const auto [tp, sp, with_loss] : layouts) {
            if (!with_loss && !part.head) continue;  // a forward without the loss is the head's
            for (int variant = 0; variant < 5; ++variant) {
                // fp32, bf16, then recomputation: selective, full for a block of one layer, full for every layer
                using G = ms::graph::RecomputeGranularity;
                const ms::DType act = variant == 1 ? ms::DType::kBF16 : ms::DType::kF32;
                ms::GptGraphOptions options;
                options.recompute.granularity = variant < 2 ? G::kNone : variant == 2 ? G::kSelective : G::kFull;
                options.recompute.method =
                    variant == 3 ? ms::graph::RecomputeMethod::kBlock : ms::graph::RecomputeMethod::kUniform;
                const std::string where = "part " + std::to_string(part.first_layer) + " tp " + std::to_string(tp) +
                                          (sp ? " sp" : "") + (with_loss ? "" : " logits") + " variant " +
                                          std::to_string(variant);
                const ms::GptGraphSpec spec{.shape = s,
                                            .part = part,
                                            .tp_size = tp,
                                            .sequence_parallel = sp,
                                            .act = act,
                                            .B = 3,
                                            .T = 4,
                                            .with_loss = with_loss,
                                            .options = options};
                const ms::graph::Graph g = ms::build_gpt_graph(spec, ms::gpt_param_table(s, tp, part)).g;
                const ms::graph::MemoryPlan trained = ms::plan_gpt_memory(s, part, tp, 3, sp, act, options);
                const ms::graph::MemoryPlan& plan = !with_loss && trained.logits_only ? *trained.logits_only : trained;
                for (const ms::graph::MemGroup group : {ms::graph::MemGroup::kSlot, ms::graph::MemGroup::kScratch}) {
                    std::vector<ms::BufferRequest> requests;
                    ms::Plan placed;
                    for (size_t t = 0; t < g.tensors.size(); ++t) {
                        const auto id = static_cast<ms::graph::TensorId>(t);
                        const ms::graph::MemoryPlan::Place p = plan.place(g, id);
                        if (p.group != group) continue;
                        int first = INT_MAX, last = -1;
                        for (size_t i = 0; i < g.nodes.size(); ++i) {
                            const auto& n = g.nodes[i];
                            const bool touches = std::find(n.in.begin(), n.in.end(), id) != n.in.end() ||
                                                 std::find(n.out.begin(), n.out.end(), id) != n.out.end();
                            if (!touches) continue;
                            first = std::min(first, static_cast<int>(i));
                            last = std::max(last, static_cast<int>(i));
                        }
                        // the host writes inputs before the first op and reads outputs after the last
                        const ms::graph::Role role = g.tensors[t].role;
                        if (role == ms::graph::Role::kInput) first = 0;
                        if (role == ms::graph::Role::kOutput || role == ms::graph::Role::kGradInput)
                            last = static_cast<int>(g.nodes.size());
                        requests.push_back(
                            {g.tensors[t].name, static_cast<size_t>(g.tensors[t].bytes()), first, last, -1});
                        placed.offsets.push_back(p.offset);
                    }
                    placed.total_bytes = group == ms::graph::MemGroup::kSlot ? plan.slot_bytes() : plan.scratch_bytes();
                    EXPECT_EQ(ms::find_plan_violation(requests, placed, ms::graph::kMemoryAlign), std::nullopt)
                        << where;
                }
            }
        }
    }
}

// Validation (train's and `eval`'s) covers the split at most once: ceil(samples / global batch) iterations.
TEST(PlanArithmetic, EvalItersStopAtOnePassOverTheSplit) {
    EXPECT_EQ(ms::bound_eval_iters(10, "eval.eval_iters", 468, 16), 10);
    EXPECT_EQ(ms::bound_eval_iters(30, "eval.eval_iters", 468, 16), 30);
    EXPECT_EQ(ms::bound_eval_iters(31, "eval.eval_iters", 468, 16), 30);
    EXPECT_EQ(ms::bound_eval_iters(2000000000, "eval.eval_iters", 468, 16), 30);
    EXPECT_EQ(ms::bound_eval_iters(5, "--iters", 3, 16), 1);  // a split smaller than one batch: one iteration
}

TEST(PlanArithmetic, ActivationBytesMatchWhatGptAllocates) {
    // A Gpt given an arena allocates its slots as kActivation and its scratch as kWorkspace: exactly the plan's bytes.
    ms::GptShape s = hand_shape();
    s.L = 2, s.C = 48, s.NH = 4, s.T = 16, s.V = 61, s.Vp = 128, s.F = 192;
    const int B = 3, slots = 2;
    ms::SelfCommunicator tp("tp");
    std::unique_ptr<ms::Backend> backend = ms::make_backend(ms::BackendOptions{});
    for (const ms::GptPart part : {ms::GptPart{}, ms::GptPart{1, 1, false, true}, ms::GptPart{0, 1, true, false}}) {
        ms::Arena arena(size_t{4} << 20);
        ms::Gpt::Options o;
        o.max_batch = B, o.part = part, o.num_slots = slots, o.arena = &arena;
        ms::Gpt model(s, *backend, tp, o);
        const auto plan = ms::plan_gpt_memory(s, part, 1, B, false, ms::DType::kF32);
        EXPECT_EQ(arena.live_bytes(ms::MemCategory::kActivation), slots * plan.slot_bytes());
        EXPECT_EQ(arena.live_bytes(ms::MemCategory::kWorkspace), plan.scratch_bytes());
        EXPECT_EQ(arena.live_bytes(ms::MemCategory::kParameter), static_cast<size_t>(model.flat_size()) * 4);
    }
}

// The GPT-2 124M and 1.5B shapes.
std::vector<ms::GptShape> gpt2_124m_and_1p5b() {
    ms::GptShape small;
    small.L = 12, small.C = 768, small.NH = 12, small.T = 1024, small.V = 50257, small.Vp = 50304, small.F = 3072;
    ms::GptShape xl = small;
    xl.L = 48, xl.C = 1600, xl.NH = 25, xl.F = 6400;
    return {small, xl};
}

// Per parameter, what zero_stage and mixed precision keep on a rank (weights, gradients, master weights, optimizer
// state; activations aside), on the GPT-2 124M and 1.5B shapes at dp 1, 2, 4 and 8: fp32 ZeRO-1 4 + 4 + 8 / dp bytes;
// bf16 ZeRO-0 2 + 4 + 4 + 8 (whole fp32 masters beside the 16-bit weights); bf16 ZeRO-1 2 + 4 + 12 / dp, the fp32
// masters sharded with the moments (Megatron's distributed optimizer with fp32 gradients); with 16-bit gradients
// (mixed_precision.grad_reduce_in_fp32: false) 2 + 2 + 12 / dp, Megatron's bf16 main_grad. The flat buffers' padding
// keeps each within 1% of the formula.
TEST(PlanArithmetic, ShardedMasterWeightsKeepTwoPlusFourPlusTwelveOverDpBytesPerParameter) {
    for (const ms::GptShape& shape : gpt2_124m_and_1p5b()) {
        std::map<int, double> bf16_zero1, bf16_grads;  // dp -> bytes per parameter (fp32, bf16 gradients)
        for (const int dp : {1, 2, 4, 8}) {
            struct Case {
                ms::DType dtype;
                int zero_stage;
                double bytes_per_param;
                ms::DType grads = ms::DType::kF32;
            };
            for (const Case c : {Case{ms::DType::kF32, 1, 4 + 4 + 8.0 / dp}, Case{ms::DType::kBF16, 0, 2 + 4 + 4 + 8},
                                 Case{ms::DType::kBF16, 1, 2 + 4 + 12.0 / dp},
                                 Case{ms::DType::kBF16, 1, 2 + 2 + 12.0 / dp, ms::DType::kBF16}}) {
                ms::PlanShape p;
                p.dp = dp, p.dtype = c.dtype, p.zero_stage = c.zero_stage;
                p.graph.grads = c.grads;
                const auto stages = ms::plan_stages(shape, p);
                ASSERT_EQ(stages.size(), 1u);
                const ms::StagePlan& st = stages[0];
                const double per_param = static_cast<double>(st.model_state_bytes()) / static_cast<double>(st.params);
                EXPECT_NEAR(per_param / c.bytes_per_param, 1.0, 0.01)
                    << "L " << shape.L << " dp " << dp << " " << ms::dtype_name(c.dtype) << " zero " << c.zero_stage
                    << " grads " << ms::dtype_name(c.grads);
                EXPECT_EQ(st.grad_bytes, static_cast<int64_t>(ms::dtype_size(c.grads)) * st.padded);
                const bool sharded = c.dtype != ms::DType::kF32 && c.zero_stage == 1;
                EXPECT_EQ(st.param_bytes, sharded ? 0 : 4 * st.padded);
                EXPECT_EQ(st.optimizer.master, sharded ? 4 * st.padded / dp : 0);
                if (sharded) (c.grads == ms::DType::kF32 ? bf16_zero1 : bf16_grads)[dp] = per_param;
            }
        }
        // 18 bytes per parameter at dp 1, 7.5 at dp 8; with bf16 gradients 16 and 5.5 (2.9x)
        EXPECT_GE(bf16_zero1[1] / bf16_zero1[8], 2.39) << "L " << shape.L;
        EXPECT_GE(bf16_grads[1] / bf16_grads[8], 2.9) << "L " << shape.L;
    }
}

// zero_stage 2 (engine/optim/sharded_grads.h) keeps of the gradients this rank's dp shard, two bucket slots (GPT's
// backward has one bucket open at a time, plus one for the reduction in flight) and the gradients it keeps whole --
// on one GPT-2 stage the tied embedding's, Vp x C -- so per parameter 2 + 12/dp (as ZeRO-1 in bf16) + g/dp +
// g (2 slots + Vp C) / P with g bytes per gradient element. A slot holds the longest bucket: at least bucket_elems,
// at most that plus one gradient tensor (a bucket closes at the first tensor start past bucket_elems). GPT-2 1.5B at
// dp 8 with Megatron's default 40M-element buckets: 4.42 bytes per parameter, 4.1x less than one rank's 18.
TEST(PlanArithmetic, ShardedGradientsKeepTheShardTwoSlotsAndTheTiedEmbedding) {
    for (const ms::GptShape& shape : gpt2_124m_and_1p5b()) {
        const int64_t largest = int64_t{shape.Vp} * shape.C;  // no gradient tensor is longer than the embedding
        for (const int dp : {2, 4, 8}) {
            for (const int64_t bucket : {ms::default_bucket_elems(dp), int64_t{4'000'000}}) {
                for (const ms::DType grads : {ms::DType::kF32, ms::DType::kBF16}) {
                    ms::PlanShape p;
                    p.dp = dp, p.dtype = ms::DType::kBF16, p.zero_stage = 2, p.grad_bucket_elems = bucket;
                    p.graph.grads = grads;
                    const auto stages = ms::plan_stages(shape, p);
                    ASSERT_EQ(stages.size(), 1u);
                    const ms::StagePlan& st = stages[0];
                    const ms::ShardedGradLayout l = ms::stage_sharded_grad_layout(
                        shape, ms::stage_params(shape, 1, 1, 0, 1), 1, 1, false, p.dtype, p.graph, dp, bucket);
                    const std::string what =
                        fmt::format("L {} dp {} bucket {} {} gradients", shape.L, dp, bucket, ms::dtype_name(grads));
                    EXPECT_EQ(l.slots, 2) << what;
                    EXPECT_EQ(l.kept_elems, int64_t{shape.Vp} * shape.C) << what;
                    EXPECT_GE(l.slot_elems, std::min(bucket, st.params / 2)) << what;
                    EXPECT_LE(l.slot_elems, bucket + largest) << what;
                    const auto g = static_cast<double>(ms::dtype_size(grads));
                    const double P = static_cast<double>(st.params);
                    EXPECT_EQ(st.grad_bytes, static_cast<int64_t>(g) * (2 * l.slot_elems + l.kept_elems)) << what;
                    EXPECT_EQ(st.grad_shard_bytes, static_cast<int64_t>(g) * st.padded / dp) << what;
                    const double formula =
                        2 + 12.0 / dp + g / dp + g * static_cast<double>(2 * l.slot_elems + l.kept_elems) / P;
                    const double per_param = static_cast<double>(st.model_state_bytes()) / P;
                    EXPECT_NEAR(per_param / formula, 1.0, 0.01) << what;
                    if (shape.L == 48 && dp == 8 && bucket == ms::default_bucket_elems(dp) &&
                        grads == ms::DType::kF32) {
                        EXPECT_GE(18.0 / per_param, 4.0) << what << ": " << per_param << " bytes per parameter";
                    }
                }
            }
        }
    }
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
        EXPECT_EQ(st.optimizer_bytes() * p.dp, 8 * st.padded);
        ASSERT_EQ(st.slots.size(), 2u);
    }
}

}  // namespace

// plan --graph: each chunk's ops with their bytes, the passes' rewrites, and the bytes before and after fusion;
// --dot writes one Graphviz digraph per chunk.
TEST(PlanE2E, GraphShowsOpsPassesAndBytes) {
    const std::string dot = ms::test::make_temp_dir() + "/graph.dot";
    const auto r = run_cli(demo_plan(2,
                                     "--set parallel.tensor_model_parallel_size=1 --set "
                                     "training.recompute_granularity=selective --graph --dot " +
                                         dot));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const char* line :
         {"graph of chunk 0 (layers 0-0, embedding", "graph of chunk 1 (layers 1-1, head and loss",
          "pass recompute: 1 rewrites", "matmul + gelu -> matmul+gelu", "lm_head+cross_entropy in the forward",
          "one layer, forward + backward", "fwd matmul+gelu", "bwd layernorm_backward"}) {
        EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
    }
    const std::string text = ms::test::read_file(dot);
    EXPECT_EQ(std::count(text.begin(), text.end(), '{'), 2);  // two digraphs
    EXPECT_NE(text.find("digraph \"chunk 1\""), std::string::npos);
}

namespace {

// One preset planned at a world size against an 80 GB GPU (78.5 GiB: less the 1.5 GiB plan.h's kDeviceReserveBytes
// keeps for the CUDA context, cuBLAS and NCCL).
struct PresetPlan {
    int64_t parameters = 0;             // the derived line's count (the padded vocabulary, each element once)
    int64_t largest_total = 0;          // bytes of the largest stage's rank
    std::vector<int64_t> stage_params;  // one tp rank's shard, per stage
    std::string output;
};

PresetPlan plan_preset(const std::string& preset, int world_size, const std::string& sets = "") {
    const auto r = ms::test::run_cli("plan --config " MS_SOURCE_DIR "/configs/" + preset + " --world-size " +
                                     std::to_string(world_size) + " --memory-gb 78.5 " + sets);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    PresetPlan p;
    p.output = r.output;
    std::smatch m;
    if (std::regex_search(r.output, m, std::regex("parameters ([0-9]+) \\("))) p.parameters = std::stoll(m[1]);
    if (std::regex_search(r.output, m, std::regex("largest per-rank total: [^(]*\\(([0-9]+) B")))
        p.largest_total = std::stoll(m[1]);
    for (const auto& row : table_rows(r.output, "stage")) p.stage_params.push_back(std::stoll(row[2]));
    return p;
}

}  // namespace

// The Llama presets at 8 and 64 ranks: Hugging Face's parameter counts exactly (the vocabulary 128256 needs no
// padding at make_vocab_size_divisible_by 32 x tp <= 8), the tensor-parallel shards of the plan's parameter table
// adding up to them, and every rank within an 80 GB GPU. Llama-3-8B: 8,030,261,248 (config.json's shape, untied).
// Llama-3.2-1B: 1,235,814,400 (tied).
TEST(PlanE2E, LlamaPresetsHaveHuggingFacesParameterCountsAndFit80GB) {
    struct Preset {
        const char* file;
        int64_t hf_parameters;
        int64_t L, C;  // the replicated RMSNorm weights: 2 per layer and the final one, C each
    };
    constexpr double kBudget = 78.5 * 1024 * 1024 * 1024;
    for (const Preset& preset :
         {Preset{"llama-8b.yaml", 8030261248, 32, 4096}, Preset{"llama-1b.yaml", 1235814400, 16, 2048}}) {
        for (const int world : {8, 64}) {
            const std::string where = std::string(preset.file) + " at " + std::to_string(world) + " ranks";
            const PresetPlan p = plan_preset(preset.file, world);
            EXPECT_EQ(p.parameters, preset.hf_parameters) << where << "\n" << p.output;
            EXPECT_NE(p.output.find(": fits"), std::string::npos) << where << "\n" << p.output;
            EXPECT_GT(p.largest_total, 0) << where;
            EXPECT_LE(static_cast<double>(p.largest_total), kBudget) << where;
            // one stage (pp 1): tp shards of every matrix plus tp copies of the norms
            std::smatch m;
            ASSERT_TRUE(std::regex_search(p.output, m, std::regex("= tp ([0-9]+) x pp ([0-9]+) x dp ([0-9]+)")))
                << p.output;
            const int64_t tp = std::stoll(m[1]);
            EXPECT_EQ(tp * std::stoll(m[2]) * std::stoll(m[3]), world) << where;
            ASSERT_EQ(p.stage_params.size(), 1u) << where;
            const int64_t norms = (2 * preset.L + 1) * preset.C;
            EXPECT_EQ(tp * p.stage_params[0] - (tp - 1) * norms, preset.hf_parameters) << where;
        }
    }
}

// Llama-3-8B at seq 32768 on 64 GPUs (the README's table): the preset's tp 2 + sp does not fit an 80 GB GPU alone,
// and fits with context parallelism 2 (dp 16), each rank holding 16384 tokens of every sequence; cp 4 holds 8192, so
// its memory is the seq-8192 preset's to the byte.
TEST(PlanE2E, Llama8bAtSeq32768FitsWithContextParallelism) {
    const std::string long_seq =
        "--set model.seq_length=32768 --set model.max_position_embeddings=32768 --set training.global_batch_size=128 ";
    const PresetPlan plain = plan_preset("llama-8b.yaml", 64, long_seq);
    EXPECT_NE(plain.output.find(": does not fit"), std::string::npos) << plain.output;
    const PresetPlan cp2 = plan_preset("llama-8b.yaml", 64, long_seq + "--set parallel.context_parallel_size=2");
    EXPECT_NE(cp2.output.find("world size 64 = tp 2 x pp 1 x cp 2 x dp 16"), std::string::npos) << cp2.output;
    EXPECT_NE(cp2.output.find(": fits"), std::string::npos) << cp2.output;
    EXPECT_LE(static_cast<double>(cp2.largest_total), 78.5 * 1024 * 1024 * 1024);
    EXPECT_LT(cp2.largest_total, plain.largest_total);
    const PresetPlan cp4 = plan_preset("llama-8b.yaml", 64, long_seq + "--set parallel.context_parallel_size=4");
    const PresetPlan seq8192 = plan_preset("llama-8b.yaml", 64);
    EXPECT_EQ(cp4.largest_total, seq8192.largest_total);  // dp 8 x cp 4 shards the optimizer as dp 32 does
    std::printf("llama-8b seq 32768 on 64: tp2+sp %.2f GiB, + cp2 %.2f GiB, + cp4 %.2f GiB\n",
                plain.largest_total / 1073741824.0, cp2.largest_total / 1073741824.0, cp4.largest_total / 1073741824.0);
}
