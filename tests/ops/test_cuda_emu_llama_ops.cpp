// test_cuda_emu_llama_ops.cpp: the Llama kernels (kernels/rmsnorm.cu, rope.cu, swiglu.cu) through CudaBackend on the
// CPU emulation, against the CPU backend in OpMode::kReference on the same dtype: fp32, bf16 and fp16 (fp32 is also in
// test_cuda_backend.cpp, which runs on a GPU as test_cuda_device). Shapes are not multiples of any block (N = 37 rows
// of C = 131, HS = 10); outputs sit in guarded buffers; two runs are bit-identical; the 16-bit dweight is the fp32 sum
// of its old value and the kernel's fp32 contribution, rounded once; RoPE's inverse undoes its forward. Tolerances:
// about 10x the fp32 error MS_OP_TEST_VERBOSE=1 prints; in bf16 / fp16 one rounding of the output (2^-8, 2^-11), where
// the kernel's fp32 and the reference's double land on two sides of a rounding boundary.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "engine/backends/cuda/cuda_backend.h"
#include "engine/backends/rope_table.h"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

std::unique_ptr<Backend> make_cuda() {
    BackendOptions o;
    o.kind = BackendKind::kCUDA;
    return make_backend_with_cuda(o);
}

void expect_close(const std::string& what, double err, double tol) {
    if (std::getenv("MS_OP_TEST_VERBOSE")) std::printf("  %-36s err %.2e (tol %.0e)\n", what.c_str(), err, tol);
    EXPECT_LE(err, tol) << what;
}

template <class D>
double tolerance() {
    return std::is_same_v<D, float> ? 1e-6 : std::is_same_v<D, bf16> ? 8e-3 : 1e-3;
}

// ---- RMSNorm ----

constexpr int64_t kN = 37, kC = 131;

struct RmsNormRun {
    std::vector<float> out, rstd, dinp, dweight;
};
template <class D, class G>
RmsNormRun run_rmsnorm(Backend& b, Accumulate acc, const std::vector<float>& dweight0) {
    auto inp = to_d<D>(random_floats(kN * kC, 1, -2.0f, 2.0f)), weight = to_d<D>(random_floats(kC, 2, 0.5f, 1.5f));
    auto dout = to_d<D>(random_floats(kN * kC, 3)), dinp = to_d<D>(random_floats(kN * kC, 4));
    auto dweight = to_d<G>(dweight0);
    std::vector<D> out(kN * kC);
    std::vector<float> rstd(kN);
    b.rmsnorm_forward({.inp = dview(inp, {kN, kC}),
                       .weight = dview(weight, {kC}),
                       .out = dview(out, {kN, kC}),
                       .rstd = view(rstd, {kN}),
                       .eps = 1e-5f});
    b.rmsnorm_backward({.dout = dview(dout, {kN, kC}),
                        .inp = dview(inp, {kN, kC}),
                        .weight = dview(weight, {kC}),
                        .rstd = view(rstd, {kN}),
                        .dinp = dview(dinp, {kN, kC}),
                        .dweight = dview(dweight, {kC}),
                        .accumulate = acc});
    b.synchronize();
    return {to_f32(out), rstd, to_f32(dinp), to_f32(dweight)};
}

template <class D>
void check_rmsnorm() {
    SCOPED_TRACE(dtype_name(dtype_of<D>()));
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    const auto dweight0 = random_floats(kC, 5);
    for (Accumulate acc : {Accumulate::kOverwrite, Accumulate::kAdd}) {
        const auto ref = run_rmsnorm<D, float>(*cpu, acc, dweight0);
        const auto got = run_rmsnorm<D, float>(*cuda, acc, dweight0);
        const std::string d(dtype_name(dtype_of<D>()));
        expect_close("rmsnorm out " + d, max_rel_error(got.out, ref.out), tolerance<D>());
        expect_close("rmsnorm rstd " + d, max_rel_error(got.rstd, ref.rstd), 1e-6);
        expect_close("rmsnorm dinp " + d, max_rel_error(got.dinp, ref.dinp), tolerance<D>());
        expect_close("rmsnorm dweight " + d, max_rel_error(got.dweight, ref.dweight), 1e-6);
        const auto again = run_rmsnorm<D, float>(*cuda, acc, dweight0);
        EXPECT_TRUE(bit_identical(again.out, got.out) && bit_identical(again.dinp, got.dinp) &&
                    bit_identical(again.dweight, got.dweight));
    }
    if constexpr (!std::is_same_v<D, float>) {
        // A D dweight: from_float<D>(old + the fp32 contribution), the contribution from an fp32 dweight of zeros.
        auto old = dweight0;
        for (float& x : old) x = round_to<D>(x);
        const auto contribution = run_rmsnorm<D, float>(*cuda, Accumulate::kOverwrite, std::vector<float>(kC));
        const auto half = run_rmsnorm<D, D>(*cuda, Accumulate::kOverwrite, old);
        for (int64_t c = 0; c < kC; ++c) {
            ASSERT_EQ(half.dweight[c], to_float(from_float<D>(old[c] + contribution.dweight[c]))) << c;
        }
    }
}

TEST(CudaEmuLlamaOps, RmsNormMatchesTheCpuReference) {
    check_rmsnorm<float>();
    check_rmsnorm<bf16>();
    check_rmsnorm<fp16>();
}

// ---- RoPE ----

constexpr int64_t kT = 13, kNH = 6, kNKV = 2, kHS = 10, kRow = (kNH + 2 * kNKV) * kHS, kRows = 3 * kT;

template <class D>
std::vector<float> run_rope(Backend& b, std::vector<float>& table, const std::vector<float>& qkv_f, RopeDirection dir,
                            std::vector<int32_t>* positions) {
    auto qkv = to_d<D>(qkv_f);
    b.rope({.qkv = dview(qkv, {kRows, kRow}),
            .table = view(table, {static_cast<int64_t>(table.size()) / kHS, kHS}),
            .positions = positions ? view(*positions, {kRows}) : Tensor{},
            .T = kT,
            .NH = kNH,
            .NKV = kNKV,
            .direction = dir});
    b.synchronize();
    return to_f32(qkv);
}

template <class D>
void check_rope() {
    SCOPED_TRACE(dtype_name(dtype_of<D>()));
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    auto table = rope_table(4 * kT, kHS, 500000.0, {.factor = 8.0, .original_max_position_embeddings = 32.0});
    auto positions = random_ints(kRows, 11, 0, static_cast<int32_t>(4 * kT - 1));
    const auto qkv = random_floats(kRows * kRow, 12, -2.0f, 2.0f);
    for (RopeDirection dir : {RopeDirection::kForward, RopeDirection::kInverse}) {
        for (std::vector<int32_t>* pos : {static_cast<std::vector<int32_t>*>(nullptr), &positions}) {
            const auto ref = run_rope<D>(*cpu, table, qkv, dir, pos);
            const auto got = run_rope<D>(*cuda, table, qkv, dir, pos);
            expect_close("rope " + std::string(dtype_name(dtype_of<D>())), max_rel_error(got, ref), tolerance<D>());
            EXPECT_TRUE(bit_identical(run_rope<D>(*cuda, table, qkv, dir, pos), got));
            for (int64_t n = 0; n < kRows; ++n) {  // V untouched (bit for bit: rounded through D once, as the input)
                for (int64_t c = (kNH + kNKV) * kHS; c < kRow; ++c) {
                    ASSERT_EQ(got[n * kRow + c], round_to<D>(qkv[n * kRow + c]));
                }
            }
        }
    }
    if constexpr (std::is_same_v<D, float>) {
        const auto there = run_rope<float>(*cuda, table, qkv, RopeDirection::kForward, &positions);
        const auto back = run_rope<float>(*cuda, table, there, RopeDirection::kInverse, &positions);
        expect_close("rope forward then inverse", max_rel_error(back, qkv), 1e-6);
    }
}

TEST(CudaEmuLlamaOps, RopeMatchesTheCpuReference) {
    check_rope<float>();
    check_rope<bf16>();
    check_rope<fp16>();
}

// ---- SwiGLU ----

constexpr int64_t kF = 131;

template <class D>
void check_swiglu() {
    SCOPED_TRACE(dtype_name(dtype_of<D>()));
    auto inp = to_d<D>(random_floats(kN * 2 * kF, 21, -12.0f, 12.0f)), dout = to_d<D>(random_floats(kN * kF, 22));
    inp[0] = from_float<D>(-100.0f);  // e^-g overflows float: outputs near 0, not NaN
    inp[1] = from_float<D>(100.0f);
    std::vector<std::vector<float>> outs, dinps;
    for (int run = 0; run < 3; ++run) {  // the CPU reference, then the kernels twice
        auto b = run == 0 ? make_cpu_backend(OpMode::kReference) : make_cuda();
        std::vector<D> out(kN * kF), dinp = to_d<D>(std::vector<float>(kN * 2 * kF, NAN));
        b->swiglu_forward({.inp = dview(inp, {kN, 2 * kF}), .out = dview(out, {kN, kF})});
        b->swiglu_backward(
            {.dout = dview(dout, {kN, kF}), .inp = dview(inp, {kN, 2 * kF}), .dinp = dview(dinp, {kN, 2 * kF})});
        b->synchronize();
        outs.push_back(to_f32(out));
        dinps.push_back(to_f32(dinp));
    }
    const std::string d(dtype_name(dtype_of<D>()));
    expect_close("swiglu out " + d, max_rel_error(outs[1], outs[0]), tolerance<D>());
    expect_close("swiglu dinp " + d, max_rel_error(dinps[1], dinps[0]), tolerance<D>());
    EXPECT_TRUE(bit_identical(outs[1], outs[2]) && bit_identical(dinps[1], dinps[2]));
}

TEST(CudaEmuLlamaOps, SwiGluMatchesTheCpuReference) {
    check_swiglu<float>();
    check_swiglu<bf16>();
    check_swiglu<fp16>();
}

TEST(CudaEmuLlamaOpsDeathTest, BadShapesAreRefusedWithSentences) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    auto cuda = make_cuda();
    std::vector<float> qkv(2 * 48), table(2 * 6);
    EXPECT_DEATH(cuda->rope({.qkv = view(qkv, {2, 48}),
                             .table = view(table, {2, 6}),
                             .positions = {},
                             .T = 2,
                             .NH = 4,
                             .NKV = 3,
                             .direction = RopeDirection::kForward}),
                 "rope: NKV = 3 key/value heads do not divide NH = 4 query heads");
    std::vector<float> odd(2 * 5);
    EXPECT_DEATH(cuda->rope({.qkv = view(qkv, {2, 45}),
                             .table = view(odd, {2, 5}),
                             .positions = {},
                             .T = 2,
                             .NH = 4,
                             .NKV = 1,
                             .direction = RopeDirection::kForward}),
                 "rope: head size HS = 5 \\(the table's width\\) is odd");
}

}  // namespace
}  // namespace ms::test
