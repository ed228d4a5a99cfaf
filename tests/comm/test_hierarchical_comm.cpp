// test_hierarchical_comm.cpp: the hierarchical dp all-reduce (comm/hierarchical_communicator.h) against the flat one,
// at world 4 (2 simulated nodes of 2) and 8 (2 nodes of 4, and 4 nodes of 2); world 2 has no node of more than one
// rank, so there only the eligibility checks run.
//
// Integer inputs (and fp32 inputs that are small integers) make every sum exact whatever the order, so the results
// are compared with ==, at counts the local size divides and counts it does not. Random fp32 inputs reassociate: the
// bound is written beside that test. The matrix: an all-reduce of n bytes over p ranks on N nodes of L sends 2 (N - 1)
// / N * n / L bytes across nodes from every rank, where the flat ring sends 2 (p - 1) / p * n from each of the N ranks
// whose successor is on another node.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "comm/comm_matrix.h"
#include "comm/hierarchical_communicator.h"
#include "comm/link_model_communicator.h"
#include "tests/comm/comm_test.h"

namespace ms::test {
namespace {

// The flat dp group (all of world) and its hierarchical decoration over nodes of `local` consecutive ranks.
struct Groups {
    std::unique_ptr<Communicator> flat;
    std::unique_ptr<HierarchicalCommunicator> hier;
};
Groups make_groups(int local) {
    const int W = world().size(), r = world().rank();
    const Topology topology{1, W, 1};
    Groups g;
    g.flat = world().split(0, r, "dp");
    g.hier = std::make_unique<HierarchicalCommunicator>(world().split(0, r, "dp"),
                                                        dp_node_split(topology, nodes_by_count(W, local), r));
    return g;
}

// The node sizes this world size tests: 2 nodes of W / 2, and at 8 also 4 nodes of 2.
std::vector<int> local_sizes() {
    const int W = world().size();
    if (W < 4) return {};
    if (W == 8) return {4, 2};
    return {W / 2};
}

const std::vector<size_t> kCounts = {1, 3, 7, 64, 1001, 4096};  // some below, some not multiples of the local size

TEST(HierarchicalDp, EligibilityIsDecidedFromTheTopologyAndTheNodes) {
    EXPECT_EQ(why_not_hierarchical(Topology{1, 8, 1}, nodes_by_count(8, 4), CommKind::kMpi), "");
    EXPECT_EQ(why_not_hierarchical(Topology{1, 8, 1}, nodes_by_count(8, 8), CommKind::kMpi),
              "the dp group [0, 1, 2, 3, 4, 5, 6, 7] "
              "lies within one node");
    EXPECT_NE(
        why_not_hierarchical(Topology{1, 8, 1}, nodes_by_count(8, 1), CommKind::kMpi).find("each node holds one rank"),
        std::string::npos);
    // tp 2 dp 4: the dp group of tp rank 0 is {0, 2, 4, 6}; nodes of 4 hold 2 of them each
    EXPECT_EQ(why_not_hierarchical(Topology{2, 4, 1}, nodes_by_count(8, 4), CommKind::kMpi), "");
    // tp 4 dp 2 on nodes of 4: each dp group has one rank per node
    EXPECT_NE(why_not_hierarchical(Topology{4, 2, 1}, nodes_by_count(8, 4), CommKind::kMpi), "");
    // nodes of 3 ranks over dp 6: {0, 1, 2} and {3, 4, 5}, local size 3 (does not divide most counts)
    EXPECT_EQ(why_not_hierarchical(Topology{1, 6, 1}, nodes_by_count(6, 3), CommKind::kMpi), "");
    EXPECT_EQ(why_not_hierarchical(Topology{1, 1, 8}, nodes_by_count(8, 4), CommKind::kMpi), "dp is 1");
    // where the layout would do, NCCL's groups keep their own rings and trees
    EXPECT_NE(why_not_hierarchical(Topology{1, 8, 1}, nodes_by_count(8, 4), CommKind::kNccl).find("NCCL"),
              std::string::npos);
    const NodeLayout uneven = nodes_by_host({"a", "a", "a", "b"});
    EXPECT_NE(why_not_hierarchical(Topology{1, 4, 1}, uneven, CommKind::kMpi).find("unequally"), std::string::npos);
    const DpNodeSplit s = dp_node_split(Topology{2, 4, 1}, nodes_by_count(8, 4), 6);  // dp group {0, 2, 4, 6}
    EXPECT_EQ(s.nodes, 2);
    EXPECT_EQ(s.local_size, 2);
    EXPECT_EQ(s.node, 1);
    EXPECT_EQ(s.local_rank, 1);
}

TEST(HierarchicalDp, IntegerSumAvgAndMaxEqualTheFlatGroupsExactly) {
    const int r = world().rank();
    for (int local : local_sizes()) {
        Groups g = make_groups(local);
        for (size_t n : kCounts) {
            for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
                std::vector<int32_t> a(n), b(n);
                for (size_t i = 0; i < n; ++i) a[i] = b[i] = pattern(r, i) * (i % 2 ? -1 : 1);
                g.flat->all_reduce(std::span<int32_t>(a), op).wait();
                g.hier->all_reduce(std::span<int32_t>(b), op).wait();
                EXPECT_EQ(a, b) << "local " << local << " count " << n << " op " << static_cast<int>(op);
                std::vector<float> x(n), y(n);
                for (size_t i = 0; i < n; ++i) x[i] = y[i] = static_cast<float>(pattern(r, i));
                g.flat->all_reduce(std::span<float>(x), op).wait();
                g.hier->all_reduce(std::span<float>(y), op).wait();
                EXPECT_EQ(x, y) << "fp32, local " << local << " count " << n << " op " << static_cast<int>(op);
            }
        }
    }
}

// Random values in [-1, 1): a sum over p ranks, reassociated, differs by at most the rounding of its p - 1 additions
// on either side, each at most FLT_EPSILON / 2 of a partial sum no larger than p: 2 (p - 1) p FLT_EPSILON / 2, for any
// algorithm the MPI library picks. The test prints the largest difference it saw (notes: docs/communication.md).
TEST(HierarchicalDp, RandomFloatSumsAgreeWithinTheReassociationBound) {
    const int W = world().size(), r = world().rank();
    const double bound = (W - 1) * W * static_cast<double>(FLT_EPSILON);
    for (int local : local_sizes()) {
        Groups g = make_groups(local);
        std::mt19937 rng(static_cast<unsigned>(17 + r));
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        std::vector<float> x(4099);
        for (float& v : x) v = u(rng);
        std::vector<float> y = x;
        g.flat->all_reduce(std::span<float>(x), ReduceOp::kSum).wait();
        g.hier->all_reduce(std::span<float>(y), ReduceOp::kSum).wait();
        double worst = 0;
        for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(x[i]) - y[i]));
        EXPECT_LE(worst, bound) << "local " << local;
        if (r == 0)
            std::printf("hierarchical vs flat fp32 sum, local %d: max |diff| %.3g (bound %.3g)\n", local, worst, bound);
    }
}

// Several all-reduces in flight, waited in the reverse order (and polled with test() meanwhile): the phases still
// go out in call order on every rank, and every result is exact.
TEST(HierarchicalDp, ManyInFlightCompleteInAnyWaitOrder) {
    const int W = world().size(), r = world().rank();
    for (int local : local_sizes()) {
        Groups g = make_groups(local);
        constexpr int kOps = 6;
        std::vector<std::vector<int32_t>> bufs(kOps);
        std::vector<Handle> handles;
        for (int k = 0; k < kOps; ++k) {
            bufs[k].resize(static_cast<size_t>(100 + 37 * k));
            for (size_t i = 0; i < bufs[k].size(); ++i) bufs[k][i] = pattern(r, i + static_cast<size_t>(k));
            handles.push_back(g.hier->all_reduce(std::span<int32_t>(bufs[k]), ReduceOp::kSum, Priority::kLow));
            if (k % 2 == r % 2) handles.front().test();  // ranks poll differently
        }
        for (int k = kOps - 1; k >= 0; --k) handles[static_cast<size_t>(k)].wait();
        for (int k = 0; k < kOps; ++k) {
            for (size_t i = 0; i < bufs[k].size(); ++i) {
                ASSERT_EQ(bufs[k][i], pattern_sum(W, i + static_cast<size_t>(k))) << "op " << k << " at " << i;
            }
        }
    }
}

// What the communication matrix counts: flat vs hierarchical inter-node bytes, exactly as the ring attribution says.
TEST(HierarchicalDp, InterNodeBytesInTheMatrix) {
    const int W = world().size(), r = world().rank();
    for (int local : local_sizes()) {
        const int N = W / local;
        const NodeLayout nodes = nodes_by_count(W, local);
        const int64_t n = int64_t{4} * W * N * 16;  // bytes: int32 elements, divisible down to every ring share
        std::vector<int32_t> buf(static_cast<size_t>(n / 4), 1);
        int64_t inter[2] = {0, 0};  // flat, hierarchical
        for (int hierarchical = 0; hierarchical < 2; ++hierarchical) {
            CommMatrix matrix(r, nodes);
            auto flat = std::make_unique<LinkModelCommunicator>(world().split(0, r, "dp"), everyone(), matrix, nullptr);
            std::unique_ptr<Communicator> dp = std::move(flat);
            if (hierarchical) {
                dp = std::make_unique<HierarchicalCommunicator>(std::move(dp),
                                                                dp_node_split(Topology{1, W, 1}, nodes, r));
            }
            // The difference of two gathers: only the all-reduce, not the splits' exchange of members.
            const auto inter_bytes = [&] {
                const nlohmann::json m = matrix.gather(world());
                if (r == 0) {
                    EXPECT_FALSE(m["by_group"].contains("other")) << m["by_group"].dump();  // dp.* count as dp
                }
                return r == 0 ? m["by_link"].value("inter_node", nlohmann::json{{"bytes", 0}})["bytes"].get<int64_t>()
                              : 0;
            };
            const int64_t before = inter_bytes();
            dp->all_reduce(std::span<int32_t>(buf), ReduceOp::kSum).wait();
            EXPECT_EQ(buf[0], hierarchical ? W * W : W);
            inter[hierarchical] = inter_bytes() - before;
        }
        if (r != 0) continue;
        EXPECT_EQ(inter[0], int64_t{N} * 2 * (W - 1) * n / W) << "flat, local " << local;
        EXPECT_EQ(inter[1], int64_t{W} * 2 * (N - 1) * n / (N * local)) << "hierarchical, local " << local;
    }
}

}  // namespace
}  // namespace ms::test
