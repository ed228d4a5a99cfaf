// adamw.cpp: one fused AdamW pass over n contiguous fp32 elements (decoupled weight decay, bias correction).
//
//   g = grad * grad_scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   param -= lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * param )
// param, m and v are updated in place; grad is only read. The pass is memory bound (7 floats of traffic per
// element), so the fast path is a single vectorised OpenMP loop with the bias corrections hoisted out.
// Precision: param, m and v are fp32 (the master weights and their state); grad is fp32, or bf16 / fp16 (16-bit
// gradients), widened to fp32 on load, so a 16-bit grad gives the bits of its fp32 widening. When param_copy is
// defined (bf16, fp16 or fp32: the model's weights), it gets from_float<D>(updated param) in the same pass, the fused
// cast.
#include <cmath>
#include <cstdint>

#include "engine/backends/cpu/ops.h"
#include "engine/backends/cpu/ops/precision.h"
#include "engine/backends/cpu/ops/vec_math.h"

namespace ms::cpu {
namespace {

// The storage type of "no param_copy": the loops below skip the store at compile time.
struct NoCopy {};

template <class D>
inline void store_copy(D* copy, int64_t i, float p) {
    if constexpr (!std::is_same_v<D, NoCopy>) copy[i] = from_float<D>(p);
}

// G: grad's storage type; D: param_copy's (or NoCopy).
template <class G, class D>
void adamw_pass(const AdamWArgs& a, int64_t n, OpMode mode, D* copy) {
    float* param = a.param.f32();
    const G* grad = a.grad.as<G>();
    float* m = a.m.f32();
    float* v = a.v.f32();
    const double correction1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step));
    const double correction2 = 1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step));
    if (mode == OpMode::kReference) {
        for (int64_t i = 0; i < n; ++i) {
            const double g = static_cast<double>(to_float(grad[i])) * a.grad_scale;
            const double mi = a.beta1 * static_cast<double>(m[i]) + (1.0 - a.beta1) * g;
            const double vi = a.beta2 * static_cast<double>(v[i]) + (1.0 - a.beta2) * g * g;
            const double update = (mi / correction1) / (std::sqrt(vi / correction2) + a.eps);
            param[i] = static_cast<float>(param[i] - a.lr * (update + a.weight_decay * param[i]));
            store_copy(copy, i, param[i]);
            m[i] = static_cast<float>(mi);
            v[i] = static_cast<float>(vi);
        }
        return;
    }
    const float b1 = a.beta1, b2 = a.beta2, lr = a.lr, eps = a.eps, wd = a.weight_decay, gs = a.grad_scale;
    const float inv_c1 = static_cast<float>(1.0 / correction1);
    const float inv_c2 = static_cast<float>(1.0 / correction2);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const float g = to_float(grad[i]) * gs;
        const float mi = b1 * m[i] + (1.0f - b1) * g;
        const float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        param[i] -= lr * ((mi * inv_c1) / (sqrt_nonneg(vi * inv_c2) + eps) + wd * param[i]);
        store_copy(copy, i, param[i]);
    }
}

}  // namespace

void adamw(const AdamWArgs& a, OpMode mode) {
    const int64_t n = a.param.numel();
    MS_CHECK(a.grad.numel() == n && a.m.numel() == n && a.v.numel() == n,
             "adamw: param/grad/m/v have {}/{}/{}/{} elements", n, a.grad.numel(), a.m.numel(), a.v.numel());
    MS_CHECK(a.step >= 1, "adamw: step is {}, must be >= 1 (bias corrections divide by 1 - beta^step)", a.step);
    expect_f32(a.param, "adamw", "param", "the master weights");
    MS_CHECK(is_float(a.grad.dtype),
             "adamw: grad is {}, but gradients are fp32, bf16 or fp16 (precision contract, backend.h)",
             dtype_name(a.grad.dtype));
    expect_f32(a.m, "adamw", "m", "the optimizer's moments");
    expect_f32(a.v, "adamw", "v", "the optimizer's moments");
    if (a.param_copy.defined()) {
        MS_CHECK(a.param_copy.numel() == n, "adamw: param_copy has {} elements, param {}", a.param_copy.numel(), n);
        activation_dtype(a.param_copy, "adamw", "param_copy");
    }
    dispatch_float(a.grad.dtype, [&](auto grad_tag) {
        using G = decltype(grad_tag);
        if (!a.param_copy.defined()) return adamw_pass<G, NoCopy>(a, n, mode, nullptr);
        dispatch_float(a.param_copy.dtype, [&](auto tag) {
            using T = decltype(tag);
            adamw_pass<G, T>(a, n, mode, a.param_copy.as<T>());
        });
    });
}

}  // namespace ms::cpu
