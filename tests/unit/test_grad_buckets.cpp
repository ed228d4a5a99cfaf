// test_grad_buckets.cpp: the data-parallel gradient buckets (engine/optim/grad_buckets.h): where they are cut, when
// each is issued as the backward reports gradients, what finish() adds, and the sums of squares they take before
// reducing; how a bucket splits among the zero_stage 1 shards' owners; and the parameter gather in the same buckets
// (engine/optim/param_gather.h): which buckets a forward's read completes and casts. One rank (a SelfCommunicator):
// the reduction and the gather are the identity, the bookkeeping is what is tested.
#include <gtest/gtest.h>

#include <vector>

#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/core/half.h"
#include "engine/optim/grad_buckets.h"
#include "engine/optim/param_gather.h"

namespace {

using ms::graph::GradRange;

struct Rig {
    std::vector<ms::ParamInfo> table;
    std::vector<float> grads = std::vector<float>(160, 0.0f);
    ms::SelfCommunicator dp{"dp"};
    std::unique_ptr<ms::Backend> backend = ms::make_backend({});
    Rig() {
        int64_t offset = 0;
        for (int64_t n : {10, 20, 30, 40, 50}) {  // 150 elements, padded to 160
            ms::ParamInfo p;
            p.offset = offset;
            p.numel = n;
            table.push_back(p);
            offset += n;
        }
        for (int64_t i = 0; i < 150; ++i) grads[static_cast<size_t>(i)] = 0.5f;
    }
    GradRange param(int i) const {
        return {table[static_cast<size_t>(i)].offset, table[static_cast<size_t>(i)].offset + table[i].numel};
    }
};

// From the end down, closed at a parameter's start once a bucket holds 60 elements: [100, 160) with the padding,
// [30, 100), and the rest from 0.
TEST(GradBuckets, AreCutAtParameterStartsFromTheEndDown) {
    Rig r;
    ms::GradBuckets b(r.table, 160, 60, r.grads.data(), r.dp, *r.backend);
    ASSERT_EQ(b.num_buckets(), 3);
    EXPECT_EQ(b.begin(0), 100);
    EXPECT_EQ(b.end(0), 160);
    EXPECT_EQ(b.begin(1), 30);
    EXPECT_EQ(b.end(1), 100);
    EXPECT_EQ(b.begin(2), 0);
    EXPECT_EQ(b.end(2), 30);
    ms::GradBuckets one(r.table, 160, 1000, r.grads.data(), r.dp, *r.backend);
    ASSERT_EQ(one.num_buckets(), 1);
    EXPECT_EQ(one.begin(0), 0);
    EXPECT_EQ(one.end(0), 160);
}

// A bucket is issued by the report that completes it, in report order; a deferred gradient completes its bucket
// only in finish(), which issues the rest in bucket order. Chunk ranges are shifted by the chunk's base.
TEST(GradBuckets, IssueWhenEveryGradientIsFinalAndDeferredOnesInFinish) {
    Rig r;
    ms::GradBuckets b(r.table, 160, 60, r.grads.data(), r.dp, *r.backend);
    const GradRange p0 = r.param(0);
    b.defer(std::span<const GradRange>(&p0, 1));
    for (int step = 0; step < 2; ++step) {  // the second step starts from nothing again
        b.begin_step();
        const GradRange last = r.param(4);
        b.final(std::span<const GradRange>(&last, 1), 0);
        EXPECT_EQ(b.issued(), std::vector<int>({0}));
        // parameters 3 and 2 as a chunk whose gradients start at element 30
        const GradRange chunk[] = {{30, 70}, {0, 30}};
        b.final(chunk, 30);
        EXPECT_EQ(b.issued(), std::vector<int>({0, 1}));
        const GradRange early[] = {r.param(1), r.param(0)};  // parameter 0 is deferred: bucket 2 waits
        b.final(early, 0);
        EXPECT_EQ(b.issued(), std::vector<int>({0, 1}));
        b.finish();
        EXPECT_EQ(b.issued(), std::vector<int>({0, 1, 2}));
        EXPECT_EQ(b.squares_before_reduction(), 150 * 0.25);  // exact: 0.5^2 per element, the padding zeros
    }
}

// A bucket no report completes (a parameter no op writes) is issued by finish(), after the reported ones.
TEST(GradBuckets, FinishIssuesWhatNoReportCompleted) {
    Rig r;
    ms::GradBuckets b(r.table, 160, 60, r.grads.data(), r.dp, *r.backend);
    b.begin_step();
    const GradRange p2 = r.param(2);
    b.final(std::span<const GradRange>(&p2, 1), 0);
    EXPECT_TRUE(b.issued().empty());
    b.finish();
    EXPECT_EQ(b.issued(), std::vector<int>({0, 1, 2}));
}

// A bucket's part in each shard [d * S, (d + 1) * S) goes to d: cut at the shard boundaries, in owner order.
TEST(GradBuckets, OwnerPartsCutABucketAtTheShardBoundaries) {
    using ms::OwnerPart;
    EXPECT_EQ(ms::owner_parts(10, 30, 40), std::vector<OwnerPart>({{0, 10, 30}}));  // inside one shard
    EXPECT_EQ(ms::owner_parts(30, 90, 40), std::vector<OwnerPart>({{0, 30, 40}, {1, 40, 80}, {2, 80, 90}}));
    EXPECT_EQ(ms::owner_parts(40, 80, 40), std::vector<OwnerPart>({{1, 40, 80}}));  // exactly one shard
    EXPECT_EQ(ms::owner_parts(100, 160, 80), std::vector<OwnerPart>({{1, 100, 160}}));
    EXPECT_TRUE(ms::owner_parts(50, 50, 40).empty());
}

// zero_stage 1's buckets are issued by the same reports; each reduces its parts into their owners (here the one
// rank), and the sums of squares are taken before, as with the all-reduce.
TEST(GradBuckets, ToShardOwnersIssueLikeTheAllReduce) {
    Rig r;
    ms::GradBuckets b(r.table, 160, 60, r.grads.data(), r.dp, *r.backend, ms::GradReduction::kToShardOwners);
    ASSERT_EQ(b.num_buckets(), 3);
    b.begin_step();
    const GradRange last = r.param(4);
    b.final(std::span<const GradRange>(&last, 1), 0);
    EXPECT_EQ(b.issued(), std::vector<int>({0}));
    b.finish();
    EXPECT_EQ(b.issued(), std::vector<int>({0, 1, 2}));
    EXPECT_EQ(b.squares_before_reduction(), 150 * 0.25);
}

// The gather's buckets are the gradient buckets, in flat-buffer order. A read completes the buckets that hold its
// parameters and casts them into the 16-bit weights; the rest stay in flight (their weights untouched) until
// another read or finish().
TEST(ParamGather, AReadCompletesAndCastsOnlyItsBuckets) {
    Rig r;
    const auto buckets = ms::param_bucket_ranges(r.table, 160, 60);
    const ms::GradBuckets grad(r.table, 160, 60, r.grads.data(), r.dp, *r.backend, ms::GradReduction::kToShardOwners);
    ASSERT_EQ(buckets.size(), static_cast<size_t>(grad.num_buckets()));
    for (int b = 0; b < grad.num_buckets(); ++b)
        EXPECT_EQ(buckets[static_cast<size_t>(b)], std::make_pair(grad.begin(b), grad.end(b))) << b;
    std::vector<float> params(160);
    for (size_t i = 0; i < params.size(); ++i) params[i] = 1.0f + static_cast<float>(i);  // exact in bf16 to 256
    std::vector<ms::bf16> weights(160, ms::bf16{0});
    ms::ParamGather g(buckets, 160, params.data(), r.dp, *r.backend);
    g.set_weights(weights.data(), ms::DType::kBF16);
    EXPECT_FALSE(g.in_flight());
    g.start();
    EXPECT_TRUE(g.in_flight());
    const auto cast = [&](size_t i) { return ms::to_float(weights[i]); };
    // a read of [5, 15) in a chunk whose parameters start at 20: [25, 35) spans buckets [0, 30) and [30, 100)
    const GradRange read[] = {{5, 15}};
    g.need(read, 20);
    for (size_t i = 0; i < 100; ++i) EXPECT_EQ(cast(i), params[i]) << i;
    for (size_t i = 100; i < 160; ++i) EXPECT_EQ(weights[i].bits, 0) << i;
    EXPECT_TRUE(g.in_flight());
    g.finish();
    EXPECT_FALSE(g.in_flight());
    for (size_t i = 100; i < 160; ++i) EXPECT_EQ(cast(i), params[i]) << i;
}

}  // namespace
