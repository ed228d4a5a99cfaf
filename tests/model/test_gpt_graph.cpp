// test_gpt_graph.cpp: GPT-2 built as an op graph (engine/model/gpt_graph.h) against the hand-written Gpt
// (engine/model/gpt.h): the same backend calls on the same inputs, so losses, parameter gradients and pipeline
// hand-offs are compared bit for bit (memcmp) in fp32, bf16 and fp16; and the graph's own structure: the backward
// derived from the forward, what the fusion pass did, and a memory plan that no two live tensors share.
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <optional>
#include <vector>

#include "engine/graph/memory_plan.h"
#include "engine/model/gpt_graph.h"
#include "tests/model/gpt_test_util.h"

namespace ms::test {
namespace {

bool same_bits(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

// A Gpt chunk and a GptProgram over the same weights (the Gpt's), each with its own gradients.
struct Pair {
    Pair(const GptShape& s, Backend& be, DType dtype, const GptPart& part, int max_batch, int slots = 1) {
        Gpt::Options go;
        go.max_batch = max_batch;
        go.part = part;
        go.num_slots = slots;
        go.dtype = dtype;
        gpt = std::make_unique<Gpt>(s, be, tp_self(), go);
        gpt->init_weights(42);
        gpt->zero_grads();
        grads.assign(static_cast<size_t>(gpt->flat_size()), 0.0f);
        GptProgram::Options po;
        po.max_batch = max_batch;
        po.num_slots = slots;
        po.part = part;
        po.dtype = dtype;
        po.params = gpt->params();
        po.weights = gpt->weights();
        po.grads = grads.data();
        program = std::make_unique<GptProgram>(s, be, tp_self(), po);
    }
    bool same_grads() const { return same_bits(gpt->grads(), grads.data(), grads.size() * sizeof(float)); }
    std::unique_ptr<Gpt> gpt;
    std::vector<float> grads;
    std::unique_ptr<GptProgram> program;
};

class GptGraphOneRank : public ::testing::TestWithParam<DType> {};

TEST_P(GptGraphOneRank, LossesAndGradientsAreBitIdenticalToGpt) {
    const DType dtype = GetParam();
    const GptShape s = tiny_shape();
    auto be = make_cpu_backend(OpMode::kFast);
    Pair p(s, *be, dtype, GptPart{}, 4);
    const float scale = dtype == DType::kF16 ? 1024.0f : 1.0f;
    // two micro-batches of different shapes (the second smaller than the plan's), accumulated into the gradients
    for (auto [B, T, seed] : {std::tuple{4, 16, 1}, std::tuple{3, 13, 2}}) {
        const auto tokens = random_tokens(B * T, s.V, seed, 0), targets = random_tokens(B * T, s.V, seed, 1);
        const float a = p.gpt->forward(tokens.data(), targets.data(), B, T);
        const float b = p.program->forward(tokens.data(), targets.data(), B, T);
        EXPECT_TRUE(same_bits(&a, &b, sizeof a)) << "loss " << a << " vs " << b << " at B " << B << " T " << T;
        EXPECT_TRUE(same_bits(p.gpt->losses(), p.program->losses(), static_cast<size_t>(B * T) * sizeof(float)));
        EXPECT_TRUE(
            same_bits(p.gpt->logits_tensor().data, p.program->logits_tensor().data, p.gpt->logits_tensor().bytes()));
        p.gpt->backward(scale);
        p.program->backward(scale);
        EXPECT_TRUE(p.same_grads()) << "gradients differ after the micro-batch B " << B << " T " << T;
    }
    // logits only (eval): no targets
    const auto tokens = random_tokens(2 * 16, s.V, 3, 0);
    p.gpt->forward(tokens.data(), nullptr, 2, 16);
    p.program->forward(tokens.data(), nullptr, 2, 16);
    EXPECT_TRUE(
        same_bits(p.gpt->logits_tensor().data, p.program->logits_tensor().data, p.gpt->logits_tensor().bytes()));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GptGraphOneRank, ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Two pipeline chunks (embedding + layer 0, layer 1 + head) with two activation slots: the hand-offs, the input
// gradient and every gradient as Gpt's.
TEST(GptGraph, PipelineChunksAreBitIdenticalToGpt) {
    const GptShape s = tiny_shape();
    auto be = make_cpu_backend(OpMode::kFast);
    const GptPart first{.first_layer = 0, .num_layers = 1, .embedding = true, .head = false};
    const GptPart last{.first_layer = 1, .num_layers = 1, .embedding = false, .head = true};
    Pair a(s, *be, DType::kF32, first, 2, 2), b(s, *be, DType::kF32, last, 2, 2);
    const int B = 2, T = 16;
    const size_t act_bytes = static_cast<size_t>(B * T * s.C) * sizeof(float);
    std::vector<std::vector<int32_t>> tokens, targets;
    for (int m = 0; m < 2; ++m) {
        tokens.push_back(random_tokens(B * T, s.V, 10 + m, 0));
        targets.push_back(random_tokens(B * T, s.V, 10 + m, 1));
        a.gpt->forward(tokens[m].data(), nullptr, B, T, m);
        a.program->forward(tokens[m].data(), nullptr, B, T, m);
        ASSERT_TRUE(same_bits(a.gpt->output(m), a.program->output(m), act_bytes)) << "micro-batch " << m;
        std::memcpy(b.gpt->input(m), a.gpt->output(m), act_bytes);
        std::memcpy(b.program->input(m), a.program->output(m), act_bytes);
        const float la = b.gpt->forward(nullptr, targets[m].data(), B, T, m);
        const float lb = b.program->forward(nullptr, targets[m].data(), B, T, m);
        EXPECT_TRUE(same_bits(&la, &lb, sizeof la)) << la << " vs " << lb;
    }
    for (int m = 1; m >= 0; --m) {  // backward in the other order, as 1F1B may
        b.gpt->backward(1.0f, m);
        b.program->backward(1.0f, m);
        ASSERT_TRUE(same_bits(b.gpt->grad_input(m), b.program->grad_input(m), act_bytes)) << "micro-batch " << m;
        std::memcpy(a.gpt->grad_output(m), b.gpt->grad_input(m), act_bytes);
        std::memcpy(a.program->grad_output(m), b.program->grad_input(m), act_bytes);
        a.gpt->backward(1.0f, m);
        a.program->backward(1.0f, m);
    }
    EXPECT_TRUE(a.same_grads());
    EXPECT_TRUE(b.same_grads());
}

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

// Every tensor two ops of one call touch at once lives in its own bytes, at every step of a 5-layer chunk's
// forward and backward (the plan is made from the first two layers; the check walks all five).
TEST(GptGraph, PlanHoldsForEveryLayer) {
    GptShape s = tiny_shape();
    s.L = 5;
    for (bool head : {true, false}) {
        const GptPart part{.first_layer = 0, .num_layers = 5, .embedding = true, .head = head};
        const GptGraphSpec spec{.shape = s, .part = part, .B = 2, .T = 16};
        const GptGraph gg = build_gpt_graph(spec, gpt_param_table(s, 1, part));
        const graph::Graph& g = gg.g;
        const graph::MemoryPlan plan = plan_gpt_memory(s, part, 1, 2, false, DType::kF32);
        // lifetimes of every tensor over the whole graph, as BufferRequests at the plan's offsets
        for (graph::MemGroup group : {graph::MemGroup::kSlot, graph::MemGroup::kScratch}) {
            std::vector<BufferRequest> requests;
            Plan placed;
            for (size_t t = 0; t < g.tensors.size(); ++t) {
                const graph::MemoryPlan::Place p = plan.place(g, static_cast<graph::TensorId>(t));
                if (p.group != group) continue;
                int first = INT_MAX, last = -1;
                for (size_t i = 0; i < g.nodes.size(); ++i) {
                    for (const auto* list : {&g.nodes[i].in, &g.nodes[i].out}) {
                        for (graph::TensorId x : *list) {
                            if (x != static_cast<graph::TensorId>(t)) continue;
                            first = std::min(first, static_cast<int>(i));
                            last = std::max(last, static_cast<int>(i));
                        }
                    }
                }
                const graph::Role role = g.tensors[t].role;  // the host's inputs and outputs, before and after
                if (role == graph::Role::kInput) first = 0;
                if (role == graph::Role::kOutput || role == graph::Role::kGradInput)
                    last = static_cast<int>(g.nodes.size());
                requests.push_back({g.tensors[t].name, static_cast<size_t>(g.tensors[t].bytes()), first, last, -1});
                placed.offsets.push_back(p.offset);
            }
            placed.total_bytes = group == graph::MemGroup::kSlot ? plan.slot_bytes() : plan.scratch_bytes();
            EXPECT_EQ(find_plan_violation(requests, placed, graph::kMemoryAlign), std::nullopt) << "head " << head;
        }
    }
}

}  // namespace
}  // namespace ms::test
