// test_cuda_emu_attention_block.cpp: context parallelism's ring-attention ops (kernels/attention_block.cu) through
// CudaBackend on the CPU emulation:
//   - attention_block_forward / attention_block_backward against the CPU backend's kReference on the same inputs,
//     fp32, bf16 and fp16, NH = 4 with NKV = 2 and 4, B = 2, HS = 16, rows and keys spanning two 32-row chunks of the
//     kernels and not multiples of their 4-row blocks: a causal own block, a full block merged onto a previous result
//     (kv a packed tensor with its keys at a column offset), and rows [q_begin, q_begin + q_rows) against kv_rows <
//     Tk keys (the other rows of acc and lse untouched); the backward from nonzero dq and dkv (+=); two runs
//     bit-identical;
//   - check_ring_composition (attention_block_check.h): two ranks' blocks reproduce CudaBackend's full causal
//     attention, forward and backward;
//   - copy_columns: exact conversions between fp32, bf16 and fp16 (bf16 / fp16 rounding to nearest even, ties
//     included) at column offsets, the other columns of dst untouched, bit-identical to the CPU backend's.
//
// Tolerances: scale-free (max |got - want| / max |want|), 5-10x the largest MS_OP_TEST_VERBOSE=1 measured. Against
// the CPU reference every output is fp32 from the same fp32 inputs (16-bit inputs are exact in fp32), so the dtypes
// differ only by the kernels' fp32 summation: acc 4.3e-7, lse 9.3e-8, dq 3.1e-7, dkv 3.2e-7 (every dtype).
// Composition, against CudaBackend's attention ops: fp32 out 3.1e-7, lse 1.7e-7, dqkv 4.3e-7; bf16 (the full
// attention on the tensor-core kernels, P and dS rounded to bf16, and the outputs rounded to bf16) out 5.6e-3, lse
// 1.7e-7, dqkv 4.7e-3.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/backends/cuda/cuda_backend.h"
#include "tests/ops/attention_block_check.h"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

constexpr int kB = 2, kNH = 4, kHS = 16;

std::unique_ptr<Backend> make_cuda() {
    BackendOptions o;
    o.kind = BackendKind::kCUDA;
    return make_backend_with_cuda(o);
}

struct Tol {
    double acc, lse, dq, dkv;
};
constexpr Tol kVsReference{3e-6, 5e-7, 3e-6, 3e-6};

// The three blocks of the header, for NKV key/value heads.
std::vector<BlockShape> block_cases(int NKV) {
    const int W = (kNH + 2 * NKV) * kHS, C = kNH * kHS, KV = 2 * NKV * kHS;
    return {
        // B, T, Tk, Wkv, NH, NKV, HS, kv_column, q_begin, q_rows, kv_rows, causal, merge
        {kB, 37, 37, W, kNH, NKV, kHS, C, 0, 37, 37, true, false},       // the rank's own block, kv = qkv
        {kB, 37, 35, KV + 5, kNH, NKV, kHS, 3, 0, 37, 35, false, true},  // a remote block merged onto acc, lse
        {kB, 41, 40, KV, kNH, NKV, kHS, 0, 5, 30, 33, false, false},     // some rows, the first kv_rows keys
    };
}

BlockInputs block_inputs(DType d, const BlockShape& s, uint32_t seed) {
    BlockInputs in;
    const size_t N = size_t{1} * s.B * s.T;
    in.kv_is_qkv = s.causal;
    in.qkv = rounded(d, random_floats(N * s.W(), seed, -2, 2));
    if (!in.kv_is_qkv) in.kv = rounded(d, random_floats(size_t{1} * s.B * s.Tk * s.Wkv, seed + 1, -2, 2));
    in.acc = random_floats(N * s.C(), seed + 2);
    in.lse = random_floats(size_t{1} * s.B * s.NH * s.T, seed + 3, 0.5f, 2.5f);
    in.dout = rounded(d, random_floats(N * s.C(), seed + 4));
    in.dq = random_floats(N * s.C(), seed + 5);
    in.dkv = random_floats(size_t{1} * s.B * s.Tk * s.Wd(), seed + 6);
    return in;
}

void check_against_reference(DType d) {
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    for (int NKV : {2, 4}) {
        uint32_t seed = 10 * NKV;
        for (const BlockShape& s : block_cases(NKV)) {
            const std::string tag = std::string(dtype_name(d)) + " " + s.tag();
            SCOPED_TRACE(tag);
            BlockInputs in = block_inputs(d, s, seed += 7);
            const BlockForwardResult want = run_block_forward(*cpu, d, s, in);
            const BlockForwardResult got = run_block_forward(*cuda, d, s, in);
            expect_gqa_close(tag + " acc", gqa_error(got.acc, want.acc), kVsReference.acc);
            expect_gqa_close(tag + " lse", gqa_error(got.lse, want.lse), kVsReference.lse);
            const BlockForwardResult again = run_block_forward(*cuda, d, s, in);
            EXPECT_TRUE(bit_identical(again.acc, got.acc) && bit_identical(again.lse, got.lse));
            // Rows outside [q_begin, q_begin + q_rows) keep their acc and lse.
            for (int b = 0; b < s.B; ++b) {
                for (int t = 0; t < s.T; ++t) {
                    if (t >= s.q_begin && t < s.q_begin + s.q_rows) continue;
                    for (int h = 0; h < s.NH; ++h) {
                        const size_t l = (size_t(b) * s.NH + h) * s.T + t;
                        ASSERT_EQ(got.lse[l], in.lse[l]) << b << " " << h << " " << t;
                    }
                    for (int x = 0; x < s.C(); ++x) {
                        const size_t i = (size_t(b) * s.T + t) * s.C() + x;
                        ASSERT_EQ(got.acc[i], in.acc[i]) << b << " " << t << " " << x;
                    }
                }
            }

            // The backward from the forward's result (out rounded to d, its lse as the final one).
            in.out = rounded(d, want.acc);
            in.final_lse = want.lse;
            const BlockBackwardResult bwant = run_block_backward(*cpu, d, s, in);
            const BlockBackwardResult bgot = run_block_backward(*cuda, d, s, in);
            expect_gqa_close(tag + " dq", gqa_error(bgot.dq, bwant.dq), kVsReference.dq);
            expect_gqa_close(tag + " dkv", gqa_error(bgot.dkv, bwant.dkv), kVsReference.dkv);
            const BlockBackwardResult bagain = run_block_backward(*cuda, d, s, in);
            EXPECT_TRUE(bit_identical(bagain.dq, bgot.dq) && bit_identical(bagain.dkv, bgot.dkv));
            // += : the rows and keys outside the block keep their starting dq, dkv exactly.
            for (int b = 0; b < s.B; ++b) {
                for (int t = 0; t < s.T; ++t) {
                    if (t >= s.q_begin && t < s.q_begin + s.q_rows) continue;
                    for (int x = 0; x < s.C(); ++x) {
                        const size_t i = (size_t(b) * s.T + t) * s.C() + x;
                        ASSERT_EQ(bgot.dq[i], in.dq[i]) << b << " " << t << " " << x;
                    }
                }
                for (int u = s.kv_rows; u < s.Tk; ++u) {
                    for (int x = 0; x < s.Wd(); ++x) {
                        const size_t i = (size_t(b) * s.Tk + u) * s.Wd() + x;
                        ASSERT_EQ(bgot.dkv[i], in.dkv[i]) << b << " " << u << " " << x;
                    }
                }
            }
        }
    }
}

TEST(CudaEmuAttentionBlock, MatchesTheCpuReferenceFp32) { check_against_reference(DType::kF32); }
TEST(CudaEmuAttentionBlock, MatchesTheCpuReferenceBf16) { check_against_reference(DType::kBF16); }
TEST(CudaEmuAttentionBlock, MatchesTheCpuReferenceFp16) { check_against_reference(DType::kF16); }

TEST(CudaEmuAttentionBlock, RingBlocksReproduceFullCausalAttention) {
    auto cuda = make_cuda();
    for (int NKV : {2, 4}) {
        check_ring_composition(*cuda, DType::kF32, kB, 35, kNH, NKV, kHS, {3e-6, 1e-6, 3e-6}, "cuda-emulated");
        check_ring_composition(*cuda, DType::kBF16, kB, 35, kNH, NKV, kHS, {3e-2, 1e-6, 3e-2}, "cuda-emulated");
    }
}

// ---- copy_columns ----

// dst[r, dst_column + c] = from_float<D>(to_float(src[r, src_column + c])), the rest of dst untouched; the CPU
// backend's copy gives the same bits.
template <class S, class D>
void check_copy_columns(Backend& cuda, Backend& cpu) {
    SCOPED_TRACE(std::string(dtype_name(dtype_of<S>())) + " -> " + std::string(dtype_name(dtype_of<D>())));
    constexpr int64_t kRows = 7, kWs = 9, kWd = 11, kSrcColumn = 2, kDstColumn = 6, kCols = 4;
    std::vector<float> values = random_floats(kRows * kWs, 91, -3, 3);
    // Exact ties of bf16 (1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6) and fp16 (1 + 2^-11 -> 1, 1 + 3 * 2^-11 ->
    // 1 + 2^-9), and values bf16 and fp16 hold exactly.
    const float specials[] = {
        1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 0.0f, -0.0f, 0.5f};
    for (int i = 0; i < 8; ++i) values[kSrcColumn + (i / kCols) * kWs + i % kCols] = specials[i];
    std::vector<S> src(values.size());
    for (size_t i = 0; i < values.size(); ++i) src[i] = from_float<S>(values[i]);
    const std::vector<float> sentinel = random_floats(kRows * kWd, 92);
    std::vector<D> got(sentinel.size()), want(sentinel.size());
    for (size_t i = 0; i < sentinel.size(); ++i) got[i] = want[i] = from_float<D>(sentinel[i]);
    const CopyColumnsArgs args{.src = Tensor(src.data(), dtype_of<S>(), {kRows, kWs}),
                               .dst = Tensor(got.data(), dtype_of<D>(), {kRows, kWd}),
                               .src_column = kSrcColumn,
                               .dst_column = kDstColumn,
                               .cols = kCols};
    cuda.copy_columns(args);
    cuda.synchronize();
    CopyColumnsArgs cpu_args = args;
    cpu_args.dst = Tensor(want.data(), dtype_of<D>(), {kRows, kWd});
    cpu.copy_columns(cpu_args);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(D)), 0) << "CUDA and CPU copies differ";
    for (int64_t r = 0; r < kRows; ++r) {
        for (int64_t c = 0; c < kWd; ++c) {
            const bool copied = c >= kDstColumn && c < kDstColumn + kCols;
            const D expected = copied ? from_float<D>(to_float(src[r * kWs + kSrcColumn + c - kDstColumn]))
                                      : from_float<D>(sentinel[r * kWd + c]);
            ASSERT_EQ(std::memcmp(&got[r * kWd + c], &expected, sizeof(D)), 0) << r << " " << c;
        }
    }
    if constexpr (std::is_same_v<S, float> && std::is_same_v<D, bf16>) {
        EXPECT_EQ(to_float(got[kDstColumn]), 1.0f);
        EXPECT_EQ(to_float(got[kDstColumn + 1]), 1.0f + 0x1p-6f);
        EXPECT_EQ(to_float(got[kDstColumn + 2]), -1.0f);
    }
    if constexpr (std::is_same_v<S, float> && std::is_same_v<D, fp16>) {
        EXPECT_EQ(to_float(got[kDstColumn + 3]), 1.0f);
        EXPECT_EQ(to_float(got[kWd + kDstColumn]), 1.0f + 0x1p-9f);
    }
    if constexpr (std::is_same_v<S, D>) {
        for (int64_t r = 0; r < kRows; ++r) {
            EXPECT_EQ(std::memcmp(&got[r * kWd + kDstColumn], &src[r * kWs + kSrcColumn], kCols * sizeof(D)), 0);
        }
    }
}

TEST(CudaEmuAttentionBlock, CopyColumnsConvertsExactly) {
    auto cuda = make_cuda();
    auto cpu = make_cpu_backend(OpMode::kReference);
    check_copy_columns<float, float>(*cuda, *cpu);
    check_copy_columns<float, bf16>(*cuda, *cpu);
    check_copy_columns<float, fp16>(*cuda, *cpu);
    check_copy_columns<bf16, float>(*cuda, *cpu);
    check_copy_columns<bf16, bf16>(*cuda, *cpu);
    check_copy_columns<bf16, fp16>(*cuda, *cpu);
    check_copy_columns<fp16, float>(*cuda, *cpu);
    check_copy_columns<fp16, bf16>(*cuda, *cpu);
    check_copy_columns<fp16, fp16>(*cuda, *cpu);
}

TEST(CudaEmuAttentionBlockDeathTest, BadShapesAreRefusedWithSentences) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    auto cuda = make_cuda();
    std::vector<float> qkv(2 * 8 * 3 * 16), kv(2 * 8 * 2 * 16), acc(2 * 8 * 16), lse(2 * 8);
    const AttentionBlockForwardArgs ok{.qkv = view(qkv, {2, 8, 48}),
                                       .kv = view(kv, {2, 8, 32}),
                                       .acc = view(acc, {2, 8, 16}),
                                       .lse = view(lse, {2, 1, 8}),
                                       .q_begin = 0,
                                       .q_rows = 8,
                                       .kv_rows = 8,
                                       .NH = 1};
    AttentionBlockForwardArgs causal_offset = ok;
    causal_offset.causal = true;
    causal_offset.q_begin = 2;
    causal_offset.q_rows = 6;
    causal_offset.kv_rows = 6;
    EXPECT_DEATH(cuda->attention_block_forward(causal_offset), "a causal block is the rank's own");
    AttentionBlockForwardArgs too_many_keys = ok;
    too_many_keys.kv_rows = 9;
    EXPECT_DEATH(cuda->attention_block_forward(too_many_keys), "key rows \\[0, 9\\) of 8");
    AttentionBlockForwardArgs past_the_columns = ok;
    past_the_columns.kv_column = 1;
    EXPECT_DEATH(cuda->attention_block_forward(past_the_columns), "need 32 columns of kv's 32");
    EXPECT_DEATH(
        cuda->copy_columns({.src = view(kv, {16, 32}), .dst = view(acc, {16, 16}), .src_column = 20, .cols = 13}),
        "13 columns from 20 of 32");
}

}  // namespace
}  // namespace ms::test
