// test_grad_buckets.cpp: the data-parallel gradient buckets (engine/optim/grad_buckets.h): where they are cut, when
// each is issued as the backward reports gradients, what finish() adds, and the sums of squares they take before
// reducing. One rank (a SelfCommunicator): the reduction is the identity, the bookkeeping is what is tested.
#include <gtest/gtest.h>

#include <vector>

#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/optim/grad_buckets.h"

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

}  // namespace
