// test_cuda_emu_packed.cpp: the 16-byte packed paths of the memory-bound kernels on bf16 / fp16 (layernorm.cu,
// gelu.cu, residual.cu, cross_entropy.cu; engine/backends/cuda/pack.cuh) against their scalar paths, bit for bit (the
// cross-entropy's exp-sum to a float rounding: its order differs), on the CPU emulation. A kernel takes the packed path
// when its pointers are 16-byte aligned (and, for LayerNorm, C % 8 == 0; for the residual's bias, M % 8 == 0); the same
// data one element past an aligned address takes the scalar path. Both must store the same bits: each element's math is
// the same function, and LayerNorm sums its row in the same order either way. test_cuda_emu_mixed.cpp compares the
// kernels with the CPU backend (at widths that are not multiples of 8, so on the scalar paths); with this test, the
// packed paths inherit that comparison. Widths with more than 32 packs per row (every lane loops) and element counts
// with a scalar tail are included.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/backends/cuda/kernels/cross_entropy.cuh"
#include "engine/backends/cuda/kernels/gelu.cuh"
#include "engine/backends/cuda/kernels/layernorm.cuh"
#include "engine/backends/cuda/kernels/residual.cuh"
#include "engine/core/half.h"

namespace ms {
namespace {

// n values of T at a 16-byte aligned address (packed) or one element past one (scalar), with the same contents.
template <class T>
class Buf {
  public:
    Buf(int64_t n, bool aligned, uint32_t seed, float lo = -2.0f, float hi = 2.0f) : store_(n + 16) {
        auto addr = reinterpret_cast<uintptr_t>(store_.data());
        size_t first = 0;
        while ((addr + first * sizeof(T)) % 16 != 0) ++first;
        p_ = store_.data() + first + (aligned ? 0 : 1);
        uint32_t s = seed * 2654435761u + 1;
        for (int64_t i = 0; i < n; ++i) {
            s = s * 1664525u + 1013904223u;
            p_[i] = from_float<T>(lo + (hi - lo) * static_cast<float>(s >> 8) / 16777216.0f);
        }
        n_ = n;
    }
    T* data() { return p_; }
    std::vector<uint16_t> bits() const {
        std::vector<uint16_t> b(static_cast<size_t>(n_));
        std::memcpy(b.data(), p_, b.size() * sizeof(T));
        return b;
    }

  private:
    std::vector<T> store_;
    T* p_ = nullptr;
    int64_t n_ = 0;
};

std::vector<uint32_t> float_bits_of(const std::vector<float>& v) {
    std::vector<uint32_t> b(v.size());
    std::memcpy(b.data(), v.data(), v.size() * 4);
    return b;
}

template <class T>
class CudaEmuPacked : public ::testing::Test {};
using HalfTypes = ::testing::Types<bf16, fp16>;
TYPED_TEST_SUITE(CudaEmuPacked, HalfTypes);

TYPED_TEST(CudaEmuPacked, GeluForwardAndBackwardAreTheScalarPathsBits) {
    using T = TypeParam;
    for (int64_t n : {int64_t{8}, int64_t{1003}, int64_t{40000}}) {
        std::vector<uint16_t> out[2], dinp[2], inplace[2];
        for (int aligned = 0; aligned < 2; ++aligned) {
            Buf<T> x(n, aligned, 1, -6.0f, 6.0f), y(n, aligned, 2), dy(n, aligned, 3), dx(n, aligned, 4),
                d2(n, aligned, 3);
            cuda::gelu_forward(y.data(), x.data(), n, nullptr);
            cuda::gelu_backward(dx.data(), x.data(), dy.data(), n, nullptr);
            cuda::gelu_backward(d2.data(), x.data(), d2.data(), n, nullptr);  // dinp aliasing dout
            out[aligned] = y.bits(), dinp[aligned] = dx.bits(), inplace[aligned] = d2.bits();
        }
        EXPECT_EQ(out[0], out[1]) << "n = " << n;
        EXPECT_EQ(dinp[0], dinp[1]) << "n = " << n;
        EXPECT_EQ(inplace[0], inplace[1]) << "n = " << n;
        EXPECT_EQ(dinp[1], inplace[1]) << "n = " << n;
    }
}

TYPED_TEST(CudaEmuPacked, ResidualIsTheScalarPathsBits) {
    using T = TypeParam;
    const int64_t M = 96, n = 37 * M;  // a bias of M % 8 == 0: packed with the bias too
    for (int64_t len : {n, n + 5}) {   // + 5: a scalar tail (without the bias, which must divide n)
        std::vector<uint16_t> with_bias[2], in_place[2];
        for (int aligned = 0; aligned < 2; ++aligned) {
            Buf<T> a(len, aligned, 1), b(len, aligned, 2), bias(M, aligned, 3), out(len, aligned, 4);
            if (len == n) cuda::residual_forward(out.data(), a.data(), b.data(), bias.data(), len, M, nullptr);
            with_bias[aligned] = out.bits();
            cuda::residual_forward(a.data(), a.data(), b.data(), nullptr, len, 0, nullptr);  // out aliasing a
            in_place[aligned] = a.bits();
        }
        EXPECT_EQ(with_bias[0], with_bias[1]) << "n = " << len;
        EXPECT_EQ(in_place[0], in_place[1]) << "n = " << len;
    }
}

TYPED_TEST(CudaEmuPacked, LayerNormForwardAndBackwardAreTheScalarPathsBits) {
    using T = TypeParam;
    const int N = 37;
    for (int C : {96, 776}) {  // 12 packs per row; 97 (every lane loops, one lane three times)
        const int64_t NC = int64_t{N} * C;
        struct Result {
            std::vector<uint16_t> out, dinp_add, dinp;
            std::vector<uint32_t> mean, rstd, dw, db;
        } r[2];
        for (int aligned = 0; aligned < 2; ++aligned) {
            Buf<T> x(NC, aligned, 1, -2.0f, 3.0f), w(C, aligned, 2, 0.5f, 1.5f), b(C, aligned, 3), y(NC, aligned, 4),
                dy(NC, aligned, 5), dx_add(NC, aligned, 6), dx(NC, aligned, 7);
            std::vector<float> mean(N), rstd(N), dw(C, 0.25f), db(C, -0.5f),
                scratch(cuda::layernorm_backward_scratch_floats(N, C));
            cuda::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f,
                                    nullptr);
            cuda::layernorm_backward(dx_add.data(), dw.data(), db.data(), scratch.data(), dy.data(), x.data(), w.data(),
                                     mean.data(), rstd.data(), N, C, cuda::DinpWrite::kAdd, nullptr);
            cuda::layernorm_backward(dx.data(), dw.data(), db.data(), scratch.data(), dy.data(), x.data(), w.data(),
                                     mean.data(), rstd.data(), N, C, cuda::DinpWrite::kOverwrite, nullptr);
            r[aligned] = {y.bits(),          dx_add.bits(),    dx.bits(), float_bits_of(mean), float_bits_of(rstd),
                          float_bits_of(dw), float_bits_of(db)};
        }
        EXPECT_EQ(r[0].out, r[1].out) << "C = " << C;
        EXPECT_EQ(r[0].mean, r[1].mean) << "C = " << C;
        EXPECT_EQ(r[0].rstd, r[1].rstd) << "C = " << C;
        EXPECT_EQ(r[0].dinp_add, r[1].dinp_add) << "C = " << C;
        EXPECT_EQ(r[0].dinp, r[1].dinp) << "C = " << C;
        EXPECT_EQ(r[0].dw, r[1].dw) << "C = " << C;
        EXPECT_EQ(r[0].db, r[1].db) << "C = " << C;
    }
}

// A row takes the packed path when the logits are 16-byte aligned and Vp % 8 == 0 (every row then starts aligned).
// Vp = 2112: 264 packs per row (every thread loops, some twice); valid = 2100 < Vp leaves a scalar tail of valid
// columns and masked columns inside packs; targets include a masked column and one outside this shard.
TYPED_TEST(CudaEmuPacked, CrossEntropyIsTheScalarPathsBits) {
    using T = TypeParam;
    const int N = 5, Vp = 2112, valid = 2100;
    const int64_t vocab_start = 1000;
    std::vector<int32_t> targets = {1000, 1000 + 2099, 1000 + 17, 1000 + 2105, 7};
    struct Result {
        std::vector<uint32_t> max, target_logit;
        std::vector<float> sum;
        std::vector<uint16_t> dlogits;
    } r[2];
    for (int aligned = 0; aligned < 2; ++aligned) {
        Buf<T> logits(int64_t{N} * Vp, aligned, 1, -8.0f, 8.0f);
        std::vector<float> max(N), sum(N), target_logit(N), dloss(N, 0.25f);
        cuda::cross_entropy_forward(max.data(), sum.data(), target_logit.data(), logits.data(), targets.data(), N, Vp,
                                    vocab_start, valid, cuda::CrossEntropyPhase::kMax, nullptr);
        cuda::cross_entropy_forward(max.data(), sum.data(), target_logit.data(), logits.data(), targets.data(), N, Vp,
                                    vocab_start, valid, cuda::CrossEntropyPhase::kSumExp, nullptr);
        std::vector<float> max1(N), sum1(N), target1(N);  // both pieces in one read, packed or not
        cuda::cross_entropy_forward(max1.data(), sum1.data(), target1.data(), logits.data(), targets.data(), N, Vp,
                                    vocab_start, valid, cuda::CrossEntropyPhase::kMaxSumExp, nullptr);
        EXPECT_EQ(float_bits_of(max1), float_bits_of(max));
        EXPECT_EQ(float_bits_of(target1), float_bits_of(target_logit));
        for (int n = 0; n < N; ++n) EXPECT_NEAR(sum1[n], sum[n], 1e-6 * sum[n]) << "row " << n;
        cuda::cross_entropy_backward(logits.data(), targets.data(), max.data(), sum.data(), dloss.data(), N, Vp,
                                     vocab_start, valid, nullptr);
        r[aligned] = {float_bits_of(max), float_bits_of(target_logit), sum, logits.bits()};
    }
    EXPECT_EQ(r[0].max, r[1].max);
    EXPECT_EQ(r[0].target_logit, r[1].target_logit);
    for (int n = 0; n < N; ++n) EXPECT_NEAR(r[1].sum[n], r[0].sum[n], 1e-6 * r[0].sum[n]) << "row " << n;
    // dlogits: exp(x - max) * (dloss / sum): the sums' last-bit difference can move a 16-bit rounding by one ulp
    size_t differ = 0;
    for (size_t i = 0; i < r[0].dlogits.size(); ++i) {
        const uint16_t a = r[0].dlogits[i], b = r[1].dlogits[i];
        differ += a != b;
        EXPECT_LE(a > b ? a - b : b - a, 1) << "dlogit " << i;
        if (i % Vp >= static_cast<size_t>(valid)) {
            EXPECT_EQ(b, 0u) << "masked dlogit " << i;
        }
    }
    EXPECT_LE(differ, r[0].dlogits.size() / 100);
}

}  // namespace
}  // namespace ms
