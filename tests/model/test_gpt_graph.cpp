// test_gpt_graph.cpp: GPT-2's op graph (engine/model/gpt_graph.h) itself: the backward derived from the forward,
// what the fusion pass did, and where the memory plan puts tensors. (What the graph computes is what every model,
// parallel and end-to-end test checks: Gpt runs it.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "engine/graph/memory_plan.h"
#include "engine/model/gpt_graph.h"
#include "tests/model/gpt_test_util.h"

namespace ms::test {
namespace {

// The backward is derived (one backward op per differentiable forward op, in reverse), the fusion pass makes the
// fused ops Gpt calls, and the plan is legal.
TEST(GptGraph, StructureFusionAndPlan) {
    const GptShape s = tiny_shape();  // L = 2
    GptGraphSpec spec{.shape = s, .B = 2, .T = 16};
    const GptGraph gg = build_gpt_graph(spec, gpt_param_table(s));
    const graph::Graph& g = gg.g;
    auto count = [&](graph::OpCode op) {
        int n = 0;
        for (const graph::Node& node : g.nodes) n += node.op == op;
        return n;
    };
    using graph::OpCode;
    // residual adds: 2 per layer, each fused into the LayerNorm after it (the next ln_1, ln_2, ln_f)
    EXPECT_EQ(count(OpCode::kResidual), 0);
    EXPECT_EQ(count(OpCode::kResidualLayerNorm), 2 * s.L);
    EXPECT_EQ(count(OpCode::kLayerNorm), 1);  // the first ln_1 reads the embedding
    EXPECT_EQ(count(OpCode::kMatmulGelu), s.L);
    EXPECT_EQ(count(OpCode::kGelu) + count(OpCode::kGeluBackward) + count(OpCode::kBiasGradient), 0);
    EXPECT_EQ(count(OpCode::kMatmul), 3 * s.L + 1);  // c_attn, attn.c_proj, mlp.c_proj per layer; the head
    EXPECT_EQ(count(OpCode::kMatmulBackward), 4 * s.L + 1);
    EXPECT_EQ(count(OpCode::kLayerNormBackward), 2 * s.L + 1);
    EXPECT_EQ(gg.fusion.steps.size(), static_cast<size_t>(2 * s.L + s.L + s.L + 2 * s.L));
    // every row-parallel bias gradient went into its matmul_backward
    int with_bias = 0;
    for (const graph::Node& n : g.nodes) with_bias += n.op == OpCode::kMatmulBackward && n.out[2] != graph::kNoTensor;
    EXPECT_EQ(with_bias, 4 * s.L);
    const graph::MemoryPlan plan = plan_gpt_memory(s, GptPart{}, 1, 2, false, DType::kF32);
    EXPECT_FALSE(find_plan_violation(plan.slot_requests, plan.slot, graph::kMemoryAlign).has_value());
    EXPECT_FALSE(find_plan_violation(plan.scratch_requests, plan.scratch, graph::kMemoryAlign).has_value());
    for (int phase = 0; phase < 2; ++phase)
        EXPECT_FALSE(
            find_plan_violation(plan.layer_scratch_requests[phase], plan.layer_scratch[phase], graph::kMemoryAlign)
                .has_value());
    // saved activations are kept in the slot, each layer its own; the MLP's input gradient before the GELU never
    // exists
    auto place = [&](const char* name) { return plan.place(g, g.find(name)); };
    EXPECT_EQ(place("h.0.qkv").group, graph::MemGroup::kSlot);
    EXPECT_EQ(place("h.1.qkv").offset - place("h.0.qkv").offset, plan.kinds[0].slot_bytes);
    EXPECT_EQ(place("d.h.0.qkv").group, graph::MemGroup::kScratch);
    EXPECT_EQ(place("d.h.0.qkv").offset, place("d.h.1.qkv").offset);
    EXPECT_EQ(place("d.h.0.fch_gelu").group, graph::MemGroup::kNone);
}

// Each program says before which step each parameter is first read (parallel.overlap_param_gather waits there):
// with the parameters NaN until the callback puts them back, a forward and a backward give the loss and gradients of
// untouched ones, bit for bit, and each program names every parameter once -- with recomputation too, whose
// backward reads parameters again.
TEST(GptGraph, ProgramsSayBeforeWhichStepEachParameterIsFirstRead) {
    GptShape s = tiny_shape();
    s.L = 3;
    auto be = make_cpu_backend(OpMode::kFast);
    for (const graph::RecomputeGranularity rc :
         {graph::RecomputeGranularity::kNone, graph::RecomputeGranularity::kFull}) {
        Gpt::Options o;
        o.max_batch = 2;
        o.graph.recompute.granularity = rc;
        Gpt model(s, *be, tp_self(), o);
        model.init_weights(4);
        const auto tokens = random_tokens(2 * s.T, s.V, 20, 0);
        const auto targets = random_tokens(2 * s.T, s.V, 20, 1);
        model.zero_grads();
        const float want_loss = model.forward(tokens.data(), targets.data(), 2, s.T);
        model.backward(0);
        const int64_t n = model.flat_size();
        const std::vector<float> want_grads(model.grads_f32(), model.grads_f32() + n);
        const std::vector<float> saved(model.params(), model.params() + n);

        std::vector<graph::GradRange> named;
        const graph::ParamsNeededFn restore = [&](std::span<const graph::GradRange> ranges) {
            for (const graph::GradRange& r : ranges) {
                named.push_back(r);
                std::copy(saved.begin() + r.begin, saved.begin() + r.end, model.params() + r.begin);
            }
        };
        model.set_params_needed(&restore);
        const auto poison = [&] { std::fill(model.params(), model.params() + n, std::nanf("")); };
        const auto each_once = [&](const char* phase) {
            const std::vector<ParamInfo>& table = model.params_info();
            EXPECT_EQ(named.size(), table.size()) << phase;
            for (const ParamInfo& p : table) {
                EXPECT_EQ(std::count(named.begin(), named.end(), graph::GradRange{p.offset, p.offset + p.numel}), 1)
                    << phase << " " << p.name;
            }
            named.clear();
        };
        model.zero_grads();
        poison();
        EXPECT_EQ(model.forward(tokens.data(), targets.data(), 2, s.T), want_loss);
        each_once("forward");
        poison();
        model.backward(0);
        EXPECT_EQ(std::memcmp(model.grads_f32(), want_grads.data(), static_cast<size_t>(n) * sizeof(float)), 0);
        EXPECT_LE(named.size(), model.params_info().size());  // what the backward reads again
        named.clear();
        model.set_params_needed(nullptr);
    }
}

}  // namespace
}  // namespace ms::test

namespace ms::test {
namespace {

// The fused LM head (model.cross_entropy_loss_fusion) against the ops as written, on the same weights and batches.
struct FusedAgainstUnfused {
    float loss_diff = 0;   // |fused - unfused| / |unfused|
    double grad_diff = 0;  // max |fused - unfused| over all gradients / max |unfused|
};
FusedAgainstUnfused compare_fused_head(DType dtype, const GptShape& s, int B) {
    auto be = make_cpu_backend(OpMode::kFast);
    std::unique_ptr<Gpt> model[2];
    for (int fused = 0; fused < 2; ++fused) {
        Gpt::Options o;
        o.max_batch = B;
        o.dtype = dtype;
        o.graph.lm_head_loss_fusion = fused == 1;
        model[fused] = std::make_unique<Gpt>(s, *be, tp_self(), o);
        model[fused]->init_weights(5);
        model[fused]->zero_grads();
    }
    const float scale = dtype == DType::kF16 ? 1024.0f : 1.0f;
    const auto tokens = random_tokens(B * s.T, s.V, 6, 0), targets = random_tokens(B * s.T, s.V, 6, 1);
    float loss[2];
    for (int f = 0; f < 2; ++f) {
        loss[f] = model[f]->forward(tokens.data(), targets.data(), B, s.T, 0, scale);
        model[f]->backward();
    }
    FusedAgainstUnfused r;
    r.loss_diff = std::abs(loss[1] - loss[0]) / std::abs(loss[0]);
    double worst = 0, largest = 0;
    for (int64_t i = 0; i < model[0]->flat_size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::abs(model[1]->grads_f32()[i] - model[0]->grads_f32()[i])));
        largest = std::max(largest, static_cast<double>(std::abs(model[0]->grads_f32()[i])));
    }
    r.grad_diff = worst / largest;
    return r;
}

// Tolerances: 10x what this test measured on an AMD EPYC (OpenBLAS Cooperlake kernel), 4 x 128 rows in two chunks of
// the CPU's 256: the loss bit-identical in every dtype; the gradients' largest difference relative to the largest
// gradient 0 in fp32, 4e-6 in bf16 and 6.7e-5 in fp16 (the head's weight gradient rounds dlogits to 16 bits and sums
// the chunks' products one after the other).
TEST(GptGraph, FusedLmHeadMatchesTheOpsAsWritten) {
    GptShape s = tiny_shape();
    s.T = 128;  // 4 x 128 rows: two chunks of the CPU's 256
    const std::pair<DType, double> cases[] = {{DType::kF32, 1e-6}, {DType::kBF16, 4e-5}, {DType::kF16, 7e-4}};
    for (const auto& [dtype, tolerance] : cases) {
        const FusedAgainstUnfused r = compare_fused_head(dtype, s, 4);
        EXPECT_LE(r.loss_diff, 1e-6) << dtype_name(dtype);
        EXPECT_LE(r.grad_diff, tolerance) << dtype_name(dtype);
    }
    // the graph has the fused op and no logits; the plan holds a chunk of logits instead of all of them
    GptGraphSpec spec{.shape = s, .B = 4, .T = s.T};
    spec.options.lm_head_loss_fusion = true;
    const GptGraph fused = build_gpt_graph(spec, gpt_param_table(s));
    int lm_head = 0;
    for (const graph::Node& n : fused.g.nodes) lm_head += n.op == graph::OpCode::kLmHeadLoss;
    EXPECT_EQ(lm_head, 1);
    const graph::MemoryPlan with = plan_gpt_memory(s, GptPart{}, 1, 4, false, DType::kF32, spec.options);
    const graph::MemoryPlan without = plan_gpt_memory(s, GptPart{}, 1, 4, false, DType::kF32);
    EXPECT_EQ(with.place(fused.g, fused.g.find("logits")).group, graph::MemGroup::kNone);
    EXPECT_LT(with.slot_bytes(), without.slot_bytes() - static_cast<size_t>(4 * s.T * s.Vp * 4) / 2);
}

// A forward no backward follows (loss_scale 0: evaluation) computes the same loss and no gradient.
TEST(GptGraph, FusedLmHeadEvaluationLeavesTheGradients) {
    GptShape s = tiny_shape();
    auto be = make_cpu_backend(OpMode::kFast);
    Gpt::Options o;
    o.max_batch = 2;
    o.graph.lm_head_loss_fusion = true;
    Gpt model(s, *be, tp_self(), o);
    model.init_weights(3);
    model.zero_grads();
    const auto tokens = random_tokens(2 * s.T, s.V, 8, 0), targets = random_tokens(2 * s.T, s.V, 8, 1);
    const float eval = model.forward(tokens.data(), targets.data(), 2, s.T, 0, 0.0f);
    for (int64_t i = 0; i < model.flat_size(); ++i) ASSERT_EQ(model.grads_f32()[i], 0.0f) << i;
    EXPECT_DEATH(model.backward(), "without a forward");
    const float train = model.forward(tokens.data(), targets.data(), 2, s.T, 0, 1.0f);
    EXPECT_EQ(eval, train);
}

}  // namespace
}  // namespace ms::test

namespace ms::test {
namespace {

graph::RecomputeOptions recompute_of(graph::RecomputeGranularity g, graph::RecomputeMethod m, int n) {
    graph::RecomputeOptions o;
    o.granularity = g;
    o.method = m;
    o.num_layers = n;
    return o;
}

// Recomputation runs the same deterministic ops on the same inputs: loss and every gradient bit-identical to keeping
// everything, in fp32 and bf16, over two micro-batches of two slots; and the plan keeps less. GPT and Llama (whose
// RoPE rotates the recomputed qkv in place again).
TEST(GptGraph, RecomputationIsBitIdenticalAndKeepsLess) {
    using G = graph::RecomputeGranularity;
    using M = graph::RecomputeMethod;
    const graph::RecomputeOptions cases[] = {
        recompute_of(G::kNone, M::kUniform, 1), recompute_of(G::kSelective, M::kUniform, 1),
        recompute_of(G::kFull, M::kBlock, 2), recompute_of(G::kFull, M::kUniform, 1)};
    auto be = make_cpu_backend(OpMode::kFast);
    for (GptShape s : {tiny_shape(), tiny_llama_shape()})
        for (DType dtype : {DType::kF32, DType::kBF16}) {
            s.L = 3;
            std::vector<float> loss_of[4];
            std::vector<std::vector<float>> grads_of(4);
            size_t slot_of[4];
            for (int c = 0; c < 4; ++c) {
                Gpt::Options o;
                o.max_batch = 2;
                o.num_slots = 2;
                o.dtype = dtype;
                o.graph.recompute = cases[c];
                Gpt model(s, *be, tp_self(), o);
                model.init_weights(4);
                model.zero_grads();
                for (int mb = 0; mb < 2; ++mb) {
                    const auto tokens = random_tokens(2 * s.T, s.V, 20 + mb, 0);
                    const auto targets = random_tokens(2 * s.T, s.V, 20 + mb, 1);
                    loss_of[c].push_back(model.forward(tokens.data(), targets.data(), 2, s.T, mb, 0.5f));
                }
                model.backward(1);
                model.backward(0);
                grads_of[c].assign(model.grads_f32(), model.grads_f32() + model.flat_size());
                slot_of[c] = plan_gpt_memory(s, GptPart{}, 1, 2, false, dtype, o.graph).slot_bytes();
            }
            for (int c = 1; c < 4; ++c) {
                const std::string what =
                    fmt::format("case {} {} {}", c, s.arch == ModelArch::kLlama ? "llama" : "gpt", dtype_name(dtype));
                EXPECT_EQ(loss_of[c], loss_of[0]) << what;
                EXPECT_EQ(std::memcmp(grads_of[c].data(), grads_of[0].data(), grads_of[0].size() * sizeof(float)), 0)
                    << what;
                EXPECT_LT(slot_of[c], slot_of[c - 1]) << what;
            }
        }
}

// Every tensor of every program Gpt may compile (a training micro-batch, an evaluation, the logits of generation's
// growing window) lies inside its block, with and without recomputation and the fused head, whichever of the
// training plan and the logits-only plan sizes the blocks.
TEST(GptGraph, EveryProgramsTensorsLieInsideTheirBlocks) {
    GptShape s = tiny_shape();
    s.L = 3;
    using G = graph::RecomputeGranularity;
    using M = graph::RecomputeMethod;
    for (const graph::RecomputeOptions& rc :
         {recompute_of(G::kNone, M::kUniform, 1), recompute_of(G::kSelective, M::kUniform, 1),
          recompute_of(G::kFull, M::kUniform, 1), recompute_of(G::kFull, M::kBlock, 2)}) {
        for (const bool fused : {false, true}) {
            GptGraphOptions options;
            options.lm_head_loss_fusion = fused;
            options.recompute = rc;
            const int max_batch = 4;
            const graph::MemoryPlan plan = plan_gpt_memory(s, GptPart{}, 1, max_batch, false, DType::kF32, options);
            for (const int B : {1, max_batch}) {
                for (const int T : {1, s.T / 2 + 1, s.T}) {
                    for (const bool with_loss : {true, false}) {
                        const GptGraphSpec spec{.shape = s, .B = B, .T = T, .with_loss = with_loss, .options = options};
                        const graph::Graph g = build_gpt_graph(spec, gpt_param_table(s)).g;
                        const graph::MemoryPlan& p = !with_loss && plan.logits_only ? *plan.logits_only : plan;
                        for (size_t t = 0; t < g.tensors.size(); ++t) {
                            const graph::MemoryPlan::Place at = p.place(g, static_cast<graph::TensorId>(t));
                            if (at.group == graph::MemGroup::kNone) continue;
                            const size_t block =
                                at.group == graph::MemGroup::kSlot ? plan.slot_bytes() : plan.scratch_bytes();
                            EXPECT_LE(at.offset + static_cast<size_t>(g.tensors[t].bytes()), block)
                                << g.tensors[t].name << " B " << B << " T " << T << " loss " << with_loss << " fused "
                                << fused << " recompute " << static_cast<int>(rc.granularity) << "/"
                                << static_cast<int>(rc.method);
                        }
                    }
                }
            }
        }
    }
}

// The backward says when each gradient is final (for the data-parallel buckets): every parameter's exactly once,
// the last layers' before the first ones', and what a gradient holds when it is reported is what it holds at the
// end of the backward, bit for bit (no later op writes it), with the fused head and without, with recomputation.
TEST(GptGraph, BackwardReportsEveryGradientOnceWhenItIsFinal) {
    GptShape s = tiny_shape();
    s.L = 3;
    auto be = make_cpu_backend(OpMode::kFast);
    for (const bool fused : {true, false}) {
        for (const graph::RecomputeGranularity rc :
             {graph::RecomputeGranularity::kNone, graph::RecomputeGranularity::kFull}) {
            Gpt::Options o;
            o.max_batch = 2;
            o.graph.lm_head_loss_fusion = fused;
            o.graph.recompute.granularity = rc;
            Gpt model(s, *be, tp_self(), o);
            model.init_weights(4);
            model.zero_grads();
            const auto tokens = random_tokens(2 * s.T, s.V, 20, 0);
            const auto targets = random_tokens(2 * s.T, s.V, 20, 1);
            model.forward(tokens.data(), targets.data(), 2, s.T);
            std::vector<graph::GradRange> order;
            std::vector<std::vector<float>> at_report;
            const graph::GradsFinalFn record = [&](std::span<const graph::GradRange> ranges) {
                for (const graph::GradRange& r : ranges) {
                    order.push_back(r);
                    at_report.emplace_back(model.grads_f32() + r.begin, model.grads_f32() + r.end);
                }
            };
            model.backward(0, &record);
            const std::vector<ParamInfo>& table = model.params_info();
            ASSERT_EQ(order.size(), table.size()) << fused;
            for (const ParamInfo& p : table) {
                const graph::GradRange want{p.offset, p.offset + p.numel};
                EXPECT_EQ(std::count(order.begin(), order.end(), want), 1) << p.name;
            }
            for (size_t i = 0; i < order.size(); ++i) {
                EXPECT_EQ(std::memcmp(at_report[i].data(), model.grads_f32() + order[i].begin,
                                      at_report[i].size() * sizeof(float)),
                          0)
                    << "gradient at " << order[i].begin << " changed after it was reported final";
            }
            // the first report is of the last layers (ln_f or the last block); the embeddings' (token and position,
            // one op) come last
            const auto wte =
                std::find_if(table.begin(), table.end(), [](const ParamInfo& p) { return p.name == "wte.weight"; });
            ASSERT_NE(wte, table.end());
            const auto wte_at =
                std::find(order.begin(), order.end(), graph::GradRange{wte->offset, wte->offset + wte->numel});
            EXPECT_GE(wte_at - order.begin(), static_cast<std::ptrdiff_t>(order.size()) - 2) << fused;
            EXPECT_GT(order.front().begin, table[table.size() / 2].offset) << fused;
        }
    }
}

}  // namespace
}  // namespace ms::test
