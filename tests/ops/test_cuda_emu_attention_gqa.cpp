// test_cuda_emu_attention_gqa.cpp: grouped-query attention (NKV < NH key/value heads) in the CUDA kernels on the CPU
// emulation: the scalar kernels (fp32, and bf16 under AttentionKernels::kScalar) and the tensor-core kernels (bf16,
// split and fused backward), then CudaBackend's dispatch of AttentionForwardArgs / AttentionBackwardArgs::NKV.
//
// Per path, NH = 4, NKV in {1, 2, 4}, B = 2, HS 16 (and 8 on the scalar kernels, which the tensor cores do not take),
// T in {16, 33} on the scalar kernels (33 spans three 16-row tiles) and {33, 70, 130} on the tensor cores (one partial
// 64-row tile; two and three key tiles, so the dK/dV walk prefetches across query heads and the fused backward's dQ
// adds cross key tiles for every query head of a group):
//   - against the same path's multi-head attention on a qkv with the key/value heads repeated per group (repeat_kv):
//     out, lse and dQ bit for bit (per query head the kernels do the same operations on the same values), dK and dV
//     within a measured tolerance of the double group sums (group_sum_kv), bit for bit when NKV = NH;
//   - against the CPU backend's kReference on the same grouped-query tensors: measured tolerances;
//   - the fused tensor-core backward's dK and dV equal the split one's bit for bit (the same dkv_step walk over the
//     group's query heads), its dQ within one unit in the last place of bf16 of the split dQ's scale.
// Through CudaBackend: NKV = 2 gives the launchers' bits (the fused backward on the backend's scratch), and NKV = 0
// gives NKV = NH's.
//
// Tolerances: scale-free (max |got - want| / max |want|), about 3x the largest MS_OP_TEST_VERBOSE=1 measured:
//   dK, dV vs the group sums: fp32 scalar 3.5e-7; bf16 4.8e-3 (scalar), 4.5e-3 (tensor cores)
//   vs the CPU reference: fp32 scalar out 2.7e-7, lse 9.9e-8, dqkv 3.5e-7; bf16 scalar out 2.5e-4, lse 9.9e-8,
//   dqkv 4.6e-3; bf16 tensor cores out 4.1e-3, lse 9.9e-8, dqkv 7.1e-3 (split and fused alike); fused vs split dQ 0
#include <string>
#include <type_traits>
#include <vector>

#include "engine/backends/cuda/cuda_backend.h"
#include "engine/backends/cuda/kernels/attention.cuh"
#include "engine/backends/cuda/kernels/attention_tc.cuh"
#include "tests/ops/attention_gqa_check.h"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

const cudaStream_t kStream = nullptr;  // the emulation runs launches synchronously
constexpr int kB = 2, kNH = 4;

enum class Path { kScalar, kTensorCoresSplit, kTensorCoresFused };
const char* path_name(Path p) {
    return p == Path::kScalar ? "scalar" : p == Path::kTensorCoresSplit ? "tensor cores, split" : "tensor cores, fused";
}

struct Tol {
    double group_sum, out, lse, dqkv;
};
Tol tolerance(DType d, Path p) {
    if (d == DType::kF32) return {1.2e-6, 1e-6, 4e-7, 1.2e-6};
    return {1.5e-2, 1.2e-2, 4e-7, p == Path::kScalar ? 1.4e-2 : 2.1e-2};
}

// A forward, then the backward on the forward's out and lse, through the launchers of `path`; s.NKV key/value heads.
AttentionResult run_kernels(Path path, DType d, const GqaShape& s, const std::vector<float>& qkv_values,
                            const std::vector<float>& dout_values) {
    const size_t N = size_t{1} * s.B * s.T;
    TypedBuf qkv(d, qkv_values), dout(d, dout_values), out(d, N * s.C()), dqkv(d, N * s.W());
    TypedBuf lse(DType::kF32, size_t{1} * s.B * s.NH * s.T);
    TypedBuf scratch(DType::kF32, cuda::attention_tc_backward_scratch_bytes(s.B, s.T, s.NH, s.HS) / 4 + 1);
    visit_float(d, [&](auto z) {
        using S = decltype(z);
        auto* o = static_cast<S*>(out.raw());
        auto* l = static_cast<float*>(lse.raw());
        const auto* x = static_cast<const S*>(qkv.raw());
        const auto* dy = static_cast<const S*>(dout.raw());
        auto* dx = static_cast<S*>(dqkv.raw());
        if (path == Path::kScalar) {
            cuda::attention_forward(o, l, x, s.B, s.T, s.NH, s.NKV, s.HS, kStream, cuda::AttentionKernels::kScalar);
            cuda::attention_backward(dx, dy, x, o, l, nullptr, s.B, s.T, s.NH, s.NKV, s.HS, kStream,
                                     cuda::AttentionKernels::kScalar);
        } else if constexpr (!std::is_same_v<S, float>) {
            cuda::attention_tc_forward(o, l, x, s.B, s.T, s.NH, s.NKV, s.HS, kStream);
            const bool fused = path == Path::kTensorCoresFused;
            cuda::attention_tc_backward(dx, dy, x, o, l, fused ? scratch.raw() : nullptr, s.B, s.T, s.NH, s.NKV, s.HS,
                                        fused ? cuda::AttentionTcBackward::kFused : cuda::AttentionTcBackward::kSplit,
                                        kStream);
        } else {
            ADD_FAILURE() << "no fp32 tensor-core kernels";
        }
    });
    return {out.values(), lse.values(), dqkv.values()};
}

void check_path(Path path, DType d, std::initializer_list<int> head_sizes) {
    const Tol tol = tolerance(d, path);
    auto cpu = make_cpu_backend(OpMode::kReference);
    const std::vector<int> lengths = path == Path::kScalar ? std::vector<int>{16, 33} : std::vector<int>{33, 70, 130};
    for (int NKV : {1, 2, 4}) {
        for (int T : lengths) {
            for (int HS : head_sizes) {
                const GqaShape s{kB, T, kNH, NKV, HS}, mha_shape{kB, T, kNH, kNH, HS};
                const std::string tag = std::string(path_name(path)) + " " + std::string(dtype_name(d)) + " " + s.tag();
                SCOPED_TRACE(tag);
                const std::vector<float> qkv =
                    rounded(d, random_floats(size_t{1} * kB * T * s.W(), 31 + T + NKV, -2, 2));
                const std::vector<float> dout = rounded(d, random_floats(size_t{1} * kB * T * s.C(), 32 + T));
                const AttentionResult gqa = run_kernels(path, d, s, qkv, dout);
                const AttentionResult mha = run_kernels(path, d, mha_shape, repeat_kv(qkv, s), dout);
                const int C = s.C(), W = s.W(), KV = NKV * HS;
                EXPECT_TRUE(bit_identical(gqa.out, mha.out));
                EXPECT_TRUE(bit_identical(gqa.lse, mha.lse));
                EXPECT_TRUE(bit_identical(columns(gqa.dqkv, W, 0, C), columns(mha.dqkv, 3 * C, 0, C)));
                const std::vector<double> sums = group_sum_kv(mha.dqkv, s);
                const double group_tol = NKV == kNH ? 0.0 : tol.group_sum;
                expect_gqa_close(tag + " dK vs group sum",
                                 gqa_error(columns(gqa.dqkv, W, C, KV), columns(sums, W, C, KV)), group_tol);
                expect_gqa_close(tag + " dV vs group sum",
                                 gqa_error(columns(gqa.dqkv, W, C + KV, KV), columns(sums, W, C + KV, KV)), group_tol);

                const AttentionResult ref = run_attention(*cpu, d, kB, T, kNH, NKV, HS, qkv, dout);
                expect_gqa_close(tag + " out vs CPU", gqa_error(gqa.out, ref.out), tol.out);
                expect_gqa_close(tag + " lse vs CPU", gqa_error(gqa.lse, ref.lse), tol.lse);
                expect_gqa_close(tag + " dqkv vs CPU", gqa_error(gqa.dqkv, ref.dqkv), tol.dqkv);

                if (path == Path::kTensorCoresFused) {
                    const AttentionResult split = run_kernels(Path::kTensorCoresSplit, d, s, qkv, dout);
                    EXPECT_TRUE(bit_identical(columns(gqa.dqkv, W, C, 2 * KV), columns(split.dqkv, W, C, 2 * KV)))
                        << "fused dK, dV differ from split's";
                    expect_gqa_close(tag + " fused dQ vs split",
                                     gqa_error(columns(gqa.dqkv, W, 0, C), columns(split.dqkv, W, 0, C)), 4e-3);
                }
            }
        }
    }
}

TEST(CudaEmuAttentionGqa, ScalarKernelsFp32) { check_path(Path::kScalar, DType::kF32, {8, 16}); }
TEST(CudaEmuAttentionGqa, ScalarKernelsBf16) { check_path(Path::kScalar, DType::kBF16, {8, 16}); }
TEST(CudaEmuAttentionGqa, TensorCoresSplitBackward) { check_path(Path::kTensorCoresSplit, DType::kBF16, {16}); }
TEST(CudaEmuAttentionGqa, TensorCoresFusedBackward) { check_path(Path::kTensorCoresFused, DType::kBF16, {16}); }

// CudaBackend passes NKV on: NKV = 2 gives the fused launchers' bits (its default backward, on its own scratch), and
// NKV = 0 what NKV = NH gives.
TEST(CudaEmuAttentionGqa, BackendPassesKeyValueHeadsOn) {
    BackendOptions o;
    o.kind = BackendKind::kCUDA;
    auto be = make_backend_with_cuda(o);
    const DType d = DType::kBF16;
    const GqaShape s{kB, 33, kNH, 2, 16};
    const std::vector<float> qkv = rounded(d, random_floats(size_t{1} * kB * s.T * s.W(), 3, -2, 2));
    const std::vector<float> dout = rounded(d, random_floats(size_t{1} * kB * s.T * s.C(), 4));
    const AttentionResult want = run_kernels(Path::kTensorCoresFused, d, s, qkv, dout);
    const AttentionResult got = run_attention(*be, d, kB, s.T, kNH, s.NKV, s.HS, qkv, dout);
    EXPECT_TRUE(bit_identical(got.out, want.out));
    EXPECT_TRUE(bit_identical(got.lse, want.lse));
    EXPECT_TRUE(bit_identical(got.dqkv, want.dqkv));

    const std::vector<float> qkv_mha = repeat_kv(qkv, s);
    const AttentionResult zero = run_attention(*be, d, kB, s.T, kNH, 0, s.HS, qkv_mha, dout);
    const AttentionResult nh = run_attention(*be, d, kB, s.T, kNH, kNH, s.HS, qkv_mha, dout);
    EXPECT_TRUE(bit_identical(zero.out, nh.out));
    EXPECT_TRUE(bit_identical(zero.lse, nh.lse));
    EXPECT_TRUE(bit_identical(zero.dqkv, nh.dqkv));
}

}  // namespace
}  // namespace ms::test
