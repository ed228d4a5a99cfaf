// test_gpt_graph.cpp: GPT-2's op graph (engine/model/gpt_graph.h) itself: the backward derived from the forward,
// what the fusion pass did, and where the memory plan puts tensors. (What the graph computes is what every model,
// parallel and end-to-end test checks: Gpt runs it.)
#include <gtest/gtest.h>

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
    EXPECT_EQ(place("h.1.qkv").offset - place("h.0.qkv").offset, plan.layer_slot_bytes);
    EXPECT_EQ(place("d.h.0.qkv").group, graph::MemGroup::kScratch);
    EXPECT_EQ(place("d.h.0.qkv").offset, place("d.h.1.qkv").offset);
    EXPECT_EQ(place("d.h.0.fch_gelu").group, graph::MemGroup::kNone);
}

}  // namespace
}  // namespace ms::test
