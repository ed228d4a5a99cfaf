// test_cpu_ops_mixed_contract.cpp: the parts of the precision contract (backend.h) that are not one op's numbers:
// kAdd rounds the fp32 sum of the old value and the new term once; AdamW's fused param_copy; the matmul's GELU
// fusion (bit for bit the two ops); cast; supports(); and
// the checks that refuse dtypes breaking the contract, with a message naming the op and the tensor.
#include <fmt/format.h>
#include <omp.h>

#include <cstring>

#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

constexpr OpMode kModes[] = {OpMode::kReference, OpMode::kFast};

template <class D>
std::vector<float> rounded(std::vector<float> v) {
    for (float& x : v) x = round_to<D>(x);
    return v;
}

// kAdd on D = from_float<D>(old + term), term the fp32 op's kOverwrite result on the same inputs: exact (the
// reference runs the same fp32 arithmetic on D; the fast matmul runs the same sgemm), and in the fast layernorm
// within half an ulp (the compiler may fuse `old + x * rstd` into one FMA in one of the two builds: measured 0).
// The double rounding from_float<D>(old + round_to<D>(term)) differs on some elements here, so the test can tell.
template <class D>
void check_kadd(OpMode mode) {
    constexpr int64_t N = 37, K = 53, M = 29;
    const auto inp = rounded<D>(random_floats(N * K, 1)), weight = rounded<D>(random_floats(M * K, 2));
    const auto dout = rounded<D>(random_floats(N * M, 3)), old = rounded<D>(random_floats(N * K, 4));
    auto backend = make_cpu_backend(mode);
    const auto matmul_dinp = [&](auto& inp_v, auto& weight_v, auto& dout_v, auto& dinp_v, Accumulate acc) {
        std::vector<float> dweight(M * K);
        backend->matmul_backward({.dout = dview(dout_v, {N, M}),
                                  .inp = dview(inp_v, {N, K}),
                                  .weight = dview(weight_v, {M, K}),
                                  .dinp = dview(dinp_v, {N, K}),
                                  .dweight = view(dweight, {M, K}),
                                  .dbias = {},
                                  .accumulate = acc});
    };
    std::vector<float> inp32 = inp, weight32 = weight, dout32 = dout, term(N * K);
    matmul_dinp(inp32, weight32, dout32, term, Accumulate::kOverwrite);
    auto inp_d = to_d<D>(inp), weight_d = to_d<D>(weight), dout_d = to_d<D>(dout), dinp_d = to_d<D>(old);
    matmul_dinp(inp_d, weight_d, dout_d, dinp_d, Accumulate::kAdd);
    const std::vector<float> got = to_f32(dinp_d);
    int double_rounding_differs = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], round_to<D>(old[i] + term[i])) << "matmul dinp " << i << " in mode " << mode_name(mode);
        double_rounding_differs += round_to<D>(old[i] + round_to<D>(term[i])) != got[i];
    }
    EXPECT_GT(double_rounding_differs, 0) << "the inputs cannot tell one rounding from two";

    // layernorm_backward's dinp, with fp32 statistics.
    constexpr int64_t C = K;
    const auto ln_w = rounded<D>(random_floats(C, 5, 0.5f, 1.5f));
    std::vector<float> mean(N), rstd(N), ln_out(N * C), ln_w32 = ln_w, ln_b(C, 0.0f), ln_inp = inp;
    make_cpu_backend(OpMode::kReference)
        ->layernorm_forward({.inp = view(ln_inp, {N, C}),
                             .weight = view(ln_w32, {C}),
                             .bias = view(ln_b, {C}),
                             .out = view(ln_out, {N, C}),
                             .mean = view(mean, {N}),
                             .rstd = view(rstd, {N}),
                             .eps = 1e-5f});
    const auto ln_dout = rounded<D>(random_floats(N * C, 6));
    const auto layernorm_dinp = [&](auto& inp_v, auto& w_v, auto& dout_v, auto& dinp_v, Accumulate acc) {
        std::vector<float> dw(C), db(C);
        backend->layernorm_backward({.dout = dview(dout_v, {N, C}),
                                     .inp = dview(inp_v, {N, C}),
                                     .weight = dview(w_v, {C}),
                                     .mean = view(mean, {N}),
                                     .rstd = view(rstd, {N}),
                                     .dinp = dview(dinp_v, {N, C}),
                                     .dweight = view(dw, {C}),
                                     .dbias = view(db, {C}),
                                     .accumulate = acc});
    };
    std::vector<float> ln_dout32 = ln_dout, ln_term(N * C);
    layernorm_dinp(ln_inp, ln_w32, ln_dout32, ln_term, Accumulate::kOverwrite);
    auto ln_inp_d = to_d<D>(ln_inp), ln_w_d = to_d<D>(ln_w), ln_dout_d = to_d<D>(ln_dout), ln_dinp_d = to_d<D>(old);
    layernorm_dinp(ln_inp_d, ln_w_d, ln_dout_d, ln_dinp_d, Accumulate::kAdd);
    const std::vector<float> ln_got = to_f32(ln_dinp_d);
    for (size_t i = 0; i < ln_got.size(); ++i) {
        ASSERT_EQ(ln_got[i], round_to<D>(old[i] + ln_term[i])) << "layernorm dinp " << i << " in " << mode_name(mode);
    }
}

MS_OP_TEST(MixedPrecision, KAddRoundsTheFp32SumOnce, kContract, OpKind::kMatmulBackward, OpKind::kLayerNormBackward) {
    for (OpMode mode : kModes) {
        check_kadd<bf16>(mode);
        check_kadd<fp16>(mode);
    }
}

// The MLP's GELU fusion (backend.h: gelu_out, gelu_inp) on the CPU is its matmul, then its gelu, in the same mode:
// bit for bit what the two ops give called one after the other, for every dtype (so the model's CPU results did not
// change when gpt.cpp switched to the fused form). dweight and dbias are unaffected by the fusion, checked too.
template <class D>
void check_gelu_fusion(OpMode mode) {
    constexpr int64_t N = 37, K = 45, M = 29;
    const auto inp = to_d<D>(random_floats(N * K, 1, -2.0f, 2.0f)), weight = to_d<D>(random_floats(M * K, 2));
    const auto bias = to_d<D>(random_floats(M, 3)), dout = to_d<D>(random_floats(N * M, 4));
    const auto gelu_inp = to_d<D>(random_floats(N * K, 5, -3.0f, 3.0f));
    auto backend = make_cpu_backend(mode);
    auto x = inp, w = weight, b = bias, dy = dout, g = gelu_inp;

    std::vector<D> out(N * M), act(N * M), out_f(N * M), act_f(N * M);
    backend->matmul_forward(
        {.inp = dview(x, {N, K}), .weight = dview(w, {M, K}), .bias = dview(b, {M}), .out = dview(out, {N, M})});
    backend->gelu_forward({.inp = dview(out, {N * M}), .out = dview(act, {N * M})});
    backend->matmul_forward({.inp = dview(x, {N, K}),
                             .weight = dview(w, {M, K}),
                             .bias = dview(b, {M}),
                             .out = dview(out_f, {N, M}),
                             .gelu_out = dview(act_f, {N, M})});
    EXPECT_EQ(to_f32(out_f), to_f32(out)) << "pre-activation in mode " << mode_name(mode);
    EXPECT_EQ(to_f32(act_f), to_f32(act)) << "gelu_out in mode " << mode_name(mode);

    std::vector<D> dx(N * K), dx_f(N * K, from_float<D>(7.0f));
    std::vector<float> dw(M * K, 0.5f), db(M, 0.25f), dw_f = dw, db_f = db;
    backend->matmul_backward({.dout = dview(dy, {N, M}),
                              .inp = dview(x, {N, K}),
                              .weight = dview(w, {M, K}),
                              .dinp = dview(dx, {N, K}),
                              .dweight = view(dw, {M, K}),
                              .dbias = view(db, {M}),
                              .accumulate = Accumulate::kOverwrite});
    backend->gelu_backward({.inp = dview(g, {N * K}), .dout = dview(dx, {N * K}), .dinp = dview(dx, {N * K})});
    backend->matmul_backward({.dout = dview(dy, {N, M}),
                              .inp = dview(x, {N, K}),
                              .weight = dview(w, {M, K}),
                              .dinp = dview(dx_f, {N, K}),
                              .dweight = view(dw_f, {M, K}),
                              .dbias = view(db_f, {M}),
                              .accumulate = Accumulate::kOverwrite,
                              .gelu_inp = dview(g, {N, K})});
    EXPECT_EQ(to_f32(dx_f), to_f32(dx)) << "dinp in mode " << mode_name(mode);
    EXPECT_TRUE(bit_identical(dw_f, dw) && bit_identical(db_f, db)) << "dweight, dbias in mode " << mode_name(mode);
}

MS_OP_TEST(MixedPrecision, MatmulGeluFusionIsMatmulThenGelu, kContract, OpKind::kMatmulForward,
           OpKind::kMatmulBackward) {
    for (OpMode mode : kModes) {
        check_gelu_fusion<float>(mode);
        check_gelu_fusion<bf16>(mode);
        check_gelu_fusion<fp16>(mode);
    }
}

// The residual add fused into layernorm_forward (backend.h) is residual_forward then layernorm_forward, bit for bit
// (residual_out, out, mean, rstd), with and without the residual bias, with residual_out aliasing residual_a (the
// in-place stream) and with out aliasing residual_b (the trainer's sequence-parallel buffer). C = 53: no vector
// width divides it.
enum class LnAlias : uint8_t { kNone, kResidualOutIsA, kOutIsB };

template <class D>
void check_residual_fusion(OpMode mode) {
    constexpr int64_t N = 37, C = 53;
    const auto a0 = to_d<D>(random_floats(N * C, 1, -3.0f, 5.0f)), b0 = to_d<D>(random_floats(N * C, 2));
    auto res_bias = to_d<D>(random_floats(C, 3)), weight = to_d<D>(random_floats(C, 4)),
         bias = to_d<D>(random_floats(C, 5));
    auto backend = make_cpu_backend(mode);
    for (bool with_bias : {true, false}) {
        const Tensor rb = with_bias ? dview(res_bias, {C}) : Tensor();
        std::vector<D> a = a0, b = b0, res(N * C), out(N * C);
        std::vector<float> mean(N), rstd(N);
        backend->residual_forward(
            {.a = dview(a, {N * C}), .b = dview(b, {N * C}), .out = dview(res, {N * C}), .bias = rb});
        backend->layernorm_forward({.inp = dview(res, {N, C}),
                                    .weight = dview(weight, {C}),
                                    .bias = dview(bias, {C}),
                                    .out = dview(out, {N, C}),
                                    .mean = view(mean, {N}),
                                    .rstd = view(rstd, {N}),
                                    .eps = 1e-5f});
        for (LnAlias alias : {LnAlias::kNone, LnAlias::kResidualOutIsA, LnAlias::kOutIsB}) {
            std::vector<D> fa = a0, fb = b0, fres(N * C, from_float<D>(-7.0f)), fout(N * C, from_float<D>(-7.0f));
            std::vector<float> fmean(N, -7.0f), frstd(N, -7.0f);
            std::vector<D>& res_out = alias == LnAlias::kResidualOutIsA ? fa : fres;
            std::vector<D>& ln_out = alias == LnAlias::kOutIsB ? fb : fout;
            backend->layernorm_forward({.inp = {},
                                        .weight = dview(weight, {C}),
                                        .bias = dview(bias, {C}),
                                        .out = dview(ln_out, {N, C}),
                                        .mean = view(fmean, {N}),
                                        .rstd = view(frstd, {N}),
                                        .eps = 1e-5f,
                                        .residual_a = dview(fa, {N, C}),
                                        .residual_b = dview(fb, {N, C}),
                                        .residual_bias = rb,
                                        .residual_out = dview(res_out, {N, C})});
            const std::string what = fmt::format("{} {} bias {} alias {}", dtype_name(dtype_of<D>()), mode_name(mode),
                                                 with_bias, static_cast<int>(alias));
            EXPECT_TRUE(bit_identical(to_f32(res_out), to_f32(res))) << "residual_out, " << what;
            EXPECT_TRUE(bit_identical(to_f32(ln_out), to_f32(out))) << "out, " << what;
            EXPECT_TRUE(bit_identical(fmean, mean) && bit_identical(frstd, rstd)) << "mean, rstd, " << what;
        }
    }
}

MS_OP_TEST(MixedPrecision, LayerNormResidualFusionIsResidualThenLayerNorm, kExact, OpKind::kLayerNormResidualForward) {
    for (OpMode mode : kModes) {
        check_residual_fusion<float>(mode);
        check_residual_fusion<bf16>(mode);
        check_residual_fusion<fp16>(mode);
    }
}

// The fused op's aliasing contract alone, on fp32: in place (residual_out is residual_a) and out over residual_b
// give what separate buffers give.
MS_OP_TEST(Contract, LayerNormResidualAlias, kContract, OpKind::kLayerNormResidualForward) {
    for (OpMode mode : kModes) check_residual_fusion<float>(mode);
}

// param, m and v are exactly the fp32 update's; param_copy is exactly from_float<D>(param), in both modes.
template <class D>
void check_adamw_param_copy(OpMode mode) {
    constexpr int64_t n = 1001;
    const auto param0 = random_floats(n, 1), m0 = random_floats(n, 2, -0.1f, 0.1f);
    const auto v0 = random_floats(n, 3, 0.0f, 0.01f);
    auto grad = random_floats(n, 4);
    auto backend = make_cpu_backend(mode);
    const auto step = [&](std::vector<float>& p, std::vector<float>& m, std::vector<float>& v, Tensor copy) {
        backend->adamw({.param = view(p, {n}),
                        .grad = view(grad, {n}),
                        .m = view(m, {n}),
                        .v = view(v, {n}),
                        .lr = 1e-3f,
                        .beta1 = 0.9f,
                        .beta2 = 0.95f,
                        .eps = 1e-8f,
                        .weight_decay = 0.1f,
                        .grad_scale = 0.7f,
                        .step = 3,
                        .param_copy = copy});
    };
    std::vector<float> p1 = param0, m1 = m0, v1 = v0, p2 = param0, m2 = m0, v2 = v0;
    step(p1, m1, v1, Tensor());
    std::vector<D> copy(n + 2, D{0x5555});  // one guard element on each side
    step(p2, m2, v2, Tensor(copy.data() + 1, dtype_of<D>(), {n}));
    EXPECT_TRUE(bit_identical(p1, p2) && bit_identical(m1, m2) && bit_identical(v1, v2)) << mode_name(mode);
    EXPECT_EQ(copy[0].bits, 0x5555);
    EXPECT_EQ(copy[n + 1].bits, 0x5555);
    for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(copy[i + 1].bits, from_float<D>(p2[i]).bits) << i << " in mode " << mode_name(mode);
    }
}

MS_OP_TEST(MixedPrecision, AdamWParamCopyIsTheRoundedParam, kExact, OpKind::kAdamW) {
    for (OpMode mode : kModes) {
        check_adamw_param_copy<bf16>(mode);
        check_adamw_param_copy<fp16>(mode);
    }
}

// ---- cast ----

// Every finite bf16 / fp16 value, as fp32: cast to D and back is exact, and to D gives the original bits.
template <class D>
void check_cast_round_trip(OpMode mode) {
    std::vector<D> all;
    for (uint32_t b = 0; b <= 0xffff; ++b) {
        const D h{static_cast<uint16_t>(b)};
        if (std::isfinite(to_float(h))) all.push_back(h);
    }
    const int64_t n = static_cast<int64_t>(all.size());
    std::vector<float> f32 = to_f32(all), back(n, -1.0f);
    std::vector<D> d(n, D{0x5555});
    auto backend = make_cpu_backend(mode);
    backend->cast({.src = view(f32, {n}), .dst = dview(d, {n})});
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(d[i].bits, all[i].bits) << i;
    backend->cast({.src = dview(d, {n}), .dst = view(back, {n})});
    EXPECT_TRUE(bit_identical(back, f32));
}

MS_OP_TEST(Cast, Fp32ToHalfAndBackIsExactOnRepresentableValues, kExact, OpKind::kCast) {
    for (OpMode mode : kModes) {
        check_cast_round_trip<bf16>(mode);
        check_cast_round_trip<fp16>(mode);
    }
}

// Arbitrary fp32 values round to nearest even, element by element: both modes give from_float's bits, on any
// thread count, twice (n above the parallel threshold).
template <class D>
std::vector<uint16_t> cast_bits(Backend& backend, std::vector<float>& src) {
    const int64_t n = static_cast<int64_t>(src.size());
    std::vector<D> dst(n);
    backend.cast({.src = view(src, {n}), .dst = dview(dst, {n})});
    std::vector<uint16_t> bits(n);
    for (int64_t i = 0; i < n; ++i) bits[i] = dst[i].bits;
    return bits;
}

template <class D>
void check_cast_rounding() {
    auto src = random_floats((1 << 17) + 3, 7, -70000.0f, 70000.0f);  // past fp16's overflow at 65520
    src[0] = std::ldexp(1.0f, -20);                                   // an fp16 subnormal
    src[1] = 1.0f + std::ldexp(1.0f, -8);                             // a bf16 tie
    std::vector<uint16_t> want(src.size());
    for (size_t i = 0; i < src.size(); ++i) want[i] = from_float<D>(src[i]).bits;
    auto fast = make_cpu_backend(OpMode::kFast);
    const int saved_threads = omp_get_max_threads();
    omp_set_num_threads(1);
    EXPECT_EQ(cast_bits<D>(*fast, src), want);
    omp_set_num_threads(3);
    EXPECT_EQ(cast_bits<D>(*fast, src), want);
    EXPECT_EQ(cast_bits<D>(*fast, src), want);
    omp_set_num_threads(saved_threads);
    EXPECT_EQ(cast_bits<D>(*make_cpu_backend(OpMode::kReference), src), want);
}

MS_OP_TEST(Cast, RoundsToNearestEvenInBothModes, kFastVsReference, OpKind::kCast) {
    check_cast_rounding<bf16>();
    check_cast_rounding<fp16>();
}
static const bool kCastDeterminismRegistered =
    register_op_test(Check::kDeterminism, "Cast.RoundsToNearestEvenInBothModes", {OpKind::kCast});

// Same dtype: a copy; the same tensor: nothing moves. fp16 -> bf16 goes through fp32 (one rounding, to bf16).
MS_OP_TEST(Cast, SameDtypeCopiesAndHalfToHalfRoundsOnce, kContract, OpKind::kCast) {
    auto backend = make_cpu_backend(OpMode::kFast);
    std::vector<float> a = random_floats(100, 1), b(100, 0.0f);
    backend->cast({.src = view(a, {100}), .dst = view(b, {100})});
    EXPECT_TRUE(bit_identical(a, b));
    backend->cast({.src = view(a, {100}), .dst = view(a, {100})});
    EXPECT_TRUE(bit_identical(a, b));
    std::vector<fp16> h = to_d<fp16>(a);
    std::vector<bf16> g(100);
    backend->cast({.src = dview(h, {100}), .dst = dview(g, {100})});
    for (size_t i = 0; i < h.size(); ++i) EXPECT_EQ(g[i].bits, from_float<bf16>(to_float(h[i])).bits);
}

// ---- supports() and the dtype checks ----

TEST(MixedPrecision, CpuSupportsEveryOpOnFp32Bf16Fp16) {
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        for (int op = 0; op < static_cast<int>(OpKind::kCount); ++op) {
            for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
                EXPECT_TRUE(backend->supports(static_cast<OpKind>(op), d)) << "OpKind " << op << " " << dtype_name(d);
            }
            EXPECT_FALSE(backend->supports(static_cast<OpKind>(op), DType::kI32)) << "OpKind " << op;
        }
    }
}

TEST(MixedPrecisionDeathTest, DtypesThatBreakTheContractAreRefused) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    auto backend = make_cpu_backend(OpMode::kFast);
    std::vector<bf16> x(12), y(12), z(12);
    std::vector<float> f(12), g(12);
    // An fp16 parameter gradient of a bf16 op (parameter gradients are fp32 or the activation dtype).
    std::vector<fp16> dw16(12);
    EXPECT_DEATH(
        backend->matmul_backward({.dout = dview(x, {3, 4}),
                                  .inp = dview(y, {3, 3}),
                                  .weight = dview(z, {4, 3}),
                                  .dinp = {},
                                  .dweight = dview(dw16, {4, 3}),
                                  .dbias = {},
                                  .accumulate = Accumulate::kOverwrite}),
        "matmul_backward: dweight is fp16, but a parameter gradient is fp32 or the op's activation dtype bf16");
    // An fp32 weight with bf16 activations.
    EXPECT_DEATH(backend->matmul_forward(
                     {.inp = dview(x, {3, 4}), .weight = view(f, {3, 4}), .bias = {}, .out = dview(y, {3, 3})}),
                 "matmul_forward: weight is fp32 but the op computes on bf16");
    // fp16 output of a bf16 op.
    std::vector<fp16> h(12);
    EXPECT_DEATH(backend->gelu_forward({.inp = dview(x, {12}), .out = dview(h, {12})}),
                 "gelu_forward: out is fp16 but the op computes on bf16");
    // bf16 statistics.
    EXPECT_DEATH(backend->layernorm_forward({.inp = dview(x, {3, 4}),
                                             .weight = dview(y, {4}),
                                             .bias = dview(z, {4}),
                                             .out = dview(y, {3, 4}),
                                             .mean = dview(z, {3}),
                                             .rstd = view(g, {3}),
                                             .eps = 1e-5f}),
                 "layernorm_forward: mean is bf16, but statistics are always fp32");
    // The GELU fusion: its backward overwrites dinp (and needs one); gelu_out must not alias out.
    std::vector<float> dw(12);
    EXPECT_DEATH(backend->matmul_backward({.dout = dview(x, {3, 4}),
                                           .inp = dview(y, {3, 3}),
                                           .weight = dview(z, {4, 3}),
                                           .dinp = dview(y, {3, 3}),
                                           .dweight = view(dw, {4, 3}),
                                           .dbias = {},
                                           .accumulate = Accumulate::kAdd,
                                           .gelu_inp = dview(x, {3, 3})}),
                 "matmul: gelu_inp needs dinp with accumulate = kOverwrite");
    EXPECT_DEATH(backend->matmul_forward({.inp = dview(x, {3, 4}),
                                          .weight = dview(y, {3, 4}),
                                          .bias = {},
                                          .out = dview(z, {3, 3}),
                                          .gelu_out = dview(z, {3, 3})}),
                 "matmul: gelu_out must not alias out");
    // sum_squares takes fp32, bf16 or fp16 gradients; adamw's state is fp32.
    std::vector<int32_t> ids(12);
    EXPECT_DEATH(backend->sum_squares(Tensor::i32(ids.data(), {12})), "sum_squares: x is int32");
    EXPECT_DEATH(backend->adamw({.param = dview(x, {12}),
                                 .grad = view(f, {12}),
                                 .m = view(g, {12}),
                                 .v = view(g, {12}),
                                 .lr = 1e-3f,
                                 .beta1 = 0.9f,
                                 .beta2 = 0.95f,
                                 .eps = 1e-8f,
                                 .weight_decay = 0.0f,
                                 .grad_scale = 1.0f,
                                 .step = 1,
                                 .param_copy = {}}),
                 "adamw: param is bf16, but the master weights are always fp32");
}

}  // namespace
}  // namespace ms::test
