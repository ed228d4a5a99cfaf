// test_gpt.cpp: whole-model properties of Gpt that need no reference implementation: the loss at init, that a
// tiny model can overfit one batch, bit-exact reruns, layout-invariant init, the padded vocabulary, agreement
// of the fast and reference CPU backends, gradient accumulation over micro-batches, the GPT-2 124M table, and that the
// init std scales the same draws.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "tests/model/gpt_test_util.h"

namespace ms {
namespace {

using test::rel_max_error;

const float* param_ptr(Gpt& m, const std::string& name) { return m.params() + m.param(name).offset; }

bool bit_equal(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// (a) With init std 0.02 and ln_f = identity affine, ln_f's output x has |x|^2 ~= C, so each real logit
// x . wte[j] is ~N(0, s^2) with s^2 = C * 0.02^2 (0.0192 here): E[logsumexp] = ln V + s^2 / 2 to second order,
// and the target logit averages 0. Expected loss = ln 61 + 0.0096 = 4.1205. The per-position loss then has a
// spread of ~s = 0.14, so the mean over N = 512 positions scatters by ~0.006 around it.
TEST(Gpt, LossAtInitIsLogVocab) {
    const GptShape s = test::tiny_shape();
    constexpr int B = 32;
    const int64_t N = int64_t(B) * s.T;
    auto backend = test::make_cpu_backend(OpMode::kFast);
    Gpt model(s, *backend, test::tp_self(), B);
    const double sigma2 = s.C * 0.02 * 0.02;
    const double expected = std::log(double(s.V)) + sigma2 / 2;
    double worst = 0;
    for (uint64_t seed = 1; seed <= 4; ++seed) {
        model.init_weights(seed);
        const auto tokens = test::random_tokens(N, s.V, seed, 1);
        const auto targets = test::random_tokens(N, s.V, seed, 2);
        const float loss = model.forward(tokens.data(), targets.data(), B, s.T);
        worst = std::max(worst, std::abs(loss - expected));
        // Measured over seeds 1..40: |loss - expected| <= 0.016, mean +0.003, standard deviation 0.0066 (as
        // estimated above). 0.04 is 6 standard deviations (2.5x the worst of 40 seeds): a false alarm is
        // practically impossible, while a 2x too large init std (s^2 / 2 grows by 0.029) nearly reaches it.
        EXPECT_NEAR(loss, expected, 0.04) << "seed " << seed;
    }
    std::printf("loss at init: expected %.4f (ln V = %.4f), worst deviation over 4 seeds %.4f\n", expected,
                std::log(double(s.V)), worst);
}

// (b) 48 positions of random tokens are memorisable by a 2-layer, C = 48 model: the loss must collapse.
TEST(Gpt, OverfitsOneBatch) {
    const GptShape s = test::tiny_shape();
    constexpr int B = 3;
    constexpr int kSteps = 100;
    const int64_t N = int64_t(B) * s.T;
    auto backend = test::make_cpu_backend(OpMode::kFast);
    Gpt model(s, *backend, test::tp_self(), B);
    model.init_weights(42);
    const auto tokens = test::random_tokens(N, s.V, 42, 1);
    const auto targets = test::random_tokens(N, s.V, 42, 2);
    OptimizerConfig oc;
    oc.lr = 1e-2f;
    oc.weight_decay = 0.0f;
    AdamW opt(model.params_info(), test::flat_size(model), oc, *backend);
    float first = 0, last = 0;
    for (int step = 0; step < kSteps; ++step) {
        last = test::train_step(model, opt, *backend, tokens.data(), targets.data(), B, s.T, oc.lr, 1.0f).loss;
        if (step == 0) first = last;
        ASSERT_TRUE(std::isfinite(last)) << "step " << step;
    }
    last = model.forward(tokens.data(), targets.data(), B, s.T);
    std::printf("overfit: loss %.4f -> %.5f after %d steps\n", first, last, kSteps);
    // Measured (seeds 1-5 and 42): the loss is 1.4-1.8 after 10 steps, 0.006-0.013 after 30, <= 2.4e-3 after 40
    // and <= 2.2e-4 after 100 (~0.15 s). 0.01 (0.25% of ln V: the batch is memorised) leaves a 45x margin at 100
    // steps, yet fails a model that learns 3x slower than this one because of a wrong gradient.
    EXPECT_LT(last, 0.01f);
}

// (c) Same config, same seed: bit-identical losses, parameters and optimizer state after five steps.
TEST(Gpt, RerunIsBitIdentical) {
    const GptShape s = test::tiny_shape();
    constexpr int B = 3;
    const int64_t N = int64_t(B) * s.T;
    const auto tokens = test::random_tokens(N, s.V, 7, 1);
    const auto targets = test::random_tokens(N, s.V, 7, 2);
    struct Run {
        std::vector<float> losses, params, m, v;
    };
    auto run = [&]() {
        auto backend = test::make_cpu_backend(OpMode::kFast);
        Gpt model(s, *backend, test::tp_self(), B);
        model.init_weights(7);
        OptimizerConfig oc;
        AdamW opt(model.params_info(), test::flat_size(model), oc, *backend);
        Run r;
        for (int step = 0; step < 5; ++step)
            r.losses.push_back(
                test::train_step(model, opt, *backend, tokens.data(), targets.data(), B, s.T, 1e-3f, 1.0f).loss);
        const int64_t n = test::flat_size(model);
        r.params.assign(model.params(), model.params() + n);
        r.m.assign(opt.exp_avg(), opt.exp_avg() + n);
        r.v.assign(opt.exp_avg_sq(), opt.exp_avg_sq() + n);
        return r;
    };
    const Run a = run(), b = run();
    ASSERT_EQ(a.losses.size(), b.losses.size());
    EXPECT_TRUE(bit_equal(a.losses.data(), b.losses.data(), int64_t(a.losses.size())));
    EXPECT_TRUE(bit_equal(a.params.data(), b.params.data(), int64_t(a.params.size())));
    EXPECT_TRUE(bit_equal(a.m.data(), b.m.data(), int64_t(a.m.size())));
    EXPECT_TRUE(bit_equal(a.v.data(), b.v.data(), int64_t(a.v.size())));
}

// (d) Every element is a function of (seed, name, index) only. Changing L rescales the residual projections
// (std / sqrt(2 L)) and touches nothing else of the shared tensors; changing T or V keeps the shared rows.
TEST(Gpt, InitIsLayoutInvariant) {
    auto backend = test::make_cpu_backend(OpMode::kFast);
    GptShape s2 = test::tiny_shape();
    GptShape s3 = s2;
    s3.L = 3;
    Gpt m2(s2, *backend, test::tp_self(), 1), m3(s3, *backend, test::tp_self(), 1);
    m2.init_weights(5);
    m3.init_weights(5);
    for (const ParamInfo& p : m2.params_info()) {
        const float* a = param_ptr(m2, p.name);
        const float* b = param_ptr(m3, p.name);
        ASSERT_EQ(m3.param(p.name).numel, p.numel) << p.name;
        const bool residual_proj = p.name.ends_with("c_proj.weight");
        if (!residual_proj) {
            EXPECT_TRUE(bit_equal(a, b, p.numel)) << p.name << " changed with L";
        } else {
            EXPECT_FLOAT_EQ(m3.param(p.name).std_for(kGpt2InitStd), 0.02f / std::sqrt(6.0f)) << p.name;
            EXPECT_FALSE(bit_equal(a, b, p.numel)) << p.name << " should depend on L";
        }
        // gpt.h's contract, exactly: element i is init_std * philox_normal(seed, name_hash(name), i) for any shape
        if (p.init == InitKind::kConstant) continue;
        const float std2 = p.std_for(kGpt2InitStd), std3 = m3.param(p.name).std_for(kGpt2InitStd);
        const int64_t live = p.name == "wte.weight" ? int64_t(s2.V) * s2.C : p.numel;
        int64_t mismatches = 0;
        for (int64_t i = 0; i < live; ++i) {
            const float draw = philox_normal(5, name_hash(p.name), uint64_t(i));
            mismatches += a[i] != std2 * draw || b[i] != std3 * draw;
        }
        EXPECT_EQ(mismatches, 0) << p.name << ": not the Philox draws of its name";
    }

    GptShape sT = s2;
    sT.T = 2 * s2.T;  // more position embeddings: the first T rows are the same
    GptShape sV = s2;
    sV.V = 100;  // more real vocabulary rows (same Vp): the first 61 rows are the same
    Gpt mT(sT, *backend, test::tp_self(), 1), mV(sV, *backend, test::tp_self(), 1);
    mT.init_weights(5);
    mV.init_weights(5);
    for (const ParamInfo& p : m2.params_info()) {
        EXPECT_TRUE(bit_equal(param_ptr(m2, p.name), param_ptr(mT, p.name), p.numel)) << p.name << " (T)";
        const int64_t n = p.name == "wte.weight" ? int64_t(s2.V) * s2.C : p.numel;
        EXPECT_TRUE(bit_equal(param_ptr(m2, p.name), param_ptr(mV, p.name), n)) << p.name << " (V)";
    }
    // and the seed matters
    Gpt m2b(s2, *backend, test::tp_self(), 1);
    m2b.init_weights(6);
    EXPECT_FALSE(bit_equal(param_ptr(m2, "wte.weight"), param_ptr(m2b, "wte.weight"), int64_t(s2.V) * s2.C));
}

// (d') The init std is init_weights()'s argument (the config's model.init_method_std), not a table entry: the same
// Philox draws scaled, so with half the std every normal-initialised element is exactly half (halving is exact in
// binary floating point), the residual projections included (std / sqrt(2 L)); constants do not move.
TEST(Gpt, InitStdScalesTheDraws) {
    auto backend = test::make_cpu_backend(OpMode::kFast);
    const GptShape s = test::tiny_shape();
    EXPECT_EQ(ModelConfig{}.init_method_std, kGpt2InitStd);  // the config's default is the model's default
    Gpt a(s, *backend, test::tp_self(), 1), b(s, *backend, test::tp_self(), 1), d(s, *backend, test::tp_self(), 1);
    a.init_weights(11, 0.02f);
    b.init_weights(11, 0.01f);
    d.init_weights(11);
    EXPECT_TRUE(bit_equal(a.params(), d.params(), a.flat_size())) << "the default std is not 0.02";
    int normal = 0;
    for (const ParamInfo& p : a.params_info()) {
        const float* wa = param_ptr(a, p.name);
        const float* wb = param_ptr(b, p.name);
        int64_t mismatches = 0, nonzero = 0;
        for (int64_t i = 0; i < p.numel; ++i) {
            const float expect = p.init == InitKind::kNormal ? 0.5f * wa[i] : wa[i];
            mismatches += wb[i] != expect;
            nonzero += wa[i] != 0.0f;
        }
        EXPECT_EQ(mismatches, 0) << p.name;
        if (p.init == InitKind::kNormal) {
            ++normal;
            EXPECT_GT(nonzero, 0) << p.name;
            const float divisor = p.name.ends_with("c_proj.weight") ? std::sqrt(2.0f * float(s.L)) : 1.0f;
            EXPECT_EQ(p.init_divisor, divisor) << p.name;
            EXPECT_EQ(wb[0], (0.01f / divisor) * philox_normal(11, name_hash(p.name), 0)) << p.name;
        }
    }
    EXPECT_EQ(normal, 2 + 4 * s.L);  // wte, wpe, and c_attn, attn.c_proj, c_fc, mlp.c_proj per layer
}

// (e) Rows V..Vp-1 of wte are never looked up and their logits are masked: 0 at init, exactly 0 gradient.
TEST(Gpt, PaddedVocabRowsStayZero) {
    const GptShape s = test::tiny_shape();
    constexpr int B = 3;
    const int64_t N = int64_t(B) * s.T;
    for (OpMode mode : {OpMode::kFast, OpMode::kReference}) {
        auto backend = test::make_cpu_backend(mode);
        Gpt model(s, *backend, test::tp_self(), B);
        model.init_weights(3);
        const ParamInfo& wte = model.param("wte.weight");
        const int64_t pad_begin = int64_t(s.V) * s.C, pad_end = int64_t(s.Vp) * s.C;
        for (int64_t i = pad_begin; i < pad_end; ++i) ASSERT_EQ(model.params()[wte.offset + i], 0.0f) << i;
        // the real rows are not (accidentally) zero
        double sumsq = 0;
        for (int64_t i = 0; i < pad_begin; ++i)
            sumsq += double(model.params()[wte.offset + i]) * model.params()[wte.offset + i];
        EXPECT_NEAR(std::sqrt(sumsq / double(pad_begin)), 0.02, 0.002);

        const auto tokens = test::random_tokens(N, s.V, 3, 1);
        const auto targets = test::random_tokens(N, s.V, 3, 2);
        model.zero_grads();
        model.forward(tokens.data(), targets.data(), B, s.T);
        model.backward();
        for (int64_t i = pad_begin; i < pad_end; ++i)
            ASSERT_EQ(model.grads_f32()[wte.offset + i], 0.0f) << backend->name() << " wte grad element " << i;
    }
}

// (f) The fast path (OpenBLAS, OpenMP, fused loops) against the reference loops, whole model.
TEST(Gpt, FastAndReferenceBackendsAgree) {
    const GptShape s = test::tiny_shape();
    constexpr int B = 3;
    const int64_t N = int64_t(B) * s.T;
    auto fast = test::make_cpu_backend(OpMode::kFast);
    auto ref = test::make_cpu_backend(OpMode::kReference);
    Gpt mf(s, *fast, test::tp_self(), B), mr(s, *ref, test::tp_self(), B);
    double worst_grad = 0, worst_logits = 0, worst_loss = 0;
    std::string worst_name;
    for (uint64_t seed : {11u, 12u, 13u}) {
        mf.init_weights(seed);
        mr.init_weights(seed);
        const auto tokens = test::random_tokens(N, s.V, seed, 1);
        const auto targets = test::random_tokens(N, s.V, seed, 2);
        const float lf = mf.forward(tokens.data(), targets.data(), B, s.T);
        const float lr = mr.forward(tokens.data(), targets.data(), B, s.T);
        worst_loss = std::max(worst_loss, double(std::abs(lf - lr)));
        worst_logits = std::max(worst_logits, rel_max_error(mf.logits(), mr.logits(), N * s.Vp));
        mf.zero_grads();
        mr.zero_grads();
        mf.backward();
        mr.backward();
        for (const ParamInfo& p : mf.params_info()) {
            const double e = rel_max_error(mf.grads_f32() + p.offset, mr.grads_f32() + p.offset, p.numel);
            if (e > worst_grad) worst_grad = e, worst_name = p.name;
            // Measured over seeds 1-20: worst 8.8e-7 (any tensor); 5e-6 is ~6x that.
            EXPECT_LE(e, 5e-6) << p.name << " seed " << seed;
        }
    }
    std::printf("fast vs reference: loss %.3g, logits rel %.3g, worst gradient rel %.3g (%s)\n", worst_loss,
                worst_logits, worst_grad, worst_name.c_str());
    // Measured over seeds 1-20: loss 4.8e-7 (1 ulp at 4.1), logits 3.1e-7 (relative to the largest logit).
    // Tolerances are ~4x and ~6x those.
    EXPECT_LE(worst_loss, 2e-6);
    EXPECT_LE(worst_logits, 2e-6);
}

// Gradients accumulate (+=) over micro-batches (backend.h's contract): two micro-batches of one sequence, each
// a loss scale of 1/2, give the gradient of the mean loss over the batch of both.
TEST(Gpt, GradientsAccumulateOverMicroBatches) {
    const GptShape s = test::tiny_shape();
    const int T = s.T;
    const auto tokens = test::random_tokens(2 * T, s.V, 9, 1);
    const auto targets = test::random_tokens(2 * T, s.V, 9, 2);
    for (OpMode mode : {OpMode::kFast, OpMode::kReference}) {
        auto backend = test::make_cpu_backend(mode);
        Gpt model(s, *backend, test::tp_self(), 2);
        model.init_weights(9);
        const int64_t n = test::flat_size(model);

        model.zero_grads();
        const float full_loss = model.forward(tokens.data(), targets.data(), 2, T);
        model.backward();
        const std::vector<float> full(model.grads_f32(), model.grads_f32() + n);

        model.zero_grads();
        float acc_loss = 0;
        for (int mb = 0; mb < 2; ++mb) {
            acc_loss += 0.5f * model.forward(tokens.data() + mb * T, targets.data() + mb * T, 1, T, 0, 0.5f);
            model.backward();
        }
        double worst = 0;
        for (const ParamInfo& p : model.params_info()) {
            const double e = rel_max_error(model.grads_f32() + p.offset, full.data() + p.offset, p.numel);
            worst = std::max(worst, e);
            // Measured over seeds 1-20: worst 4.8e-7 (fast), 1.2e-7 (reference); 3e-6 is ~6x the larger. The two
            // differ only in summation order; a gradient overwritten instead of accumulated is off by ~100%.
            EXPECT_LE(e, 3e-6) << backend->name() << " " << p.name;
        }
        // Measured: 4.8e-7 (1 ulp at 4.1) over seeds 1-20; 2e-6 is 4x that.
        EXPECT_NEAR(acc_loss, full_loss, 2e-6) << backend->name();
        std::printf("[%s] micro-batch accumulation: loss err %.3g, worst gradient rel err %.3g\n",
                    std::string(backend->name()).c_str(), std::abs(acc_loss - full_loss), worst);
    }
}

// (g) GPT-2 124M: the parameter table and count. HF's GPT-2 has 124,439,808 parameters with V = 50257; padding
// the vocabulary to 50304 adds 47 rows of 768.
TEST(Gpt, ParamTableOfGpt2Small) {
    GptShape s;  // the defaults are GPT-2 124M
    ASSERT_EQ(s.L, 12);
    ASSERT_EQ(s.C, 768);
    ASSERT_EQ(s.NH, 12);
    ASSERT_EQ(s.T, 1024);
    ASSERT_EQ(s.V, 50257);
    ASSERT_EQ(s.Vp, 50304);
    ASSERT_EQ(s.F, 3072);
    const int64_t L = s.L, C = s.C, T = s.T, Vp = s.Vp, V = s.V;
    const int64_t formula = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
    EXPECT_EQ(formula, 124'475'904);
    EXPECT_EQ(gpt_num_params(s), 124'475'904);
    EXPECT_EQ(gpt_num_params(s) - (Vp - V) * C, 124'439'808);  // Hugging Face's count for gpt2

    const std::vector<ParamInfo> t = gpt_param_table(s);
    ASSERT_EQ(t.size(), size_t(2 + 12 * L + 2));
    auto expect = [&](size_t i, const std::string& name, std::vector<int64_t> shape, bool wd, float std_, float value) {
        ASSERT_LT(i, t.size());
        EXPECT_EQ(t[i].name, name);
        EXPECT_EQ(t[i].shape, shape) << name;
        EXPECT_EQ(t[i].weight_decay, wd) << name;
        EXPECT_EQ(t[i].init, std_ > 0 ? InitKind::kNormal : InitKind::kConstant) << name;
        EXPECT_FLOAT_EQ(t[i].std_for(0.02f), std_) << name;
        EXPECT_EQ(t[i].init_value, value) << name;
    };
    const float proj = 0.02f / std::sqrt(24.0f);
    expect(0, "wte.weight", {Vp, C}, true, 0.02f, 0);
    expect(1, "wpe.weight", {T, C}, true, 0.02f, 0);
    for (int64_t l = 0; l < L; ++l) {
        const std::string h = "h." + std::to_string(l) + ".";
        const size_t b = 2 + 12 * size_t(l);
        expect(b + 0, h + "ln_1.weight", {C}, false, 0, 1);
        expect(b + 1, h + "ln_1.bias", {C}, false, 0, 0);
        expect(b + 2, h + "attn.c_attn.weight", {3 * C, C}, true, 0.02f, 0);
        expect(b + 3, h + "attn.c_attn.bias", {3 * C}, false, 0, 0);
        expect(b + 4, h + "attn.c_proj.weight", {C, C}, true, proj, 0);
        expect(b + 5, h + "attn.c_proj.bias", {C}, false, 0, 0);
        expect(b + 6, h + "ln_2.weight", {C}, false, 0, 1);
        expect(b + 7, h + "ln_2.bias", {C}, false, 0, 0);
        expect(b + 8, h + "mlp.c_fc.weight", {4 * C, C}, true, 0.02f, 0);
        expect(b + 9, h + "mlp.c_fc.bias", {4 * C}, false, 0, 0);
        expect(b + 10, h + "mlp.c_proj.weight", {C, 4 * C}, true, proj, 0);
        expect(b + 11, h + "mlp.c_proj.bias", {C}, false, 0, 0);
    }
    expect(t.size() - 2, "ln_f.weight", {C}, false, 0, 1);
    expect(t.size() - 1, "ln_f.bias", {C}, false, 0, 0);

    // the flat layout: in order, non-overlapping, every tensor 64-byte aligned, numel = product of the shape
    int64_t end = 0, sum = 0;
    for (const ParamInfo& p : t) {
        int64_t numel = 1;
        for (int64_t d : p.shape) numel *= d;
        EXPECT_EQ(p.numel, numel) << p.name;
        EXPECT_GE(p.offset, end) << p.name;
        EXPECT_EQ(p.offset % 16, 0) << p.name;
        end = p.offset + p.numel;
        sum += p.numel;
    }
    EXPECT_EQ(sum, gpt_num_params(s));
}

}  // namespace
}  // namespace ms
