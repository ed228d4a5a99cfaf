// test_attention_gqa.cpp: grouped-query attention (AttentionForwardArgs / AttentionBackwardArgs with NKV < NH) on the
// CPU backend, both modes, fp32 and bf16.
//
// The spec: grouped-query attention is multi-head attention on a qkv whose key/value heads are repeated per group
// (repeat_kv), with dK and dV of a key/value head the sums of its query heads' (group_sum_kv). Per query head the ops
// run the same operations on the same values, so out, lse and dQ must equal the multi-head ones bit for bit; dK and
// dV sum the group's terms in one accumulator (double in kReference, fp32 in kFast) and round once, where the
// multi-head op rounds each head's, so they are checked against the double group sums within measured tolerances
// (and bit for bit when NKV = NH, a group of one). NH = 4, NKV in {1, 2, 4}, B = 2, T in {16, 33}, HS in {8, 16}; fast
// against reference also at T = 150, where the fast path's query blocks of 64 rows are three, the last one partial. NKV
// = 0 must be NKV = NH bit for bit; the fast backward must not depend on the thread count; an NKV that does not divide
// NH is refused with a sentence naming both.
//
// Tolerances: scale-free (max |got - want| / max |want|), about 3x the largest MS_OP_TEST_VERBOSE=1 measured over the
// shapes above:
//   dK, dV vs the group sums: fp32 reference 5.7e-8, fp32 fast 4.4e-7, bf16 (either mode) 4.8e-3
//   fast vs reference: fp32 out 3.0e-7, lse 1.0e-7, dqkv 4.8e-7; bf16 out 2.0e-3, lse 1.0e-7, dqkv 3.9e-3
#include <omp.h>

#include <string>
#include <vector>

#include "tests/ops/attention_gqa_check.h"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

constexpr int kB = 2, kNH = 4;

struct GroupSumTol {
    double f32_reference, f32_fast, bf16;
};
constexpr GroupSumTol kGroupSumTol{2e-7, 1.5e-6, 1.5e-2};

struct Inputs {
    std::vector<float> qkv, dout;  // rounded through the dtype, so repeating heads and storing are exact
};
Inputs make_inputs(DType d, const GqaShape& s, uint32_t seed) {
    return {rounded(d, random_floats(size_t{1} * s.B * s.T * s.W(), seed, -2.0f, 2.0f)),
            rounded(d, random_floats(size_t{1} * s.B * s.T * s.C(), seed + 1))};
}

TEST(AttentionGqa, EqualsMultiHeadAttentionOnRepeatedKeyValueHeads) {
    for (DType d : {DType::kF32, DType::kBF16}) {
        for (OpMode mode : {OpMode::kReference, OpMode::kFast}) {
            auto be = make_cpu_backend(mode);
            const double tol = d == DType::kBF16       ? kGroupSumTol.bf16
                               : mode == OpMode::kFast ? kGroupSumTol.f32_fast
                                                       : kGroupSumTol.f32_reference;
            for (int NKV : {1, 2, 4}) {
                for (int T : {16, 33}) {
                    for (int HS : {8, 16}) {
                        const GqaShape s{kB, T, kNH, NKV, HS};
                        const std::string tag = std::string(dtype_name(d)) + " " + mode_name(mode) + " " + s.tag();
                        SCOPED_TRACE(tag);
                        const Inputs in = make_inputs(d, s, 100 + T + HS + NKV);
                        const AttentionResult gqa = run_attention(*be, d, kB, T, kNH, NKV, HS, in.qkv, in.dout);
                        const AttentionResult mha =
                            run_attention(*be, d, kB, T, kNH, 0, HS, repeat_kv(in.qkv, s), in.dout);
                        EXPECT_TRUE(bit_identical(gqa.out, mha.out));
                        EXPECT_TRUE(bit_identical(gqa.lse, mha.lse));
                        const int C = s.C(), W = s.W(), KV = NKV * HS;
                        EXPECT_TRUE(bit_identical(columns(gqa.dqkv, W, 0, C), columns(mha.dqkv, 3 * C, 0, C)));
                        const std::vector<double> want = group_sum_kv(mha.dqkv, s);
                        const double err_k = gqa_error(columns(gqa.dqkv, W, C, KV), columns(want, W, C, KV));
                        const double err_v = gqa_error(columns(gqa.dqkv, W, C + KV, KV), columns(want, W, C + KV, KV));
                        expect_gqa_close(tag + " dK vs group sum", err_k, NKV == kNH ? 0.0 : tol);
                        expect_gqa_close(tag + " dV vs group sum", err_v, NKV == kNH ? 0.0 : tol);
                    }
                }
            }
        }
    }
}

TEST(AttentionGqa, FastMatchesReference) {
    struct Tol {
        double out, lse, dqkv;
    };
    auto ref = make_cpu_backend(OpMode::kReference);
    auto fast = make_cpu_backend(OpMode::kFast);
    for (DType d : {DType::kF32, DType::kBF16}) {
        const Tol tol = d == DType::kF32 ? Tol{1e-6, 4e-7, 1.5e-6} : Tol{6e-3, 4e-7, 1.2e-2};
        for (int NKV : {1, 2}) {
            for (int T : {16, 33, 150}) {
                const GqaShape s{kB, T, kNH, NKV, 16};
                const std::string tag = std::string(dtype_name(d)) + " " + s.tag();
                SCOPED_TRACE(tag);
                const Inputs in = make_inputs(d, s, 7 + T);
                const AttentionResult r = run_attention(*ref, d, kB, T, kNH, NKV, 16, in.qkv, in.dout);
                const AttentionResult f = run_attention(*fast, d, kB, T, kNH, NKV, 16, in.qkv, in.dout);
                expect_gqa_close(tag + " out", gqa_error(f.out, r.out), tol.out);
                expect_gqa_close(tag + " lse", gqa_error(f.lse, r.lse), tol.lse);
                expect_gqa_close(tag + " dqkv", gqa_error(f.dqkv, r.dqkv), tol.dqkv);
            }
        }
    }
}

// NKV = 0 is multi-head attention: NKV = NH, bit for bit, in both modes and dtypes.
TEST(AttentionGqa, ZeroKeyValueHeadsMeansOnePerQueryHead) {
    for (DType d : {DType::kF32, DType::kBF16}) {
        for (OpMode mode : {OpMode::kReference, OpMode::kFast}) {
            auto be = make_cpu_backend(mode);
            const GqaShape s{kB, 33, kNH, kNH, 16};
            const Inputs in = make_inputs(d, s, 5);
            const AttentionResult zero = run_attention(*be, d, kB, s.T, kNH, 0, s.HS, in.qkv, in.dout);
            const AttentionResult nh = run_attention(*be, d, kB, s.T, kNH, kNH, s.HS, in.qkv, in.dout);
            EXPECT_TRUE(bit_identical(zero.out, nh.out)) << dtype_name(d) << " " << mode_name(mode);
            EXPECT_TRUE(bit_identical(zero.lse, nh.lse)) << dtype_name(d) << " " << mode_name(mode);
            EXPECT_TRUE(bit_identical(zero.dqkv, nh.dqkv)) << dtype_name(d) << " " << mode_name(mode);
        }
    }
}

// The fast backward runs (b, key/value head) pairs in parallel, each summing its group in a fixed order.
TEST(AttentionGqa, FastBackwardDoesNotDependOnTheThreadCount) {
    auto fast = make_cpu_backend(OpMode::kFast);
    const int saved_threads = omp_get_max_threads();
    for (DType d : {DType::kF32, DType::kBF16}) {
        const GqaShape s{kB, 150, kNH, 2, 16};
        const Inputs in = make_inputs(d, s, 9);
        omp_set_num_threads(1);
        const AttentionResult one = run_attention(*fast, d, kB, s.T, kNH, s.NKV, s.HS, in.qkv, in.dout);
        for (int threads : {2, 3}) {
            omp_set_num_threads(threads);
            const AttentionResult many = run_attention(*fast, d, kB, s.T, kNH, s.NKV, s.HS, in.qkv, in.dout);
            EXPECT_TRUE(bit_identical(many.out, one.out)) << dtype_name(d) << " " << threads << " threads";
            EXPECT_TRUE(bit_identical(many.dqkv, one.dqkv)) << dtype_name(d) << " " << threads << " threads";
        }
    }
    omp_set_num_threads(saved_threads);
}

TEST(AttentionGqaDeathTest, KeyValueHeadsThatDoNotDivideTheQueryHeadsAreRefused) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    auto be = make_cpu_backend(OpMode::kFast);
    const GqaShape s{1, 4, 4, 3, 8};
    const Inputs in = make_inputs(DType::kF32, s, 1);
    EXPECT_DEATH(run_attention(*be, DType::kF32, s.B, s.T, s.NH, s.NKV, s.HS, in.qkv, in.dout),
                 "NKV\\(3\\) key/value heads do not divide NH\\(4\\) query heads");
}

}  // namespace
}  // namespace ms::test
