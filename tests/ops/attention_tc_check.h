// attention_tc_check.h: what the tensor-core attention tests share -- on the CPU emulation
// (tests/ops/test_cuda_emu_attention_tc.cpp) and on a GPU (tests/gpu/test_gpu_attention.cpp): the error measure,
// dqkv's thirds, and one set of tolerances, so the GPU is held to exactly what the emulation measured.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace ms::test {

// Columns [part * C, (part + 1) * C) of every row of the (B * T, 3C) dqkv: dQ, dK or dV.
inline std::vector<float> third(const std::vector<float>& dqkv, int64_t C, int part) {
    std::vector<float> v;
    for (size_t row = 0; row < dqkv.size() / (3 * C); ++row) {
        const auto first = dqkv.begin() + static_cast<int64_t>(row) * 3 * C + part * C;
        v.insert(v.end(), first, first + C);
    }
    return v;
}

// max |got - want| / max |scale|; infinite when got has a NaN.
inline double error_on_scale(const std::vector<float>& got, const std::vector<float>& want,
                             const std::vector<float>& scale) {
    double diff = 0.0, ref = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(got[i])) return INFINITY;
        diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    }
    for (float x : scale) ref = std::max(ref, std::fabs(static_cast<double>(x)));
    return diff / std::max(ref, 1e-30);
}

// EXPECT err <= tol; with MS_OP_TEST_VERBOSE set, also print the measured error (how the tolerances were chosen).
inline void expect_close(const std::string& what, double err, double tol) {
    if (std::getenv("MS_OP_TEST_VERBOSE")) std::printf("  %-40s err %.2e (tol %.0e)\n", what.c_str(), err, tol);
    EXPECT_LE(err, tol) << what;
}

// Scale-free tolerances, about 3x the largest errors MS_OP_TEST_VERBOSE=1 measured on the emulation over all T and
// HS (mma.sync kernels; test_cuda_emu_attention_tc.cpp lists them). The kernels round P (forward) and dS (backward) to
// the storage type before their mma, so the error is a few units in its last place: bf16 has 8 bits of mantissa,
// fp16 11, hence the ~8x between the two; lse is fp32 from fp32 sums: float rounding only.
struct Tolerances {
    double out, lse, dq, dk, dv;
};
inline constexpr Tolerances kAttentionTcBf16Tol{1.2e-2, 6e-7, 1.5e-2, 2.1e-2, 1.4e-2};
inline constexpr Tolerances kAttentionTcFp16Tol{1.5e-3, 8e-7, 2.4e-3, 2.2e-3, 2.0e-3};

}  // namespace ms::test
