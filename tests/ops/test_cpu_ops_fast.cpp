// test_cpu_ops_fast.cpp: a table of op cases, each run in OpMode::kFast and OpMode::kReference on shapes that are
// not multiples of any block or vector width (N = 37, C = 53, B = 3, T = 13, NH = 3, HS = 7, Vp = 67 with 61 valid
// columns, vocab_start = 5), compared output by output with a measured tolerance; and the same cases run in kFast
// on 1, 3 and 3 OpenMP threads, which must be bit-identical (every CPU op is thread-count invariant by design).
// Outputs sit in guarded buffers, and the inputs that are accumulated into (+=, kAdd) start from random values.
// Tolerances are scale-free (max |fast - ref| / max |ref|), about 10x the error measured here
// (MS_OP_TEST_VERBOSE=1 prints it); 0 where the fast path does the same float operations in the same order.
#include <fmt/format.h>
#include <omp.h>

#include <cstring>
#include <limits>

#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

struct OpOutput {
    std::string name;
    std::vector<double> values;
    double tol;  // fast vs reference
    bool guards_intact;
};
using OpOutputs = std::vector<OpOutput>;

struct OpCase {
    std::string name;
    OpKind op;
    // Builds the inputs from fixed seeds (so every call sees the same ones), runs the op on `backend`, and returns
    // its outputs. Inputs that come from another op (mean/rstd, lse, softmax stats) are made by the reference.
    std::function<OpOutputs(Backend& backend)> run;
};

OpOutput collect(const std::string& name, const Guarded& g, double tol) {
    const std::vector<float> v = g.values();
    return {name, std::vector<double>(v.begin(), v.end()), tol, g.guards_intact()};
}

constexpr int64_t kB = 3, kT = 13, kN = 37, kC = 53, kNH = 3, kHS = 7, kVp = 67, kValid = 61, kVocabStart = 5;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<OpCase> embedding_cases() {
    constexpr int64_t N = kB * kT, V_local = 23;
    // Ids in [0, 38): below, inside and above this shard's rows [5, 28).
    const auto make_tokens = [] { return random_ints(N, 1, 0, kVocabStart + V_local + 9); };
    return {
        {"embedding_forward", OpKind::kEmbeddingForward,
         [=](Backend& b) {
             auto tokens = make_tokens();
             auto table = random_floats(V_local * kC, 2);
             auto pos = random_floats(kT * kC, 3);
             Guarded out(N * kC, kNaN);
             b.embedding_forward({.tokens = view(tokens, {N}),
                                  .table = view(table, {V_local, kC}),
                                  .pos = view(pos, {kT, kC}),
                                  .out = out.tensor({N, kC}),
                                  .vocab_start = kVocabStart,
                                  .T = kT});
             return OpOutputs{collect("out", out, 0.0)};  // the same float adds in both modes
         }},
        {"embedding_backward", OpKind::kEmbeddingBackward,
         [=](Backend& b) {
             auto tokens = make_tokens();
             auto dout = random_floats(N * kC, 4);
             Guarded dtable(random_floats(V_local * kC, 5)), dpos(random_floats(kT * kC, 6));
             b.embedding_backward({.tokens = view(tokens, {N}),
                                   .dout = view(dout, {N, kC}),
                                   .dtable = dtable.tensor({V_local, kC}),
                                   .dpos = dpos.tensor({kT, kC}),
                                   .vocab_start = kVocabStart,
                                   .T = kT});
             // Both modes add the rows in token order, column by column: bit-identical.
             return OpOutputs{collect("dtable", dtable, 0.0), collect("dpos", dpos, 0.0)};
         }},
    };
}

std::vector<OpCase> layernorm_cases() {
    const auto forward = [](Backend& b, std::vector<float>& inp, std::vector<float>& weight, std::vector<float>& bias,
                            Guarded& out, Guarded& mean, Guarded& rstd) {
        b.layernorm_forward({.inp = view(inp, {kN, kC}),
                             .weight = view(weight, {kC}),
                             .bias = view(bias, {kC}),
                             .out = out.tensor({kN, kC}),
                             .mean = mean.tensor({kN}),
                             .rstd = rstd.tensor({kN}),
                             .eps = 1e-5f});
    };
    return {
        {"layernorm_forward", OpKind::kLayerNormForward,
         [=](Backend& b) {
             auto inp = random_floats(kN * kC, 1, -3.0f, 5.0f);  // a mean far from 0 tests the two-pass variance
             auto weight = random_floats(kC, 2), bias = random_floats(kC, 3);
             Guarded out(kN * kC), mean(kN), rstd(kN);
             forward(b, inp, weight, bias, out, mean, rstd);
             // Measured 1.6e-7 / 1.4e-7 / 6e-8: float row sums vs double.
             return OpOutputs{collect("out", out, 2e-6), collect("mean", mean, 2e-6), collect("rstd", rstd, 1e-6)};
         }},
        {"layernorm_backward", OpKind::kLayerNormBackward,
         [=](Backend& b) {
             auto inp = random_floats(kN * kC, 1, -3.0f, 5.0f);
             auto weight = random_floats(kC, 2), bias = random_floats(kC, 3);
             Guarded out(kN * kC), mean(kN), rstd(kN);
             forward(*make_cpu_backend(OpMode::kReference), inp, weight, bias, out, mean, rstd);
             auto dout = random_floats(kN * kC, 4);
             Guarded dinp(random_floats(kN * kC, 5)), dweight(random_floats(kC, 6)), dbias(random_floats(kC, 7));
             b.layernorm_backward({.dout = view(dout, {kN, kC}),
                                   .inp = view(inp, {kN, kC}),
                                   .weight = view(weight, {kC}),
                                   .mean = mean.tensor({kN}),
                                   .rstd = rstd.tensor({kN}),
                                   .dinp = dinp.tensor({kN, kC}),
                                   .dweight = dweight.tensor({kC}),
                                   .dbias = dbias.tensor({kC}),
                                   .accumulate = Accumulate::kAdd});
             // Measured 9.6e-8 (dinp), 1.5e-7 (dweight), 1.1e-7 (dbias).
             return OpOutputs{collect("dinp", dinp, 1e-6), collect("dweight", dweight, 2e-6),
                              collect("dbias", dbias, 2e-6)};
         }},
        {"layernorm_forward_residual", OpKind::kLayerNormResidualForward,
         [=](Backend& b) {
             auto res_a = random_floats(kN * kC, 1, -3.0f, 5.0f), res_b = random_floats(kN * kC, 4);
             auto res_bias = random_floats(kC, 5), weight = random_floats(kC, 2), bias = random_floats(kC, 3);
             Guarded res_out(kN * kC, kNaN), out(kN * kC, kNaN), mean(kN, kNaN), rstd(kN, kNaN);
             b.layernorm_forward({.inp = {},
                                  .weight = view(weight, {kC}),
                                  .bias = view(bias, {kC}),
                                  .out = out.tensor({kN, kC}),
                                  .mean = mean.tensor({kN}),
                                  .rstd = rstd.tensor({kN}),
                                  .eps = 1e-5f,
                                  .residual_a = view(res_a, {kN, kC}),
                                  .residual_b = view(res_b, {kN, kC}),
                                  .residual_bias = view(res_bias, {kC}),
                                  .residual_out = res_out.tensor({kN, kC})});
             // The residual sum is one exactly rounded add in both modes; the LayerNorm as layernorm_forward's case.
             return OpOutputs{collect("residual_out", res_out, 0.0), collect("out", out, 2e-6),
                              collect("mean", mean, 2e-6), collect("rstd", rstd, 1e-6)};
         }},
    };
}

// K = 515 crosses OpenBLAS's K blocking; M = 129 is one past a multiple of every vector width; M = 3100 is cut into
// tiles of 784 columns, the last one 748 wide (column_blocks.h: output_tiles), shared unevenly by 3 threads.
std::vector<OpCase> matmul_cases() {
    std::vector<OpCase> cases;
    struct Shape {
        int64_t N, K, M;
        bool bias;
    };
    for (const Shape s :
         {Shape{kN, kC, kVp, true}, Shape{kN, 515, 129, true}, Shape{kN, kC, kVp, false}, Shape{kN, 130, 3100, true}}) {
        const std::string suffix = fmt::format("_{}x{}x{}{}", s.N, s.K, s.M, s.bias ? "" : "_nobias");
        cases.push_back({"matmul_forward" + suffix, OpKind::kMatmulForward, [=](Backend& b) {
                             auto inp = random_floats(s.N * s.K, 1), weight = random_floats(s.M * s.K, 2);
                             auto bias = random_floats(s.M, 3);
                             Guarded out(s.N * s.M, kNaN);
                             b.matmul_forward({.inp = view(inp, {s.N, s.K}),
                                               .weight = view(weight, {s.M, s.K}),
                                               .bias = s.bias ? view(bias, {s.M}) : Tensor(),
                                               .out = out.tensor({s.N, s.M})});
                             // Measured 2.7e-7 (K = 53) and 2.5e-7 (K = 515): sgemm's float sums vs double.
                             return OpOutputs{collect("out", out, 3e-6)};
                         }});
        cases.push_back({"matmul_backward" + suffix, OpKind::kMatmulBackward, [=](Backend& b) {
                             auto inp = random_floats(s.N * s.K, 1), weight = random_floats(s.M * s.K, 2);
                             auto dout = random_floats(s.N * s.M, 4);
                             Guarded dinp(random_floats(s.N * s.K, 5)), dweight(random_floats(s.M * s.K, 6));
                             Guarded dbias(random_floats(s.M, 7));
                             b.matmul_backward({.dout = view(dout, {s.N, s.M}),
                                                .inp = view(inp, {s.N, s.K}),
                                                .weight = view(weight, {s.M, s.K}),
                                                .dinp = dinp.tensor({s.N, s.K}),
                                                .dweight = dweight.tensor({s.M, s.K}),
                                                .dbias = s.bias ? dbias.tensor({s.M}) : Tensor(),
                                                .accumulate = Accumulate::kAdd});
                             // Measured <= 3e-7 for all three on every shape.
                             return OpOutputs{collect("dinp", dinp, 3e-6), collect("dweight", dweight, 3e-6),
                                              collect("dbias", dbias, 3e-6)};
                         }});
    }
    return cases;
}

std::vector<OpCase> attention_cases() {
    constexpr int64_t C = kNH * kHS;
    const auto forward = [](Backend& b, std::vector<float>& qkv, Guarded& out, Guarded& lse) {
        b.attention_forward({.qkv = view(qkv, {kB, kT, 3 * C}),
                             .out = out.tensor({kB, kT, C}),
                             .lse = lse.tensor({kB, kNH, kT}),
                             .NH = kNH});
    };
    return {
        {"attention_forward", OpKind::kAttentionForward,
         [=](Backend& b) {
             auto qkv = random_floats(kB * kT * 3 * C, 1, -2.0f, 2.0f);
             Guarded out(kB * kT * C, kNaN), lse(kB * kNH * kT, kNaN);
             forward(b, qkv, out, lse);
             // Measured 1.5e-7 (out) and 1.1e-7 (lse): float dot products and exp_approx vs double.
             return OpOutputs{collect("out", out, 2e-6), collect("lse", lse, 1e-6)};
         }},
        {"attention_backward", OpKind::kAttentionBackward,
         [=](Backend& b) {
             auto qkv = random_floats(kB * kT * 3 * C, 1, -2.0f, 2.0f);
             Guarded out(kB * kT * C), lse(kB * kNH * kT);
             forward(*make_cpu_backend(OpMode::kReference), qkv, out, lse);
             auto dout = random_floats(kB * kT * C, 2);
             Guarded dqkv(qkv.size(), kNaN);  // overwritten: NaN must not survive
             b.attention_backward({.dout = view(dout, {kB, kT, C}),
                                   .qkv = view(qkv, {kB, kT, 3 * C}),
                                   .out = out.tensor({kB, kT, C}),
                                   .lse = lse.tensor({kB, kNH, kT}),
                                   .dqkv = dqkv.tensor({kB, kT, 3 * C}),
                                   .NH = kNH});
             // Measured 2.8e-7.
             return OpOutputs{collect("dqkv", dqkv, 3e-6)};
         }},
    };
}

std::vector<OpCase> elementwise_cases() {
    constexpr int64_t n = kN * kC;
    return {
        {"gelu_forward", OpKind::kGeluForward,
         [=](Backend& b) {
             auto inp = random_floats(n, 1, -8.0f, 8.0f);
             Guarded out(n, kNaN);
             b.gelu_forward({.inp = view(inp, {n}), .out = out.tensor({n})});
             // Measured 6e-8 (exp_approx and the sigmoid form vs double tanh).
             return OpOutputs{collect("out", out, 1e-6)};
         }},
        {"gelu_backward", OpKind::kGeluBackward,
         [=](Backend& b) {
             auto inp = random_floats(n, 1, -8.0f, 8.0f);
             auto dout = random_floats(n, 2);
             Guarded dinp(n, kNaN);
             b.gelu_backward({.inp = view(inp, {n}), .dout = view(dout, {n}), .dinp = dinp.tensor({n})});
             // Measured 1.1e-7 (1.4e-6 before 1 - s was computed as e * s, without cancellation).
             return OpOutputs{collect("dinp", dinp, 1e-6)};
         }},
        {"residual_forward", OpKind::kResidualForward,
         [=](Backend& b) {
             auto a = random_floats(n, 1), c = random_floats(n, 2);
             Guarded out(n, kNaN);
             b.residual_forward({.a = view(a, {n}), .b = view(c, {n}), .out = out.tensor({n}), .bias = {}});
             return OpOutputs{collect("out", out, 0.0)};  // one exactly rounded add in both modes
         }},
        {"adamw", OpKind::kAdamW,
         [=](Backend& b) {
             Guarded param(random_floats(n, 1)), m(random_floats(n, 2, -0.1f, 0.1f)),
                 v(random_floats(n, 3, 0.0f, 0.01f));
             auto grad = random_floats(n, 4);
             b.adamw({.param = param.tensor({n}),
                      .grad = view(grad, {n}),
                      .m = m.tensor({n}),
                      .v = v.tensor({n}),
                      .lr = 1e-3f,
                      .beta1 = 0.9f,
                      .beta2 = 0.95f,
                      .eps = 1e-8f,
                      .weight_decay = 0.1f,
                      .grad_scale = 0.7f,
                      .step = 3,
                      .param_copy = {}});
             // Measured 6e-8 / 9.4e-8 / 1.7e-7 (param, m, v): float vs double arithmetic, then float rounding.
             return OpOutputs{collect("param", param, 1e-6), collect("m", m, 1e-6), collect("v", v, 2e-6)};
         }},
        {"sum_squares", OpKind::kSumSquares,
         [=](Backend& b) {
             auto x = random_floats(300007, 1);
             // Measured 2.9e-13: mostly the reference's one long sequential double sum.
             return OpOutputs{{"sum", {b.sum_squares(view(x, {300007}))}, 3e-12, true}};
         }},
    };
}

std::vector<OpCase> cross_entropy_cases() {
    // Targets in [0, 76): some in this shard's columns [5, 66), some held elsewhere.
    const auto make_targets = [] { return random_ints(kN, 2, 0, static_cast<int32_t>(kVocabStart + kValid + 9)); };
    const auto forward = [](Backend& b, std::vector<float>& logits, std::vector<int32_t>& targets, Guarded& row_max,
                            Guarded& sum_exp, Guarded& target_logit) {
        for (CrossEntropyPhase phase : {CrossEntropyPhase::kMax, CrossEntropyPhase::kSumExp}) {
            b.cross_entropy_forward({.logits = view(logits, {kN, kVp}),
                                     .targets = view(targets, {kN}),
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
         [=](Backend& b) {
             auto logits = random_floats(kN * kVp, 1, -6.0f, 6.0f);
             auto targets = make_targets();
             Guarded row_max(kN), sum_exp(kN), target_logit(kN, kNaN);
             forward(b, logits, targets, row_max, sum_exp, target_logit);
             // max and the picked logit are exact; sum_exp measured 8.7e-8 (exp_approx, float blocks).
             return OpOutputs{collect("row_max", row_max, 0.0), collect("sum_exp", sum_exp, 1e-6),
                              collect("target_logit", target_logit, 0.0)};
         }},
        {"cross_entropy_backward", OpKind::kCrossEntropyBackward,
         [=](Backend& b) {
             auto logits = random_floats(kN * kVp, 1, -6.0f, 6.0f);
             auto targets = make_targets();
             Guarded row_max(kN), sum_exp(kN), target_logit(kN);
             forward(*make_cpu_backend(OpMode::kReference), logits, targets, row_max, sum_exp, target_logit);
             auto dloss = random_floats(kN, 3, 0.1f, 1.0f);
             Guarded dlogits(logits);
             b.cross_entropy_backward({.logits = dlogits.tensor({kN, kVp}),
                                       .targets = view(targets, {kN}),
                                       .row_max = row_max.tensor({kN}),
                                       .sum_exp = sum_exp.tensor({kN}),
                                       .dloss = view(dloss, {kN}),
                                       .vocab_start = kVocabStart,
                                       .vocab_valid_local = kValid});
             // Measured 6.1e-8 (exp_approx times a float reciprocal vs double).
             return OpOutputs{collect("dlogits", dlogits, 1e-6)};
         }},
    };
}

const std::vector<OpCase>& all_cases() {
    static const std::vector<OpCase> cases = [] {
        std::vector<OpCase> all;
        for (auto make : {embedding_cases, layernorm_cases, matmul_cases, attention_cases, elementwise_cases,
                          cross_entropy_cases}) {
            for (OpCase& c : make()) all.push_back(std::move(c));
        }
        return all;
    }();
    return cases;
}

// Every case counts towards coverage for both checks below.
const bool kCasesRegistered = [] {
    for (const OpCase& c : all_cases()) {
        register_op_test(Check::kFastVsReference, "FastVsReference.AllOps", {c.op});
        register_op_test(Check::kDeterminism, "Determinism.AllOpsAnyThreadCount", {c.op});
    }
    return true;
}();

TEST(FastVsReference, AllOps) {
    auto fast = make_cpu_backend(OpMode::kFast);
    auto ref = make_cpu_backend(OpMode::kReference);
    for (const OpCase& c : all_cases()) {
        const OpOutputs got = c.run(*fast);
        const OpOutputs want = c.run(*ref);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
            EXPECT_TRUE(got[i].guards_intact) << c.name << " wrote outside " << got[i].name;
            EXPECT_TRUE(want[i].guards_intact) << c.name << " (reference) wrote outside " << want[i].name;
            expect_within(c.name + " " + got[i].name, OpMode::kFast, max_rel_error(got[i].values, want[i].values),
                          got[i].tol);
        }
    }
}

TEST(Determinism, AllOpsAnyThreadCount) {
    auto fast = make_cpu_backend(OpMode::kFast);
    const int saved_threads = omp_get_max_threads();
    for (const OpCase& c : all_cases()) {
        omp_set_num_threads(1);
        const OpOutputs one = c.run(*fast);
        for (const int threads : {2, 3}) {
            omp_set_num_threads(threads);
            const OpOutputs many = c.run(*fast);
            const OpOutputs again = c.run(*fast);
            for (size_t i = 0; i < one.size(); ++i) {
                const auto& a = one[i].values;
                EXPECT_TRUE(a.size() == many[i].values.size() &&
                            std::memcmp(a.data(), many[i].values.data(), a.size() * sizeof(double)) == 0)
                    << c.name << " " << one[i].name << ": 1 thread and " << threads << " threads differ";
                EXPECT_TRUE(std::memcmp(many[i].values.data(), again[i].values.data(), a.size() * sizeof(double)) == 0)
                    << c.name << " " << one[i].name << ": two runs on " << threads << " threads differ";
            }
        }
    }
    omp_set_num_threads(saved_threads);
}

}  // namespace
}  // namespace ms::test
