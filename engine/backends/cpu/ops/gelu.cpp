// gelu.cpp: GELU, tanh approximation, forward and backward, elementwise over n values.
//
//   u = sqrt(2/pi) (x + 0.044715 x^3);  gelu(x) = 0.5 x (1 + tanh u);
//   gelu'(x) = 0.5 (1 + tanh u) + 0.5 x sech^2(u) u',  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
// The fast path uses 0.5 (1 + tanh u) = sigmoid(2u) = 1 / (1 + e^-2u) and sech^2 u = 4 sigmoid(2u) (1 - sigmoid(2u))
// with 1 - sigmoid(2u) = e^-2u sigmoid(2u): one vectorisable exp per element and no cancellation on either side.
// dinp is overwritten and may alias dout (each element is read before it is written).
// Precision: inp, out, dout and dinp are D; each element is computed from fp32 loads and rounded once on store.
#include <cmath>
#include <cstdint>

#include "engine/backends/cpu/ops.h"
#include "engine/backends/cpu/ops/precision.h"
#include "engine/backends/cpu/ops/vec_math.h"

namespace ms::cpu {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kCubic = 0.044715;

template <class D>
void forward(const GeluForwardArgs& a, int64_t n, OpMode mode) {
    const D* inp = a.inp.as<D>();
    D* out = a.out.as<D>();
    if (mode == OpMode::kReference) {
        for (int64_t i = 0; i < n; ++i) {
            const double x = to_float(inp[i]);
            const double u = kSqrt2OverPi * (x + kCubic * x * x * x);
            out[i] = from_float<D>(static_cast<float>(0.5 * x * (1.0 + std::tanh(u))));
        }
        return;
    }
    constexpr float k2 = static_cast<float>(2.0 * kSqrt2OverPi);
    constexpr float kc = static_cast<float>(kCubic);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const float x = to_float(inp[i]);
        out[i] = from_float<D>(x * sigmoid_approx(k2 * (x + kc * x * x * x)));
    }
}

template <class D>
void backward(const GeluBackwardArgs& a, int64_t n, OpMode mode) {
    const D* inp = a.inp.as<D>();
    const D* dout = a.dout.as<D>();
    D* dinp = a.dinp.as<D>();
    if (mode == OpMode::kReference) {
        for (int64_t i = 0; i < n; ++i) {
            const double x = to_float(inp[i]);
            const double u = kSqrt2OverPi * (x + kCubic * x * x * x);
            const double du = kSqrt2OverPi * (1.0 + 3.0 * kCubic * x * x);
            const double th = std::tanh(u);
            const double grad = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
            dinp[i] = from_float<D>(static_cast<float>(grad * to_float(dout[i])));
        }
        return;
    }
    constexpr float k2 = static_cast<float>(2.0 * kSqrt2OverPi);
    constexpr float kc = static_cast<float>(kCubic);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const float x = to_float(inp[i]);
        const float e = exp_approx(-k2 * (x + kc * x * x * x));  // e^(-2u)
        const float s = 1.0f / (1.0f + e);                       // sigmoid(2u) = 0.5 (1 + tanh u)
        const float one_minus_s = e * s;                         // not 1 - s, which cancels for large u
        const float du2 = k2 * (1.0f + 3.0f * kc * x * x);       // 2 u'
        dinp[i] = from_float<D>((s + x * s * one_minus_s * du2) * to_float(dout[i]));
    }
}

}  // namespace

void gelu_forward(const GeluForwardArgs& a, OpMode mode) {
    const int64_t n = a.inp.numel();
    MS_CHECK(a.out.numel() == n, "gelu: out has {} elements, inp has {}", a.out.numel(), n);
    const DType D = activation_dtype(a.inp, "gelu_forward", "inp");
    expect_d(a.out, D, "gelu_forward", "out", "inp");
    dispatch_float(D, [&](auto tag) { forward<decltype(tag)>(a, n, mode); });
}

void gelu_backward(const GeluBackwardArgs& a, OpMode mode) {
    const int64_t n = a.inp.numel();
    MS_CHECK(a.dout.numel() == n && a.dinp.numel() == n, "gelu: dout/dinp have {}/{} elements, inp has {}",
             a.dout.numel(), a.dinp.numel(), n);
    const DType D = activation_dtype(a.inp, "gelu_backward", "inp");
    expect_d(a.dout, D, "gelu_backward", "dout", "inp");
    expect_d(a.dinp, D, "gelu_backward", "dinp", "inp");
    dispatch_float(D, [&](auto tag) { backward<decltype(tag)>(a, n, mode); });
}

}  // namespace ms::cpu
