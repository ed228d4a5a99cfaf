// test_link_model.cpp: the link model (comm/link_model.h), the node layout (comm/nodes.h), the communication
// matrix's ring attribution (comm/comm_matrix.h) and the decorator's asynchronous delay
// (comm/link_model_communicator.h), over an in-process stand-in for a two-rank group whose operations complete at once.
//
// Timings: the delays are tens of milliseconds and the assertions only one-sided (at least the modelled time), or
// loose by 40 ms where an overlap must hide the delay: a sleep overshoots by well under a millisecond on an idle
// machine, and the margin covers a loaded one.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "comm/comm_matrix.h"
#include "comm/link_model.h"
#include "comm/link_model_communicator.h"
#include "comm/nodes.h"
#include "engine/core/timer.h"

namespace ms {
namespace {

// A group of `size` ranks (this process is rank `rank`) whose every operation is complete when issued and counts
// what an MPI communicator counts (mpi_communicator.h).
class InstantCommunicator final : public Communicator {
  public:
    InstantCommunicator(int rank, int size, std::string name) : rank_(rank), size_(size), name_(std::move(name)) {}
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string_view name() const override { return name_; }
    void barrier() override {}
    std::unique_ptr<Communicator> split(int, int, std::string name) override {
        return std::make_unique<InstantCommunicator>(rank_, size_, std::move(name));
    }

  protected:
    Handle batch_send_recv_impl(std::span<const P2POp> ops, Priority) override {
        for (const P2POp& o : ops) {
            count(o.kind == P2POp::Kind::kSend ? CommOp::kSend : CommOp::kRecv,
                  o.kind == P2POp::Kind::kSend ? o.count * dtype_size(o.dtype) : 0);
        }
        return {};
    }
    Handle all_reduce_impl(void*, size_t count_, DType t, ReduceOp, Priority) override {
        count(CommOp::kAllReduce, count_ * dtype_size(t));
        return {};
    }
    Handle reduce_scatter_impl(const void*, void*, size_t, size_t in_count, DType t, ReduceOp, Priority) override {
        count(CommOp::kReduceScatter, in_count * dtype_size(t));
        return {};
    }
    Handle all_gather_impl(const void*, void*, size_t in_count, size_t, DType t, Priority) override {
        count(CommOp::kAllGather, in_count * dtype_size(t));
        return {};
    }
    Handle broadcast_impl(void*, size_t, DType, int, Priority) override { return {}; }
    Handle reduce_impl(void*, size_t, DType, int, ReduceOp, Priority) override { return {}; }
    Handle all_to_all_impl(const void*, void*, size_t, size_t, DType, Priority) override { return {}; }

  private:
    int rank_, size_;
    std::string name_;
};

TEST(LinkModel, CollectiveTimesAreTheRingFormulas) {
    const LinkModel m{.intra = {.alpha_s = 1e-5, .bytes_per_s = 1e9},
                      .inter = {.alpha_s = 1e-4, .bytes_per_s = 1.25e8},
                      .occupancy = nullptr};
    const double n = 8e6;  // bytes
    // all_reduce, 4 ranks in a node: 2 * 3 steps of n / 4 bytes = 6 * (1e-5 + 2e6 / 1e9) s
    EXPECT_DOUBLE_EQ(collective_seconds(m, CommOp::kAllReduce, n, 4, LinkClass::kIntraNode), 0.01206);
    // the same ring with a hop between nodes: 6 * (1e-4 + 2e6 / 1.25e8)
    EXPECT_DOUBLE_EQ(collective_seconds(m, CommOp::kAllReduce, n, 4, LinkClass::kInterNode), 0.0966);
    // reduce-scatter and all-gather: 3 steps of n / 4
    EXPECT_DOUBLE_EQ(collective_seconds(m, CommOp::kReduceScatter, n, 4, LinkClass::kIntraNode), 0.00603);
    EXPECT_DOUBLE_EQ(collective_seconds(m, CommOp::kAllGather, n, 4, LinkClass::kInterNode), 0.0483);
    EXPECT_DOUBLE_EQ(collective_seconds(m, CommOp::kAllToAll, n, 4, LinkClass::kIntraNode), 0.00603);
    // broadcast: a pipelined chain, 3 latencies and the whole buffer once: 3e-5 + 8e-3
    EXPECT_DOUBLE_EQ(collective_seconds(m, CommOp::kBroadcast, n, 4, LinkClass::kIntraNode), 0.00803);
    // point to point: alpha + b / beta of the pair
    EXPECT_DOUBLE_EQ(m.of(LinkClass::kInterNode).seconds(1.25e6), 0.0101);
    // a group of one moves nothing
    EXPECT_EQ(collective_seconds(m, CommOp::kAllReduce, n, 1, LinkClass::kInterNode), 0.0);
    EXPECT_EQ(ring_schedule(CommOp::kAllReduce, n, 2).steps, 2);
    EXPECT_DOUBLE_EQ(ring_schedule(CommOp::kAllReduce, n, 2).link_bytes, n);

    // what each rank adds: (p - 1) n / p in an all-reduce and a reduce-scatter, n along a reduce's chain, nothing
    // in the collectives that only move data; timed only where the link has a reduction rate (2e9 B/s here)
    EXPECT_DOUBLE_EQ(ring_schedule(CommOp::kAllReduce, n, 4).reduced_bytes, 6e6);
    EXPECT_DOUBLE_EQ(ring_schedule(CommOp::kReduceScatter, n, 4).reduced_bytes, 6e6);
    EXPECT_DOUBLE_EQ(ring_schedule(CommOp::kReduce, n, 4).reduced_bytes, n);
    for (CommOp op : {CommOp::kAllGather, CommOp::kAllToAll, CommOp::kBroadcast})
        EXPECT_EQ(ring_schedule(op, n, 4).reduced_bytes, 0.0);
    LinkModel reducing = m;
    reducing.intra.reduce_bytes_per_s = 2e9;
    EXPECT_DOUBLE_EQ(collective_seconds(reducing, CommOp::kAllReduce, n, 4, LinkClass::kIntraNode), 0.01206 + 3e-3);
    EXPECT_DOUBLE_EQ(collective_seconds(reducing, CommOp::kAllGather, n, 4, LinkClass::kIntraNode),
                     collective_seconds(m, CommOp::kAllGather, n, 4, LinkClass::kIntraNode));
}

TEST(LinkModel, RingClassIsTheSlowestHop) {
    const NodeLayout nodes = nodes_by_count(8, 4);  // ranks 0-3 on node 0, 4-7 on node 1
    EXPECT_EQ(ring_class(nodes, std::vector<int>{0, 1, 2, 3}), LinkClass::kIntraNode);
    EXPECT_EQ(ring_class(nodes, std::vector<int>{0, 2, 4, 6}), LinkClass::kInterNode);
    EXPECT_EQ(ring_class(nodes, std::vector<int>{3, 4}), LinkClass::kInterNode);
    EXPECT_EQ(ring_class(nodes, std::vector<int>{5}), LinkClass::kIntraNode);
    EXPECT_EQ(pair_class(nodes, 3, 4), LinkClass::kInterNode);
    EXPECT_EQ(pair_class(nodes, 4, 7), LinkClass::kIntraNode);
}

TEST(Nodes, ByCountAndByHost) {
    const NodeLayout c = nodes_by_count(6, 2);
    EXPECT_EQ(c.node_of, (std::vector<int>{0, 0, 1, 1, 2, 2}));
    EXPECT_EQ(c.num_nodes, 3);
    EXPECT_TRUE(c.simulated);
    EXPECT_EQ(c.describe(), "3 nodes of 2 ranks (simulated: run.ranks_per_node 2)");
    const NodeLayout h = nodes_by_host({"b", "b", "a", "b", "a"});
    EXPECT_EQ(h.node_of, (std::vector<int>{0, 0, 1, 0, 1}));  // numbered by their lowest rank
    EXPECT_EQ(h.num_nodes, 2);
    EXPECT_FALSE(h.simulated);
    EXPECT_EQ(h.describe(), "2 nodes of 3, 2 ranks (by host)");
    EXPECT_EQ(make_node_layout(0, {"x", "x"}).num_nodes, 1);
    EXPECT_EQ(make_node_layout(1, {"x", "x"}).num_nodes, 2);
}

TEST(CommMatrix, RingAttribution) {
    std::vector<RingSend> s;
    ring_sends(CommOp::kAllReduce, 4096, 4, 1, 0, s);  // 2 * 3 * 4096 / 4 to rank 2
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].to, 2);
    EXPECT_EQ(s[0].bytes, 6144);
    s.clear();
    ring_sends(CommOp::kReduceScatter, 4096, 4, 3, 0, s);  // 3 * 1024 to rank 0 (the ring wraps)
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].to, 0);
    EXPECT_EQ(s[0].bytes, 3072);
    s.clear();
    ring_sends(CommOp::kBroadcast, 100, 4, 1, 2, s);  // the rank before the root ends the chain
    EXPECT_TRUE(s.empty());
    ring_sends(CommOp::kBroadcast, 100, 4, 2, 2, s);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].to, 3);
    EXPECT_EQ(s[0].bytes, 100);
    s.clear();
    ring_sends(CommOp::kReduce, 100, 4, 2, 2, s);  // the root ends the chain toward it
    EXPECT_TRUE(s.empty());
    ring_sends(CommOp::kReduce, 100, 4, 1, 2, s);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].to, 2);
    EXPECT_EQ(s[0].bytes, 100);
    s.clear();
    ring_sends(CommOp::kAllToAll, 400, 4, 0, 0, s);  // 100 to each other rank
    ASSERT_EQ(s.size(), 3u);
    for (const RingSend& x : s) EXPECT_EQ(x.bytes, 100);
    s.clear();
    ring_sends(CommOp::kAllReduce, 4096, 1, 0, 0, s);  // alone: nothing
    EXPECT_TRUE(s.empty());
}

// The decorator over a two-rank "dp" group of world ranks {0, 2} on separate simulated nodes.
struct Decorated {
    CommMatrix matrix{0, nodes_by_count(4, 2)};
    LinkModel model;
    LinkModelCommunicator comm;
    explicit Decorated(const LinkModel& m, bool modelled)
        : model(m),
          comm(std::make_unique<InstantCommunicator>(0, 2, "dp"), {0, 2}, matrix, modelled ? &model : nullptr) {}
};

// 50 ms for an all-reduce of 1000 floats over the inter-node link: 2 steps of 25 ms latency (bandwidth negligible).
const LinkModel kSlow{.intra = {.alpha_s = 1e-3, .bytes_per_s = 1e15},
                      .inter = {.alpha_s = 0.025, .bytes_per_s = 1e15},
                      .occupancy = nullptr};
constexpr double kModelled = 2 * (0.025 + 2000.0 / 1e15);

TEST(LinkModelCommunicator, CountsByRingAndMirrorsTheStats) {
    Decorated d(kSlow, /*modelled=*/false);
    std::vector<float> buf(1000);
    const int dp = CommMatrix::group_index("dp");
    d.comm.all_reduce(std::span<float>(buf), ReduceOp::kSum).wait();
    std::vector<float> out(500);
    d.comm.reduce_scatter(std::span<const float>(buf), std::span<float>(out), ReduceOp::kSum).wait();
    // all_reduce 2 * 1 * 4000 / 2 + reduce_scatter 1 * 4000 / 2, to world rank 2 (group rank 1)
    EXPECT_EQ(d.matrix.sent(dp, 2).bytes, 4000 + 2000);
    EXPECT_EQ(d.matrix.sent(dp, 2).ops, 2);
    EXPECT_EQ(d.matrix.sent(dp, 0).bytes, 0);
    EXPECT_EQ(d.comm.stats().bytes[static_cast<size_t>(CommOp::kAllReduce)], 4000);  // the inner's count
    EXPECT_EQ(d.comm.stats().ops[static_cast<size_t>(CommOp::kReduceScatter)], 1);
    const float one = 1;
    const P2POp send = P2POp::send(std::span<const float>(&one, 1), 1, 7);
    d.comm.batch_send_recv(std::span<const P2POp>(&send, 1)).wait();
    EXPECT_EQ(d.matrix.sent(dp, 2).bytes, 6004);  // point to point exactly
}

TEST(LinkModelCommunicator, WaitingAtOnceTakesTheModelledTime) {
    Decorated d(kSlow, /*modelled=*/true);
    std::vector<float> buf(1000);
    const double t0 = now_seconds();
    d.comm.all_reduce(std::span<float>(buf), ReduceOp::kSum).wait();
    const double took = now_seconds() - t0;
    EXPECT_GE(took, kModelled);
    EXPECT_GE(d.comm.stats().wait_seconds, kModelled);  // all of it exposed
    // (issue + model) - issue: equal up to the rounding of the clock's magnitude
    EXPECT_GE(d.matrix.op_seconds(CommMatrix::group_index("dp")), kModelled - 1e-9);
    // a point-to-point send over the inter-node pair: alpha of 25 ms
    const float one = 1;
    const P2POp send = P2POp::send(std::span<const float>(&one, 1), 1);
    const double t1 = now_seconds();
    d.comm.batch_send_recv(std::span<const P2POp>(&send, 1)).wait();
    EXPECT_GE(now_seconds() - t1, 0.025);
}

TEST(LinkModelCommunicator, WorkBeforeTheWaitHidesTheDelay) {
    Decorated d(kSlow, /*modelled=*/true);
    std::vector<float> buf(1000);
    // 120 ms of work after the issue: the 50 ms transfer is over when the wait begins
    double t0 = now_seconds();
    Handle h = d.comm.all_reduce(std::span<float>(buf), ReduceOp::kSum);
    EXPECT_FALSE(h.test());  // not before its modelled time
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    const double before_wait = now_seconds();
    h.wait();
    const double waited = now_seconds() - before_wait;
    EXPECT_LT(waited, 0.040);
    EXPECT_GE(now_seconds() - t0, 0.120);
    // test() says done once the modelled time has passed
    Handle polled = d.comm.all_reduce(std::span<float>(buf), ReduceOp::kSum);
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    EXPECT_TRUE(polled.test());
    // the time counted is the modelled one (the ops completed at their deadlines), not the 120 ms to the wait
    EXPECT_NEAR(d.matrix.op_seconds(CommMatrix::group_index("dp")), 2 * kModelled, 1e-9);
    // 10 ms of work: the wait pays the remaining 40 ms, the whole op takes ~max(10, 50) ms
    t0 = now_seconds();
    h = d.comm.all_reduce(std::span<float>(buf), ReduceOp::kSum);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    h.wait();
    const double took = now_seconds() - t0;
    EXPECT_GE(took, kModelled);
    EXPECT_LT(took, kModelled + 0.040);
}

TEST(LinkModelCommunicator, WithoutAModelNothingIsDelayed) {
    Decorated d(kSlow, /*modelled=*/false);
    std::vector<float> buf(1000);
    const double t0 = now_seconds();
    for (int i = 0; i < 10; ++i) d.comm.all_reduce(std::span<float>(buf), ReduceOp::kSum).wait();
    EXPECT_LT(now_seconds() - t0, kModelled);  // ten would take 10 x 50 ms with the model
    EXPECT_EQ(d.matrix.sent(CommMatrix::group_index("dp"), 2).ops, 10);
}

}  // namespace
}  // namespace ms
