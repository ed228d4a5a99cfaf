// test_link_model_comm.cpp: the link model's decorator over MPI (comm/link_model_communicator.h), at world 2, 4, 8.
//
// A receive posted long before its send completes no earlier than the sender's issue time + the modelled transfer
// (the sends carry their issue time; the ranks share the machine's clock, so the comparison is exact); a modelled
// all-reduce gives the same values as MPI's; the gathered matrix holds each rank's ring share to its successor.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "comm/comm_matrix.h"
#include "comm/link_model_communicator.h"
#include "engine/core/timer.h"
#include "tests/comm/comm_test.h"

namespace ms::test {
namespace {

// Every rank its own node: every link inter-node, 30 ms latency, bandwidth that adds 0.4 ms per kB.
const LinkModel kModel{.intra = {.alpha_s = 1e-3, .bytes_per_s = 1e9},
                       .inter = {.alpha_s = 0.03, .bytes_per_s = 2.5e6},
                       .occupancy = nullptr};

TEST(LinkModelMpi, ReceiveCompletesAfterTheSendersIssuePlusTheModel) {
    const int W = world().size();
    CommMatrix matrix(world().rank(), nodes_by_count(W, 1));
    LinkModelCommunicator comm(world(), everyone(), matrix, &kModel);
    std::vector<float> data(256);  // 1 kB: 30 ms + 1024 / 2.5e6 s
    const double modelled = kModel.inter.seconds(1024.0);
    double sent_at = 0, received_at = 0;
    if (comm.rank() == 1) {
        const P2POp recv = P2POp::recv(std::span<float>(data), 0, 5);
        comm.batch_send_recv(std::span<const P2POp>(&recv, 1)).wait();  // posted ~100 ms before the send
        received_at = now_seconds();
        for (size_t i = 0; i < data.size(); ++i) EXPECT_EQ(data[i], static_cast<float>(i));
    } else if (comm.rank() == 0) {
        std::iota(data.begin(), data.end(), 0.0f);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        sent_at = now_seconds();
        const P2POp send = P2POp::send(std::span<const float>(data), 1, 5);
        comm.batch_send_recv(std::span<const P2POp>(&send, 1)).wait();
        EXPECT_GE(now_seconds() - sent_at, modelled - 1e-9);
        EXPECT_EQ(matrix.sent(CommMatrix::group_index("world"), 1).bytes, 1024);
    }
    std::array<int32_t, 2> words{};
    std::memcpy(words.data(), &sent_at, sizeof(sent_at));
    world().broadcast(std::span<int32_t>(words), 0).wait();
    std::memcpy(&sent_at, words.data(), sizeof(sent_at));
    if (comm.rank() == 1) {
        EXPECT_GE(received_at, sent_at + modelled);
    }
}

TEST(LinkModelMpi, ModelledAllReduceIsExactAndTheMatrixHoldsTheRing) {
    const int W = world().size(), r = world().rank();
    CommMatrix matrix(r, nodes_by_count(W, 1));
    LinkModelCommunicator comm(world(), everyone(), matrix, &kModel);
    std::vector<int32_t> buf(64 * static_cast<size_t>(W));
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = pattern(r, i);
    const double t0 = now_seconds();
    comm.all_reduce(std::span<int32_t>(buf), ReduceOp::kSum).wait();
    const double bytes = 4.0 * static_cast<double>(buf.size());
    EXPECT_GE(now_seconds() - t0, collective_seconds(kModel, CommOp::kAllReduce, bytes, W, LinkClass::kInterNode));
    for (size_t i = 0; i < buf.size(); ++i) EXPECT_EQ(buf[i], pattern_sum(W, i));
    const nlohmann::json m = matrix.gather(world());
    if (r != 0) {
        EXPECT_TRUE(m.is_null());
        return;
    }
    ASSERT_EQ(m["pairs"].size(), static_cast<size_t>(W));
    for (const nlohmann::json& p : m["pairs"]) {
        EXPECT_EQ(p["dst"].get<int>(), (p["src"].get<int>() + 1) % W);
        EXPECT_EQ(p["bytes"].get<int64_t>(), 2 * (W - 1) * 64 * 4);  // 2 (W - 1) n / W, n = 64 W ints
        EXPECT_EQ(p["group"], "world");
        EXPECT_EQ(p["link"], "inter_node");
    }
    EXPECT_EQ(m["by_link"]["inter_node"]["bytes"].get<int64_t>(), int64_t{2} * (W - 1) * 64 * 4 * W);
}

}  // namespace
}  // namespace ms::test
