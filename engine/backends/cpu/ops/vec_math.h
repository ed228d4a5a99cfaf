// vec_math.h: branch-free exp, sigmoid and sqrt that GCC auto-vectorises inside `#pragma omp simd` loops.
//
// Why: without -ffast-math / -fno-math-errno, glibc's expf, tanhf and sqrtf stay scalar calls (errno), and a
// single call keeps a whole loop scalar. These are used only by the kFast paths; kReference uses <cmath>.
// Accuracy, measured against double over every float in range: exp_approx 8.6e-8 relative (1.5 ulp), sqrt_nonneg
// 1.7e-7 relative.
// All are pure functions of their input, so results stay deterministic.
#pragma once

#include <bit>
#include <cstdint>

namespace ms::cpu {

// e^x for x in [-87, 88] (inputs outside are clamped; e^-87 ~ 1.6e-38 stands in for 0).
// Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then Cephes' degree-6 polynomial for e^r.
inline float exp_approx(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    // Adding and removing 1.5 * 2^23 rounds to the nearest integer without a (non-vectorised) call to rintf.
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t scale_bits = (static_cast<int32_t>(n) + 127) << 23;
    return p * std::bit_cast<float>(scale_bits);
}

// 1 / (1 + e^-x); saturates cleanly to 0 and 1.
inline float sigmoid_approx(float x) { return 1.0f / (1.0f + exp_approx(-x)); }

// sqrt(x) for x >= 0 (sqrt(0) = 0): bit-trick guess for 1/sqrt(x), three Newton steps, times x.
inline float sqrt_nonneg(float x) {
    float y = std::bit_cast<float>(0x5f3759df - (std::bit_cast<int32_t>(x) >> 1));
    const float half_x = 0.5f * x;
    y = y * (1.5f - half_x * y * y);
    y = y * (1.5f - half_x * y * y);
    y = y * (1.5f - half_x * y * y);
    return x * y;
}

// x . y and y += alpha x over n floats, vectorised (the fast attention paths' inner loops).
inline float dot_f32(const float* x, const float* y, int64_t n) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t d = 0; d < n; ++d) acc += x[d] * y[d];
    return acc;
}

inline void axpy_f32(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
    for (int64_t d = 0; d < n; ++d) y[d] += alpha * x[d];
}

// The largest of n >= 1 floats, in 16 lanes (a vector register, which a scalar running max is not).
inline float max_f32(const float* x, int64_t n) {
    constexpr int64_t kLanes = 16;
    float lanes[kLanes];
    for (int64_t k = 0; k < kLanes; ++k) lanes[k] = x[0];
    int64_t u = 0;
    for (; u + kLanes <= n; u += kLanes) {
        for (int64_t k = 0; k < kLanes; ++k) lanes[k] = lanes[k] < x[u + k] ? x[u + k] : lanes[k];
    }
    for (; u < n; ++u) lanes[0] = lanes[0] < x[u] ? x[u] : lanes[0];
    float m = lanes[0];
    for (int64_t k = 1; k < kLanes; ++k) m = m < lanes[k] ? lanes[k] : m;
    return m;
}

}  // namespace ms::cpu
