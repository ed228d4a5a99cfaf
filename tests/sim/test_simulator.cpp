// test_simulator.cpp: the step simulator (engine/sim/simulator.h) on cases worked out by hand: one rank (the sum of
// its ops, the optimizer and the zeroing), pure pipelines with the known bubble, pure data parallelism with the ring
// all-reduce's time, a gradient bucket hidden behind the rest of the backward, tensor-parallel all-reduces on the
// critical path, and a two-stage pipeline with its messages and the tied embedding's all-reduce.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/nodes.h"
#include "engine/config/config.h"
#include "engine/core/check.h"
#include "engine/optim/distributed_optimizer.h"
#include "engine/sim/simulator.h"
#include "engine/train/plan.h"
#include "engine/train/run_layout.h"
#include "tests/common/hand_cost_model.h"

namespace {

using ms::sim::ChunkCost;
using ms::sim::SimulatedStep;
using ms::sim::StageInput;
using ms::sim::StepInputs;

// Sums of a few doubles: exact up to the last bits.
constexpr double kRel = 1e-12;

// A small GPT: L layers of C = 64, 4 heads, 32 tokens, vocabulary 128 (no padding), micro-batch 2.
ms::Config small(int layers, std::vector<std::string> extra = {}) {
    std::vector<std::string> s = {"model.num_layers=" + std::to_string(layers),
                                  "model.hidden_size=64",
                                  "model.num_attention_heads=4",
                                  "model.seq_length=32",
                                  "model.max_position_embeddings=32",
                                  "model.vocab_size=128",
                                  "training.micro_batch_size=2",
                                  "training.train_iters=10"};
    s.insert(s.end(), extra.begin(), extra.end());
    return ms::load_config("", s);
}

// Stages of equal chunks (forward f, backward b per local chunk), free messages.
StepInputs equal_stages(ms::ScheduleKind kind, int pp, int m, int v, double f, double b) {
    StepInputs in;
    in.schedule = kind;
    in.microbatches = m;
    in.virtual_stages = v;
    in.p2p_seconds.assign(pp, std::vector<double>(pp, 0.0));
    for (int s = 0; s < pp; ++s) {
        StageInput st;
        st.chunks.assign(v, ChunkCost{.forward = f, .backward = b});
        st.params = {{0, 16}};
        st.padded = 16;
        in.stages.push_back(st);
    }
    return in;
}

TEST(SimStages, PipelineBubbleIsPMinusOneOverMPlusPMinusOne) {
    for (const ms::ScheduleKind kind : {ms::ScheduleKind::kGPipe, ms::ScheduleKind::k1F1B}) {
        // pp 4, m 8, forward 1 s, backward 2 s: (m + p - 1) (f + b) = 33 s, bubble 3 / 11
        const SimulatedStep r = ms::sim::simulate_stages(equal_stages(kind, 4, 8, 1, 1.0, 2.0));
        EXPECT_NEAR(r.step_seconds, 33.0, 33.0 * kRel) << ms::to_string(kind);
        EXPECT_NEAR(r.pipeline_seconds, 33.0, 33.0 * kRel);
        EXPECT_NEAR(r.bubble_fraction, 3.0 / 11.0, kRel);
        for (const auto& st : r.stages) EXPECT_NEAR(st.busy, 24.0, 24.0 * kRel);
    }
}

TEST(SimStages, InterleavedBubbleIsPMinusOneOverVMPlusPMinusOne) {
    // pp 4, v 2, m 8; each chunk half a stage: forward 0.5 s, backward 1 s. (v m + p - 1) (f + b) / v... per chunk:
    // (16 + 3) * 1.5 = 28.5 s, bubble 3 / 19
    const SimulatedStep r =
        ms::sim::simulate_stages(equal_stages(ms::ScheduleKind::kInterleaved1F1B, 4, 8, 2, 0.5, 1.0));
    EXPECT_NEAR(r.step_seconds, 28.5, 28.5 * kRel);
    EXPECT_NEAR(r.bubble_fraction, 3.0 / 19.0, kRel);
}

TEST(SimStages, MessagesSitOnTheCriticalPathOfAPipeline) {
    // GPipe, pp 2, m 1, forward 1 s and backward 2 s per stage, 0.25 s per message: F0, send, F1, B1, send, B0
    StepInputs in = equal_stages(ms::ScheduleKind::kGPipe, 2, 1, 1, 1.0, 2.0);
    in.p2p_seconds = {{0, 0.25}, {0.25, 0}};
    const SimulatedStep r = ms::sim::simulate_stages(in);
    EXPECT_NEAR(r.step_seconds, 1 + 0.25 + 1 + 2 + 0.25 + 2, kRel);
    EXPECT_NEAR(r.stages[0].p2p, 0.25, kRel);  // stage 0 sends one activation
    EXPECT_NEAR(r.stages[1].p2p, 0.25, kRel);  // stage 1 one gradient
}

// Step 7: ranks wanting s times the host's cores make the step at least s x (a rank's compute -- forwards,
// backwards, zeroing, optimizer; mean over the stages -- + the exposed communication); the longer of that and 1-6,
// where the stages' forwards and backwards share pp / s cores.
TEST(SimStages, AnOversubscribedHostRunsEveryRanksComputeOnItsCores) {
    // one stage, 2 micro-batches of forward 1 s (0.25 s of it tp all-reduces) and backward 2 s (0.5 s); zeroing
    // 0.5 s, optimizer 0.5 s, scalars 0.1 s. On cores of its own: 0.5 + 2 x 3 + 0.1 + 0.5 = 7.1 s.
    StepInputs in = equal_stages(ms::ScheduleKind::k1F1B, 1, 2, 1, 1.0, 2.0);
    in.stages[0].chunks[0].forward_comm = 0.25;
    in.stages[0].chunks[0].backward_comm = 0.5;
    in.stages[0].zero_seconds = 0.5;
    in.stages[0].optimizer_seconds = 0.5;
    in.scalar_seconds = 0.1;
    const SimulatedStep own = ms::sim::simulate_stages(in);
    EXPECT_NEAR(own.step_seconds, 7.1, 7.1 * kRel);
    EXPECT_EQ(own.shared_cores_seconds, own.step_seconds);
    // twice oversubscribed: compute 2 x (3 - 0.75) + 0.5 + 0.5 = 5.5 s and communication 1.5 + 0.1 s, doubled;
    // the pipeline on half a core takes 12 s, so 0.5 + 12 + 0.1 + 0.5 = 13.1 s before the bound
    in.oversubscription = 2;
    const SimulatedStep twice = ms::sim::simulate_stages(in);
    EXPECT_NEAR(twice.host_compute_seconds, 5.5, 5.5 * kRel);
    EXPECT_NEAR(twice.comm_exposed_seconds, 1.6, 1.6 * kRel);
    EXPECT_NEAR(twice.host_bound_seconds, 2 * (5.5 + 1.6), 14.2 * kRel);
    EXPECT_EQ(twice.step_seconds, twice.host_bound_seconds);
    EXPECT_NEAR(twice.shared_cores_seconds, 13.1, 13.1 * kRel);
    EXPECT_NEAR(twice.tokens_per_s * twice.step_seconds, own.tokens_per_s * own.step_seconds, kRel);

    // pp 2 (1F1B), 2 micro-batches of forward 1 s and backward 2 s, on 2 / (4/3) = 1.5 cores: two stages computing
    // at once run at 0.75 each, one alone at 1. S0 F0 alone [0, 1]; S0 F1 and S1 F0 [1, 2.33]; S1 B0 alone (S0 waits
    // for its gradient) [2.33, 4.33]; S0 B0 with S1 F1 [4.33, 5.67], S0 B0's last half with S1 B1's first
    // [5.67, 7]; S1 B1's rest alone [7, 8]; S0 B1 alone [8, 10]. 10 s: more than on cores of their own ((2 + 1) x 3
    // = 9 s) and than the host bound (4/3 x 6 = 8 s).
    StepInputs pipe = equal_stages(ms::ScheduleKind::k1F1B, 2, 2, 1, 1.0, 2.0);
    EXPECT_NEAR(ms::sim::simulate_stages(pipe).step_seconds, 9.0, 9.0 * kRel);
    pipe.oversubscription = 4.0 / 3.0;
    const SimulatedStep shared = ms::sim::simulate_stages(pipe);
    EXPECT_NEAR(shared.pipeline_seconds, 10.0, 1e-9);
    EXPECT_NEAR(shared.host_bound_seconds, 8.0, 1e-9);
    EXPECT_NEAR(shared.step_seconds, 10.0, 1e-9);
    // 2x: one core, never idle in this schedule (some stage always computes): the host bound, 2 x 6 = 12 s
    pipe.oversubscription = 2;
    EXPECT_NEAR(ms::sim::simulate_stages(pipe).step_seconds, 12.0, 1e-9);
}

// step_inputs asks the cost model for the ranks on the fullest node.
TEST(SimStep, OversubscriptionCountsTheRanksOfTheFullestNode) {
    struct Counting final : ms::sim::CostModel {  // free ops and links; s = ranks / 2
        ms::test::HandCostModel free;
        mutable int asked = 0;
        std::string describe() const override { return "counting"; }
        double op_seconds(const ms::graph::Graph& g, const ms::graph::Node& n) const override {
            return free.op_seconds(g, n);
        }
        double optimizer_seconds(int64_t e, ms::DType w) const override { return free.optimizer_seconds(e, w); }
        double memory_seconds(int64_t bytes) const override { return free.memory_seconds(bytes); }
        double peak_flops(ms::DType act) const override { return free.peak_flops(act); }
        ms::LinkModel links() const override { return free.links(); }
        double oversubscription(int ranks_per_host) const override {
            asked = ranks_per_host;
            return ranks_per_host / 2.0;
        }
    };
    const ms::RunLayout l = ms::make_run_layout(small(2, {"parallel.hierarchical_dp=off"}), 4);
    Counting cost;
    EXPECT_EQ(ms::sim::step_inputs(l, cost, ms::nodes_by_count(4, 4)).oversubscription, 2.0);
    EXPECT_EQ(cost.asked, 4);
    EXPECT_EQ(ms::sim::step_inputs(l, cost, ms::nodes_by_count(4, 2)).oversubscription, 1.0);
    EXPECT_EQ(cost.asked, 2);
}

TEST(SimStages, BucketRangesCutAsGradBucketsCutThem) {
    // from the end down, closing at a parameter's start once a bucket holds 8 elements
    const std::vector<std::pair<int64_t, int64_t>> params = {{0, 10}, {10, 30}, {30, 35}};
    const std::vector<std::pair<int64_t, int64_t>> expected = {{30, 40}, {10, 30}, {0, 10}};
    EXPECT_EQ(ms::bucket_ranges(params, 40, 8), expected);
    const std::vector<std::pair<int64_t, int64_t>> whole = {{0, 40}};
    EXPECT_EQ(ms::bucket_ranges(params, 40, 1000), whole);
}

TEST(SimStages, OverlapHidesABucketBehindTheRestOfTheBackward) {
    // one rank of dp 2, m 1: forward 1 s, backward 4 s. Parameters [0, 100) and [100, 200); the backward finishes
    // [100, 200) 1 s in and [0, 100) at its end. A bucket of 100 fp32 elements all-reduces in 1 s.
    StepInputs in = equal_stages(ms::ScheduleKind::k1F1B, 1, 1, 1, 1.0, 4.0);
    StageInput& st = in.stages[0];
    st.params = {{0, 100}, {100, 200}};
    st.padded = 200;
    st.chunks[0].grads_final = {{1.0, 100, 200}, {4.0, 0, 100}};
    in.dp.size = 2;
    in.dp.reduce_whole = in.dp.reduce_bucket = {0.0, 1.0 / 400};

    // without buckets: the whole 800 bytes after the backward, 2 s exposed
    SimulatedStep r = ms::sim::simulate_stages(in);
    EXPECT_NEAR(r.step_seconds, 5.0 + 2.0, kRel);
    EXPECT_NEAR(r.stages[0].dp_exposed, 2.0, kRel);

    // buckets of 100: [100, 200) runs from 2 s to 3 s behind the backward; [0, 100) from 5 s to 6 s, exposed
    in.dp.bucket_elems = 100;
    r = ms::sim::simulate_stages(in);
    EXPECT_EQ(r.stages[0].buckets, 2);
    EXPECT_NEAR(r.stages[0].dp_total, 2.0, kRel);
    EXPECT_NEAR(r.stages[0].dp_exposed, 1.0, kRel);
    EXPECT_NEAR(r.step_seconds, 6.0, kRel);
    EXPECT_NEAR(r.comm_exposed_seconds, 1.0, kRel);
    EXPECT_NEAR(r.comm_total_seconds, 2.0, kRel);

    // a deferred gradient (the tied embedding's) holds its bucket until after the backward: both exposed
    st.deferred = {{100, 200}};
    r = ms::sim::simulate_stages(in);
    EXPECT_NEAR(r.stages[0].dp_exposed, 2.0, kRel);
}

TEST(SimStages, ZeroOneGathersTheUpdatedParametersWholeOrBehindTheNextForward) {
    // one rank of dp 2, zero_stage 1, m 1: forward 2 s, reading [0, 100) at its start and [100, 200) 1 s in;
    // backward 2 s, finishing every gradient at its end. Shards of 100 elements.
    StepInputs in = equal_stages(ms::ScheduleKind::k1F1B, 1, 1, 1, 2.0, 2.0);
    StageInput& st = in.stages[0];
    st.params = {{0, 100}, {100, 200}};
    st.padded = 200;
    st.chunks[0].params_read = {{0.0, 0, 100}, {1.0, 100, 200}};
    st.chunks[0].grads_final = {{2.0, 0, 200}};
    in.dp.size = 2;
    in.dp.zero_stage = 1;

    // whole: a reduce-scatter of 800 bytes (1 s) after the backward, an all-gather of 800 bytes (1 s) after the
    // optimizer
    in.dp.reduce_whole = in.dp.gather_whole = {0.0, 1.0 / 800};
    SimulatedStep r = ms::sim::simulate_stages(in);
    EXPECT_NEAR(r.step_seconds, 4.0 + 1.0 + 1.0, kRel);
    EXPECT_NEAR(r.stages[0].gather_exposed, 1.0, kRel);

    // buckets of 100, one owner part each, 1 s per reduce and per broadcast: the reduces run from 4 s to 6 s, after
    // the backward; the gathers from the next step's start, [0, 100) until 1 s (read at 0: 1 s late), [100, 200)
    // until 2 s (read at 1 s: 1 s late). The step pays 2 s of reduction and 1 s of waiting for parameters.
    in.dp.bucket_elems = 100;
    in.dp.param_gather_overlap = true;
    in.dp.reduce_bucket = in.dp.gather_part = {0.0, 1.0 / 400};
    r = ms::sim::simulate_stages(in);
    EXPECT_NEAR(r.stages[0].dp_exposed, 2.0, kRel);
    EXPECT_NEAR(r.stages[0].gather_total, 2.0, kRel);
    EXPECT_NEAR(r.stages[0].gather_exposed, 1.0, kRel);
    EXPECT_NEAR(r.step_seconds, 4.0 + 2.0 + 1.0, kRel);
}

TEST(SimStep, OneRankIsTheSumOfItsOpsTheOptimizerAndTheZeroing) {
    // 2 layers, 3 micro-batches of 2 sequences. GPT's matmuls per micro-batch: per layer qkv, attention projection,
    // fc (+ GELU), mlp projection: 4 L = 8 forward and 8 backward, 1 ms each (the LM head is fused with its loss at
    // tp 1, model.cross_entropy_loss_fusion, and is no matmul op).
    const ms::RunLayout l = ms::make_run_layout(small(2, {"training.global_batch_size=6"}), 1);
    ASSERT_EQ(l.num_microbatches, 3);
    ms::test::HandCostModel cost;
    cost.matmul_s = 1e-3;
    cost.optimizer_s_per_elem = 1e-9;
    cost.memory_s_per_byte = 1e-10;
    const SimulatedStep r = ms::sim::simulate_step(l, cost, ms::nodes_by_count(1, 1));
    // every parameter's numel is a multiple of 16 here, so the flat buffer is the parameter count
    const int64_t padded = ms::padded_flat_size(l.num_parameters, 1);
    const double expected = 3 * 16 * 1e-3 + static_cast<double>(padded) * (1e-9 + 4 * 1e-10);
    EXPECT_NEAR(r.step_seconds, expected, expected * kRel);
    EXPECT_NEAR(r.bubble_fraction, 0.0, kRel);
    EXPECT_EQ(r.comm_total_seconds, 0.0);
    // tokens and MFU: 6 sequences of 32 tokens per step
    EXPECT_NEAR(r.tokens_per_s, 6 * 32 / expected, 6 * 32 / expected * kRel);
    const double flops = ms::gpt_train_flops_per_token(l.shape, 32) * r.tokens_per_s;
    EXPECT_NEAR(r.mfu, flops / cost.peak, r.mfu * kRel);
    ASSERT_EQ(r.stages.size(), 1u);
    EXPECT_GT(r.stages[0].memory_bytes, 0);
}

TEST(SimStep, PureDataParallelAddsTheRingAllReduce) {
    // dp 4 on one node, every op free: the step is the gradient all-reduce, 2 (p - 1) / p n / beta + 2 (p - 1) alpha,
    // and the scalar all-reduces (world, dp twice; pp and mp are groups of one): 3 (2 (p - 1) alpha + 6 / 4 x 4 B /
    // beta)
    const ms::RunLayout l = ms::make_run_layout(small(2), 4);
    ASSERT_EQ(l.dp(), 4);
    ms::test::HandCostModel cost;
    cost.intra = {1e-5, 1e9};
    const SimulatedStep r = ms::sim::simulate_step(l, cost, ms::nodes_by_count(4, 4));
    const double n = 4.0 * static_cast<double>(ms::padded_flat_size(l.num_parameters, 4));
    const double all_reduce = 2.0 * 3 / 4 * n / 1e9 + 2 * 3 * 1e-5;
    const double scalars = 3 * (2 * 3 * 1e-5 + 2.0 * 3 / 4 * 4 / 1e9);
    EXPECT_NEAR(r.stages[0].dp_total, all_reduce, all_reduce * kRel);
    EXPECT_NEAR(r.stages[0].dp_exposed, all_reduce, all_reduce * kRel);
    EXPECT_NEAR(r.step_seconds, all_reduce + scalars, (all_reduce + scalars) * kRel);

    // across two nodes of 2 the ring is paced by its inter-node hops (beta 1e8); hierarchical_dp off: flat
    const ms::RunLayout flat = ms::make_run_layout(small(2, {"parallel.hierarchical_dp=off"}), 4);
    const SimulatedStep x = ms::sim::simulate_step(flat, cost, ms::nodes_by_count(4, 2));
    const double inter = 2.0 * 3 / 4 * n / 1e8;
    EXPECT_NEAR(x.stages[0].dp_total, inter, inter * kRel);

    // hierarchical (auto, MPI): reduce-scatter in the node of 2, all-reduce over 2 nodes on n / 2, all-gather
    const SimulatedStep h = ms::sim::simulate_step(l, cost, ms::nodes_by_count(4, 2));
    const double hier = (1e-5 + n / 2 / 1e9) + (2 * 0.0 + 2.0 / 2 * (n / 2) / 1e8) + (1e-5 + n / 2 / 1e9);
    EXPECT_NEAR(h.stages[0].dp_total, hier, hier * kRel);

    // a measured reduction rate (2e9 B/s) adds the (p - 1) n / p bytes each rank sums, to the gradient's all-reduce
    // and to the scalars'
    cost.intra.reduce_bytes_per_s = 2e9;
    const SimulatedStep reducing = ms::sim::simulate_step(l, cost, ms::nodes_by_count(4, 4));
    const double summed = all_reduce + 3.0 / 4 * n / 2e9;
    EXPECT_NEAR(reducing.stages[0].dp_total, summed, summed * kRel);
    const double summed_scalars = scalars + 3 * (3.0 / 4 * 4 / 2e9);
    EXPECT_NEAR(reducing.step_seconds, summed + summed_scalars, (summed + summed_scalars) * kRel);
}

TEST(SimStep, TensorParallelAllReducesAreOnTheCriticalPath) {
    // tp 2, 1 layer, one micro-batch of N = 2 x 32 rows, every op free: the step is the tp collectives (2 ranks:
    // 2 alpha + n / beta each) and the scalars. All-reduces of N x C fp32 (n = 16 KiB): forward the embedding's and
    // the two row-parallel outputs; backward the two column-parallel inputs' copies and the LM head's input: 6.
    // The cross-entropy's statistics: the row maxima (N floats) and the sums (2 N floats).
    const ms::RunLayout l =
        ms::make_run_layout(small(1, {"parallel.tensor_model_parallel_size=2", "training.micro_batch_size=2"}), 2);
    ASSERT_EQ(l.tp(), 2);
    ms::test::HandCostModel cost;
    cost.intra = {1e-6, 1e9};
    const SimulatedStep r = ms::sim::simulate_step(l, cost, ms::nodes_by_count(2, 2));
    const double N = 2 * 32, alpha = 1e-6, beta = 1e9;
    const auto ar = [&](double bytes) { return 2 * alpha + bytes / beta; };
    const double tp = 6 * ar(N * 64 * 4) + ar(N * 4) + ar(2 * N * 4);
    const double scalars = 2 * ar(4);  // world and mp (tp x pp); pp and dp are groups of one
    EXPECT_NEAR(r.stages[0].tp_comm, tp, tp * kRel);
    EXPECT_NEAR(r.step_seconds, tp + scalars, (tp + scalars) * kRel);
    EXPECT_NEAR(r.comm_exposed_seconds, tp + scalars, (tp + scalars) * kRel);
}

TEST(SimStep, TwoStagesSendActivationsAndSumTheTiedEmbedding) {
    // pp 2, 2 layers, one micro-batch, 1F1B; matmuls 1 ms each. Each stage a layer: 4 matmuls each way (the head
    // on stage 1 is fused with its loss). Messages of B T C fp32 = 16 KiB: alpha + n / beta. After the backward the
    // first and last stage all-reduce the tied wte's gradient (Vp x C fp32); then the scalars over world, pp and mp (2
    // ranks each).
    const ms::RunLayout l = ms::make_run_layout(small(2, {"parallel.pipeline_model_parallel_size=2"}), 2);
    ms::test::HandCostModel cost;
    cost.matmul_s = 1e-3;
    cost.intra = {1e-6, 1e9};
    const SimulatedStep r = ms::sim::simulate_step(l, cost, ms::nodes_by_count(2, 2));
    const double alpha = 1e-6, beta = 1e9;
    const double message = alpha + 2 * 32 * 64 * 4 / beta;
    const double wte = 2 * alpha + 128 * 64 * 4 / beta;
    const double scalars = 3 * (2 * alpha + 4 / beta);
    const double expected = 4e-3 + message + 4e-3 + 4e-3 + message + 4e-3 + wte + scalars;
    EXPECT_NEAR(r.step_seconds, expected, expected * kRel);
    EXPECT_NEAR(r.stages[0].embd, wte, wte * kRel);
    // each stage idles while the other runs: busy 8 ms of a 16 ms + 2 messages schedule
    const double pipeline = 16e-3 + 2 * message;
    EXPECT_NEAR(r.pipeline_seconds, pipeline, pipeline * kRel);
    EXPECT_NEAR(r.bubble_fraction, 1 - 8e-3 / pipeline, kRel);
}

TEST(SimStep, CachedChunksGiveTheSameStep) {
    // pp 2 x vpp 2 over 4 layers, overlap_grad_reduce in small buckets: a cache shares the chunks of equal depth and
    // ends (and a second layout's), shifted to each chunk's offsets
    const ms::RunLayout l = ms::make_run_layout(
        small(4, {"parallel.pipeline_model_parallel_size=2", "parallel.virtual_pipeline_model_parallel_size=2",
                  "parallel.pipeline_schedule=interleaved_1f1b", "training.global_batch_size=8",
                  "parallel.overlap_grad_reduce=true", "parallel.bucket_size=4096"}),
        4);
    ms::test::HandCostModel cost;
    cost.matmul_s = 1e-3;
    cost.other_s = 1e-4;
    cost.intra = {1e-6, 1e9};
    const ms::NodeLayout nodes = ms::nodes_by_count(4, 2);
    const SimulatedStep plain = ms::sim::simulate_step(l, cost, nodes);
    ms::sim::ChunkCostCache cache;
    ms::sim::simulate_step(l, cost, nodes, &cache);
    const SimulatedStep cached = ms::sim::simulate_step(l, cost, nodes, &cache);
    EXPECT_EQ(cached.step_seconds, plain.step_seconds);
    EXPECT_EQ(cached.comm_exposed_seconds, plain.comm_exposed_seconds);
    for (size_t s = 0; s < plain.stages.size(); ++s) {
        EXPECT_EQ(cached.stages[s].dp_exposed, plain.stages[s].dp_exposed);
        EXPECT_GT(plain.stages[s].buckets, 1);
    }
}

TEST(SimStep, PlanSimulateWithoutACostModelSaysHowToMakeOne) {
    ms::PlanOptions o;
    o.simulate = true;
    try {
        ms::run_plan(small(1), o);
        ADD_FAILURE() << "no UserError";
    } catch (const ms::UserError& e) {
        EXPECT_NE(std::string(e.what()).find("mindspeed-train calibrate"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("--device"), std::string::npos) << e.what();
    }
}

}  // namespace
