// half.h: the 16-bit float storage types (bf16, fp16) and their conversions to and from fp32, the same bits on the
// host, in the CUDA emulation and on a GPU.
//
// Mixed precision (docs/design.md §6, backends/backend.h) stores activations and model weights in 16 bits and computes
// in fp32: an op loads with to_float(), computes in fp32, and rounds once on store with from_float<T>(). Rounding is
// IEEE round-to-nearest-even; a NaN becomes the canonical quiet NaN 0x7FFF, as the GPU's cvt.rn does; fp16
// overflows to +-inf (|x| >= 65520) and keeps subnormals. Both conversions are plain integer arithmetic, so the
// host, the CPU emulation of the kernels and the GPU agree bit for bit (tests/unit/test_half.cpp checks fp16
// against the compiler's _Float16 over every bf16/fp16 bit pattern and a sweep of floats).
//
// Self-contained on purpose: nvcc compiles it into the kernels, so it includes no engine header.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MS_HOST_DEVICE __host__ __device__
#else
#define MS_HOST_DEVICE
#endif

namespace ms {

// Storage only: arithmetic goes through fp32. Trivially copyable, 2 bytes, the bits of the IEEE format.
struct bf16 {
    uint16_t bits;
};
struct fp16 {
    uint16_t bits;
};
static_assert(sizeof(bf16) == 2 && sizeof(fp16) == 2);

MS_HOST_DEVICE inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
#endif
}
MS_HOST_DEVICE inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
}

MS_HOST_DEVICE inline float to_float(float x) { return x; }
MS_HOST_DEVICE inline float to_float(bf16 x) { return bits_float(static_cast<uint32_t>(x.bits) << 16); }
MS_HOST_DEVICE inline float to_float(fp16 x) {
    const uint32_t sign = static_cast<uint32_t>(x.bits & 0x8000u) << 16;
    const uint32_t exp = (x.bits >> 10) & 0x1fu;
    uint32_t mant = x.bits & 0x3ffu;
    if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf, NaN (payload kept)
    if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
    if (mant == 0) return bits_float(sign);  // +-0
    // subnormal: mant * 2^-24, normalised
    int e = 113;  // exponent field of 2^-14, decremented while the leading bit is below position 10
    while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --e;
    }
    return bits_float(sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3ffu) << 13));
}

MS_HOST_DEVICE inline bf16 bf16_from_float(float f) {
    const uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{0x7fffu};  // NaN
    return bf16{static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

MS_HOST_DEVICE inline fp16 fp16_from_float(float f) {
    const uint32_t x = float_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return fp16{0x7fffu};                                 // NaN
    if (a >= 0x477ff000u) return fp16{static_cast<uint16_t>(sign | 0x7c00u)};  // >= 65520 (and inf): inf
    if (a < 0x38800000u) {                                                     // below 2^-14: subnormal or 0
        if (a < 0x33000000u) return fp16{static_cast<uint16_t>(sign)};         // <= 2^-25 rounds to 0
        const uint32_t e = a >> 23;                                            // 102 .. 112
        const uint32_t m = (a & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - e;  // 14 .. 24
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
        return fp16{static_cast<uint16_t>(sign | h)};
    }
    const uint32_t r = a - 0x38000000u;  // rebias the exponent from 127 to 15
    uint32_t h = r >> 13;
    const uint32_t rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return fp16{static_cast<uint16_t>(sign | h)};
}

// from_float<T>(x): x rounded to T (the identity for float). Kernels templated on the storage type T store with it.
template <class T>
MS_HOST_DEVICE inline T from_float(float x);
template <>
MS_HOST_DEVICE inline float from_float<float>(float x) {
    return x;
}
template <>
MS_HOST_DEVICE inline bf16 from_float<bf16>(float x) {
    return bf16_from_float(x);
}
template <>
MS_HOST_DEVICE inline fp16 from_float<fp16>(float x) {
    return fp16_from_float(x);
}

// x rounded to T and back: what storing x in a T tensor keeps (tests round their fp32 references through it).
template <class T>
MS_HOST_DEVICE inline float round_to(float x) {
    return to_float(from_float<T>(x));
}

}  // namespace ms
