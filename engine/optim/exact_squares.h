// exact_squares.h: the two host passes of the exact gradient norm (DistributedOptimizer::exact_grad_squares), in a
// header of their own so that a unit test can hold them to their definitions.
//
//   max_abs(x, n)                  the largest |x[i]|, or +inf when some x[i] is not finite
//   fixed_point_scale(peak)        the fixed point for squares of values up to peak: the unit u, and the exponent
//                                  that scales a sum of them back
//   fixed_point_squares(x, n, u)   the sum over i of trunc(x[i]^2 * u), exact in 128 bits
//
// Both are written so that the compiler vectorizes them: a float max with NaN semantics does not vectorize and a
// 128-bit accumulator does not, so the max runs over the bit patterns of |x| and the sum over two 31-bit halves.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "engine/core/half.h"

namespace ms {

using u128 = unsigned __int128;

// With the sign bit cleared, the bit patterns of finite floats and of +inf order like their values, and every NaN's
// pattern lies above +inf's: so one unsigned max finds both the largest |x| and whether any x is not finite.
template <class T>
float max_abs(const T* x, int64_t n) {
    constexpr uint32_t kMagnitude = 0x7fffffffu, kInfinity = 0x7f800000u;
    uint32_t peak = 0;
#pragma omp parallel for schedule(static) reduction(max : peak)
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t a = float_bits(to_float(x[i])) & kMagnitude;
        peak = a > peak ? a : peak;
    }
    return peak >= kInfinity ? std::numeric_limits<float>::infinity() : bits_float(peak);
}

// The fixed point: each square in units of 2^-kFixedBits of 2^(2 e), e the exponent of the largest |x| (peak < 2^e),
// so a square is below 2^kFixedBits and 2^66 of them fit in 128 bits. A sum S in these units is S * 2^(2 e -
// kFixedBits), which `scale_back` holds.
constexpr int kFixedBits = 62;
struct FixedPointScale {
    double unit = 0;     // 2^(kFixedBits - 2 e)
    int scale_back = 0;  // 2 e - kFixedBits
};
inline FixedPointScale fixed_point_scale(float peak) {
    int e = 0;
    std::frexp(peak, &e);
    return {std::ldexp(1.0, kFixedBits - 2 * e), 2 * e - kFixedBits};
}

// x^2 is exact in double and the power of two keeps it so: only the truncation rounds, once per element, and the
// integer sum is exact in any order, so the threads may split it as they like. Each term t = x^2 u < 2^62 (unit
// from fixed_point_scale) is cut at
// 2^31: h = floor(t / 2^31) and r = t - h 2^31, which is exact (r = t when h is 0, and t / 2 <= h 2^31 <= t
// otherwise), so trunc(t) = h 2^31 + trunc(r) with both parts below 2^31. The parts are added in 64 bits, which hold
// 2^33 terms of each.
template <class T>
u128 fixed_point_squares(const T* x, int64_t n, double unit) {
    constexpr double kHalf = 2147483648.0, kInvHalf = 1.0 / kHalf;  // 2^31, 2^-31
    uint64_t high = 0, low = 0;
#pragma omp parallel for schedule(static) reduction(+ : high, low)
    for (int64_t i = 0; i < n; ++i) {
        const double d = to_float(x[i]);
        const double t = d * d * unit;
        const int32_t h = static_cast<int32_t>(t * kInvHalf);  // truncation is the floor: t >= 0
        high += static_cast<uint32_t>(h);
        low += static_cast<uint32_t>(static_cast<int32_t>(t - h * kHalf));
    }
    return (static_cast<u128>(high) << 31) + low;
}

}  // namespace ms
