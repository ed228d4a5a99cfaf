// attention_gqa_check.h: what the grouped-query attention tests share (tests/ops/test_attention_gqa.cpp on the CPU,
// tests/ops/test_cuda_emu_attention_gqa.cpp on the CUDA emulation): the shape, a qkv whose key/value heads are
// repeated per group (the multi-head attention that grouped-query attention must equal), the group sums of that
// attention's dK and dV, a typed buffer for fp32 / bf16 / fp16 tensors, and one forward + backward through a Backend.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/core/half.h"
#include "engine/core/tensor.h"

namespace ms::test {

// qkv rows [Q: NH*HS | K: NKV*HS | V: NKV*HS]; query head h reads key/value head h / (NH / NKV).
struct GqaShape {
    int B, T, NH, NKV, HS;
    int C() const { return NH * HS; }
    int W() const { return (NH + 2 * NKV) * HS; }  // qkv's row width
    int G() const { return NH / NKV; }
    std::string tag() const {
        return "B " + std::to_string(B) + " T " + std::to_string(T) + " NH " + std::to_string(NH) + " NKV " +
               std::to_string(NKV) + " HS " + std::to_string(HS);
    }
};

// The multi-head qkv (B, T, 3*NH*HS) whose K and V head h are key/value head h / G of the grouped-query qkv.
inline std::vector<float> repeat_kv(const std::vector<float>& qkv, const GqaShape& s) {
    const int C = s.C(), W = s.W(), HS = s.HS;
    std::vector<float> mha(size_t{1} * s.B * s.T * 3 * C);
    for (int64_t row = 0; row < int64_t{s.B} * s.T; ++row) {
        const float* src = qkv.data() + row * W;
        float* dst = mha.data() + row * 3 * C;
        for (int h = 0; h < s.NH; ++h) {
            const int kv = h / s.G();
            for (int d = 0; d < HS; ++d) {
                dst[h * HS + d] = src[h * HS + d];
                dst[C + h * HS + d] = src[C + kv * HS + d];
                dst[2 * C + h * HS + d] = src[C + (s.NKV + kv) * HS + d];
            }
        }
    }
    return mha;
}

// The grouped-query dqkv (B, T, W) that the multi-head dqkv (B, T, 3*NH*HS) of repeat_kv's qkv implies: dQ as it is,
// dK and dV of key/value head kv the sums (in double, head order) of those of query heads kv*G .. kv*G + G - 1.
inline std::vector<double> group_sum_kv(const std::vector<float>& dqkv_mha, const GqaShape& s) {
    const int C = s.C(), W = s.W(), HS = s.HS;
    std::vector<double> gqa(size_t{1} * s.B * s.T * W, 0.0);
    for (int64_t row = 0; row < int64_t{s.B} * s.T; ++row) {
        const float* src = dqkv_mha.data() + row * 3 * C;
        double* dst = gqa.data() + row * W;
        for (int h = 0; h < s.NH; ++h) {
            const int kv = h / s.G();
            for (int d = 0; d < HS; ++d) {
                dst[h * HS + d] = src[h * HS + d];
                dst[C + kv * HS + d] += src[C + h * HS + d];
                dst[C + (s.NKV + kv) * HS + d] += src[2 * C + h * HS + d];
            }
        }
    }
    return gqa;
}

// Columns [from, from + width) of every row of a (rows, row_width) matrix: dQ, dK or dV of a dqkv.
template <class X>
std::vector<X> columns(const std::vector<X>& m, int64_t row_width, int64_t from, int64_t width) {
    std::vector<X> v;
    for (size_t row = 0; row < m.size() / row_width; ++row) {
        const auto first = m.begin() + static_cast<int64_t>(row) * row_width + from;
        v.insert(v.end(), first, first + width);
    }
    return v;
}

// max |got - want| / max |want|; infinite when got has a NaN.
template <class X>
double gqa_error(const std::vector<float>& got, const std::vector<X>& want) {
    double diff = 0.0, ref = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(got[i])) return INFINITY;
        diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i])));
        ref = std::max(ref, std::fabs(static_cast<double>(want[i])));
    }
    return diff / std::max(ref, 1e-30);
}

// EXPECT err <= tol; with MS_OP_TEST_VERBOSE set, also print the measured error (how the tolerances were chosen).
inline void expect_gqa_close(const std::string& what, double err, double tol) {
    if (std::getenv("MS_OP_TEST_VERBOSE")) std::printf("  %-52s err %.2e (tol %.0e)\n", what.c_str(), err, tol);
    EXPECT_LE(err, tol) << what;
}

// n values of dtype d (fp32, bf16 or fp16), 16-byte aligned, started as NaN so every element must be written.
class TypedBuf {
  public:
    TypedBuf(DType d, size_t n) : d_(d), n_(n), words_((n * dtype_size(d) + 15) / 16) {
        visit_float(d_, [&](auto z) {
            using S = decltype(z);
            for (size_t i = 0; i < n_; ++i) data<S>()[i] = from_float<S>(NAN);
        });
    }
    TypedBuf(DType d, const std::vector<float>& init) : TypedBuf(d, init.size()) {
        visit_float(d_, [&](auto z) {
            using S = decltype(z);
            for (size_t i = 0; i < n_; ++i) data<S>()[i] = from_float<S>(init[i]);
        });
    }
    Tensor tensor(std::initializer_list<int64_t> dims) { return Tensor(words_.data(), d_, dims); }
    void* raw() { return words_.data(); }
    std::vector<float> values() const {
        std::vector<float> v(n_);
        visit_float(d_, [&](auto z) {
            using S = decltype(z);
            const S* p = reinterpret_cast<const S*>(words_.data());
            for (size_t i = 0; i < n_; ++i) v[i] = to_float(p[i]);
        });
        return v;
    }

  private:
    template <class S>
    S* data() {
        return reinterpret_cast<S*>(words_.data());
    }
    struct alignas(16) Word {
        unsigned char bytes[16];
    };
    DType d_;
    size_t n_;
    std::vector<Word> words_;
};

// One attention forward, then its backward on the forward's own out and lse. nkv: the NKV argument (0: NH); qkv's
// heads follow from it (NH + 2 * NKV of them, NKV = nkv or NH).
struct AttentionResult {
    std::vector<float> out, lse, dqkv;
};
inline AttentionResult run_attention(Backend& be, DType d, int B, int T, int NH, int64_t nkv, int HS,
                                     const std::vector<float>& qkv_values, const std::vector<float>& dout_values) {
    const int64_t kv = nkv == 0 ? NH : nkv, W = (NH + 2 * kv) * HS, C = int64_t{NH} * HS;
    TypedBuf qkv(d, qkv_values), dout(d, dout_values), out(d, size_t(B) * T * C), dqkv(d, size_t(B) * T * W);
    TypedBuf lse(DType::kF32, size_t(B) * NH * T);
    be.attention_forward({.qkv = qkv.tensor({B, T, W}),
                          .out = out.tensor({B, T, C}),
                          .lse = lse.tensor({B, NH, T}),
                          .NH = NH,
                          .NKV = nkv});
    be.attention_backward({.dout = dout.tensor({B, T, C}),
                           .qkv = qkv.tensor({B, T, W}),
                           .out = out.tensor({B, T, C}),
                           .lse = lse.tensor({B, NH, T}),
                           .dqkv = dqkv.tensor({B, T, W}),
                           .NH = NH,
                           .NKV = nkv});
    return {out.values(), lse.values(), dqkv.values()};
}

}  // namespace ms::test
