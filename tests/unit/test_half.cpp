// test_half.cpp: the 16-bit float conversions of engine/core/half.h against independent references.
//
//   fp16: to_float over all 65536 bit patterns and from_float over a sweep of float bit patterns (a strided pass
//         over all 2^32, and every float near each fp16 rounding boundary: normal and subnormal ties, overflow at
//         65520) against the compiler's _Float16 conversions (g++ >= 12 on x86-64: F16C or libgcc, both IEEE
//         round-to-nearest-even). NaNs are compared as NaNs: half.h canonicalises to 0x7FFF (as the GPU's cvt.rn),
//         the compiler keeps the payload.
//   bf16: the conversion to float is the bits shifted up (checked over all 65536 patterns), the round trip is the
//         identity on every non-NaN pattern, from_float against a remainder-comparison reference written here over a
//         float sweep, and the round-to-nearest-even tie cases worked out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/core/half.h"

namespace ms {
namespace {

// _Float16: g++ >= 12 and clang >= 15 on x86-64 (clang 14, the sanitizer build's compiler here, has none; the
// g++ build runs the two comparisons with it).
#if defined(__FLT16_MAX__)
#define MS_HAVE_FLOAT16 1
uint16_t f16_bits(_Float16 h) {
    uint16_t b;
    std::memcpy(&b, &h, 2);
    return b;
}
_Float16 f16_from_bits(uint16_t b) {
    _Float16 h;
    std::memcpy(&h, &b, 2);
    return h;
}

#endif

// bf16 rounding written differently from half.h: compare the 16 dropped bits with the halfway point.
uint16_t bf16_reference(float f) {
    const uint32_t u = float_bits(f);
    if (std::isnan(f)) return 0x7fff;
    uint32_t hi = u >> 16;
    const uint32_t lo = u & 0xffffu;
    if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) ++hi;  // carries into the exponent, up to inf: as IEEE says
    return static_cast<uint16_t>(hi);
}

// Float bit patterns: a strided pass over all 2^32, and around each of fp16's rounding boundaries (every fp16
// mantissa at every exponent that fp16 normals, subnormals or overflow reach, with the dropped bits at 0, 1,
// halfway - 1, halfway, halfway + 1 and all ones).
std::vector<uint32_t> float_sweep() {
    std::vector<uint32_t> patterns;
    for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) patterns.push_back(static_cast<uint32_t>(u));
    for (uint32_t sign : {0u, 0x80000000u}) {
        for (uint32_t e = 98; e <= 144; ++e) {  // 2^-29 .. 2^17: below the smallest fp16 subnormal to past 65520
            // The number of dropped bits: 13 for fp16 normals, more for subnormals (exponent below 113).
            const uint32_t dropped = e >= 113 ? 13u : std::min(24u, 13u + (113u - e));
            const uint32_t half = 1u << (dropped - 1);
            for (uint32_t kept = 0; kept < (1u << (23 - std::min(dropped, 23u))); ++kept) {
                for (uint32_t low : {0u, 1u, half - 1, half, half + 1, (half << 1) - 1}) {
                    const uint32_t mant = ((kept << dropped) | low) & 0x7fffffu;
                    patterns.push_back(sign | (e << 23) | mant);
                }
            }
        }
    }
    for (uint32_t special : {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffc12345u, 0x477fefffu, 0x477ff000u,
                             0x477ff001u, 0xc77ff000u, 0x7f7fffffu, 0x00000001u, 0x80000001u}) {
        patterns.push_back(special);
    }
    return patterns;
}

#if defined(MS_HAVE_FLOAT16)
TEST(Half, Fp16ToFloatMatchesCompilerOnAllPatterns) {
    for (uint32_t b = 0; b <= 0xffff; ++b) {
        const float got = to_float(fp16{static_cast<uint16_t>(b)});
        const float want = static_cast<float>(f16_from_bits(static_cast<uint16_t>(b)));
        if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(got)) << std::hex << b;
            // The payload is kept (the compiler also sets the quiet bit 0x00400000).
            ASSERT_EQ(float_bits(got) | 0x00400000u, float_bits(want) | 0x00400000u) << std::hex << b;
            continue;
        }
        ASSERT_EQ(float_bits(got), float_bits(want)) << std::hex << "fp16 0x" << b;
    }
}

TEST(Half, Fp16FromFloatMatchesCompilerOnFloatSweep) {
    const std::vector<uint32_t> patterns = float_sweep();
    size_t checked = 0;
    for (uint32_t u : patterns) {
        const float f = bits_float(u);
        const uint16_t got = from_float<fp16>(f).bits;
        if (std::isnan(f)) {
            ASSERT_EQ(got, 0x7fff) << std::hex << "float 0x" << u << ": NaN must become the canonical 0x7FFF";
            continue;
        }
        ASSERT_EQ(got, f16_bits(static_cast<_Float16>(f))) << std::hex << "float 0x" << u << " (" << f << ")";
        ++checked;
    }
    EXPECT_GT(checked, 1000000u);
}

#else
TEST(Half, Fp16ToFloatMatchesCompilerOnAllPatterns) { GTEST_SKIP() << "this compiler has no _Float16"; }
TEST(Half, Fp16FromFloatMatchesCompilerOnFloatSweep) { GTEST_SKIP() << "this compiler has no _Float16"; }
#endif

TEST(Half, Fp16OverflowBoundaryAndSubnormals) {
    EXPECT_EQ(from_float<fp16>(65504.0f).bits, 0x7bff);                 // the largest finite fp16
    EXPECT_EQ(from_float<fp16>(bits_float(0x477fefffu)).bits, 0x7bff);  // just below 65520: rounds down
    EXPECT_EQ(from_float<fp16>(65520.0f).bits, 0x7c00);                 // halfway to 2^16, odd mantissa: up to inf
    EXPECT_EQ(from_float<fp16>(-65520.0f).bits, 0xfc00);
    EXPECT_EQ(from_float<fp16>(INFINITY).bits, 0x7c00);
    EXPECT_EQ(from_float<fp16>(std::ldexp(1.0f, -24)).bits, 0x0001);         // the smallest subnormal
    EXPECT_EQ(from_float<fp16>(std::ldexp(1.0f, -25)).bits, 0x0000);         // half of it: ties to even (0)
    EXPECT_EQ(from_float<fp16>(std::ldexp(3.0f, -25)).bits, 0x0002);         // 1.5 subnormals: ties to even (2)
    EXPECT_EQ(from_float<fp16>(-std::ldexp(1.0f, -26)).bits, 0x8000);        // -0 keeps its sign
    EXPECT_EQ(from_float<fp16>(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);  // tie at 1: to even
    EXPECT_EQ(from_float<fp16>(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);
    EXPECT_EQ(from_float<fp16>(std::nanf("")).bits, 0x7fff);
    EXPECT_EQ(from_float<fp16>(-std::nanf("")).bits, 0x7fff);
}

TEST(Half, Bf16ToFloatAndRoundTripOnAllPatterns) {
    for (uint32_t b = 0; b <= 0xffff; ++b) {
        const bf16 h{static_cast<uint16_t>(b)};
        const float f = to_float(h);
        ASSERT_EQ(float_bits(f), b << 16) << std::hex << b;
        const uint16_t back = from_float<bf16>(f).bits;
        if (std::isnan(f)) {
            ASSERT_EQ(back, 0x7fff) << std::hex << b;
        } else {
            ASSERT_EQ(back, b) << std::hex << "bf16 0x" << b << " does not round-trip";
        }
    }
}

TEST(Half, Bf16FromFloatMatchesReferenceOnFloatSweep) {
    for (uint64_t u = 0; u <= 0xffffffffull; u += 257) {
        const float f = bits_float(static_cast<uint32_t>(u));
        ASSERT_EQ(from_float<bf16>(f).bits, bf16_reference(f)) << std::hex << "float 0x" << u;
    }
    // Every bf16 value with the dropped 16 bits at each interesting offset.
    for (uint32_t hi = 0; hi <= 0xffff; ++hi) {
        for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
            const float f = bits_float((hi << 16) | low);
            ASSERT_EQ(from_float<bf16>(f).bits, bf16_reference(f)) << std::hex << "float 0x" << ((hi << 16) | low);
        }
    }
}

TEST(Half, Bf16TiesToEvenByHand) {
    // 1 + 2^-8 lies halfway between bf16 1.0 (0x3F80) and 1 + 2^-7 (0x3F81): the even one, 0x3F80.
    EXPECT_EQ(from_float<bf16>(bits_float(0x3f808000u)).bits, 0x3f80);
    // 1 + 3 * 2^-8 lies halfway between 0x3F81 and 0x3F82: the even one, 0x3F82.
    EXPECT_EQ(from_float<bf16>(bits_float(0x3f818000u)).bits, 0x3f82);
    EXPECT_EQ(from_float<bf16>(bits_float(0x3f808001u)).bits, 0x3f81);  // just above halfway: up
    EXPECT_EQ(from_float<bf16>(bits_float(0x3f807fffu)).bits, 0x3f80);  // just below: down
    EXPECT_EQ(from_float<bf16>(bits_float(0xbf808000u)).bits, 0xbf80);  // negative tie: to even magnitude
    EXPECT_EQ(from_float<bf16>(bits_float(0xbf818000u)).bits, 0xbf82);
    // The largest finite bf16 is 0x7F7F; halfway to inf (odd mantissa) rounds to inf, just below stays finite.
    EXPECT_EQ(from_float<bf16>(bits_float(0x7f7f8000u)).bits, 0x7f80);
    EXPECT_EQ(from_float<bf16>(bits_float(0x7f7f7fffu)).bits, 0x7f7f);
    EXPECT_EQ(from_float<bf16>(bits_float(0x7f7fffffu)).bits, 0x7f80);  // FLT_MAX overflows to inf
    // Subnormals round like any other value: 2^-149 * 0x8000 is halfway between 0 and the smallest bf16 subnormal.
    EXPECT_EQ(from_float<bf16>(bits_float(0x00008000u)).bits, 0x0000);
    EXPECT_EQ(from_float<bf16>(bits_float(0x00018000u)).bits, 0x0002);
    EXPECT_EQ(from_float<bf16>(INFINITY).bits, 0x7f80);
    EXPECT_EQ(from_float<bf16>(-INFINITY).bits, 0xff80);
    EXPECT_EQ(from_float<bf16>(std::nanf("")).bits, 0x7fff);
    EXPECT_EQ(from_float<bf16>(bits_float(0xffc00001u)).bits, 0x7fff);  // any NaN, any sign
    EXPECT_EQ(round_to<bf16>(1.0f / 3.0f), bits_float(0x3eab0000u));    // 0x3EAAAAAB rounds up to 0x3EAB
}

}  // namespace
}  // namespace ms
