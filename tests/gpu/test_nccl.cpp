// test_nccl.cpp: the NCCL communicator (comm/nccl/nccl_communicator.h) on one GPU as one rank: every collective on
// device buffers, in fp32 and bf16 (and int32 for the reductions), through real NCCL calls (SingleRank::kCallNccl)
// and through the size-1 shortcut (kShortcut, what a tp = 1 group gets); host buffers through the MPI path;
// split, the counters, the flight recorder, and no heap allocation per collective once warm.
//
// Inputs are small integers (|v| <= 100), exact in fp32 and bf16, and one rank's sum, average and maximum are its
// own values: every expectation is ==. One rank cannot show a reduction across ranks (a one-GPU machine cannot run
// two NCCL ranks: NCCL refuses two ranks of a communicator on one device); what it checks is the plumbing -- dtype
// and op mapping, in-place forms, streams, events, handles, pools -- on the real library.
//
// Label gpu (tests/CMakeLists.txt): built with NCCL only, run under mpiexec -n 1, skipped where no CUDA device is
// visible (each test GTEST_SKIPs, so the binary also runs cleanly on a machine without a GPU).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/nccl/nccl_communicator.h"
#include "engine/core/half.h"
#include "memory/alloc_guard.h"

namespace {

using ms::CommOp;
using ms::NcclCommunicator;
using ms::ReduceOp;
using SingleRank = NcclCommunicator::SingleRank;

ms::MpiRuntime* g_mpi = nullptr;
// One communicator per SingleRank mode, made by the first test that needs it (NCCL's set-up takes about a second)
// and destroyed before MPI (main).
std::unique_ptr<NcclCommunicator> g_comms[2];

bool have_gpu() {
    int count = 0;
    const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
    if (!ok) (void)cudaGetLastError();
    return ok;
}

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

template <class T>
T from_int(int v) {
    if constexpr (std::is_same_v<T, float>)
        return static_cast<float>(v);
    else if constexpr (std::is_same_v<T, int32_t>)
        return v;
    else
        return ms::from_float<T>(static_cast<float>(v));
}
template <class T>
double value(T x) {
    if constexpr (std::is_same_v<T, int32_t>)
        return x;
    else
        return ms::to_float(x);
}

// A device buffer of n elements (cudaMalloc), with host copies in and out.
template <class T>
class DeviceBuffer {
  public:
    explicit DeviceBuffer(size_t n) : n_(n) { EXPECT_EQ(cudaMalloc(&p_, n * sizeof(T)), cudaSuccess); }
    ~DeviceBuffer() { cudaFree(p_); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    // Complete on the device before it returns: the communicator's stream is non-blocking, so it would not wait for
    // a copy still in flight on the legacy stream (a pageable cudaMemcpy may return before its DMA is done).
    void upload(const std::vector<T>& v) {
        EXPECT_EQ(cudaMemcpy(p_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
    void fill(int v) { upload(std::vector<T>(n_, from_int<T>(v))); }
    std::vector<double> download() const {
        std::vector<T> h(n_);
        EXPECT_EQ(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
        std::vector<double> out(n_);
        for (size_t i = 0; i < n_; ++i) out[i] = value(h[i]);
        return out;
    }
    std::span<T> span() { return {p_, n_}; }
    std::span<const T> cspan() const { return {p_, n_}; }

  private:
    T* p_ = nullptr;
    size_t n_;
};

// v[i] = (i * 37) % 201 - 100: integers in [-100, 100], every one exact in bf16.
template <class T>
std::vector<T> pattern(size_t n, int shift = 0) {
    std::vector<T> v(n);
    for (size_t i = 0; i < n; ++i)
        v[i] = from_int<T>(static_cast<int>((i * 37 + static_cast<size_t>(shift)) % 201) - 100);
    return v;
}
template <class T>
std::vector<double> values(const std::vector<T>& v) {
    std::vector<double> out;
    for (T x : v) out.push_back(value(x));
    return out;
}

class NcclOneRank : public testing::TestWithParam<SingleRank> {
  protected:
    void SetUp() override {
        if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
        std::unique_ptr<NcclCommunicator>& c = g_comms[GetParam() == SingleRank::kCallNccl ? 0 : 1];
        if (!c) c = NcclCommunicator::create_world(g_mpi->world(), 0, GetParam());
        comm_ = c.get();
        ASSERT_EQ(comm_->size(), 1);
        ASSERT_EQ(comm_->rank(), 0);
    }
    NcclCommunicator* comm_ = nullptr;
};

// Every collective once on n-element device buffers of T.
template <class T>
void every_collective(ms::Communicator& c, size_t n, bool reductions) {
    const std::vector<T> in = pattern<T>(n);
    const std::vector<double> want = values(in);
    DeviceBuffer<T> a(n), b(n);
    if (reductions) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
            a.upload(in);
            c.all_reduce(a.span(), op).wait();
            EXPECT_EQ(a.download(), want) << "all_reduce op " << static_cast<int>(op);
        }
        a.upload(in);
        b.fill(7);
        c.reduce_scatter(a.cspan(), b.span(), ReduceOp::kSum).wait();
        EXPECT_EQ(b.download(), want) << "reduce_scatter";
        a.upload(in);  // in place: the output is this rank's (the only) block of the input
        c.reduce_scatter(a.cspan(), a.span(), ReduceOp::kAvg).wait();
        EXPECT_EQ(a.download(), want) << "reduce_scatter in place";
    }
    a.upload(in);
    b.fill(7);
    c.all_gather(a.cspan(), b.span()).wait();
    EXPECT_EQ(b.download(), want) << "all_gather";
    c.all_gather(b.cspan(), b.span()).wait();  // in place
    EXPECT_EQ(b.download(), want) << "all_gather in place";
    a.upload(in);
    c.broadcast(a.span(), 0).wait();
    EXPECT_EQ(a.download(), want) << "broadcast";
    b.fill(7);
    c.all_to_all(a.cspan(), b.span()).wait();
    EXPECT_EQ(b.download(), want) << "all_to_all";
    b.fill(7);
    const ms::P2POp ops[] = {ms::P2POp::send(a.cspan(), 0, 3), ms::P2POp::recv(b.span(), 0, 3)};
    c.batch_send_recv(ops).wait();
    EXPECT_EQ(b.download(), want) << "send/recv to self";
}

TEST_P(NcclOneRank, EveryCollectiveFp32) { every_collective<float>(*comm_, 1000, true); }
TEST_P(NcclOneRank, EveryCollectiveBf16) { every_collective<ms::bf16>(*comm_, 1000, true); }
TEST_P(NcclOneRank, EveryCollectiveFp16) { every_collective<ms::fp16>(*comm_, 1000, true); }
TEST_P(NcclOneRank, EveryCollectiveInt32) { every_collective<int32_t>(*comm_, 1000, true); }
TEST_P(NcclOneRank, OneElementAndOneMillion) {
    every_collective<float>(*comm_, 1, true);
    every_collective<float>(*comm_, 1 << 20, true);
}

// The handle completes asynchronously: test() turns true by itself once the stream has run the call.
TEST_P(NcclOneRank, TestPollsToCompletion) {
    const std::vector<float> in = pattern<float>(4096);
    DeviceBuffer<float> a(4096);
    a.upload(in);
    ms::Handle h = comm_->all_reduce(a.span(), ReduceOp::kSum);
    while (!h.test()) {
    }
    EXPECT_EQ(a.download(), values(in));
}

// Critical (kHigh, kNormal) and background (kLow) operations go on two streams of different priority; a call that
// changes stream waits for the other one's work, so a chain of copies that alternates priorities, waited only at its
// end, still runs in issue order (64 MiB each: long enough for a reordering to show).
TEST_P(NcclOneRank, PrioritiesKeepTheIssueOrder) {
    const size_t n = size_t{16} << 20;
    const std::vector<float> in = pattern<float>(n);
    DeviceBuffer<float> a(n), b(n), c(n), d(n);
    a.upload(in);
    for (DeviceBuffer<float>* x : {&b, &c, &d}) x->fill(7);
    ms::Handle h1 = comm_->all_gather(a.cspan(), b.span(), ms::Priority::kLow);
    ms::Handle h2 = comm_->all_gather(b.cspan(), c.span(), ms::Priority::kHigh);
    ms::Handle h3 = comm_->all_gather(c.cspan(), d.span(), ms::Priority::kLow);
    h3.wait();
    EXPECT_TRUE(h1.test());
    EXPECT_TRUE(h2.test());
    EXPECT_EQ(d.download(), values(in));
}

// Host memory takes the MPI path, device memory NCCL; the counters count both, the recorder only NCCL's calls.
TEST_P(NcclOneRank, HostBuffersGoThroughMpiAndStatsCountBoth) {
    comm_->reset_stats();
    std::vector<float> host = {1, -2, 3};
    comm_->all_reduce(std::span<float>(host), ReduceOp::kSum).wait();
    EXPECT_EQ(host, (std::vector<float>{1, -2, 3}));
    const int64_t calls0 = comm_->nccl_calls();
    const uint64_t seq0 = comm_->flight_recorder().last_seq();
    DeviceBuffer<float> a(8);
    a.fill(5);
    comm_->all_reduce(a.span(), ReduceOp::kMax).wait();
    EXPECT_EQ(a.download(), std::vector<double>(8, 5.0));
    const bool nccl = GetParam() == SingleRank::kCallNccl;
    EXPECT_EQ(comm_->nccl_calls() - calls0, nccl ? 1 : 0);
    EXPECT_EQ(comm_->flight_recorder().last_seq() - seq0, nccl ? 1u : 0u);
    const ms::CommStats& s = comm_->stats();
    EXPECT_EQ(s.ops[static_cast<size_t>(CommOp::kAllReduce)], 2);
    EXPECT_EQ(s.total_bytes(), 0);  // a group of one sends nothing (as the MPI communicator counts)
    comm_->barrier();
    EXPECT_EQ(s.ops[static_cast<size_t>(CommOp::kBarrier)], 1);
}

// split: NCCL and MPI children with the same rank; color < 0 joins nothing.
TEST_P(NcclOneRank, Split) {
    std::unique_ptr<ms::Communicator> child = comm_->split(0, 0, "tp");
    ASSERT_NE(child, nullptr);
    EXPECT_EQ(child->name(), "tp");
    EXPECT_EQ(child->size(), 1);
    EXPECT_NE(dynamic_cast<NcclCommunicator*>(child.get()), nullptr);
    every_collective<float>(*child, 64, true);
    EXPECT_EQ(comm_->split(-1, 0, "embd"), nullptr);
}

// Once warm, a collective allocates nothing (memory/alloc_guard.h; the trainer checks it from step 3 with
// MS_CHECK_ALLOCS=1): handle states and events are pooled on both paths.
TEST_P(NcclOneRank, NoAllocationOnceWarm) {
    DeviceBuffer<float> a(256), b(256);
    a.fill(1);
    float host = 2;
    auto round = [&] {
        comm_->all_reduce(a.span(), ReduceOp::kSum).wait();
        ms::Handle h1 = comm_->all_reduce(a.span(), ReduceOp::kAvg);  // two in flight at once
        ms::Handle h2 = comm_->all_gather(a.cspan(), b.span());
        h1.wait();
        h2.wait();
        comm_->reduce_scatter(a.cspan(), b.span(), ReduceOp::kSum).wait();
        comm_->broadcast(a.span(), 0).wait();
        comm_->all_reduce(std::span<float>(&host, 1), ReduceOp::kSum).wait();
    };
    for (int i = 0; i < 3; ++i) round();
    ms::alloc_guard::arm();
    for (int i = 0; i < 10; ++i) round();
    const ms::alloc_guard::Counts c = ms::alloc_guard::disarm();
    EXPECT_EQ(c.allocations, 0u) << c.bytes << " bytes";
}

INSTANTIATE_TEST_SUITE_P(Nccl, NcclOneRank, testing::Values(SingleRank::kCallNccl, SingleRank::kShortcut),
                         [](const testing::TestParamInfo<SingleRank>& i) {
                             return i.param == SingleRank::kCallNccl ? "CallNccl" : "Shortcut";
                         });

}  // namespace

int main(int argc, char** argv) {
    testing::InitGoogleTest(&argc, argv);
    ms::MpiRuntime mpi(&argc, &argv);
    g_mpi = &mpi;
    const int rc = RUN_ALL_TESTS();
    for (auto& c : g_comms) c.reset();
    return rc;
}
