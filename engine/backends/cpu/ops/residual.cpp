// residual.cpp: the residual stream's add, out = a + (b + bias[i % M]) elementwise over n values (bias optional).
//
// out may alias a (the trainer adds a block's output into the stream in place). Its backward is the identity on
// both inputs, so there is no residual_backward: the stream's gradient reaches both consumers through
// Accumulate::kAdd on their dinp.
#include <cstdint>

#include "engine/backends/cpu/ops.h"

namespace ms::cpu {

void residual_forward(const ResidualForwardArgs& args, OpMode mode) {
    const int64_t n = args.a.numel();
    MS_CHECK(args.b.numel() == n && args.out.numel() == n, "residual: a/b/out have {}/{}/{} elements", n,
             args.b.numel(), args.out.numel());
    const float* a = args.a.f32();
    const float* b = args.b.f32();
    float* out = args.out.f32();
    if (args.bias.defined()) {
        const int64_t M = args.bias.numel();
        MS_CHECK(M > 0 && n % M == 0, "residual: bias has {} elements, which does not divide n = {}", M, n);
        const float* bias = args.bias.f32();
        const int64_t rows = n / M;
        if (mode == OpMode::kReference) {
            for (int64_t i = 0; i < n; ++i) out[i] = a[i] + (b[i] + bias[i % M]);
            return;
        }
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
#pragma omp simd
            for (int64_t m = 0; m < M; ++m) out[r * M + m] = a[r * M + m] + (b[r * M + m] + bias[m]);
        }
        return;
    }
    if (mode == OpMode::kReference) {
        for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
        return;
    }
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace ms::cpu
