// test_gpt_graph_tp.cpp: the GPT-2 op graph (engine/model/gpt_graph.h) under tensor parallelism, with and without
// sequence parallelism, against the hand-written Gpt on the same tensor-parallel group of 2 (world ranks paired):
// the graph's collectives (the derived backward's all-reduces, all-gathers and reduce-scatters, the vocab-parallel
// cross-entropy's statistics) are the same calls on the same buffers' contents, so the loss and every gradient,
// after finish_gradients(), agree bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/gpt_graph.h"
#include "tests/comm/comm_test.h"
#include "tests/model/gpt_test_util.h"

namespace ms::test {
namespace {

void check_tp(bool sequence_parallel, DType dtype) {
    if (world().size() % 2 != 0) GTEST_SKIP() << "needs an even world";
    SCOPED_TRACE(std::string(sequence_parallel ? "sp " : "") + std::string(dtype_name(dtype)));
    std::unique_ptr<Communicator> tp = world().split(world().rank() / 2, world().rank(), "tp");
    const GptShape s = tiny_shape();
    auto be = make_cpu_backend(OpMode::kFast);
    Gpt::Options go;
    go.max_batch = 2;
    go.dtype = dtype;
    go.sequence_parallel = sequence_parallel;
    Gpt gpt(s, *be, *tp, go);
    gpt.init_weights(7);
    gpt.zero_grads();
    std::vector<float> grads(static_cast<size_t>(gpt.flat_size()), 0.0f);
    GptProgram::Options po;
    po.max_batch = 2;
    po.dtype = dtype;
    po.sequence_parallel = sequence_parallel;
    po.params = gpt.params();
    po.weights = gpt.weights();
    po.grads = grads.data();
    GptProgram program(s, *be, *tp, po);
    // the full micro-batch and a smaller one (eval's last batch, generation): the target logits follow the call's
    // row count, and the tp all-reduce of the statistics must cover them
    for (auto [B, T] : {std::pair{2, 16}, std::pair{1, 10}}) {
        // the same tokens on both ranks of a tp group
        const auto tokens = random_tokens(B * T, s.V, 5 + B, 0), targets = random_tokens(B * T, s.V, 5 + B, 1);
        const float a = gpt.forward(tokens.data(), targets.data(), B, T);
        const float b = program.forward(tokens.data(), targets.data(), B, T);
        EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << a << " vs " << b << " at B " << B << " T " << T;
        gpt.backward(1.0f);
        program.backward(1.0f);
    }
    gpt.finish_gradients();
    program.finish_gradients();
    EXPECT_EQ(std::memcmp(gpt.grads(), grads.data(), grads.size() * sizeof(float)), 0);
}

TEST(GptGraphTensorParallel, BitIdenticalToGpt) { check_tp(false, DType::kF32); }
TEST(GptGraphTensorParallel, SequenceParallelBitIdenticalToGpt) { check_tp(true, DType::kF32); }
TEST(GptGraphTensorParallel, SequenceParallelBf16BitIdenticalToGpt) { check_tp(true, DType::kBF16); }

}  // namespace
}  // namespace ms::test
