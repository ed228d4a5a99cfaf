// test_llama_ops.cpp: the Llama ops of the CPU backend -- RMSNorm, rotary position embeddings (and their table),
// SwiGLU -- in OpMode::kReference and kFast, on fp32, bf16 and fp16.
//
// Checks: fast vs reference on shapes that are not multiples of any block or vector width (N = 37, C = 131), with
// scale-free tolerances about 10x what MS_OP_TEST_VERBOSE=1 prints; fast on 1 and 3 OpenMP threads bit-identical;
// backward vs central finite differences of the forward (fp32 reference); the accumulation contract (dinp per
// Accumulate, dweight +=, a 16-bit dweight rounded once: D == from_float<D>(old + the fp32 contribution)); RoPE's
// table against Hugging Face's llama3 inverse frequencies, a hand-computed rotation, the inverse undoing the forward,
// pair norms kept, V untouched, explicit positions; and the sentences that refuse bad shapes.
#include <omp.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "engine/backends/rope_table.h"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

constexpr OpMode kModes[] = {OpMode::kReference, OpMode::kFast};

// ---- RMSNorm ----

constexpr int64_t kN = 37, kC = 131;
constexpr float kEps = 1e-5f;

// Every output of one forward and one backward (dinp per `acc` from `dinp0`, dweight of type G from `dweight0`).
struct RmsNormRun {
    std::vector<float> out, rstd, dinp, dweight;
};
template <class D, class G = float>
RmsNormRun run_rmsnorm(Backend& backend, int64_t N, int64_t C, const std::vector<float>& inp_f,
                       const std::vector<float>& weight_f, const std::vector<float>& dout_f,
                       const std::vector<float>& dinp0, const std::vector<float>& dweight0, Accumulate acc) {
    auto inp = to_d<D>(inp_f), weight = to_d<D>(weight_f), dout = to_d<D>(dout_f), dinp = to_d<D>(dinp0);
    auto dweight = to_d<G>(dweight0);
    std::vector<D> out(N * C);
    std::vector<float> rstd(N);
    backend.rmsnorm_forward({.inp = dview(inp, {N, C}),
                             .weight = dview(weight, {C}),
                             .out = dview(out, {N, C}),
                             .rstd = view(rstd, {N}),
                             .eps = kEps});
    backend.rmsnorm_backward({.dout = dview(dout, {N, C}),
                              .inp = dview(inp, {N, C}),
                              .weight = dview(weight, {C}),
                              .rstd = view(rstd, {N}),
                              .dinp = dview(dinp, {N, C}),
                              .dweight = dview(dweight, {C}),
                              .accumulate = acc});
    return {to_f32(out), rstd, to_f32(dinp), to_f32(dweight)};
}

struct RmsNormInputs {
    std::vector<float> inp = random_floats(kN * kC, 1, -2.0f, 2.0f), weight = random_floats(kC, 2, 0.5f, 1.5f);
    std::vector<float> dout = random_floats(kN * kC, 3), dinp0 = random_floats(kN * kC, 4),
                       dweight0 = random_floats(kC, 5);
};

template <class D>
void rmsnorm_fast_vs_reference(double tol_out, double tol_grad) {
    const RmsNormInputs in;
    auto ref = make_cpu_backend(OpMode::kReference), fast = make_cpu_backend(OpMode::kFast);
    const auto r = run_rmsnorm<D>(*ref, kN, kC, in.inp, in.weight, in.dout, in.dinp0, in.dweight0, Accumulate::kAdd);
    const auto f = run_rmsnorm<D>(*fast, kN, kC, in.inp, in.weight, in.dout, in.dinp0, in.dweight0, Accumulate::kAdd);
    const std::string d(dtype_name(dtype_of<D>()));
    expect_within("rmsnorm out " + d, OpMode::kFast, max_rel_error(f.out, r.out), tol_out);
    expect_within("rmsnorm rstd " + d, OpMode::kFast, max_rel_error(f.rstd, r.rstd), 1e-6);
    expect_within("rmsnorm dinp " + d, OpMode::kFast, max_rel_error(f.dinp, r.dinp), tol_grad);
    expect_within("rmsnorm dweight " + d, OpMode::kFast, max_rel_error(f.dweight, r.dweight), 1e-6);
}

// Tolerances: fp32 about 10x the measured error; bf16 / fp16 a rounding of the output (2^-8, 2^-11) apart at most,
// where the fast path's fp32 and the reference's double land on two sides of a rounding boundary.
MS_OP_TEST(RmsNorm, FastMatchesReference, kFastVsReference, OpKind::kRmsNormForward, OpKind::kRmsNormBackward) {
    rmsnorm_fast_vs_reference<float>(1e-6, 1e-6);
    rmsnorm_fast_vs_reference<bf16>(8e-3, 8e-3);
    rmsnorm_fast_vs_reference<fp16>(1e-3, 1e-3);
}

MS_OP_TEST(RmsNorm, FastIsThreadCountInvariant, kDeterminism, OpKind::kRmsNormForward, OpKind::kRmsNormBackward) {
    const RmsNormInputs in;
    auto fast = make_cpu_backend(OpMode::kFast);
    RmsNormRun one, three;
    with_threads(1, [&] {
        one = run_rmsnorm<bf16>(*fast, kN, kC, in.inp, in.weight, in.dout, in.dinp0, in.dweight0, Accumulate::kAdd);
    });
    with_threads(3, [&] {
        three = run_rmsnorm<bf16>(*fast, kN, kC, in.inp, in.weight, in.dout, in.dinp0, in.dweight0, Accumulate::kAdd);
    });
    EXPECT_TRUE(bit_identical(one.out, three.out) && bit_identical(one.rstd, three.rstd));
    EXPECT_TRUE(bit_identical(one.dinp, three.dinp) && bit_identical(one.dweight, three.dweight));
}

// A row (3, 4) of weight (1, 2): mean of squares 12.5, so rstd = 1 / sqrt(12.5 + eps).
MS_OP_TEST(RmsNorm, ForwardMatchesHandComputedValues, kExact, OpKind::kRmsNormForward) {
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        std::vector<float> inp = {3.0f, 4.0f}, weight = {1.0f, 2.0f}, out(2), rstd(1);
        backend->rmsnorm_forward({.inp = view(inp, {1, 2}),
                                  .weight = view(weight, {2}),
                                  .out = view(out, {1, 2}),
                                  .rstd = view(rstd, {1}),
                                  .eps = kEps});
        const double r = 1.0 / std::sqrt(12.5 + static_cast<double>(kEps));
        EXPECT_NEAR(rstd[0], r, 1e-7) << mode_name(mode);
        EXPECT_NEAR(out[0], 3.0 * r, 1e-6) << mode_name(mode);
        EXPECT_NEAR(out[1], 8.0 * r, 1e-6) << mode_name(mode);
    }
}

// dinp, dweight vs central differences of sum(out * r) (fp32, double-precision reference); relative errors of a few
// 1e-4 are what float finite differences with a step of 1e-3 give.
MS_OP_TEST(RmsNorm, BackwardMatchesFiniteDifferences, kGradient, OpKind::kRmsNormForward, OpKind::kRmsNormBackward) {
    constexpr int64_t N = 5, C = 7;
    auto inp = random_floats(N * C, 11, -2.0f, 2.0f), weight = random_floats(C, 12, 0.5f, 1.5f);
    const auto r = random_floats(N * C, 13);
    auto backend = make_cpu_backend(OpMode::kReference);
    const auto loss = [&] {
        std::vector<float> out(N * C), rstd(N);
        backend->rmsnorm_forward({.inp = view(inp, {N, C}),
                                  .weight = view(weight, {C}),
                                  .out = view(out, {N, C}),
                                  .rstd = view(rstd, {N}),
                                  .eps = kEps});
        return dot_loss(out, r);
    };
    const auto run = run_rmsnorm<float>(*backend, N, C, inp, weight, r, std::vector<float>(N * C),
                                        std::vector<float>(C), Accumulate::kOverwrite);
    EXPECT_LE(max_rel_error(run.dinp, numeric_grad(inp, loss)), 2e-3);
    EXPECT_LE(max_rel_error(run.dweight, numeric_grad(weight, loss)), 2e-3);
}

// kAdd adds the kOverwrite result to the old dinp, and dweight += in fp32; a 16-bit dweight gets the fp32 sum of its
// old value and the contribution, rounded once (exact comparisons: the same fp32 arithmetic on the same inputs).
template <class D>
void check_rmsnorm_contract(OpMode mode) {
    const RmsNormInputs in;
    auto backend = make_cpu_backend(mode);
    const std::vector<float> zero_dinp(kN * kC), zero_dw(kC);
    const auto fresh =
        run_rmsnorm<float>(*backend, kN, kC, in.inp, in.weight, in.dout, zero_dinp, zero_dw, Accumulate::kOverwrite);
    const auto added =
        run_rmsnorm<float>(*backend, kN, kC, in.inp, in.weight, in.dout, in.dinp0, in.dweight0, Accumulate::kAdd);
    const auto over =
        run_rmsnorm<float>(*backend, kN, kC, in.inp, in.weight, in.dout, in.dinp0, in.dweight0, Accumulate::kOverwrite);
    EXPECT_TRUE(bit_identical(over.dinp, fresh.dinp));
    for (int64_t i = 0; i < kN * kC; ++i) ASSERT_EQ(added.dinp[i], in.dinp0[i] + fresh.dinp[i]) << i;
    for (int64_t c = 0; c < kC; ++c) ASSERT_EQ(added.dweight[c], in.dweight0[c] + fresh.dweight[c]) << c;
    // 16-bit gradient: the contribution from a D run with an fp32 dweight of zeros.
    const auto d_inputs = [](std::vector<float> v) {
        for (float& x : v) x = round_to<D>(x);
        return v;
    };
    const auto old = d_inputs(in.dweight0);
    const auto f32 =
        run_rmsnorm<D, float>(*backend, kN, kC, in.inp, in.weight, in.dout, zero_dinp, zero_dw, Accumulate::kOverwrite);
    const auto half =
        run_rmsnorm<D, D>(*backend, kN, kC, in.inp, in.weight, in.dout, zero_dinp, old, Accumulate::kOverwrite);
    for (int64_t c = 0; c < kC; ++c) {
        ASSERT_EQ(half.dweight[c], to_float(from_float<D>(old[c] + f32.dweight[c])))
            << c << " " << mode_name(mode) << " " << dtype_name(dtype_of<D>());
    }
    EXPECT_TRUE(bit_identical(half.dinp, f32.dinp));
}

MS_OP_TEST(RmsNorm, AccumulationContract, kContract, OpKind::kRmsNormBackward) {
    for (OpMode mode : kModes) {
        check_rmsnorm_contract<bf16>(mode);
        check_rmsnorm_contract<fp16>(mode);
    }
}

// ---- rotary position embedding ----

// Inverse frequencies printed by tests/ops/rope_llama3_reference.py (Hugging Face's llama3 rule in float64 torch).
TEST(RopeTable, InverseFrequenciesMatchHuggingFaceLlama3) {
    const RopeScaling llama31{
        .factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0, .original_max_position_embeddings = 8192.0};
    const auto f = rope_inv_freq(128, 500000.0, llama31);
    ASSERT_EQ(f.size(), 64u);
    const std::pair<int, double> expected[] = {{0, 1.0},
                                               {25, 0.005940730375674967},  // high frequency: unchanged
                                               {29, 0.002166570763503359},  // medium: smoothed
                                               {31, 0.0008567514129196321},
                                               {34, 0.00017850781276799638},
                                               {40, 3.428102195952591e-05},  // low: divided by the factor
                                               {63, 3.068925988914511e-07}};
    for (const auto& [i, v] : expected) EXPECT_NEAR(f[i], v, 1e-14 * v) << i;
    const double small_expected[] = {
        1.0,     0.2546479089470326,   0.025464790894703257, 0.007905694150420948, 0.0025, 0.0007905694150420947,
        0.00025, 7.905694150420948e-05};
    const auto g = rope_inv_freq(16, 10000.0, {.factor = 4.0, .original_max_position_embeddings = 64.0});
    for (int i = 0; i < 8; ++i) EXPECT_NEAR(g[i], small_expected[i], 1e-14 * small_expected[i]) << i;
    // factor 0 or 1: theta^(-2i/HS) unchanged.
    for (double factor : {0.0, 1.0}) {
        const auto plain = rope_inv_freq(16, 10000.0, {.factor = factor});
        for (int i = 0; i < 8; ++i) EXPECT_DOUBLE_EQ(plain[i], std::pow(10000.0, -i / 8.0)) << i;
    }
}

TEST(RopeTable, RowsAreCosThenSinOfPositionTimesFrequency) {
    const RopeScaling scaling{.factor = 4.0, .original_max_position_embeddings = 64.0};
    const auto f = rope_inv_freq(16, 10000.0, scaling);
    const auto table = rope_table(300, 16, 10000.0, scaling);
    ASSERT_EQ(table.size(), 300u * 16u);
    for (int p : {0, 1, 7, 299}) {
        for (int i = 0; i < 8; ++i) {
            EXPECT_EQ(table[p * 16 + i], static_cast<float>(std::cos(p * f[i]))) << p << " " << i;
            EXPECT_EQ(table[p * 16 + 8 + i], static_cast<float>(std::sin(p * f[i]))) << p << " " << i;
        }
    }
}

// Shapes: B = 3, T = 13 (N = 39), NH = 4, NKV = 2, HS = 10 (HS/2 = 5 is no vector width).
constexpr int64_t kB = 3, kT = 13, kNH = 4, kNKV = 2, kHS = 10, kRow = (kNH + 2 * kNKV) * kHS;

constexpr RopeScaling kNoScaling{};

struct RopeSetup {
    std::vector<float> table = rope_table(2 * kT, kHS, 10000.0, kNoScaling);
    std::vector<float> qkv = random_floats(kB * kT * kRow, 21, -2.0f, 2.0f);
};

template <class D>
std::vector<float> run_rope(Backend& backend, std::vector<float>& table, const std::vector<float>& qkv_f,
                            RopeDirection dir, std::vector<int32_t>* positions = nullptr) {
    auto qkv = to_d<D>(qkv_f);
    const int64_t N = static_cast<int64_t>(qkv.size()) / kRow;
    backend.rope({.qkv = dview(qkv, {N, kRow}),
                  .table = view(table, {static_cast<int64_t>(table.size()) / kHS, kHS}),
                  .positions = positions ? view(*positions, {N}) : Tensor{},
                  .T = kT,
                  .NH = kNH,
                  .NKV = kNKV,
                  .direction = dir});
    return to_f32(qkv);
}

// x = (1, 2 | 3, 4) (HS = 4, pairs (0, 2) and (1, 3)) at position 1 of a table with f = (1, 0.01): the forward
// rotates (1, 3) by 1 radian and (2, 4) by 0.01.
MS_OP_TEST(Rope, MatchesHandComputedRotation, kExact, OpKind::kRope) {
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        auto table = rope_table(2, 4, 10000.0, {});  // f = (1, 10000^-1/2 = 0.01)
        std::vector<float> qkv = {1.0f, 2.0f, 3.0f, 4.0f, 0, 0, 0, 0, 9.0f, 9.0f, 9.0f, 9.0f};
        std::vector<int32_t> pos = {1};
        backend->rope({.qkv = view(qkv, {1, 12}),
                       .table = view(table, {2, 4}),
                       .positions = view(pos, {1}),
                       .T = 1,
                       .NH = 1,
                       .NKV = 1,
                       .direction = RopeDirection::kForward});
        const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(0.01), s2 = std::sin(0.01);
        EXPECT_NEAR(qkv[0], 1 * c1 - 3 * s1, 1e-6) << mode_name(mode);
        EXPECT_NEAR(qkv[2], 3 * c1 + 1 * s1, 1e-6) << mode_name(mode);
        EXPECT_NEAR(qkv[1], 2 * c2 - 4 * s2, 1e-6) << mode_name(mode);
        EXPECT_NEAR(qkv[3], 4 * c2 + 2 * s2, 1e-6) << mode_name(mode);
        for (int i = 4; i < 8; ++i) EXPECT_EQ(qkv[i], 0.0f);   // K: zeros stay zeros
        for (int i = 8; i < 12; ++i) EXPECT_EQ(qkv[i], 9.0f);  // V untouched
    }
}

// The inverse undoes the forward (fp32, within 1e-6 of each element's scale), every pair keeps its norm, V is not
// touched, and explicit positions n % T give the same bits as none.
MS_OP_TEST(Rope, InverseUndoesForwardAndPairNormsAreKept, kContract, OpKind::kRope) {
    RopeSetup s;
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        const auto rotated = run_rope<float>(*backend, s.table, s.qkv, RopeDirection::kForward);
        const auto back = run_rope<float>(*backend, s.table, rotated, RopeDirection::kInverse);
        expect_within("rope forward then inverse", mode, max_rel_error(back, s.qkv), 1e-6);
        for (int64_t n = 0; n < kB * kT; ++n) {
            for (int64_t h = 0; h < kNH + kNKV; ++h) {
                for (int64_t i = 0; i < kHS / 2; ++i) {
                    const int64_t a = n * kRow + h * kHS + i, b = a + kHS / 2;
                    const double before = std::hypot(s.qkv[a], s.qkv[b]), after = std::hypot(rotated[a], rotated[b]);
                    ASSERT_NEAR(after, before, 1e-6 * std::max(1.0, before)) << n << " " << h << " " << i;
                }
            }
            for (int64_t c = (kNH + kNKV) * kHS; c < kRow; ++c) ASSERT_EQ(rotated[n * kRow + c], s.qkv[n * kRow + c]);
        }
        std::vector<int32_t> pos(kB * kT);
        for (int64_t n = 0; n < kB * kT; ++n) pos[n] = static_cast<int32_t>(n % kT);
        EXPECT_TRUE(bit_identical(run_rope<float>(*backend, s.table, s.qkv, RopeDirection::kForward, &pos), rotated));
        // Positions beyond T (a packed or shifted sequence) read their own rows of the table.
        for (int32_t& p : pos) p = static_cast<int32_t>(2 * kT - 1 - p);
        const auto shifted = run_rope<float>(*backend, s.table, s.qkv, RopeDirection::kForward, &pos);
        EXPECT_FALSE(bit_identical(shifted, rotated));
        expect_within("rope shifted round trip", mode,
                      max_rel_error(run_rope<float>(*backend, s.table, shifted, RopeDirection::kInverse, &pos), s.qkv),
                      1e-6);
    }
}

// The inverse is the forward's transpose, so it is its backward: <R x, y> = <x, R^T y> (double sums of fp32 values).
MS_OP_TEST(Rope, InverseIsTheTransposeOfForward, kGradient, OpKind::kRope) {
    RopeSetup s;
    const auto y = random_floats(s.qkv.size(), 22);
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        const double lhs = dot_loss(run_rope<float>(*backend, s.table, s.qkv, RopeDirection::kForward), y);
        const double rhs = dot_loss(run_rope<float>(*backend, s.table, y, RopeDirection::kInverse), s.qkv);
        EXPECT_NEAR(lhs, rhs, 1e-6 * std::fabs(lhs) + 1e-5) << mode_name(mode);
    }
}

template <class D>
void rope_fast_vs_reference(double tol) {
    RopeSetup s;
    auto ref = make_cpu_backend(OpMode::kReference), fast = make_cpu_backend(OpMode::kFast);
    for (RopeDirection dir : {RopeDirection::kForward, RopeDirection::kInverse}) {
        const auto r = run_rope<D>(*ref, s.table, s.qkv, dir), f = run_rope<D>(*fast, s.table, s.qkv, dir);
        expect_within("rope " + std::string(dtype_name(dtype_of<D>())), OpMode::kFast, max_rel_error(f, r), tol);
    }
}

// fp32: the fast path's fp32 products against the reference's double (about 1e-7 measured); bf16 / fp16: one
// rounding of the output apart at most.
MS_OP_TEST(Rope, FastMatchesReference, kFastVsReference, OpKind::kRope) {
    rope_fast_vs_reference<float>(1e-6);
    rope_fast_vs_reference<bf16>(8e-3);
    rope_fast_vs_reference<fp16>(1e-3);
}

MS_OP_TEST(Rope, FastIsThreadCountInvariant, kDeterminism, OpKind::kRope) {
    RopeSetup s;
    auto fast = make_cpu_backend(OpMode::kFast);
    std::vector<float> one, three;
    with_threads(1, [&] { one = run_rope<bf16>(*fast, s.table, s.qkv, RopeDirection::kForward); });
    with_threads(3, [&] { three = run_rope<bf16>(*fast, s.table, s.qkv, RopeDirection::kForward); });
    EXPECT_TRUE(bit_identical(one, three));
}

TEST(RopeDeathTest, BadShapesAreRefusedWithSentences) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    auto backend = make_cpu_backend(OpMode::kFast);
    std::vector<float> qkv(4 * 27), odd_table(2 * 9), table(2 * 6);
    EXPECT_DEATH(backend->rope({.qkv = view(qkv, {4, 27}),
                                .table = view(odd_table, {2, 9}),
                                .positions = {},
                                .T = 2,
                                .NH = 1,
                                .NKV = 1,
                                .direction = RopeDirection::kForward}),
                 "rope: head size HS = 9 \\(the table's width\\) is odd");
    std::vector<float> qkv3(2 * 48);
    EXPECT_DEATH(backend->rope({.qkv = view(qkv3, {2, 48}),
                                .table = view(table, {2, 6}),
                                .positions = {},
                                .T = 2,
                                .NH = 4,
                                .NKV = 3,  // does not divide NH = 4
                                .direction = RopeDirection::kForward}),
                 "rope: NKV = 3 key/value heads do not divide NH = 4 query heads");
    std::vector<float> qkv4(2 * 18);
    std::vector<int32_t> pos = {0, 5};
    EXPECT_DEATH(backend->rope({.qkv = view(qkv4, {2, 18}),
                                .table = view(table, {2, 6}),
                                .positions = view(pos, {2}),
                                .T = 2,
                                .NH = 1,
                                .NKV = 1,
                                .direction = RopeDirection::kForward}),
                 "rope: positions\\[1\\] = 5 is outside the table's \\[0, 2\\)");
    EXPECT_DEATH(rope_table(4, 7, 10000.0, {}), "rope: head size HS = 7 is odd");
}

// ---- SwiGLU ----

constexpr int64_t kF = 131;

struct SwiGluRun {
    std::vector<float> out, dinp;
};
template <class D>
SwiGluRun run_swiglu(Backend& backend, int64_t N, int64_t F, const std::vector<float>& inp_f,
                     const std::vector<float>& dout_f) {
    auto inp = to_d<D>(inp_f), dout = to_d<D>(dout_f);
    std::vector<D> out(N * F), dinp = to_d<D>(std::vector<float>(N * 2 * F, 7.0f));  // overwritten
    backend.swiglu_forward({.inp = dview(inp, {N, 2 * F}), .out = dview(out, {N, F})});
    backend.swiglu_backward(
        {.dout = dview(dout, {N, F}), .inp = dview(inp, {N, 2 * F}), .dinp = dview(dinp, {N, 2 * F})});
    return {to_f32(out), to_f32(dinp)};
}

template <class D>
void swiglu_fast_vs_reference(double tol) {
    // gates out to +-12: where sigmoid saturates, and e^-g is large
    const auto inp = random_floats(kN * 2 * kF, 31, -12.0f, 12.0f), dout = random_floats(kN * kF, 32);
    auto ref = make_cpu_backend(OpMode::kReference), fast = make_cpu_backend(OpMode::kFast);
    const auto r = run_swiglu<D>(*ref, kN, kF, inp, dout), f = run_swiglu<D>(*fast, kN, kF, inp, dout);
    const std::string d(dtype_name(dtype_of<D>()));
    expect_within("swiglu out " + d, OpMode::kFast, max_rel_error(f.out, r.out), tol);
    expect_within("swiglu dinp " + d, OpMode::kFast, max_rel_error(f.dinp, r.dinp), tol);
}

MS_OP_TEST(SwiGlu, FastMatchesReference, kFastVsReference, OpKind::kSwiGluForward, OpKind::kSwiGluBackward) {
    swiglu_fast_vs_reference<float>(1e-6);
    swiglu_fast_vs_reference<bf16>(8e-3);
    swiglu_fast_vs_reference<fp16>(1e-3);
}

MS_OP_TEST(SwiGlu, FastIsThreadCountInvariant, kDeterminism, OpKind::kSwiGluForward, OpKind::kSwiGluBackward) {
    const auto inp = random_floats(kN * 2 * kF, 31, -4.0f, 4.0f), dout = random_floats(kN * kF, 32);
    auto fast = make_cpu_backend(OpMode::kFast);
    SwiGluRun one, three;
    with_threads(1, [&] { one = run_swiglu<fp16>(*fast, kN, kF, inp, dout); });
    with_threads(3, [&] { three = run_swiglu<fp16>(*fast, kN, kF, inp, dout); });
    EXPECT_TRUE(bit_identical(one.out, three.out) && bit_identical(one.dinp, three.dinp));
}

// gate (1, -2, 0), up (2, 3, 5): out = (2 / (1 + e^-1), -6 / (1 + e^2), 0).
MS_OP_TEST(SwiGlu, ForwardMatchesHandComputedValues, kExact, OpKind::kSwiGluForward) {
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        std::vector<float> inp = {1.0f, -2.0f, 0.0f, 2.0f, 3.0f, 5.0f}, out(3);
        backend->swiglu_forward({.inp = view(inp, {1, 6}), .out = view(out, {1, 3})});
        EXPECT_NEAR(out[0], 2.0 / (1.0 + std::exp(-1.0)), 1e-6) << mode_name(mode);
        EXPECT_NEAR(out[1], -6.0 / (1.0 + std::exp(2.0)), 1e-6) << mode_name(mode);
        EXPECT_EQ(out[2], 0.0f) << mode_name(mode);
    }
}

// dinp (both halves) vs central differences of sum(out * r) in both modes; dinp is overwritten (run_swiglu fills it
// with 7 first).
MS_OP_TEST(SwiGlu, BackwardMatchesFiniteDifferences, kGradient, OpKind::kSwiGluForward, OpKind::kSwiGluBackward) {
    constexpr int64_t N = 4, F = 9;
    auto inp = random_floats(N * 2 * F, 41, -4.0f, 4.0f);
    const auto r = random_floats(N * F, 42);
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        const auto loss = [&] {
            std::vector<float> out(N * F);
            backend->swiglu_forward({.inp = view(inp, {N, 2 * F}), .out = view(out, {N, F})});
            return dot_loss(out, r);
        };
        const auto run = run_swiglu<float>(*backend, N, F, inp, r);
        expect_within("swiglu dinp vs finite differences", mode, max_rel_error(run.dinp, numeric_grad(inp, loss)),
                      2e-3);
    }
}

MS_OP_TEST(SwiGlu, BackwardOverwritesAndSaturatesWithoutNaN, kContract, OpKind::kSwiGluBackward) {
    // g = -100: sigmoid ~ 0 and e^-g overflowing float (outputs of order 1e-41 or 0, never NaN or inf); g = 100:
    // sigmoid 1.
    const std::vector<float> inp = {-100.0f, 100.0f, 3.0f, 5.0f}, dout = {1.0f, 1.0f};
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        const auto run = run_swiglu<float>(*backend, 1, 2, inp, dout);
        EXPECT_NEAR(run.out[0], 0.0f, 1e-30f) << mode_name(mode);
        EXPECT_NEAR(run.out[1], 500.0f, 1e-3) << mode_name(mode);
        EXPECT_NEAR(run.dinp[0], 0.0f, 1e-30f) << mode_name(mode);
        EXPECT_NEAR(run.dinp[1], 5.0f, 1e-5) << mode_name(mode);
        EXPECT_NEAR(run.dinp[2], 0.0f, 1e-30f) << mode_name(mode);
        EXPECT_NEAR(run.dinp[3], 100.0f, 1e-4) << mode_name(mode);
    }
}

TEST(LlamaOpsDeathTest, BadShapesAndDtypesAreRefusedWithSentences) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    auto backend = make_cpu_backend(OpMode::kFast);
    std::vector<float> inp(15), out(8);
    EXPECT_DEATH(
        backend->swiglu_forward({.inp = view(inp, {3, 5}), .out = view(out, {3, 2})}),
        "swiglu: inp rows have 5 columns; a row is \\[gate \\(F\\) \\| up \\(F\\)\\], so the width must be even");
    std::vector<bf16> x(6), w(3), dx(6), dw_half(3);
    std::vector<fp16> dw_other(3);
    std::vector<float> rstd(2);
    EXPECT_DEATH(
        backend->rmsnorm_backward({.dout = dview(x, {2, 3}),
                                   .inp = dview(x, {2, 3}),
                                   .weight = dview(w, {3}),
                                   .rstd = view(rstd, {2}),
                                   .dinp = dview(dx, {2, 3}),
                                   .dweight = dview(dw_other, {3}),
                                   .accumulate = Accumulate::kOverwrite}),
        "rmsnorm_backward: dweight is fp16, but a parameter gradient is fp32 or the op.s activation dtype bf16");
}

}  // namespace
}  // namespace ms::test
