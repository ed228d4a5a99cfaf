// residual.cpp: the residual stream's add, out = a + b elementwise over n values.
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
    if (mode == OpMode::kReference) {
        for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
        return;
    }
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace ms::cpu
