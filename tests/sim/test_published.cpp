// test_published.cpp: the step simulator (engine/sim/simulator.h) with the a100-80g estimate (engine/sim/profile.h)
// against published numbers: Megatron-LM's weak-scaling table (Narayanan et al., "Efficient Large-Scale Language
// Model Training on GPU Clusters Using Megatron-LM", SC 2021, arXiv 2104.04473, Table 1), and the seed's 512-GPU
// setting with the data-parallel overlap off and on, printed as the table of README.md and docs/planner.md
// ("Validation against published numbers").
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "comm/nodes.h"
#include "engine/backends/backend.h"
#include "engine/config/config.h"
#include "engine/sim/profile.h"
#include "engine/sim/simulator.h"
#include "engine/train/run_layout.h"

namespace {

// One row of Table 1: GPT, sequence 2048, vocabulary 51200, mixed precision, full activation recomputation, on
// DGX A100 80GB nodes (8 GPUs on NVSwitch, 8 x 200 Gb/s InfiniBand), the interleaved schedule where pp > 1.
struct MegatronRow {
    const char* params;  // as the paper names the model, billions
    int heads, hidden, layers, tp, pp, gpus, batch;
    double tflops;  // achieved teraFLOP/s per GPU, the paper's FLOP count (below)
    // Not in the table: the model chunks per stage of the interleaved schedule (ours: 2 where the layers per stage
    // are even, else 3, which divides both odd counts, 15 and 3) and the micro-batch (ours: 1 throughout).
    int vpp;
};
constexpr int kSeq = 2048, kVocab = 51200, kGpusPerNode = 8;
constexpr MegatronRow kTable1[] = {
    {"1.7", 24, 2304, 24, 1, 1, 32, 512, 137, 1},          {"3.6", 32, 3072, 30, 2, 1, 64, 512, 138, 1},
    {"7.5", 32, 4096, 36, 4, 1, 128, 512, 142, 1},         {"18.4", 48, 6144, 40, 8, 1, 256, 1024, 135, 1},
    {"39.1", 64, 8192, 48, 8, 2, 512, 1536, 138, 2},       {"76.1", 80, 10240, 60, 8, 4, 1024, 1792, 140, 3},
    {"145.6", 96, 12288, 80, 8, 8, 1536, 2304, 148, 2},    {"310.1", 128, 16384, 96, 8, 16, 1920, 2160, 155, 2},
    {"529.6", 128, 20480, 105, 8, 35, 2520, 2520, 163, 3}, {"1008.0", 160, 25600, 128, 8, 64, 3072, 3072, 163, 2},
};

// The paper's FLOPs of one step: 96 B s l h^2 (1 + s / 6h + V / 16lh), which counts the
// recomputation's second forward (72 without it); the trainer's MFU (gpt_train_flops_per_token) does not.
double megatron_step_flops(const MegatronRow& r) {
    const double B = r.batch, s = kSeq, l = r.layers, h = r.hidden, V = kVocab;
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

ms::Config gpt_config(int layers, int hidden, int heads, std::vector<std::string> extra) {
    ms::register_planning_cuda_backend();  // run.backend: cuda configs validate; nothing here builds one
    std::vector<std::string> s = {"run.backend=cuda",
                                  "model.num_layers=" + std::to_string(layers),
                                  "model.hidden_size=" + std::to_string(hidden),
                                  "model.num_attention_heads=" + std::to_string(heads),
                                  "model.seq_length=" + std::to_string(kSeq),
                                  "model.vocab_size=" + std::to_string(kVocab),
                                  "mixed_precision.dtype=bf16",
                                  "training.micro_batch_size=1",
                                  "training.recompute_granularity=full"};
    s.insert(s.end(), extra.begin(), extra.end());
    return ms::load_config("", s);
}

ms::Config megatron_config(const MegatronRow& r) {
    std::vector<std::string> s = {"parallel.tensor_model_parallel_size=" + std::to_string(r.tp),
                                  "parallel.pipeline_model_parallel_size=" + std::to_string(r.pp),
                                  "training.global_batch_size=" + std::to_string(r.batch)};
    if (r.vpp > 1) {
        s.push_back("parallel.pipeline_schedule=interleaved_1f1b");
        s.push_back("parallel.virtual_pipeline_model_parallel_size=" + std::to_string(r.vpp));
    }
    return gpt_config(r.layers, r.hidden, r.heads, s);
}

const ms::sim::ProfileCostModel& a100() {
    static const ms::sim::ProfileCostModel m(ms::sim::estimate_profile("a100-80g"));
    return m;
}

TEST(Published, MegatronWeakScalingTableWithinTwentyPercent) {
    std::printf(
        "| model | tp | pp | vpp | GPUs | batch | published TFLOP/s/GPU | simulated | ratio | step s | bubble | "
        "exposed comm |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const MegatronRow& r : kTable1) {
        const ms::RunLayout layout = ms::make_run_layout(megatron_config(r), r.gpus);
        const ms::sim::SimulatedStep step =
            ms::sim::simulate_step(layout, a100(), ms::nodes_by_count(r.gpus, kGpusPerNode));
        const double achieved = megatron_step_flops(r) / step.step_seconds / r.gpus / 1e12;
        const double ratio = achieved / r.tflops;
        std::printf("| %sB | %d | %d | %d | %d | %d | %.0f | %.1f | %.3f | %.2f | %.1f%% | %.1f%% |\n", r.params, r.tp,
                    r.pp, r.vpp, r.gpus, r.batch, r.tflops, achieved, ratio, step.step_seconds,
                    100 * step.bubble_fraction, 100 * step.comm_exposed_share());
        // The acceptance bound. The estimate's tensor-core GEMM efficiency is tuned to the 145.6B row (engine/sim/
        // profile.cpp); measured ratios over the table: 0.900 (529.6B, 1008B) to 1.109 (1.7B), 1.001 at 145.6B.
        EXPECT_NEAR(ratio, 1.0, 0.2) << r.params << "B";
    }
}

// The seed's 512-GPU setting: 64 DGX A100 nodes (8 A100 80GB on NVSwitch each; 8 x 200 Gb/s InfiniBand per node, as
// the a100-80g estimate's one NIC per GPU assumes) training a GPT-3-class model -- GPT-3 175B's shape (96 layers,
// hidden 12288, 96 heads, sequence 2048; Megatron's vocabulary 51200) at tp 8, pp 8, dp 8, ZeRO 1, GPT-3's batch of
// 1536 sequences, micro-batch 1, full recomputation -- with the data-parallel overlap off and on.
TEST(Published, SeedSettingWithTheOverlapOffAndOn) {
    constexpr int kWorld = 512;
    const std::vector<std::string> base = {"parallel.tensor_model_parallel_size=8",
                                           "parallel.pipeline_model_parallel_size=8", "parallel.zero_stage=1",
                                           "training.global_batch_size=1536"};
    std::vector<std::string> on = base;
    on.insert(on.end(), {"parallel.overlap_grad_reduce=true", "parallel.overlap_param_gather=true"});
    const ms::NodeLayout nodes = ms::nodes_by_count(kWorld, kGpusPerNode);
    const double device_bytes = static_cast<double>(a100().profile().device_memory_bytes);
    std::printf(
        "| overlap | step s | MFU | exposed comm (share of step) | total comm | bubble | memory per rank (of 80 "
        "GiB) |\n|---|---|---|---|---|---|---|\n");
    std::vector<ms::sim::SimulatedStep> steps;
    for (const auto& [name, keys] : {std::pair{"off", base}, std::pair{"on", on}}) {
        const ms::RunLayout layout = ms::make_run_layout(gpt_config(96, 12288, 96, keys), kWorld);
        ASSERT_EQ(layout.dp(), 8);
        const ms::sim::SimulatedStep step = ms::sim::simulate_step(layout, a100(), nodes);
        int64_t memory = 0;
        for (const auto& st : step.stages) memory = std::max(memory, st.memory_bytes);
        std::printf("| %s | %.2f | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %.2f GiB (%.0f%%) |\n", name, step.step_seconds,
                    100 * step.mfu, 100 * step.comm_exposed_share(), 100 * step.comm_total_share(),
                    100 * step.bubble_fraction, static_cast<double>(memory) / (1 << 30),
                    100 * static_cast<double>(memory) / device_bytes);
        EXPECT_LT(static_cast<double>(memory), device_bytes);
        steps.push_back(step);
    }
    // the overlap hides part of the reduction and the gather, and adds no work
    EXPECT_LT(steps[1].comm_exposed_seconds, steps[0].comm_exposed_seconds);
    EXPECT_LT(steps[1].step_seconds, steps[0].step_seconds);
    EXPECT_EQ(steps[1].bubble_fraction, steps[0].bubble_fraction);
}

}  // namespace
