// test_profiling_backend.cpp: engine/backends/profiling_backend -- the decorator forwards every op unchanged (the same
// bits as the backend it wraps), counts calls per op and shape, and its table ends with the step's unaccounted rest.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/backends/profiling_backend.h"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

TEST(ProfilingBackend, ForwardsEveryOpUnchangedAndCountsCallsPerShape) {
    ProfilingBackend prof(make_cpu_backend(OpMode::kFast));
    auto plain = make_cpu_backend(OpMode::kFast);
    const int64_t N = 6, K = 5, M = 3;
    std::vector<float> inp = random_floats(N * K, 1), w = random_floats(M * K, 2), b = random_floats(M, 3);
    std::vector<float> got(N * M), want(N * M), g(N * M);
    auto fwd = [&](Backend& be, std::vector<float>& out, bool bias) {
        be.matmul_forward({Tensor::f32(inp.data(), {N, K}), Tensor::f32(w.data(), {M, K}),
                           bias ? Tensor::f32(b.data(), {M}) : Tensor(), Tensor::f32(out.data(), {N, M})});
    };
    fwd(prof, got, true);
    fwd(*plain, want, true);
    EXPECT_EQ(got, want);
    fwd(prof, got, true);
    fwd(prof, got, false);
    prof.gelu_forward({Tensor::f32(got.data(), {N * M}), Tensor::f32(g.data(), {N * M})});
    std::vector<float> g_want(N * M);
    plain->gelu_forward({Tensor::f32(got.data(), {N * M}), Tensor::f32(g_want.data(), {N * M})});
    EXPECT_EQ(g, g_want);
    EXPECT_EQ(prof.sum_squares(Tensor::f32(b.data(), {M})), plain->sum_squares(Tensor::f32(b.data(), {M})));

    const std::vector<ProfilingBackend::Row> rows = prof.rows();
    ASSERT_EQ(rows.size(), 4u);
    auto calls = [&](const std::string& op) -> int64_t {
        for (const auto& r : rows) {
            if (r.op == op) return r.calls;
        }
        return -1;
    };
    EXPECT_EQ(calls("matmul forward N 6 K 5 M 3 +bias"), 2);
    EXPECT_EQ(calls("matmul forward N 6 K 5 M 3"), 1);
    EXPECT_EQ(calls("gelu forward n 18"), 1);
    EXPECT_EQ(calls("sum of squares n 3"), 1);
    for (size_t i = 1; i < rows.size(); ++i) EXPECT_GE(rows[i - 1].seconds, rows[i].seconds);  // longest first

    const std::vector<std::string> table = prof.table(/*step_seconds=*/1.0, /*steps=*/2);
    ASSERT_EQ(table.size(), 2 + rows.size() + 1);  // title, header, a row per group, the rest
    EXPECT_EQ(table.front().rfind("op profile over 2 step(s) of 500.000 ms", 0), 0u) << table.front();
    EXPECT_NE(table.back().find("(rest: host work, communication, waits)"), std::string::npos) << table.back();

    prof.reset();
    EXPECT_TRUE(prof.rows().empty());
    EXPECT_EQ(prof.name(), plain->name());
    EXPECT_EQ(prof.supports(OpKind::kAdamW, DType::kBF16), plain->supports(OpKind::kAdamW, DType::kBF16));
}

}  // namespace
}  // namespace ms::test
