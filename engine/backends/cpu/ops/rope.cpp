// rope.cpp: rotary position embedding, in place on the Q and K heads of qkv (backend.h RopeArgs, rope_table.h).
//
// Layouts: qkv (N, (NH + 2*NKV)*HS), of which each row's first (NH + NKV)*HS columns (the Q and K heads) are
// rotated; table (P, HS) fp32 [cos | sin]; positions (N) int32 or row n at n % T.
// Per head and i < HS/2, with x0 = x[i], x1 = x[i + HS/2] and (c, s) the table's row at the row's position:
//   kForward: x0 c - x1 s, x1 c + x0 s;   kInverse: x0 c + x1 s, x1 c - x0 s.
// kReference computes in double, kFast in fp32 with the rows in parallel (each element's arithmetic is fixed, so
// the bits do not depend on the thread count). Each D element is rounded once on store.
#include <cstdint>

#include "engine/backends/cpu/ops.h"
#include "engine/backends/cpu/ops/precision.h"
#include "engine/backends/rope_table.h"

namespace ms::cpu {
namespace {

template <class D, class Real>
void rotate_row(D* x, const float* table_row, int64_t rotated, int64_t HS, Real sign) {
    const int64_t half = HS / 2;
    for (int64_t h0 = 0; h0 < rotated; h0 += HS) {
        D* head = x + h0;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
            const Real c = table_row[i], s = sign * static_cast<Real>(table_row[half + i]);
            const Real x0 = to_float(head[i]), x1 = to_float(head[half + i]);
            head[i] = from_float<D>(static_cast<float>(x0 * c - x1 * s));
            head[half + i] = from_float<D>(static_cast<float>(x1 * c + x0 * s));
        }
    }
}

template <class D>
void run(const RopeArgs& a, const RopeDims& d, OpMode mode) {
    D* qkv = a.qkv.as<D>();
    const float* table = a.table.f32();
    const int32_t* positions = a.positions.defined() ? a.positions.i32() : nullptr;
    const int64_t N = d.N, T = a.T;
    const auto position = [&](int64_t n) -> int64_t { return positions ? positions[n] : n % T; };
    for (int64_t n = 0; n < (positions ? N : 0); ++n) {
        MS_CHECK(positions[n] >= 0 && positions[n] < d.P, "rope: positions[{}] = {} is outside the table's [0, {})", n,
                 positions[n], d.P);
    }
    const bool inverse = a.direction == RopeDirection::kInverse;
    if (mode == OpMode::kReference) {
        for (int64_t n = 0; n < N; ++n) {
            rotate_row<D, double>(qkv + n * d.row, table + position(n) * d.HS, d.rotated, d.HS, inverse ? -1.0 : 1.0);
        }
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        rotate_row<D, float>(qkv + n * d.row, table + position(n) * d.HS, d.rotated, d.HS, inverse ? -1.0f : 1.0f);
    }
}

}  // namespace

void rope(const RopeArgs& a, OpMode mode) {
    const RopeDims d = rope_dims(a);
    const DType D = activation_dtype(a.qkv, "rope", "qkv");
    dispatch_float(D, [&](auto tag) { run<decltype(tag)>(a, d, mode); });
}

}  // namespace ms::cpu
