// test_bootstrap.cpp: MpiRuntime's view of the launch, check_same_config, and the MPI error message.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/mpi/mpi_check.h"
#include "engine/core/check.h"
#include "tests/comm/comm_test.h"

namespace ms::test {
namespace {

TEST(Bootstrap, RanksAndNodes) {
    MpiRuntime& rt = runtime();
    EXPECT_EQ(rt.rank(), world().rank());
    EXPECT_EQ(rt.size(), world().size());
    EXPECT_EQ(world().name(), "world");
    EXPECT_GE(rt.local_rank(), 0);
    EXPECT_LT(rt.local_rank(), rt.local_size());
    EXPECT_GE(rt.node_id(), 0);
    EXPECT_LT(rt.node_id(), rt.num_nodes());
    EXPECT_FALSE(rt.hostname().empty());
    // One leader (local rank 0) per node; local sizes add up to the world; node ids run 0 .. num_nodes - 1.
    std::vector<int32_t> v = {rt.local_rank() == 0 ? 1 : 0, rt.local_rank() == 0 ? rt.local_size() : 0};
    world().all_reduce(std::span(v), ReduceOp::kSum).wait();
    EXPECT_EQ(v[0], rt.num_nodes());
    EXPECT_EQ(v[1], rt.size());
    std::vector<int32_t> max_node = {rt.node_id()};
    world().all_reduce(std::span(max_node), ReduceOp::kMax).wait();
    EXPECT_EQ(max_node[0], rt.num_nodes() - 1);
}

TEST(Bootstrap, DescribesTheLaunch) {
    const std::string d = runtime().describe();
    EXPECT_NE(d.find("rank " + std::to_string(runtime().rank()) + "/" + std::to_string(runtime().size())),
              std::string::npos)
        << d;
    if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) {
        EXPECT_NE(launch_environment().find("OMPI_COMM_WORLD_SIZE=" + std::to_string(runtime().size())),
                  std::string::npos)
            << launch_environment();
    }
}

TEST(Bootstrap, SameConfigPasses) { EXPECT_NO_THROW(check_same_config(runtime(), 0xfeedfacecafebeefull)); }

TEST(Bootstrap, DifferentConfigNamesTheRanks) {
    // Ranks 1 and 3 differ from rank 0 in the low half and the high half of the hash respectively.
    const int r = world().rank(), w = world().size();
    uint64_t hash = 0xdeadbeef00000001ull;
    if (r == 1) hash = 0xdeadbeef00000002ull;
    if (r == 3) hash = 0x1eadbeef00000001ull;
    if (w < 2) GTEST_SKIP() << "needs two ranks";
    try {
        check_same_config(runtime(), hash);
        ADD_FAILURE() << "no error";
    } catch (const UserError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("1 (0xdeadbeef00000002, host " + runtime().host_of(1) + ")"), std::string::npos) << msg;
        EXPECT_EQ(e.failed_rank(), 1);
        EXPECT_EQ(msg.find("3 (") != std::string::npos, w > 3) << msg;
        EXPECT_EQ(msg.find("2 ("), std::string::npos) << msg;
        EXPECT_NE(msg.find("of " + std::to_string(w) + " ranks"), std::string::npos) << msg;
    }
}

TEST(MpiCheck, MessageNamesErrorAndRank) {
    const std::string msg = mpi_error_message(MPI_ERR_COUNT);
    EXPECT_NE(msg.find("MPI error"), std::string::npos) << msg;
    EXPECT_NE(msg.find("world rank " + std::to_string(world().rank())), std::string::npos) << msg;
}

}  // namespace
}  // namespace ms::test
