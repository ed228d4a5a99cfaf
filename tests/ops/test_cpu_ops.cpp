// test_cpu_ops.cpp: every CPU op's backward (both modes) against central finite differences of the reference
// forward, plus the ops without a backward against values known exactly or a closed form.
//
// Method: for a random R, the scalar loss L = sum(out * R) (in double) has dL/dout = R, so backward(dout = R)
// must match dL/dx from numeric_grad (eps = 1e-3 in float, the realised step as the denominator). Errors are
// scale-free (max |analytic - numeric| / max |numeric|). Tolerances were set from the errors this file measures
// (MS_OP_TEST_VERBOSE=1 ./test_ops prints them). The numeric side's error is dominated by the float rounding of
// the outputs divided by the 2e-3 step (~1e-7 / 2e-3); both modes measure the same, which says the analytic
// gradients agree far better than the check can resolve.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

constexpr OpMode kModes[] = {OpMode::kReference, OpMode::kFast};

MS_OP_TEST(OpGradient, Embedding, kGradient, OpKind::kEmbeddingForward, OpKind::kEmbeddingBackward) {
    const int64_t B = 2, T = 5, C = 6, V_local = 7, vocab_start = 3, N = B * T;
    // Ids in [0, 12): some below and some above this shard's rows [3, 10), and repeats.
    auto tokens = random_ints(N, 1, 0, 11);
    auto table = random_floats(V_local * C, 2);
    auto pos = random_floats(T * C, 3);
    const auto r = random_floats(N * C, 4);
    auto ref = make_cpu_backend(OpMode::kReference);
    std::vector<float> out(N * C);
    auto loss = [&] {
        ref->embedding_forward({.tokens = view(tokens, {N}),
                                .table = view(table, {V_local, C}),
                                .pos = view(pos, {T, C}),
                                .out = view(out, {N, C}),
                                .vocab_start = vocab_start,
                                .T = T});
        return dot_loss(out, r);
    };
    const auto num_dtable = numeric_grad(table, loss);
    const auto num_dpos = numeric_grad(pos, loss);
    for (OpMode mode : kModes) {
        std::vector<float> dtable(V_local * C), dpos(T * C), dout = r;
        make_cpu_backend(mode)->embedding_backward({.tokens = view(tokens, {N}),
                                                    .dout = view(dout, {N, C}),
                                                    .dtable = view(dtable, {V_local, C}),
                                                    .dpos = view(dpos, {T, C}),
                                                    .vocab_start = vocab_start,
                                                    .T = T});
        // Measured 1.2e-5 / 7.5e-6 in both modes (linear op: only the outputs' float rounding over the 2e-3 step).
        expect_within("embedding dtable", mode, max_rel_error(dtable, num_dtable), 5e-5);
        expect_within("embedding dpos", mode, max_rel_error(dpos, num_dpos), 5e-5);
    }
}

MS_OP_TEST(OpGradient, LayerNorm, kGradient, OpKind::kLayerNormForward, OpKind::kLayerNormBackward) {
    const int64_t N = 5, C = 13;
    auto inp = random_floats(N * C, 1, -2.0f, 2.0f);
    auto weight = random_floats(C, 2, 0.5f, 1.5f);
    auto bias = random_floats(C, 3);
    const auto r = random_floats(N * C, 4);
    auto ref = make_cpu_backend(OpMode::kReference);
    std::vector<float> out(N * C), mean(N), rstd(N);
    auto forward = [&](Backend& backend) {
        backend.layernorm_forward({.inp = view(inp, {N, C}),
                                   .weight = view(weight, {C}),
                                   .bias = view(bias, {C}),
                                   .out = view(out, {N, C}),
                                   .mean = view(mean, {N}),
                                   .rstd = view(rstd, {N}),
                                   .eps = 1e-5f});
    };
    auto loss = [&] {
        forward(*ref);
        return dot_loss(out, r);
    };
    const auto num_dinp = numeric_grad(inp, loss);
    const auto num_dweight = numeric_grad(weight, loss);
    const auto num_dbias = numeric_grad(bias, loss);
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        forward(*backend);  // mean and rstd from the same mode
        std::vector<float> dinp(N * C), dweight(C), dbias(C), dout = r;
        backend->layernorm_backward({.dout = view(dout, {N, C}),
                                     .inp = view(inp, {N, C}),
                                     .weight = view(weight, {C}),
                                     .mean = view(mean, {N}),
                                     .rstd = view(rstd, {N}),
                                     .dinp = view(dinp, {N, C}),
                                     .dweight = view(dweight, {C}),
                                     .dbias = view(dbias, {C}),
                                     .accumulate = Accumulate::kOverwrite});
        // Measured 6.2e-5 / 3.2e-5 / 2.6e-5 in both modes (the outputs' float rounding over the 2e-3 step dominates);
        // ~3x headroom.
        expect_within("layernorm dinp", mode, max_rel_error(dinp, num_dinp), 2e-4);
        expect_within("layernorm dweight", mode, max_rel_error(dweight, num_dweight), 1e-4);
        expect_within("layernorm dbias", mode, max_rel_error(dbias, num_dbias), 1e-4);
    }
}

MS_OP_TEST(OpGradient, Matmul, kGradient, OpKind::kMatmulForward, OpKind::kMatmulBackward) {
    const int64_t N = 4, K = 5, M = 6;
    auto inp = random_floats(N * K, 1);
    auto weight = random_floats(M * K, 2);
    auto bias = random_floats(M, 3);
    const auto r = random_floats(N * M, 4);
    auto ref = make_cpu_backend(OpMode::kReference);
    std::vector<float> out(N * M);
    auto loss = [&] {
        ref->matmul_forward({.inp = view(inp, {N, K}),
                             .weight = view(weight, {M, K}),
                             .bias = view(bias, {M}),
                             .out = view(out, {N, M})});
        return dot_loss(out, r);
    };
    const auto num_dinp = numeric_grad(inp, loss);
    const auto num_dweight = numeric_grad(weight, loss);
    const auto num_dbias = numeric_grad(bias, loss);
    for (OpMode mode : kModes) {
        std::vector<float> dinp(N * K), dweight(M * K), dbias(M), dout = r;
        make_cpu_backend(mode)->matmul_backward({.dout = view(dout, {N, M}),
                                                 .inp = view(inp, {N, K}),
                                                 .weight = view(weight, {M, K}),
                                                 .dinp = view(dinp, {N, K}),
                                                 .dweight = view(dweight, {M, K}),
                                                 .dbias = view(dbias, {M}),
                                                 .accumulate = Accumulate::kOverwrite});
        // Measured 7.4e-5 / 3.5e-5 / 2.7e-6 in both modes (linear in each input: the outputs' float rounding over the
        // 2e-3 step dominates).
        expect_within("matmul dinp", mode, max_rel_error(dinp, num_dinp), 2e-4);
        expect_within("matmul dweight", mode, max_rel_error(dweight, num_dweight), 1e-4);
        expect_within("matmul dbias", mode, max_rel_error(dbias, num_dbias), 1e-5);
    }
}

MS_OP_TEST(OpGradient, Attention, kGradient, OpKind::kAttentionForward, OpKind::kAttentionBackward) {
    const int64_t B = 2, T = 5, NH = 2, HS = 3, C = NH * HS;
    auto qkv = random_floats(B * T * 3 * C, 1, -2.0f, 2.0f);
    const auto r = random_floats(B * T * C, 2);
    auto ref = make_cpu_backend(OpMode::kReference);
    std::vector<float> out(B * T * C), lse(B * NH * T);
    auto forward = [&](Backend& backend) {
        backend.attention_forward(
            {.qkv = view(qkv, {B, T, 3 * C}), .out = view(out, {B, T, C}), .lse = view(lse, {B, NH, T}), .NH = NH});
    };
    auto loss = [&] {
        forward(*ref);
        return dot_loss(out, r);
    };
    const auto num_dqkv = numeric_grad(qkv, loss);
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        forward(*backend);  // out and lse from the same mode
        std::vector<float> dqkv(qkv.size()), dout = r;
        backend->attention_backward({.dout = view(dout, {B, T, C}),
                                     .qkv = view(qkv, {B, T, 3 * C}),
                                     .out = view(out, {B, T, C}),
                                     .lse = view(lse, {B, NH, T}),
                                     .dqkv = view(dqkv, {B, T, 3 * C}),
                                     .NH = NH});
        // Measured 4.7e-5 in both modes (the outputs' float rounding over the 2e-3 step dominates); ~4x headroom.
        expect_within("attention dqkv", mode, max_rel_error(dqkv, num_dqkv), 2e-4);
    }
}

MS_OP_TEST(OpGradient, Gelu, kGradient, OpKind::kGeluForward, OpKind::kGeluBackward) {
    const int64_t n = 64;
    auto inp = random_floats(n, 1, -5.0f, 5.0f);
    const auto r = random_floats(n, 2);
    auto ref = make_cpu_backend(OpMode::kReference);
    std::vector<float> out(n);
    auto loss = [&] {
        ref->gelu_forward({.inp = view(inp, {n}), .out = view(out, {n})});
        return dot_loss(out, r);
    };
    const auto num_dinp = numeric_grad(inp, loss);
    for (OpMode mode : kModes) {
        std::vector<float> dinp(n), dout = r;
        make_cpu_backend(mode)->gelu_backward(
            {.inp = view(inp, {n}), .dout = view(dout, {n}), .dinp = view(dinp, {n})});
        // Measured 6.2e-5 in both modes (the outputs' float rounding over the 2e-3 step dominates); ~3x headroom.
        expect_within("gelu dinp", mode, max_rel_error(dinp, num_dinp), 2e-4);
    }
}

// Full cross-entropy loss from the pieces on one shard: sum_n dloss[n] * (log sum_exp + row_max - target_logit).
struct CrossEntropyProblem {
    int64_t N, Vp, valid;
    std::vector<float> logits;  // (N, Vp)
    std::vector<int32_t> targets;
    std::vector<float> dloss;
    std::vector<float> row_max, sum_exp, target_logit;

    CrossEntropyProblem(int64_t n, int64_t vp, int64_t v, uint32_t seed)
        : N(n),
          Vp(vp),
          valid(v),
          logits(random_floats(n * vp, seed, -3.0f, 3.0f)),
          targets(random_ints(n, seed + 1, 0, static_cast<int32_t>(v - 1))),
          dloss(random_floats(n, seed + 2, 0.1f, 1.0f)),
          row_max(n),
          sum_exp(n),
          target_logit(n) {}

    void forward(Backend& backend) {
        for (CrossEntropyPhase phase : {CrossEntropyPhase::kMax, CrossEntropyPhase::kSumExp}) {
            backend.cross_entropy_forward({.logits = view(logits, {N, Vp}),
                                           .targets = view(targets, {N}),
                                           .row_max = view(row_max, {N}),
                                           .sum_exp = view(sum_exp, {N}),
                                           .target_logit = view(target_logit, {N}),
                                           .vocab_start = 0,
                                           .vocab_valid_local = valid,
                                           .phase = phase});
        }
    }
    double loss(Backend& backend) {
        forward(backend);
        double sum = 0.0;
        for (int64_t n = 0; n < N; ++n) {
            sum += dloss[n] * (std::log(static_cast<double>(sum_exp[n])) + row_max[n] - target_logit[n]);
        }
        return sum;
    }
    std::vector<float> backward(Backend& backend) {
        forward(backend);
        std::vector<float> dlogits = logits;
        backend.cross_entropy_backward({.logits = view(dlogits, {N, Vp}),
                                        .targets = view(targets, {N}),
                                        .row_max = view(row_max, {N}),
                                        .sum_exp = view(sum_exp, {N}),
                                        .dloss = view(dloss, {N}),
                                        .vocab_start = 0,
                                        .vocab_valid_local = valid});
        return dlogits;
    }
};

MS_OP_TEST(OpGradient, CrossEntropy, kGradient, OpKind::kCrossEntropyForward, OpKind::kCrossEntropyBackward) {
    CrossEntropyProblem p(4, 11, 9, 1);  // columns 9 and 10 are padding
    auto ref = make_cpu_backend(OpMode::kReference);
    const auto num_dlogits = numeric_grad(p.logits, [&] { return p.loss(*ref); });
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        const auto dlogits = p.backward(*backend);
        // Measured 3.0e-5 in both modes (the outputs' float rounding over the 2e-3 step dominates); ~3x headroom.
        expect_within("cross_entropy dlogits", mode, max_rel_error(dlogits, num_dlogits), 1e-4);
        for (int64_t n = 0; n < p.N; ++n) {
            for (int64_t j = p.valid; j < p.Vp; ++j) EXPECT_EQ(dlogits[n * p.Vp + j], 0.0f) << "padded column " << j;
        }
    }
}

// The loss from the pieces against -log softmax computed here in double.
MS_OP_TEST(OpExact, CrossEntropyLoss, kExact, OpKind::kCrossEntropyForward) {
    CrossEntropyProblem p(6, 19, 17, 7);
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        p.forward(*backend);
        std::vector<double> expected(p.N), got(p.N);
        for (int64_t n = 0; n < p.N; ++n) {
            double sum = 0.0;
            for (int64_t j = 0; j < p.valid; ++j) sum += std::exp(static_cast<double>(p.logits[n * p.Vp + j]));
            expected[n] = std::log(sum) - p.logits[n * p.Vp + p.targets[n]];
            got[n] = std::log(static_cast<double>(p.sum_exp[n])) + p.row_max[n] - p.target_logit[n];
        }
        // Measured 7e-9 (reference) and 1.7e-8 (fast): the float rounding of sum_exp and row_max; ~10x headroom.
        expect_within("cross_entropy loss", mode, max_rel_error(got, expected), 2e-7);
    }
}

// Three AdamW steps against the formula in backend.h, evaluated here in double.
MS_OP_TEST(OpExact, AdamW, kExact, OpKind::kAdamW) {
    const int64_t n = 1000;
    const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f, grad_scale = 0.5f;
    const auto param0 = random_floats(n, 1);
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        std::vector<float> param = param0, m(n), v(n);
        std::vector<double> p_ref(param0.begin(), param0.end()), m_ref(n), v_ref(n);
        for (int64_t step = 1; step <= 3; ++step) {
            auto grad = random_floats(n, 10 + static_cast<uint32_t>(step));
            backend->adamw({.param = view(param, {n}),
                            .grad = view(grad, {n}),
                            .m = view(m, {n}),
                            .v = view(v, {n}),
                            .lr = lr,
                            .beta1 = beta1,
                            .beta2 = beta2,
                            .eps = eps,
                            .weight_decay = weight_decay,
                            .grad_scale = grad_scale,
                            .step = step,
                            .param_copy = {}});
            for (int64_t i = 0; i < n; ++i) {
                const double g = static_cast<double>(grad[i]) * grad_scale;
                m_ref[i] = beta1 * m_ref[i] + (1.0 - beta1) * g;
                v_ref[i] = beta2 * v_ref[i] + (1.0 - beta2) * g * g;
                const double m_hat = m_ref[i] / (1.0 - std::pow(static_cast<double>(beta1), step));
                const double v_hat = v_ref[i] / (1.0 - std::pow(static_cast<double>(beta2), step));
                p_ref[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * p_ref[i]);
            }
        }
        // Measured <= 9.4e-8 in both modes: float storage of param, m, v between steps; ~10x headroom.
        expect_within("adamw param", mode, max_rel_error(param, p_ref), 1e-6);
        expect_within("adamw m", mode, max_rel_error(m, m_ref), 1e-6);
        expect_within("adamw v", mode, max_rel_error(v, v_ref), 1e-6);
    }
}

// Small integers make every partial sum exact in double, so both modes must return the exact value.
MS_OP_TEST(OpExact, SumSquares, kExact, OpKind::kSumSquares) {
    const int64_t n = 300007;  // several 64K blocks plus a ragged tail
    std::vector<float> x(n);
    double expected = 0.0;
    const auto ints = random_ints(n, 1, -8, 8);
    for (int64_t i = 0; i < n; ++i) {
        x[i] = static_cast<float>(ints[i]);
        expected += static_cast<double>(ints[i]) * ints[i];
    }
    for (OpMode mode : kModes)
        EXPECT_EQ(make_cpu_backend(mode)->sum_squares(view(x, {n})), expected) << mode_name(mode);
}

// a + b of floats is exactly rounded, so both modes must equal the sum computed here.
MS_OP_TEST(OpExact, Residual, kExact, OpKind::kResidualForward) {
    const int64_t n = 1001;
    auto a = random_floats(n, 1);
    auto b = random_floats(n, 2);
    std::vector<float> expected(n);
    for (int64_t i = 0; i < n; ++i) expected[i] = a[i] + b[i];
    for (OpMode mode : kModes) {
        std::vector<float> out(n);
        make_cpu_backend(mode)->residual_forward(
            {.a = view(a, {n}), .b = view(b, {n}), .out = view(out, {n}), .bias = {}});
        EXPECT_TRUE(bit_identical(out, expected)) << mode_name(mode);
    }
}

// With a bias (the row-parallel linear's, added after the TP reduce): out = a + (b + bias[i % M]), exactly, and
// out may alias a.
MS_OP_TEST(OpExact, ResidualWithBias, kExact, OpKind::kResidualForward) {
    const int64_t rows = 37, M = 53, n = rows * M;
    auto a = random_floats(n, 3);
    auto b = random_floats(n, 4);
    auto bias = random_floats(M, 5);
    std::vector<float> expected(n);
    for (int64_t i = 0; i < n; ++i) expected[i] = a[i] + (b[i] + bias[i % M]);
    for (OpMode mode : kModes) {
        std::vector<float> out(n);
        make_cpu_backend(mode)->residual_forward(
            {.a = view(a, {n}), .b = view(b, {n}), .out = view(out, {n}), .bias = view(bias, {M})});
        EXPECT_TRUE(bit_identical(out, expected)) << mode_name(mode);
        std::vector<float> inplace = a;
        make_cpu_backend(mode)->residual_forward(
            {.a = view(inplace, {n}), .b = view(b, {n}), .out = view(inplace, {n}), .bias = view(bias, {M})});
        EXPECT_TRUE(bit_identical(inplace, expected)) << mode_name(mode);
    }
}

// Known values: rows of the table where the token is held here, zero rows elsewhere, plus the position row.
MS_OP_TEST(OpExact, EmbeddingRows, kExact, OpKind::kEmbeddingForward) {
    const int64_t T = 3, C = 4, V_local = 2, vocab_start = 5, N = 6;
    std::vector<int32_t> tokens = {5, 6, 4, 7, 6, 5};  // 4 and 7 belong to other shards
    std::vector<float> table = {1, 2, 3, 4, 10, 20, 30, 40};
    std::vector<float> pos = {100, 100, 100, 100, 200, 200, 200, 200, 300, 300, 300, 300};
    const std::vector<float> expected = {101, 102, 103, 104, 210, 220, 230, 240, 300, 300, 300, 300,
                                         100, 100, 100, 100, 210, 220, 230, 240, 301, 302, 303, 304};
    for (OpMode mode : kModes) {
        std::vector<float> out(N * C);
        make_cpu_backend(mode)->embedding_forward({.tokens = view(tokens, {N}),
                                                   .table = view(table, {V_local, C}),
                                                   .pos = view(pos, {T, C}),
                                                   .out = view(out, {N, C}),
                                                   .vocab_start = vocab_start,
                                                   .T = T});
        EXPECT_EQ(out, expected) << mode_name(mode);
    }
}

TEST(CpuBackend, TheRanksOfANodeShareItsCores) {
    // run.num_threads 0 and no OMP_NUM_THREADS: each of a node's local_size ranks takes cores / local_size threads
    // (at least one); OMP_NUM_THREADS, when set, and run.num_threads stand. ctest sets OMP_NUM_THREADS for this
    // binary, so the test takes it away for the first case and puts it back.
    const int saved = omp_get_max_threads();
    const char* env = std::getenv("OMP_NUM_THREADS");
    const std::string omp_num_threads = env != nullptr ? env : "";
    const auto threads_after = [&](int local_size, int num_threads) {
        omp_set_num_threads(saved);
        BackendOptions options;
        options.local_size = local_size;
        options.num_threads = num_threads;
        make_backend(options);
        return omp_get_max_threads();
    };
    unsetenv("OMP_NUM_THREADS");
    EXPECT_EQ(threads_after(1, 0), saved);
    EXPECT_EQ(threads_after(2, 0), std::max(1, omp_get_num_procs() / 2));
    EXPECT_EQ(threads_after(1024, 0), 1);
    EXPECT_EQ(threads_after(2, 3), 3);
    setenv("OMP_NUM_THREADS", "2", 1);
    EXPECT_EQ(threads_after(4, 0), saved);
    if (env != nullptr) {
        setenv("OMP_NUM_THREADS", omp_num_threads.c_str(), 1);
    } else {
        unsetenv("OMP_NUM_THREADS");
    }
    omp_set_num_threads(saved);
}

}  // namespace
}  // namespace ms::test
