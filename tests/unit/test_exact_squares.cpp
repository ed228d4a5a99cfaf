// test_exact_squares.cpp: the exact gradient norm's host passes (engine/optim/exact_squares.h) against their
// definitions written the slow way: the largest |x| with a float max and isfinite, and each truncated square added
// as its own 128-bit integer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "engine/core/half.h"
#include "engine/optim/exact_squares.h"

namespace {

using ms::u128;

template <class T>
float reference_max_abs(const std::vector<T>& x) {
    float peak = 0.0f;
    for (const T& v : x) {
        const float a = std::fabs(ms::to_float(v));
        if (!std::isfinite(a)) return std::numeric_limits<float>::infinity();
        peak = std::max(peak, a);
    }
    return peak;
}

template <class T>
u128 reference_squares(const std::vector<T>& x, double unit) {
    u128 sum = 0;
    for (const T& v : x) {
        const double d = ms::to_float(v);
        sum += static_cast<u128>(static_cast<uint64_t>(d * d * unit));
    }
    return sum;
}

// Values over many binades, of both signs, with exact zeros and (for 16-bit types) subnormals among them.
template <class T>
std::vector<T> spread(int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-30, 3);
    std::vector<T> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        const float v = i % 17 == 0 ? 0.0f : std::ldexp(mantissa(rng), exponent(rng));
        x[static_cast<size_t>(i)] = ms::from_float<T>(v);
    }
    return x;
}

template <class T>
void expect_both_match(const std::vector<T>& x) {
    const int64_t n = static_cast<int64_t>(x.size());
    const float peak = ms::max_abs(x.data(), n);
    ASSERT_EQ(ms::float_bits(peak), ms::float_bits(reference_max_abs(x)));
    if (peak == 0.0f) return;
    const ms::FixedPointScale scale = ms::fixed_point_scale(peak);
    const u128 sum = ms::fixed_point_squares(x.data(), n, scale.unit);
    EXPECT_TRUE(sum == reference_squares(x, scale.unit));
    // scaled back, the sum is the sum of squares, short of it by at most one unit (2^scale_back) per element
    double squares = 0;
    for (const T& v : x) squares += static_cast<double>(ms::to_float(v)) * ms::to_float(v);
    const double back = std::ldexp(static_cast<double>(sum), scale.scale_back);
    EXPECT_LE(back, squares * (1 + 1e-12));
    EXPECT_GE(back, squares * (1 - 1e-12) - std::ldexp(static_cast<double>(n), scale.scale_back));
}

TEST(ExactSquares, MatchTheDefinitionsOnEveryDtype) {
    for (int64_t n : {1, 7, 64, 1001, 100003}) {
        expect_both_match(spread<float>(n, 1));
        expect_both_match(spread<ms::bf16>(n, 2));
        expect_both_match(spread<ms::fp16>(n, 3));
    }
}

TEST(ExactSquares, TermsJustBelowTwoToThe62AreExact) {
    // |x| one ulp below 2^e: its square times the unit is just below 2^62, the largest term; its high part is
    // 2^31 - 1 and the low part carries the rest.
    const float top = std::nextafter(8.0f, 0.0f);
    std::vector<float> x(1000, -top);
    for (size_t i = 0; i < x.size(); i += 3) x[i] = std::nextafter(top, 0.0f);
    expect_both_match(x);
    const double unit = ms::fixed_point_scale(top).unit;
    const double t = double{top} * double{top} * unit;
    ASSERT_LT(t, std::ldexp(1.0, ms::kFixedBits));
    EXPECT_TRUE(ms::fixed_point_squares(&top, 1, unit) == static_cast<u128>(static_cast<uint64_t>(t)));
}

TEST(ExactSquares, AnyNonFiniteValueMakesTheMaximumInfinite) {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    for (float bad : {inf, -inf, nan, -nan}) {
        for (size_t at : {size_t{0}, size_t{500}, size_t{999}}) {
            std::vector<float> x = spread<float>(1000, 4);
            x[at] = bad;
            EXPECT_EQ(ms::max_abs(x.data(), 1000), inf) << bad << " at " << at;
            std::vector<ms::bf16> b = spread<ms::bf16>(1000, 5);
            b[at] = ms::from_float<ms::bf16>(bad);
            EXPECT_EQ(ms::max_abs(b.data(), 1000), inf) << bad << " at " << at;
        }
    }
}

TEST(ExactSquares, ZerosOfBothSignsGiveZero) {
    const std::vector<float> x = {0.0f, -0.0f, -0.0f};
    EXPECT_EQ(ms::float_bits(ms::max_abs(x.data(), 3)), 0u);
    EXPECT_EQ(ms::max_abs(x.data(), 0), 0.0f);
    EXPECT_TRUE(ms::fixed_point_squares(x.data(), 0, 1.0) == 0);
}

}  // namespace
