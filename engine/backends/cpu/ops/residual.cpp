// residual.cpp: the residual stream's add, out = a + (b + bias[i % M]) elementwise over n values (bias optional).
//
// out may alias a (the trainer adds a block's output into the stream in place). Its backward is the identity on
// both inputs, so there is no residual_backward: the stream's gradient reaches both consumers through
// Accumulate::kAdd on their dinp.
// Precision: a, b, bias and out are D; the sum is fp32 and rounded once on store.
#include <cstdint>

#include "engine/backends/cpu/ops.h"
#include "engine/backends/cpu/ops/precision.h"

namespace ms::cpu {
namespace {

template <class D>
void residual(const ResidualForwardArgs& args, int64_t n, OpMode mode) {
    const D* a = args.a.as<D>();
    const D* b = args.b.as<D>();
    D* out = args.out.as<D>();
    if (args.bias.defined()) {
        const int64_t M = args.bias.numel();
        MS_CHECK(M > 0 && n % M == 0, "residual: bias has {} elements, which does not divide n = {}", M, n);
        const D* bias = args.bias.as<D>();
        const int64_t rows = n / M;
        if (mode == OpMode::kReference) {
            for (int64_t i = 0; i < n; ++i) {
                out[i] = from_float<D>(to_float(a[i]) + (to_float(b[i]) + to_float(bias[i % M])));
            }
            return;
        }
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
#pragma omp simd
            for (int64_t m = 0; m < M; ++m) {
                out[r * M + m] = from_float<D>(to_float(a[r * M + m]) + (to_float(b[r * M + m]) + to_float(bias[m])));
            }
        }
        return;
    }
    if (mode == OpMode::kReference) {
        for (int64_t i = 0; i < n; ++i) out[i] = from_float<D>(to_float(a[i]) + to_float(b[i]));
        return;
    }
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = from_float<D>(to_float(a[i]) + to_float(b[i]));
}

}  // namespace

void residual_forward(const ResidualForwardArgs& args, OpMode mode) {
    const int64_t n = args.a.numel();
    MS_CHECK(args.b.numel() == n && args.out.numel() == n, "residual: a/b/out have {}/{}/{} elements", n,
             args.b.numel(), args.out.numel());
    const DType D = activation_dtype(args.a, "residual_forward", "a");
    expect_d(args.b, D, "residual_forward", "b", "a");
    expect_d(args.out, D, "residual_forward", "out", "a");
    expect_d(args.bias, D, "residual_forward", "bias", "a");
    dispatch_float(D, [&](auto tag) { residual<decltype(tag)>(args, n, mode); });
}

}  // namespace ms::cpu
