// test_gpt_arena.cpp: a model and its optimizer on an arena, frozen for the training steps -- the in-process form
// of the trainer's guard that nothing is allocated inside a step (a frozen arena's allocate() aborts the process).
//
// Two micro-batches run the way a pipeline schedule interleaves them (forward 0, forward 1, backward 0,
// backward 1) in two activation slots that share one scratch block (engine/graph/memory_plan.h); the same
// steps run one micro-batch at a time on a model and optimizer with HostBuffers. Losses, gradient norms and
// parameters after two steps must be bit-identical: the statically planned memory sharing (scratch across slots,
// buffers with disjoint lifetimes inside a slot) loses nothing an in-flight micro-batch still needs.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "comm/self_communicator.h"
#include "engine/model/gpt_graph.h"
#include "engine/optim/distributed_optimizer.h"
#include "memory/arena.h"
#include "tests/model/gpt_test_util.h"

namespace ms {
namespace {

struct Trainee {
    std::unique_ptr<Gpt> model;
    std::unique_ptr<DistributedOptimizer> optimizer;
};

// A whole model with owned parameters padded for dp = 1, and its optimizer; both on `arena` when given.
Trainee make_trainee(const GptShape& s, Backend& backend, Communicator& dp, Communicator& mp, int B, int slots,
                     Arena* arena) {
    Trainee st;
    Gpt::Options o;
    o.max_batch = B, o.num_slots = slots, o.arena = arena;
    const ParamInfo last = gpt_param_table(s).back();
    o.flat_capacity = padded_flat_size(last.offset + last.numel, 1);
    st.model = std::make_unique<Gpt>(s, backend, test::tp_self(), o);
    st.model->init_weights(7);
    OptimizerConfig oc;
    oc.lr = 1e-3f;
    st.optimizer =
        std::make_unique<DistributedOptimizer>(st.model->params_info(), st.model->flat_size(), st.model->params(),
                                               st.model->grads_f32(), oc, 0, backend, dp, mp, 0, arena);
    return st;
}

TEST(GptArena, FrozenInterleavedStepsAllocateNothingAndMatchHostBuffers) {
    const GptShape s = test::tiny_shape();
    constexpr int B = 2, kMicroBatches = 2, kSteps = 2;
    const int64_t N = int64_t{B} * s.T;
    auto backend = test::make_cpu_backend(OpMode::kFast);
    SelfCommunicator dp("dp"), mp("mp");

    Arena arena(size_t{8} << 20, 256, 0, BlockFit::kPacked);
    Trainee on_arena = make_trainee(s, *backend, dp, mp, B, kMicroBatches, &arena);
    Trainee on_host = make_trainee(s, *backend, dp, mp, B, 1, nullptr);
    const graph::MemoryPlan plan = plan_gpt_memory(s, GptPart{}, 1, B, false, DType::kF32);
    EXPECT_EQ(arena.live_bytes(MemCategory::kActivation), kMicroBatches * plan.slot_bytes());
    EXPECT_EQ(arena.live_bytes(MemCategory::kWorkspace), plan.scratch_bytes());
    EXPECT_EQ(arena.live_bytes(MemCategory::kOptimizer), 2 * arena.live_bytes(MemCategory::kParameter));
    const BuddyStats before = arena.stats();

    arena.set_frozen(true);
    std::vector<std::vector<int32_t>> tokens, targets;
    for (int step = 0; step < kSteps; ++step) {
        for (int mb = 0; mb < kMicroBatches; ++mb) {
            tokens.push_back(test::random_tokens(N, s.V, 100 + step, 2 * mb));
            targets.push_back(test::random_tokens(N, s.V, 100 + step, 2 * mb + 1));
        }
    }
    for (int step = 0; step < kSteps; ++step) {
        auto tok = [&](int mb) { return tokens[static_cast<size_t>(step * kMicroBatches + mb)].data(); };
        auto tgt = [&](int mb) { return targets[static_cast<size_t>(step * kMicroBatches + mb)].data(); };
        const float scale = 1.0f / kMicroBatches;
        on_arena.model->zero_grads();
        on_host.model->zero_grads();
        float arena_loss[kMicroBatches], host_loss[kMicroBatches];
        for (int mb = 0; mb < kMicroBatches; ++mb) {
            arena_loss[mb] = on_arena.model->forward(tok(mb), tgt(mb), B, s.T, mb, scale);
        }
        for (int mb = 0; mb < kMicroBatches; ++mb) on_arena.model->backward(mb);
        for (int mb = 0; mb < kMicroBatches; ++mb) {
            host_loss[mb] = on_host.model->forward(tok(mb), tgt(mb), B, s.T, 0, scale);
            on_host.model->backward(0);
        }
        const OptimizerStepResult ra = on_arena.optimizer->step(1e-3f, 1.0f);
        const OptimizerStepResult rh = on_host.optimizer->step(1e-3f, 1.0f);
        for (int mb = 0; mb < kMicroBatches; ++mb) EXPECT_EQ(arena_loss[mb], host_loss[mb]) << "step " << step;
        EXPECT_EQ(ra.grad_norm, rh.grad_norm) << "step " << step;
    }
    EXPECT_EQ(std::memcmp(on_arena.model->params(), on_host.model->params(),
                          static_cast<size_t>(on_host.model->flat_size()) * sizeof(float)),
              0);
    // nothing was allocated or freed while frozen
    const BuddyStats after = arena.stats();
    EXPECT_EQ(after.live_allocations, before.live_allocations);
    EXPECT_EQ(after.peak_block_bytes, before.peak_block_bytes);
    arena.set_frozen(false);
}

}  // namespace
}  // namespace ms
