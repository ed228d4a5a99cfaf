// op_test_util.h: helpers shared by the op tests: deterministic random data, guarded output buffers, a scale-free
// error metric, central finite differences, and the coverage registry (MS_OP_TEST) that test_op_coverage.cpp
// checks against OpKind.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/core/half.h"

namespace ms::test {

// ---- coverage registry ----

// What a test establishes about an op. test_op_coverage.cpp lists which kinds every OpKind needs.
enum class Check : uint8_t {
    kGradient,         // backward vs central finite differences of the forward
    kExact,            // against values known exactly or a closed form computed in the test
    kFastVsReference,  // OpMode::kFast vs OpMode::kReference on shapes that are not multiples of any block
    kContract,         // accumulation contract, aliasing, masking, causality
    kDeterminism,      // two runs bit-identical
};

struct OpTestEntry {
    OpKind op;
    Check check;
    std::string test;
};

inline std::vector<OpTestEntry>& op_test_registry() {
    static std::vector<OpTestEntry> entries;
    return entries;
}

inline bool register_op_test(Check check, const char* test, std::initializer_list<OpKind> ops) {
    for (OpKind op : ops) op_test_registry().push_back({op, check, test});
    return true;
}

// A GoogleTest TEST that also records, at static-initialisation time, which ops it checks and how. Static
// registration (not a run-time side effect) keeps the coverage test valid when ctest runs each test alone.
#define MS_OP_TEST(suite, name, check, ...)                                                      \
    static const bool suite##_##name##_registered =                                              \
        ::ms::test::register_op_test(::ms::test::Check::check, #suite "." #name, {__VA_ARGS__}); \
    TEST(suite, name)

// ---- data ----

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

// n small integers in [-8, 8] as floats: exact in bf16 and fp16, and every product and partial sum of a 16-term dot
// product of them exact in fp32, so the emulated tensor-core instructions can be compared with == against a loop.
inline std::vector<float> small_ints(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> dist(-8, 8);
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(dist(rng));
    return v;
}

// lo and hi rounded to S (bf16 or fp16) in one 32-bit operand register, lo in the low half (the PTX fragments' order).
template <class S>
uint32_t bits_of(float lo, float hi) {
    return static_cast<uint32_t>(from_float<S>(lo).bits) | static_cast<uint32_t>(from_float<S>(hi).bits) << 16;
}

inline std::vector<int32_t> random_ints(size_t n, uint32_t seed, int32_t lo, int32_t hi_inclusive) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> dist(lo, hi_inclusive);
    std::vector<int32_t> v(n);
    for (int32_t& x : v) x = dist(rng);
    return v;
}

inline Tensor view(std::vector<float>& v, std::initializer_list<int64_t> dims) { return Tensor::f32(v.data(), dims); }
inline Tensor view(std::vector<int32_t>& v, std::initializer_list<int64_t> dims) { return Tensor::i32(v.data(), dims); }

// An output buffer with kGuard sentinel floats on each side, to catch writes outside the tensor.
class Guarded {
  public:
    static constexpr size_t kGuard = 64;
    static constexpr float kSentinel = -12345.678f;

    explicit Guarded(int64_t n, float fill = 0.0f) : Guarded(std::vector<float>(static_cast<size_t>(n), fill)) {}
    explicit Guarded(const std::vector<float>& init) : buf_(init.size() + 2 * kGuard, kSentinel), n_(init.size()) {
        std::copy(init.begin(), init.end(), buf_.begin() + kGuard);
    }
    float* data() { return buf_.data() + kGuard; }
    Tensor tensor(std::initializer_list<int64_t> dims) { return Tensor::f32(data(), dims); }
    std::vector<float> values() const { return {buf_.begin() + kGuard, buf_.begin() + kGuard + n_}; }
    bool guards_intact() const {
        for (size_t i = 0; i < kGuard; ++i) {
            if (buf_[i] != kSentinel || buf_[kGuard + n_ + i] != kSentinel) return false;
        }
        return true;
    }

  private:
    std::vector<float> buf_;
    size_t n_;
};

// ---- 16-bit buffers and threads ----

// v rounded to D element by element, and back to fp32.
template <class D>
std::vector<D> to_d(const std::vector<float>& v) {
    std::vector<D> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = from_float<D>(v[i]);
    return out;
}
template <class D>
std::vector<float> to_f32(const std::vector<D>& v) {
    std::vector<float> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = to_float(v[i]);
    return out;
}
// v's elements as a tensor of D with these dims.
template <class D>
Tensor dview(std::vector<D>& v, std::initializer_list<int64_t> dims) {
    return Tensor(v.data(), dtype_of<D>(), dims);
}

// Runs f with `threads` OpenMP threads, then restores the previous count.
template <class F>
void with_threads(int threads, F&& f) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    f();
    omp_set_num_threads(before);
}

// ---- comparison ----

// Scale-free error: max |a - b| / max |b| (b is the trusted side). Infinite when a has a NaN.
template <typename A, typename B>
double max_rel_error(const std::vector<A>& a, const std::vector<B>& b) {
    EXPECT_EQ(a.size(), b.size());
    double max_diff = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
        if (std::isnan(static_cast<double>(a[i]))) return INFINITY;
        max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
        max_ref = std::max(max_ref, std::fabs(static_cast<double>(b[i])));
    }
    return max_diff / std::max(max_ref, 1e-30);
}

inline bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
    // empty vectors are equal: memcmp may not be given their null data()
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// sum_i out[i] * r[i] in double: the scalar loss whose gradient w.r.t. out is r.
inline double dot_loss(const std::vector<float>& out, const std::vector<float>& r) {
    double sum = 0.0;
    for (size_t i = 0; i < out.size(); ++i) sum += static_cast<double>(out[i]) * r[i];
    return sum;
}

// Central differences of loss() w.r.t. every element of x, which is perturbed in place and restored. The step is
// the one that float rounding actually produced, (x + eps) - (x - eps) as stored, not 2 * eps.
inline std::vector<double> numeric_grad(std::vector<float>& x, const std::function<double()>& loss, float eps = 1e-3f) {
    std::vector<double> grad(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const float x0 = x[i];
        x[i] = x0 + eps;
        const double plus = loss();
        const float x_plus = x[i];
        x[i] = x0 - eps;
        const double minus = loss();
        const float x_minus = x[i];
        x[i] = x0;
        grad[i] = (plus - minus) / (static_cast<double>(x_plus) - static_cast<double>(x_minus));
    }
    return grad;
}

inline const char* mode_name(OpMode mode) { return mode == OpMode::kFast ? "fast" : "reference"; }

// EXPECT err <= tol; with MS_OP_TEST_VERBOSE set, also print the measured error (how the tolerances were chosen).
inline void expect_within(const std::string& what, OpMode mode, double err, double tol) {
    if (std::getenv("MS_OP_TEST_VERBOSE")) {
        std::printf("  %-36s %-9s err %.2e (tol %.0e)\n", what.c_str(), mode_name(mode), err, tol);
    }
    EXPECT_LE(err, tol) << what << " in mode " << mode_name(mode);
}

inline std::unique_ptr<Backend> make_cpu_backend(OpMode mode) {
    BackendOptions options;
    options.kind = BackendKind::kCPU;
    options.mode = mode;
    return make_backend(options);
}

// x rounded through dtype d and back (fp32: x itself): what storing x in a d tensor keeps.
inline float round_through(DType d, float x) {
    return visit_float(d, [x](auto z) { return round_to<decltype(z)>(x); });
}
// every element of v rounded through d
inline std::vector<float> rounded(DType d, std::vector<float> v) {
    for (float& x : v) x = round_through(d, x);
    return v;
}

}  // namespace ms::test
