// mpi_test_main.cpp: GoogleTest under MPI. Rank 0 prints gtest's usual report; the other ranks print only their
// failures, prefixed with the rank. The exit status is nonzero on every rank if any rank failed a test.
#include <gtest/gtest.h>

#include <cstdio>
#include <span>

#include "comm/bootstrap.h"
#include "tests/comm/comm_test.h"

namespace ms::test {
namespace {

MpiRuntime* g_runtime = nullptr;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
  public:
    explicit RankFailurePrinter(int rank) : rank_(rank) {}
    void OnTestPartResult(const ::testing::TestPartResult& r) override {
        if (!r.failed()) return;
        std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                     r.line_number(), r.message());
    }
    void OnTestEnd(const ::testing::TestInfo& info) override {
        if (info.result()->Failed())
            std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }

  private:
    int rank_;
};

}  // namespace

MpiRuntime& runtime() { return *g_runtime; }

}  // namespace ms::test

int main(int argc, char** argv) {
    ms::MpiRuntime runtime(&argc, &argv);
    ms::test::g_runtime = &runtime;
    ::testing::InitGoogleTest(&argc, argv);
    if (runtime.rank() != 0) {
        auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
        listeners.Append(new ms::test::RankFailurePrinter(runtime.rank()));
    } else {
        std::printf("test_comm: %s\n", runtime.describe().c_str());
    }
    int failed_ranks = RUN_ALL_TESTS() == 0 ? 0 : 1;
    runtime.world().all_reduce(std::span<int>(&failed_ranks, 1), ms::ReduceOp::kSum).wait();
    if (runtime.rank() == 0) std::printf("test_comm: %d of %d ranks failed\n", failed_ranks, runtime.size());
    return failed_ranks == 0 ? 0 : 1;
}
