// test_deferred_backend.cpp: engine/backends/deferred_backend -- ops run only at synchronize() or sum_squares(), in
// call order, on the arguments' memory as it is then; so an unsynchronized host read sees the memory from before the
// op, and an unsynchronized host write reaches an op called before it. The trainer-level check built on it is
// tests/e2e/test_train_deferred.cpp.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engine/backends/deferred_backend.h"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

TEST(DeferredBackend, RunsOpsInCallOrderOnlyWhenTheHostSynchronizes) {
    DeferredBackend deferred(make_cpu_backend(OpMode::kFast));
    auto plain = make_cpu_backend(OpMode::kFast);
    const int64_t n = 37;
    std::vector<float> x = random_floats(n, 1);
    std::vector<float> g(n, 0.0f), copy(n, -7.0f);
    std::vector<float> g_want(n), copy_want(n);
    // gelu, then a copy of its output: the second op must see the first one's result
    deferred.gelu_forward({Tensor::f32(x.data(), {n}), Tensor::f32(g.data(), {n})});
    deferred.cast({Tensor::f32(g.data(), {n}), Tensor::f32(copy.data(), {n})});
    plain->gelu_forward({Tensor::f32(x.data(), {n}), Tensor::f32(g_want.data(), {n})});
    plain->cast({Tensor::f32(g_want.data(), {n}), Tensor::f32(copy_want.data(), {n})});
    EXPECT_EQ(deferred.pending(), 2u);
    EXPECT_EQ(g, std::vector<float>(n, 0.0f));  // a read before synchronize() sees the memory before the ops
    EXPECT_EQ(copy, std::vector<float>(n, -7.0f));
    deferred.synchronize();
    EXPECT_EQ(deferred.pending(), 0u);
    EXPECT_EQ(g, g_want);
    EXPECT_EQ(copy, copy_want);

    EXPECT_TRUE(deferred.asynchronous());
    EXPECT_EQ(deferred.name(), plain->name());
    EXPECT_EQ(deferred.supports(OpKind::kAdamW, DType::kBF16), plain->supports(OpKind::kAdamW, DType::kBF16));
}

TEST(DeferredBackend, AnOpSeesWhatTheHostWroteAfterItsCall) {
    DeferredBackend deferred(make_cpu_backend(OpMode::kFast));
    std::vector<float> src(8, 1.0f), dst(8, 0.0f);
    deferred.cast({Tensor::f32(src.data(), {8}), Tensor::f32(dst.data(), {8})});
    src[3] = 5.0f;  // unsynchronized write to an input of a queued op: the race a GPU would have
    deferred.zero(Tensor::f32(src.data(), {8}));
    deferred.synchronize();
    std::vector<float> want(8, 1.0f);
    want[3] = 5.0f;
    EXPECT_EQ(dst, want);
    EXPECT_EQ(src, std::vector<float>(8, 0.0f));
}

TEST(DeferredBackend, SumSquaresCompletesEveryEarlierOp) {
    DeferredBackend deferred(make_cpu_backend(OpMode::kFast));
    std::vector<float> a = {1.0f, 2.0f, 3.0f}, b(3, 0.0f);
    deferred.cast({Tensor::f32(a.data(), {3}), Tensor::f32(b.data(), {3})});
    EXPECT_EQ(deferred.sum_squares(Tensor::f32(b.data(), {3})), 14.0);  // sees the cast's output
    EXPECT_EQ(deferred.pending(), 0u);
    deferred.zero(Tensor::f32(b.data(), {3}));
    EXPECT_EQ(b, (std::vector<float>{1.0f, 2.0f, 3.0f}));
    EXPECT_EQ(deferred.sum_squares(Tensor::f32(b.data(), {3})), 0.0);
}

}  // namespace
}  // namespace ms::test
