// test_synchronizing_communicator.cpp: the decorator the trainer puts around every group when the backend is
// asynchronous (comm/synchronizing_communicator.h): which collectives synchronize first, that the inner one still
// does the work, that its counters come through without the synchronization's time, and that splits and
// synchronize_before_collectives wrap what they return.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/self_communicator.h"
#include "comm/synchronizing_communicator.h"

namespace ms {
namespace {

// A SelfCommunicator that claims `size` ranks (so all_reduce and broadcast count as touching memory) and counts
// its calls as the MPI communicator does.
class CountingCommunicator final : public Communicator {
  public:
    explicit CountingCommunicator(int size) : size_(size) {}
    int rank() const override { return 0; }
    int size() const override { return size_; }
    std::string_view name() const override { return "counting"; }
    void barrier() override {}
    std::unique_ptr<Communicator> split(int color, int, std::string) override {
        return color < 0 ? nullptr : std::make_unique<CountingCommunicator>(size_);
    }

  protected:
    Handle batch_send_recv_impl(std::span<const P2POp> ops, Priority) override {
        for (const P2POp& op : ops) count(op.kind == P2POp::Kind::kSend ? CommOp::kSend : CommOp::kRecv, 0);
        return {};
    }
    Handle all_reduce_impl(void*, size_t n, DType t, ReduceOp, Priority) override {
        count(CommOp::kAllReduce, n * dtype_size(t));
        return {};
    }
    Handle reduce_scatter_impl(const void*, void*, size_t, size_t in_count, DType t, ReduceOp, Priority) override {
        count(CommOp::kReduceScatter, in_count * dtype_size(t));
        return {};
    }
    Handle all_gather_impl(const void* in, void* out, size_t in_count, size_t, DType t, Priority) override {
        count(CommOp::kAllGather, in_count * dtype_size(t));
        std::memcpy(out, in, in_count * dtype_size(t));  // rank 0's block
        return {};
    }
    Handle broadcast_impl(void*, size_t n, DType t, int, Priority) override {
        count(CommOp::kBroadcast, n * dtype_size(t));
        return {};
    }
    Handle reduce_impl(void*, size_t n, DType t, int, ReduceOp, Priority) override {
        count(CommOp::kReduce, n * dtype_size(t));
        return {};
    }
    Handle all_to_all_impl(const void*, void*, size_t in_count, size_t, DType t, Priority) override {
        count(CommOp::kAllToAll, in_count * dtype_size(t));
        return {};
    }

  private:
    int size_;
};

TEST(SynchronizingCommunicator, SynchronizesBeforeEveryCollectiveThatTouchesMemory) {
    for (int size : {1, 2}) {
        int syncs = 0;
        SynchronizingCommunicator c(std::make_unique<CountingCommunicator>(size), [&] { ++syncs; });
        std::vector<float> a(4, 1.0f), b(4 * size, 0.0f);
        std::vector<int32_t> ia(4, 3);
        c.all_reduce(std::span<float>(a), ReduceOp::kSum).wait();
        c.broadcast(std::span<int32_t>(ia), 0).wait();
        // a group of one does nothing for these: no synchronization
        EXPECT_EQ(syncs, size > 1 ? 2 : 0) << "size " << size;
        syncs = 0;
        c.all_gather(std::span<const float>(a), std::span<float>(b)).wait();
        EXPECT_EQ(b[0], 1.0f);  // the inner communicator did the work
        c.reduce_scatter(std::span<const float>(b), std::span<float>(a), ReduceOp::kSum).wait();
        c.all_to_all(std::span<const float>(b), std::span<float>(b)).wait();
        EXPECT_EQ(syncs, 3) << "size " << size;
        syncs = 0;
        c.batch_send_recv({}).wait();
        c.barrier();
        EXPECT_EQ(syncs, 0);
        const P2POp op = P2POp::send(std::span<const float>(a), 0);
        c.batch_send_recv(std::span<const P2POp>(&op, 1)).wait();
        EXPECT_EQ(syncs, 1);
        EXPECT_EQ(c.size(), size);
        EXPECT_EQ(c.name(), "counting");
    }
}

TEST(SynchronizingCommunicator, ReportsTheInnerCountersWithoutTheSynchronizationTime) {
    SynchronizingCommunicator c(std::make_unique<CountingCommunicator>(2),
                                [] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); });
    std::vector<float> a(8, 1.0f), b(16);
    c.all_reduce(std::span<float>(a), ReduceOp::kSum).wait();
    c.all_gather(std::span<const float>(a), std::span<float>(b)).wait();
    const CommStats& s = c.stats();
    EXPECT_EQ(s.ops[static_cast<size_t>(CommOp::kAllReduce)], 1);
    EXPECT_EQ(s.bytes[static_cast<size_t>(CommOp::kAllReduce)], 32);
    EXPECT_EQ(s.ops[static_cast<size_t>(CommOp::kAllGather)], 1);
    EXPECT_EQ(s.total_bytes(), 64);
    EXPECT_EQ(c.inner().stats().total_bytes(), 64);
    // two 50 ms synchronizations happened inside the calls; none of it is communication
    EXPECT_LT(s.wait_seconds, 0.02);
    EXPECT_GE(s.wait_seconds, 0.0);
}

TEST(SynchronizingCommunicator, SplitsAndProcessGroupsAreWrapped) {
    int syncs = 0;
    SynchronizingCommunicator c(std::make_unique<CountingCommunicator>(2), [&] { ++syncs; });
    EXPECT_EQ(c.split(-1, 0, "none"), nullptr);
    std::unique_ptr<Communicator> child = c.split(0, 0, "child");
    ASSERT_NE(dynamic_cast<SynchronizingCommunicator*>(child.get()), nullptr);
    float x = 1;
    child->all_reduce(std::span<float>(&x, 1), ReduceOp::kSum).wait();
    EXPECT_EQ(syncs, 1);

    SelfCommunicator world("world");
    ProcessGroups g;
    g.world = &world;
    g.tp = std::make_unique<SelfCommunicator>("tp");
    g.pp = std::make_unique<SelfCommunicator>("pp");
    g.dp = std::make_unique<SelfCommunicator>("dp");
    g.mp = std::make_unique<SelfCommunicator>("mp");
    synchronize_before_collectives(g, [&] { ++syncs; });
    for (Communicator* m : {g.tp.get(), g.pp.get(), g.dp.get(), g.mp.get()}) {
        EXPECT_NE(dynamic_cast<SynchronizingCommunicator*>(m), nullptr) << m->name();
    }
    EXPECT_EQ(g.embd, nullptr);  // a middle stage's: stays absent
    EXPECT_EQ(g.world, &world);  // not owned: left as it is
    EXPECT_EQ(g.tp->name(), "tp");
}

}  // namespace
}  // namespace ms
