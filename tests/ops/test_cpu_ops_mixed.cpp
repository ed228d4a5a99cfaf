// test_cpu_ops_mixed.cpp: every CPU op on the activation dtypes bf16 and fp16 (the precision contract, backend.h).
//
// Each case below builds its inputs from fixed seeds, rounds every D input through D (round_to), and runs the op
// with them stored either in D or in fp32. That gives, per output, three comparisons:
//   - reference mode, D vs the fp32 op on the same (D-rounded) inputs, rounded through D: EXACT. The reference loops
//     are one template, the loads are exact, so the only difference the contract allows is the one rounding on
//     store (for kAdd: of the fp32 sum of the old value and the new term). fp32 outputs (parameter gradients, which
//     accumulate into random initial values, and statistics) must be bit-identical;
//   - fast mode, the same comparison, in D ulps of the output's largest magnitude (measured tolerances);
//   - fast vs reference, both on D, in the same ulps (measured tolerances);
// plus determinism (kFast on 1 and 3 threads and twice: bit-identical), guard bytes around every output, the kAdd
// contract on its own, AdamW's fused param_copy, cast, and the checks on dtypes that break the contract.
// Tolerances: MS_OP_TEST_VERBOSE=1 ./test_ops --gtest_filter='Mixed*' prints the measured ulps; tolerance() below
// says how they were chosen.
#include <fmt/format.h>
#include <omp.h>

#include <cstring>
#include <limits>

#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

constexpr int64_t kB = 3, kT = 13, kN = 37, kC = 53, kNH = 3, kHS = 7, kVp = 67, kValid = 61, kVocabStart = 5;
constexpr DType kHalfTypes[] = {DType::kBF16, DType::kF16};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// The spacing of D's values at the magnitude x (fp16: subnormals below 2^-14).
double ulp_at(double x, DType d) {
    const int mantissa_bits = d == DType::kBF16 ? 7 : d == DType::kF16 ? 10 : 23;
    int e = x > 0 ? static_cast<int>(std::floor(std::log2(x))) : -126;
    if (d == DType::kF16) e = std::max(e, -14);
    return std::ldexp(1.0, e - mantissa_bits);
}

// max |a - b| in ulps of D at max |b|: scale-free, and 1 means "one rounding of the largest element".
double ulps(const std::vector<float>& a, const std::vector<float>& b, DType d) {
    double max_diff = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
        if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
        if (std::isnan(a[i])) continue;
        max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[i]) - b[i]));
        max_ref = std::max(max_ref, std::fabs(static_cast<double>(b[i])));
    }
    return a.size() == b.size() ? max_diff / ulp_at(max_ref, d) : INFINITY;
}

// A tensor of run-time dtype with kGuard guard bytes on each side, built from float values (rounded on store).
class Buffer {
  public:
    static constexpr size_t kGuard = 64;
    static constexpr unsigned char kSentinel = 0xA5;

    Buffer(DType dtype, const std::vector<float>& values)
        : dtype_(dtype), n_(values.size()), bytes_(n_ * dtype_size(dtype) + 2 * kGuard, kSentinel) {
        for (size_t i = 0; i < n_; ++i) {
            switch (dtype_) {
                case DType::kBF16:
                    static_cast<bf16*>(data())[i] = from_float<bf16>(values[i]);
                    break;
                case DType::kF16:
                    static_cast<fp16*>(data())[i] = from_float<fp16>(values[i]);
                    break;
                default:
                    static_cast<float*>(data())[i] = values[i];
                    break;
            }
        }
    }
    Buffer(DType dtype, int64_t n, float fill) : Buffer(dtype, std::vector<float>(static_cast<size_t>(n), fill)) {}

    void* data() { return bytes_.data() + kGuard; }
    const void* data() const { return bytes_.data() + kGuard; }
    Tensor tensor(std::initializer_list<int64_t> dims) { return Tensor(data(), dtype_, dims); }
    DType dtype() const { return dtype_; }
    std::vector<float> values() const {
        std::vector<float> v(n_);
        for (size_t i = 0; i < n_; ++i) {
            switch (dtype_) {
                case DType::kBF16:
                    v[i] = to_float(static_cast<const bf16*>(data())[i]);
                    break;
                case DType::kF16:
                    v[i] = to_float(static_cast<const fp16*>(data())[i]);
                    break;
                default:
                    v[i] = static_cast<const float*>(data())[i];
                    break;
            }
        }
        return v;
    }
    bool guards_intact() const {
        for (size_t i = 0; i < kGuard; ++i) {
            if (bytes_[i] != kSentinel || bytes_[bytes_.size() - 1 - i] != kSentinel) return false;
        }
        return true;
    }

  private:
    DType dtype_;
    size_t n_;
    std::vector<unsigned char> bytes_;
};

// How a case stores its tensors: activations and weights in `store` (D, or fp32 for the comparison run), their
// values rounded through `round` (always D); parameter gradients and statistics in fp32.
struct Ctx {
    Backend& backend;
    DType store, round;

    Buffer act(const std::vector<float>& v) const { return Buffer(store, rounded(round, v)); }
    Buffer act(int64_t n, float fill) const { return Buffer(store, n, fill); }
    static Buffer f32(const std::vector<float>& v) { return Buffer(DType::kF32, v); }
    static Buffer f32(int64_t n, float fill) { return Buffer(DType::kF32, n, fill); }
};

struct Output {
    std::string name;
    DType dtype;  // of the tensor: D outputs are compared to the fp32 run's values rounded through D
    std::vector<float> values;
    bool guards_intact;
};
using Outputs = std::vector<Output>;

Output collect(const std::string& name, const Buffer& b) { return {name, b.dtype(), b.values(), b.guards_intact()}; }

// Tolerance of the fast-mode comparisons, in ulps of D at the output's largest magnitude. A D output: 1, the most
// that two fp32 values a few fp32 ulps apart can differ by after rounding to D (they straddle at most one rounding
// boundary; measured: 0.75 for attention_backward's dqkv fast vs reference, <= 0.125 for every other op, 0 for
// every op vs fp32). An fp32 output (statistics, parameter gradients): 1e-3, about 2x the largest measured,
// 4.9e-4 (cross_entropy sum_exp vs fp32; layernorm rstd 2.4e-4): the D loops sum in another vectorised order.
double tolerance(const Output& o) { return o.dtype == DType::kF32 ? 1e-3 : 1.0; }

struct MixedCase {
    std::string name;
    OpKind op;
    std::function<Outputs(const Ctx&)> run;
};

// ---- the cases (shapes as in test_cpu_ops_fast.cpp: not multiples of any block or vector width) ----

std::vector<MixedCase> embedding_cases() {
    constexpr int64_t N = kB * kT, V_local = 23;
    const auto tokens = random_ints(N, 1, 0, kVocabStart + V_local + 9);  // some held by other shards
    return {
        {"embedding_forward", OpKind::kEmbeddingForward,
         [=](const Ctx& x) {
             auto tok = tokens;
             Buffer table = x.act(random_floats(V_local * kC, 2)), pos = x.act(random_floats(kT * kC, 3));
             Buffer out = x.act(N * kC, kNaN);
             x.backend.embedding_forward({.tokens = view(tok, {N}),
                                          .table = table.tensor({V_local, kC}),
                                          .pos = pos.tensor({kT, kC}),
                                          .out = out.tensor({N, kC}),
                                          .vocab_start = kVocabStart,
                                          .T = kT});
             return Outputs{collect("out", out)};  // one fp32 add, rounded once, in every path
         }},
        {"embedding_backward", OpKind::kEmbeddingBackward,
         [=](const Ctx& x) {
             auto tok = tokens;
             Buffer dout = x.act(random_floats(N * kC, 4));
             Buffer dtable = Ctx::f32(random_floats(V_local * kC, 5)), dpos = Ctx::f32(random_floats(kT * kC, 6));
             x.backend.embedding_backward({.tokens = view(tok, {N}),
                                           .dout = dout.tensor({N, kC}),
                                           .dtable = dtable.tensor({V_local, kC}),
                                           .dpos = dpos.tensor({kT, kC}),
                                           .vocab_start = kVocabStart,
                                           .T = kT});
             return Outputs{collect("dtable", dtable), collect("dpos", dpos)};  // same adds in order
         }},
    };
}

std::vector<MixedCase> layernorm_cases() {
    const auto inp_values = random_floats(kN * kC, 1, -3.0f, 5.0f);
    const auto weight_values = random_floats(kC, 2), bias_values = random_floats(kC, 3);
    return {
        {"layernorm_forward", OpKind::kLayerNormForward,
         [=](const Ctx& x) {
             Buffer inp = x.act(inp_values), weight = x.act(weight_values), bias = x.act(bias_values);
             Buffer out = x.act(kN * kC, kNaN), mean = Ctx::f32(kN, kNaN), rstd = Ctx::f32(kN, kNaN);
             x.backend.layernorm_forward({.inp = inp.tensor({kN, kC}),
                                          .weight = weight.tensor({kC}),
                                          .bias = bias.tensor({kC}),
                                          .out = out.tensor({kN, kC}),
                                          .mean = mean.tensor({kN}),
                                          .rstd = rstd.tensor({kN}),
                                          .eps = 1e-5f});
             return Outputs{collect("out", out), collect("mean", mean), collect("rstd", rstd)};
         }},
        {"layernorm_backward", OpKind::kLayerNormBackward,
         [=](const Ctx& x) {
             // mean and rstd from the fp32 reference on the rounded inputs: the same statistics for every run.
             auto ref = make_cpu_backend(OpMode::kReference);
             Buffer inp32 = Ctx::f32(rounded(x.round, inp_values)), w32 = Ctx::f32(rounded(x.round, weight_values));
             Buffer b32 = Ctx::f32(rounded(x.round, bias_values)), out32 = Ctx::f32(kN * kC, 0.0f);
             Buffer mean = Ctx::f32(kN, 0.0f), rstd = Ctx::f32(kN, 0.0f);
             ref->layernorm_forward({.inp = inp32.tensor({kN, kC}),
                                     .weight = w32.tensor({kC}),
                                     .bias = b32.tensor({kC}),
                                     .out = out32.tensor({kN, kC}),
                                     .mean = mean.tensor({kN}),
                                     .rstd = rstd.tensor({kN}),
                                     .eps = 1e-5f});
             Buffer inp = x.act(inp_values), weight = x.act(weight_values), dout = x.act(random_floats(kN * kC, 4));
             Buffer dinp = x.act(random_floats(kN * kC, 5));
             Buffer dweight = Ctx::f32(random_floats(kC, 6)), dbias = Ctx::f32(random_floats(kC, 7));
             x.backend.layernorm_backward({.dout = dout.tensor({kN, kC}),
                                           .inp = inp.tensor({kN, kC}),
                                           .weight = weight.tensor({kC}),
                                           .mean = mean.tensor({kN}),
                                           .rstd = rstd.tensor({kN}),
                                           .dinp = dinp.tensor({kN, kC}),
                                           .dweight = dweight.tensor({kC}),
                                           .dbias = dbias.tensor({kC}),
                                           .accumulate = Accumulate::kAdd});
             return Outputs{collect("dinp", dinp), collect("dweight", dweight), collect("dbias", dbias)};
         }},
    };
}

// K = 515 crosses OpenBLAS's K blocking.
std::vector<MixedCase> matmul_cases() {
    std::vector<MixedCase> cases;
    for (const int64_t K : {kC, int64_t{515}}) {
        constexpr int64_t M = kVp;
        const std::string suffix = fmt::format("_K{}", K);
        cases.push_back({"matmul_forward" + suffix, OpKind::kMatmulForward, [=](const Ctx& x) {
                             Buffer inp = x.act(random_floats(kN * K, 1)), weight = x.act(random_floats(M * K, 2));
                             Buffer bias = x.act(random_floats(M, 3)), out = x.act(kN * M, kNaN);
                             x.backend.matmul_forward({.inp = inp.tensor({kN, K}),
                                                       .weight = weight.tensor({M, K}),
                                                       .bias = bias.tensor({M}),
                                                       .out = out.tensor({kN, M})});
                             return Outputs{collect("out", out)};
                         }});
        cases.push_back(
            {"matmul_backward" + suffix, OpKind::kMatmulBackward, [=](const Ctx& x) {
                 Buffer inp = x.act(random_floats(kN * K, 1)), weight = x.act(random_floats(M * K, 2));
                 Buffer dout = x.act(random_floats(kN * M, 4)), dinp = x.act(random_floats(kN * K, 5));
                 Buffer dweight = Ctx::f32(random_floats(M * K, 6)), dbias = Ctx::f32(random_floats(M, 7));
                 x.backend.matmul_backward({.dout = dout.tensor({kN, M}),
                                            .inp = inp.tensor({kN, K}),
                                            .weight = weight.tensor({M, K}),
                                            .dinp = dinp.tensor({kN, K}),
                                            .dweight = dweight.tensor({M, K}),
                                            .dbias = dbias.tensor({M}),
                                            .accumulate = Accumulate::kAdd});
                 return Outputs{collect("dinp", dinp), collect("dweight", dweight), collect("dbias", dbias)};
             }});
    }
    return cases;
}

std::vector<MixedCase> attention_cases() {
    constexpr int64_t C = kNH * kHS;
    const auto qkv_values = random_floats(kB * kT * 3 * C, 1, -2.0f, 2.0f);
    return {
        {"attention_forward", OpKind::kAttentionForward,
         [=](const Ctx& x) {
             Buffer qkv = x.act(qkv_values), out = x.act(kB * kT * C, kNaN), lse = Ctx::f32(kB * kNH * kT, kNaN);
             x.backend.attention_forward({.qkv = qkv.tensor({kB, kT, 3 * C}),
                                          .out = out.tensor({kB, kT, C}),
                                          .lse = lse.tensor({kB, kNH, kT}),
                                          .NH = kNH});
             return Outputs{collect("out", out), collect("lse", lse)};
         }},
        {"attention_backward", OpKind::kAttentionBackward,
         [=](const Ctx& x) {
             // out and lse from the fp32 reference on the rounded qkv; out is an activation: rounded through D.
             Buffer qkv32 = Ctx::f32(rounded(x.round, qkv_values)), out32 = Ctx::f32(kB * kT * C, 0.0f);
             Buffer lse = Ctx::f32(kB * kNH * kT, 0.0f);
             make_cpu_backend(OpMode::kReference)
                 ->attention_forward({.qkv = qkv32.tensor({kB, kT, 3 * C}),
                                      .out = out32.tensor({kB, kT, C}),
                                      .lse = lse.tensor({kB, kNH, kT}),
                                      .NH = kNH});
             Buffer qkv = x.act(qkv_values), out = x.act(out32.values()), dout = x.act(random_floats(kB * kT * C, 2));
             Buffer dqkv = x.act(kB * kT * 3 * C, kNaN);  // overwritten: NaN must not survive
             x.backend.attention_backward({.dout = dout.tensor({kB, kT, C}),
                                           .qkv = qkv.tensor({kB, kT, 3 * C}),
                                           .out = out.tensor({kB, kT, C}),
                                           .lse = lse.tensor({kB, kNH, kT}),
                                           .dqkv = dqkv.tensor({kB, kT, 3 * C}),
                                           .NH = kNH});
             return Outputs{collect("dqkv", dqkv)};
         }},
    };
}

std::vector<MixedCase> elementwise_cases() {
    constexpr int64_t n = kN * kC;
    return {
        {"gelu_forward", OpKind::kGeluForward,
         [=](const Ctx& x) {
             Buffer inp = x.act(random_floats(n, 1, -8.0f, 8.0f)), out = x.act(n, kNaN);
             x.backend.gelu_forward({.inp = inp.tensor({n}), .out = out.tensor({n})});
             return Outputs{collect("out", out)};
         }},
        {"gelu_backward", OpKind::kGeluBackward,
         [=](const Ctx& x) {
             Buffer inp = x.act(random_floats(n, 1, -8.0f, 8.0f)), dout = x.act(random_floats(n, 2));
             Buffer dinp = x.act(n, kNaN);
             x.backend.gelu_backward({.inp = inp.tensor({n}), .dout = dout.tensor({n}), .dinp = dinp.tensor({n})});
             return Outputs{collect("dinp", dinp)};
         }},
        {"residual_forward", OpKind::kResidualForward,
         [=](const Ctx& x) {
             Buffer a = x.act(random_floats(n, 1)), b = x.act(random_floats(n, 2)), bias = x.act(random_floats(kC, 3));
             Buffer out = x.act(n, kNaN);
             x.backend.residual_forward(
                 {.a = a.tensor({n}), .b = b.tensor({n}), .out = out.tensor({n}), .bias = bias.tensor({kC})});
             return Outputs{collect("out", out)};  // the same two fp32 adds, rounded once, in every path
         }},
    };
}

std::vector<MixedCase> cross_entropy_cases() {
    const auto targets = random_ints(kN, 2, 0, static_cast<int32_t>(kVocabStart + kValid + 9));
    const auto logit_values = random_floats(kN * kVp, 1, -6.0f, 6.0f);
    // row_max, sum_exp (and target_logit) of the rounded logits by the fp32 reference.
    const auto stats = [=](DType round, Buffer& row_max, Buffer& sum_exp, Buffer& target_logit) {
        auto tgt = targets;
        Buffer logits = Ctx::f32(rounded(round, logit_values));
        auto ref = make_cpu_backend(OpMode::kReference);
        for (CrossEntropyPhase phase : {CrossEntropyPhase::kMax, CrossEntropyPhase::kSumExp}) {
            ref->cross_entropy_forward({.logits = logits.tensor({kN, kVp}),
                                        .targets = view(tgt, {kN}),
                                        .row_max = row_max.tensor({kN}),
                                        .sum_exp = sum_exp.tensor({kN}),
                                        .target_logit = target_logit.tensor({kN}),
                                        .vocab_start = kVocabStart,
                                        .vocab_valid_local = kValid,
                                        .phase = phase});
        }
    };
    return {
        {"cross_entropy_forward", OpKind::kCrossEntropyForward,
         [=](const Ctx& x) {
             auto tgt = targets;
             Buffer logits = x.act(logit_values);
             Buffer row_max = Ctx::f32(kN, kNaN), sum_exp = Ctx::f32(kN, kNaN), target_logit = Ctx::f32(kN, kNaN);
             for (CrossEntropyPhase phase : {CrossEntropyPhase::kMax, CrossEntropyPhase::kSumExp}) {
                 x.backend.cross_entropy_forward({.logits = logits.tensor({kN, kVp}),
                                                  .targets = view(tgt, {kN}),
                                                  .row_max = row_max.tensor({kN}),
                                                  .sum_exp = sum_exp.tensor({kN}),
                                                  .target_logit = target_logit.tensor({kN}),
                                                  .vocab_start = kVocabStart,
                                                  .vocab_valid_local = kValid,
                                                  .phase = phase});
             }
             return Outputs{collect("row_max", row_max), collect("sum_exp", sum_exp),
                            collect("target_logit", target_logit)};
         }},
        {"cross_entropy_backward", OpKind::kCrossEntropyBackward,
         [=](const Ctx& x) {
             auto tgt = targets;
             Buffer row_max = Ctx::f32(kN, 0.0f), sum_exp = Ctx::f32(kN, 0.0f), target_logit = Ctx::f32(kN, 0.0f);
             stats(x.round, row_max, sum_exp, target_logit);
             Buffer dloss = Ctx::f32(random_floats(kN, 3, 0.1f, 1.0f));
             Buffer dlogits = x.act(logit_values);
             x.backend.cross_entropy_backward({.logits = dlogits.tensor({kN, kVp}),
                                               .targets = view(tgt, {kN}),
                                               .row_max = row_max.tensor({kN}),
                                               .sum_exp = sum_exp.tensor({kN}),
                                               .dloss = dloss.tensor({kN}),
                                               .vocab_start = kVocabStart,
                                               .vocab_valid_local = kValid});
             return Outputs{collect("dlogits", dlogits)};
         }},
    };
}

const std::vector<MixedCase>& all_cases() {
    static const std::vector<MixedCase> cases = [] {
        std::vector<MixedCase> all;
        for (auto make : {embedding_cases, layernorm_cases, matmul_cases, attention_cases, elementwise_cases,
                          cross_entropy_cases}) {
            for (MixedCase& c : make()) all.push_back(std::move(c));
        }
        return all;
    }();
    return cases;
}

const bool kCasesRegistered = [] {
    for (const MixedCase& c : all_cases()) {
        register_op_test(Check::kFastVsReference, "MixedPrecision.FastVsReferenceOnD", {c.op});
        register_op_test(Check::kContract, "MixedPrecision.ReferenceOnDIsFp32RoundedOnce", {c.op});
        register_op_test(Check::kDeterminism, "MixedPrecision.DeterministicAnyThreadCount", {c.op});
    }
    return true;
}();

std::string label(const MixedCase& c, const Output& o, DType d) {
    return fmt::format("{} {} {}", c.name, o.name, dtype_name(d));
}

// ---- the comparisons ----

TEST(MixedPrecision, ReferenceOnDIsFp32RoundedOnce) {
    auto ref = make_cpu_backend(OpMode::kReference);
    for (DType d : kHalfTypes) {
        for (const MixedCase& c : all_cases()) {
            const Outputs got = c.run({*ref, d, d});
            const Outputs want = c.run({*ref, DType::kF32, d});
            ASSERT_EQ(got.size(), want.size());
            for (size_t i = 0; i < got.size(); ++i) {
                EXPECT_TRUE(got[i].guards_intact) << label(c, got[i], d) << ": wrote outside the tensor";
                const std::vector<float> expected =
                    got[i].dtype == DType::kF32 ? want[i].values : rounded(d, want[i].values);
                EXPECT_TRUE(bit_identical(got[i].values, expected))
                    << label(c, got[i], d) << ": " << ulps(got[i].values, expected, d) << " ulps from the fp32 op";
            }
        }
    }
}

TEST(MixedPrecision, FastOnDIsFp32RoundedOnce) {
    auto fast = make_cpu_backend(OpMode::kFast);
    for (DType d : kHalfTypes) {
        for (const MixedCase& c : all_cases()) {
            const Outputs got = c.run({*fast, d, d});
            const Outputs want = c.run({*fast, DType::kF32, d});
            for (size_t i = 0; i < got.size(); ++i) {
                EXPECT_TRUE(got[i].guards_intact) << label(c, got[i], d) << ": wrote outside the tensor";
                const std::vector<float> expected =
                    got[i].dtype == DType::kF32 ? want[i].values : rounded(d, want[i].values);
                expect_within(label(c, got[i], d) + " vs fp32 (ulps)", OpMode::kFast, ulps(got[i].values, expected, d),
                              tolerance(got[i]));
            }
        }
    }
}

TEST(MixedPrecision, FastVsReferenceOnD) {
    auto fast = make_cpu_backend(OpMode::kFast);
    auto ref = make_cpu_backend(OpMode::kReference);
    for (DType d : kHalfTypes) {
        for (const MixedCase& c : all_cases()) {
            const Outputs got = c.run({*fast, d, d});
            const Outputs want = c.run({*ref, d, d});
            for (size_t i = 0; i < got.size(); ++i) {
                expect_within(label(c, got[i], d) + " (ulps)", OpMode::kFast, ulps(got[i].values, want[i].values, d),
                              tolerance(got[i]));
            }
        }
    }
}

TEST(MixedPrecision, DeterministicAnyThreadCount) {
    auto fast = make_cpu_backend(OpMode::kFast);
    const int saved_threads = omp_get_max_threads();
    for (DType d : kHalfTypes) {
        for (const MixedCase& c : all_cases()) {
            omp_set_num_threads(1);
            const Outputs one = c.run({*fast, d, d});
            omp_set_num_threads(3);
            const Outputs three = c.run({*fast, d, d});
            const Outputs again = c.run({*fast, d, d});
            for (size_t i = 0; i < one.size(); ++i) {
                EXPECT_TRUE(bit_identical(one[i].values, three[i].values))
                    << label(c, one[i], d) << ": 1 thread and 3 threads differ";
                EXPECT_TRUE(bit_identical(three[i].values, again[i].values))
                    << label(c, one[i], d) << ": two runs differ";
            }
        }
    }
    omp_set_num_threads(saved_threads);
}

}  // namespace
}  // namespace ms::test
