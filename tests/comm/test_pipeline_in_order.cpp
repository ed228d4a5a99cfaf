// test_pipeline_in_order.cpp: the pipeline's point-to-point batches under NCCL's semantics, on MPI.
//
// NCCL cannot run two ranks on one GPU, so the pipeline's pp traffic is checked here through the same code path
// with InOrderCommunicator (tests/common/in_order_communicator.h) around pp: tags ignored, messages matched in issue
// order, a send held until its receive is posted, and each message's tag compared with its receive's. Every
// schedule kind whose pp divides the world (2, 4, 8 ranks; dp the rest) trains two steps; losses and gradients must
// be the same bits as the undecorated run's (the same arithmetic on the same data), with no mismatched message.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/process_groups.h"
#include "engine/backends/backend.h"
#include "engine/data/dataset.h"
#include "engine/parallel/topology.h"
#include "engine/train/pipeline.h"
#include "tests/comm/comm_test.h"
#include "tests/common/in_order_communicator.h"

namespace ms::test {
namespace {

struct Case {
    ScheduleKind kind;
    int pp, v, m;
};

struct Result {
    std::vector<float> losses, grads;
};

GptShape small_shape() {
    GptShape s;
    s.L = 8;
    s.C = 32;
    s.NH = 2;
    s.T = 8;
    s.V = 61;
    s.Vp = 128;
    s.F = 4 * 32;
    return s;
}

Result train_two_steps(const ProcessGroups& g, const Case& c, Backend& backend, const Sampler& sampler) {
    const GptShape shape = small_shape();
    PipelineModel model(shape, backend, g, /*micro_batch=*/2, c.kind, c.m, c.v);
    model.init_weights(1234);
    Result r;
    for (int step = 0; step < 2; ++step) r.losses.push_back(model.train_step(sampler, step * 64, shape.T));
    const float* grads = static_cast<const float*>(model.grads());  // fp32 gradients: the default
    r.grads.assign(grads, grads + model.flat_size());
    return r;
}

TEST(PipelineInOrder, BatchesTrainTheSameUnderNcclSemantics) {
    DataConfig data;
    data.synthetic.num_tokens = 1 << 14;
    const std::unique_ptr<TokenSource> source = open_token_source(data, 0);
    const Sampler sampler(*source, data.split, Split::kTrain, small_shape().T, 1);
    const std::unique_ptr<Backend> backend = make_backend({});
    const int world_size = world().size();
    for (const Case& c :
         {Case{ScheduleKind::kGPipe, 2, 1, 3}, Case{ScheduleKind::k1F1B, 2, 1, 4}, Case{ScheduleKind::k1F1B, 4, 1, 6},
          Case{ScheduleKind::kInterleaved1F1B, 2, 2, 4}, Case{ScheduleKind::kInterleaved1F1B, 4, 2, 8}}) {
        if (world_size % c.pp != 0) continue;
        SCOPED_TRACE(std::string(to_string(c.kind)) + " pp " + std::to_string(c.pp) + " v " + std::to_string(c.v) +
                     " m " + std::to_string(c.m));
        ProcessGroups g = make_process_groups(world(), make_topology(world_size, 1, c.pp));
        const Result tagged = train_two_steps(g, c, *backend, sampler);
        auto in_order = std::make_unique<InOrderCommunicator>(std::move(g.pp));
        const InOrderCommunicator& check = *in_order;
        g.pp = std::move(in_order);
        const Result untagged = train_two_steps(g, c, *backend, sampler);
        EXPECT_EQ(untagged.losses, tagged.losses);
        EXPECT_EQ(untagged.grads, tagged.grads);
        // a stage sends one message per micro-batch and model-chunk edge it produces, in both directions
        const int chunks_sending = c.v - (g.pp_rank == 0 ? 1 : 0) + c.v - (g.pp_rank == c.pp - 1 ? 1 : 0);
        EXPECT_EQ(check.messages(), 2 * c.m * chunks_sending);
        EXPECT_EQ(check.mismatches(), 0);
    }
}

// The decorator itself: a receive order that tags would pair is caught as two mismatched messages.
TEST(PipelineInOrder, DecoratorCountsMessagesReceivedOutOfOrder) {
    const int rank = world().rank();
    std::unique_ptr<Communicator> pair = world().split(rank < 2 ? 0 : -1, rank, "pair");
    if (!pair) return;
    InOrderCommunicator c(std::move(pair));
    std::vector<float> a = {1.0f}, b = {2.0f};
    if (rank == 0) {
        c.batch_send_recv(std::vector{P2POp::send<float>(a, 1, 5)}).wait();
        c.batch_send_recv(std::vector{P2POp::send<float>(b, 1, 6)}).wait();
    } else {
        c.batch_send_recv(std::vector{P2POp::recv<float>(b, 0, 6), P2POp::recv<float>(a, 0, 5)}).wait();
        EXPECT_EQ(b[0], 1.0f);  // issue order: the first message sent
        EXPECT_EQ(a[0], 2.0f);
    }
    EXPECT_EQ(c.mismatches(), rank == 0 ? 2 : 0);
    EXPECT_EQ(c.messages(), rank == 0 ? 2 : 0);
}

}  // namespace
}  // namespace ms::test
