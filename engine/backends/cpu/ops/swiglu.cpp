// swiglu.cpp: SwiGLU (Llama's MLP activation), forward and backward, elementwise over (N, F).
//
// Layouts: inp/dinp (N, 2F) rows [gate (F) | up (F)], out/dout (N, F).
//   out = silu(g) u, silu(g) = g sigmoid(g);
//   dgate = dout u sigmoid(g) (1 + g (1 - sigmoid(g))),  dup = dout silu(g)   (dinp overwritten).
// kReference computes in double with std::exp; kFast in fp32 with vec_math.h's exp, rows in parallel (each element's
// arithmetic is fixed, so the bits do not depend on the thread count). 1 - sigmoid(g) is e^-g sigmoid(g), which does
// not cancel for large g. Each D element is rounded once on store.
#include <cmath>
#include <cstdint>

#include "engine/backends/cpu/ops.h"
#include "engine/backends/cpu/ops/precision.h"
#include "engine/backends/cpu/ops/vec_math.h"

namespace ms::cpu {
namespace {

template <class D>
void forward(const SwiGluForwardArgs& a, int64_t N, int64_t F, OpMode mode) {
    const D* inp = a.inp.as<D>();
    D* out = a.out.as<D>();
    if (mode == OpMode::kReference) {
        for (int64_t n = 0; n < N; ++n) {
            for (int64_t f = 0; f < F; ++f) {
                const double g = to_float(inp[n * 2 * F + f]), u = to_float(inp[n * 2 * F + F + f]);
                out[n * F + f] = from_float<D>(static_cast<float>(g / (1.0 + std::exp(-g)) * u));
            }
        }
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        const D* gate = inp + n * 2 * F;
        const D* up = gate + F;
        D* o = out + n * F;
#pragma omp simd
        for (int64_t f = 0; f < F; ++f) {
            const float g = to_float(gate[f]);
            o[f] = from_float<D>(g * sigmoid_approx(g) * to_float(up[f]));
        }
    }
}

template <class D>
void backward(const SwiGluBackwardArgs& a, int64_t N, int64_t F, OpMode mode) {
    const D* inp = a.inp.as<D>();
    const D* dout = a.dout.as<D>();
    D* dinp = a.dinp.as<D>();
    if (mode == OpMode::kReference) {
        for (int64_t n = 0; n < N; ++n) {
            for (int64_t f = 0; f < F; ++f) {
                const double g = to_float(inp[n * 2 * F + f]), u = to_float(inp[n * 2 * F + F + f]);
                const double d = to_float(dout[n * F + f]);
                const double e = std::exp(-g), s = 1.0 / (1.0 + e);
                dinp[n * 2 * F + f] = from_float<D>(static_cast<float>(d * u * s * (1.0 + g * e * s)));
                dinp[n * 2 * F + F + f] = from_float<D>(static_cast<float>(d * g * s));
            }
        }
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        const D* gate = inp + n * 2 * F;
        const D* up = gate + F;
        const D* d = dout + n * F;
        D* dgate = dinp + n * 2 * F;
        D* dup = dgate + F;
#pragma omp simd
        for (int64_t f = 0; f < F; ++f) {
            const float g = to_float(gate[f]), u = to_float(up[f]), dy = to_float(d[f]);
            const float e = exp_approx(-g), s = 1.0f / (1.0f + e);
            dgate[f] = from_float<D>(dy * u * s * (1.0f + g * (e * s)));  // e * s <= 1: g * e alone overflows
            dup[f] = from_float<D>(dy * g * s);
        }
    }
}

// F, from inp (N, 2F) and the other operand `other` (N, F) named `name`.
int64_t gate_width(const Tensor& inp, const Tensor& other, const char* name) {
    const int64_t width = inp.dim(-1);
    MS_CHECK(width > 0 && width % 2 == 0,
             "swiglu: inp rows have {} columns; a row is [gate (F) | up (F)], so the width must be even and positive",
             width);
    const int64_t F = width / 2, N = inp.numel() / width;
    MS_CHECK(other.numel() == N * F, "swiglu: {} has {} elements, expected N({}) * F({})", name, other.numel(), N, F);
    return F;
}

}  // namespace

void swiglu_forward(const SwiGluForwardArgs& a, OpMode mode) {
    const int64_t F = gate_width(a.inp, a.out, "out");
    const DType D = activation_dtype(a.inp, "swiglu_forward", "inp");
    expect_d(a.out, D, "swiglu_forward", "out", "inp");
    dispatch_float(D, [&](auto tag) { forward<decltype(tag)>(a, a.out.numel() / F, F, mode); });
}

void swiglu_backward(const SwiGluBackwardArgs& a, OpMode mode) {
    const int64_t F = gate_width(a.inp, a.dout, "dout");
    MS_CHECK(a.dinp.numel() == a.inp.numel(), "swiglu: dinp has {} elements, inp has {}", a.dinp.numel(),
             a.inp.numel());
    const DType D = activation_dtype(a.inp, "swiglu_backward", "inp");
    expect_d(a.dout, D, "swiglu_backward", "dout", "inp");
    expect_d(a.dinp, D, "swiglu_backward", "dinp", "inp");
    dispatch_float(D, [&](auto tag) { backward<decltype(tag)>(a, a.dout.numel() / F, F, mode); });
}

}  // namespace ms::cpu
