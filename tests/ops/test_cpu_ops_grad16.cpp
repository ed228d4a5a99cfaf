// test_cpu_ops_grad16.cpp: CPU ops with 16-bit parameter gradients (the precision contract, backend.h): a gradient
// (dweight, dbias, dtable, dpos, dwte) in the activation dtype D is updated by rounding, once per call, the fp32 sum of
// its old value and the op's whole fp32 contribution c, where c is what the same call adds into an fp32 gradient
// that starts at 0 (lm_head_loss: once per chunk of rows). So every case runs the op three times on the same D
// activations, in both modes, for D = bf16 and fp16:
//   - every gradient fp32 and 0: c;
//   - the gradients under test in D holding random old values (the others fp32, holding their own old values):
//     each D element must equal from_float<D>(to_float(old) + c), bit for bit;
//   - every gradient fp32 holding the old values: the fp32 gradients of the mixed run must equal it, bit for bit,
//     and so must the op's other outputs in every run (the gradients' dtype changes nothing else).
// Elements whose old value is a NaN (embedding rows no token hits) must keep their bits and get c = 0.
// Also: sum_squares on bf16 / fp16 equals sum_squares on the fp32 widening, adamw with a 16-bit grad equals adamw
// with its fp32 widening (exactly: both widen on load), and a gradient of a third dtype is refused with a sentence
// that names it.
#include <fmt/format.h>

#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

constexpr OpMode kModes[] = {OpMode::kReference, OpMode::kFast};

template <class D>
uint16_t bits(D x) {
    uint16_t b;
    std::memcpy(&b, &x, sizeof b);
    return b;
}

// The parameter gradients of one run: gradient i is D when d_mask[i], else fp32, holding `init[i]`.
template <class D>
class Grads {
  public:
    Grads(const std::vector<std::vector<float>>& init, const std::vector<bool>& d_mask) : d_mask_(d_mask) {
        for (size_t i = 0; i < init.size(); ++i) {
            f32_.push_back(init[i]);
            d_.push_back(to_d<D>(init[i]));
        }
    }
    Tensor t(size_t i, std::initializer_list<int64_t> dims) {
        return d_mask_[i] ? dview(d_[i], dims) : view(f32_[i], dims);
    }
    const std::vector<float>& f32(size_t i) const { return f32_[i]; }
    const std::vector<D>& d(size_t i) const { return d_[i]; }

  private:
    std::vector<bool> d_mask_;
    std::vector<std::vector<float>> f32_;
    std::vector<std::vector<D>> d_;
};

// A run of the op on the gradients `g`; returns the op's other outputs (dinp, dlnf, losses) as floats.
template <class D>
using Run = std::function<std::vector<float>(Grads<D>& g)>;

// Random old values in [-scale, scale] rounded through D, the same for both dtypes of a gradient.
template <class D>
std::vector<float> random_old(size_t n, uint32_t seed, float scale = 1.0f) {
    std::vector<float> v = random_floats(n, seed, -scale, scale);
    for (float& x : v) x = round_to<D>(x);
    return v;
}

// The check described at the top for one case: gradients of `sizes` elements, those with d_mask in D; old values
// from `old` (NaN: an element the op must not touch).
template <class D>
void expect_once_rounded(const std::string& what, const std::vector<std::vector<float>>& old,
                         const std::vector<bool>& d_mask, const Run<D>& run) {
    std::vector<std::vector<float>> zeros;
    for (const auto& o : old) zeros.emplace_back(o.size(), 0.0f);
    Grads<D> contribution(zeros, std::vector<bool>(old.size(), false));
    const std::vector<float> outputs_c = run(contribution);
    Grads<D> mixed(old, d_mask);
    const std::vector<float> outputs_mixed = run(mixed);
    Grads<D> fp32(old, std::vector<bool>(old.size(), false));
    const std::vector<float> outputs_fp32 = run(fp32);
    EXPECT_TRUE(bit_identical(outputs_mixed, outputs_c)) << what << ": the other outputs depend on the grads' dtype";
    EXPECT_TRUE(bit_identical(outputs_fp32, outputs_c)) << what << ": the other outputs depend on the grads' values";
    for (size_t g = 0; g < old.size(); ++g) {
        if (!d_mask[g]) {
            EXPECT_TRUE(bit_identical(mixed.f32(g), fp32.f32(g))) << what << ": fp32 gradient " << g;
            continue;
        }
        int64_t mismatches = 0, changed = 0, touched = 0, first = -1;
        for (size_t i = 0; i < old[g].size(); ++i) {
            const float c = contribution.f32(g)[i];
            const D got = mixed.d(g)[i];
            const D was = from_float<D>(old[g][i]);
            const bool untouched = std::isnan(old[g][i]);
            const D want = untouched ? was : from_float<D>(to_float(was) + c);
            if (untouched && c != 0.0f) ++mismatches;  // a NaN-marked element must get nothing
            if (bits(got) != bits(want)) {
                ++mismatches;
                if (first < 0) first = static_cast<int64_t>(i);
            }
            if (bits(got) != bits(was)) ++changed;
            touched += !untouched;
        }
        EXPECT_EQ(mismatches, 0) << what << ": D gradient " << g << ", first at element " << first;
        // Not vacuous: the contribution moved most elements.
        EXPECT_GT(changed, touched / 4) << what << ": D gradient " << g;
    }
}

template <class F>
void for_each_half_and_mode(F&& f) {
    for (OpMode mode : kModes) {
        f(bf16{}, mode);
        f(fp16{}, mode);
    }
}

template <class D>
std::string label(const char* op, OpMode mode) {
    return fmt::format("{} {} {}", op, dtype_name(dtype_of<D>()), mode_name(mode));
}

// ---- matmul_backward ----

struct MatmulCase {
    int64_t N, K, M;
    bool dbias, gelu;
    std::vector<bool> d_mask;  // dweight, dbias
};

template <class D>
void check_matmul(const MatmulCase& mc, OpMode mode) {
    const int64_t N = mc.N, K = mc.K, M = mc.M;
    auto backend = make_cpu_backend(mode);
    const auto dout = to_d<D>(random_floats(N * M, 11)), inp = to_d<D>(random_floats(N * K, 12));
    const auto weight = to_d<D>(random_floats(M * K, 13)), gelu_inp = to_d<D>(random_floats(N * K, 14));
    const auto dinp_old = to_d<D>(random_floats(N * K, 15));
    const Run<D> run = [&](Grads<D>& g) {
        auto dout_v = dout, inp_v = inp, weight_v = weight, gelu_v = gelu_inp, dinp_v = dinp_old;
        backend->matmul_backward({.dout = dview(dout_v, {N, M}),
                                  .inp = dview(inp_v, {N, K}),
                                  .weight = dview(weight_v, {M, K}),
                                  .dinp = dview(dinp_v, {N, K}),
                                  .dweight = g.t(0, {M, K}),
                                  .dbias = mc.dbias ? g.t(1, {M}) : Tensor{},
                                  .accumulate = mc.gelu ? Accumulate::kOverwrite : Accumulate::kAdd,
                                  .gelu_inp = mc.gelu ? dview(gelu_v, {N, K}) : Tensor{}});
        std::vector<float> out(dinp_v.size());
        for (size_t i = 0; i < out.size(); ++i) out[i] = to_float(dinp_v[i]);
        return out;
    };
    std::vector<std::vector<float>> old = {random_old<D>(M * K, 16)};
    if (mc.dbias) old.push_back(random_old<D>(M, 17));
    std::vector<bool> mask = mc.d_mask;
    mask.resize(old.size());
    expect_once_rounded<D>(
        label<D>("matmul_backward", mode) + fmt::format(" N{} K{} M{} dbias {} gelu {}", N, K, M, mc.dbias, mc.gelu),
        old, mask, run);
}

MS_OP_TEST(Grad16, MatmulBackwardRoundsOncePerCall, kContract, OpKind::kMatmulBackward) {
    // M >= K cuts dweight by rows, K > M by columns (matmul.cpp); both wider than one 128-column block.
    const MatmulCase cases[] = {
        {37, 53, 150, true, false, {true, true}},  {37, 53, 150, false, false, {true}},
        {29, 300, 70, true, true, {true, true}},   {29, 300, 70, false, true, {true}},
        {29, 300, 70, true, false, {true, false}}, {37, 53, 150, true, true, {false, true}},
    };
    for_each_half_and_mode([&](auto tag, OpMode mode) {
        for (const MatmulCase& mc : cases) check_matmul<decltype(tag)>(mc, mode);
    });
}

// ---- layernorm_backward ----

template <class D>
void check_layernorm(OpMode mode, const std::vector<bool>& d_mask) {
    constexpr int64_t N = 37, C = 53;
    auto backend = make_cpu_backend(mode);
    const auto dout = to_d<D>(random_floats(N * C, 21)), inp = to_d<D>(random_floats(N * C, 22));
    const auto weight = to_d<D>(random_floats(C, 23));
    std::vector<float> mean(N), rstd(N);
    {
        auto inp_v = inp, weight_v = weight, bias_v = to_d<D>(random_floats(C, 24));
        std::vector<D> out(N * C);
        backend->layernorm_forward({.inp = dview(inp_v, {N, C}),
                                    .weight = dview(weight_v, {C}),
                                    .bias = dview(bias_v, {C}),
                                    .out = dview(out, {N, C}),
                                    .mean = view(mean, {N}),
                                    .rstd = view(rstd, {N}),
                                    .eps = 1e-5f});
    }
    const Run<D> run = [&](Grads<D>& g) {
        auto dout_v = dout, inp_v = inp, weight_v = weight;  // the 16-bit inputs
        auto mean_v = mean, rstd_v = rstd;                   // the fp32 statistics
        std::vector<D> dinp(N * C);
        backend->layernorm_backward({.dout = dview(dout_v, {N, C}),
                                     .inp = dview(inp_v, {N, C}),
                                     .weight = dview(weight_v, {C}),
                                     .mean = view(mean_v, {N}),
                                     .rstd = view(rstd_v, {N}),
                                     .dinp = dview(dinp, {N, C}),
                                     .dweight = g.t(0, {C}),
                                     .dbias = g.t(1, {C}),
                                     .accumulate = Accumulate::kOverwrite});
        std::vector<float> out(dinp.size());
        for (size_t i = 0; i < out.size(); ++i) out[i] = to_float(dinp[i]);
        return out;
    };
    expect_once_rounded<D>(label<D>("layernorm_backward", mode), {random_old<D>(C, 25), random_old<D>(C, 26)}, d_mask,
                           run);
}

MS_OP_TEST(Grad16, LayerNormBackwardRoundsOncePerCall, kContract, OpKind::kLayerNormBackward) {
    for_each_half_and_mode([&](auto tag, OpMode mode) {
        using D = decltype(tag);
        check_layernorm<D>(mode, {true, true});
        check_layernorm<D>(mode, {false, true});
    });
}

// ---- embedding_backward ----

template <class D>
void check_embedding(OpMode mode, const std::vector<bool>& d_mask) {
    constexpr int64_t B = 3, T = 13, N = B * T, C = 53, V_local = 67, vocab_start = 5;
    auto backend = make_cpu_backend(mode);
    // Ids in [0, 90): some below and above this shard's rows [5, 72), and rows no token hits.
    auto tokens = random_ints(N, 31, 0, 89);
    const auto dout = to_d<D>(random_floats(N * C, 32));
    std::vector<float> table_old = random_old<D>(V_local * C, 33);
    std::vector<bool> hit(V_local, false);
    for (int32_t tok : tokens) {
        if (tok >= vocab_start && tok < vocab_start + V_local) hit[tok - vocab_start] = true;
    }
    int64_t unhit = 0;
    for (int64_t r = 0; r < V_local; ++r) {
        if (hit[r]) continue;
        ++unhit;
        std::fill_n(table_old.begin() + r * C, C, std::numeric_limits<float>::quiet_NaN());
    }
    ASSERT_GT(unhit, 0);
    const Run<D> run = [&](Grads<D>& g) {
        auto dout_v = dout;
        backend->embedding_backward({.tokens = view(tokens, {N}),
                                     .dout = dview(dout_v, {N, C}),
                                     .dtable = g.t(0, {V_local, C}),
                                     .dpos = g.t(1, {T, C}),
                                     .vocab_start = vocab_start,
                                     .T = T});
        return std::vector<float>{};
    };
    expect_once_rounded<D>(label<D>("embedding_backward", mode), {table_old, random_old<D>(T * C, 34)}, d_mask, run);
}

MS_OP_TEST(Grad16, EmbeddingBackwardRoundsOncePerCall, kContract, OpKind::kEmbeddingBackward) {
    for_each_half_and_mode([&](auto tag, OpMode mode) {
        using D = decltype(tag);
        check_embedding<D>(mode, {true, true});
        check_embedding<D>(mode, {false, true});
        check_embedding<D>(mode, {true, false});
    });
}

// ---- lm_head_loss ----

struct HeadData {
    static constexpr int64_t N = 37, C = 53, Vp = 300, valid = 290;
};

// lm_head_loss over rows [r0, r0 + rows) of the data, in chunks of chunk_rows; dwte is g's gradient 0. Returns the
// rows' losses and dlnf.
template <class D>
std::vector<float> run_head(Backend& backend, const std::vector<D>& lnf, const std::vector<D>& wte,
                            const std::vector<int32_t>& targets, const std::vector<float>& dloss, int64_t r0,
                            int64_t rows, int64_t chunk_rows, const Tensor& dwte) {
    constexpr int64_t C = HeadData::C, Vp = HeadData::Vp;
    std::vector<D> lnf_v(lnf.begin() + r0 * C, lnf.begin() + (r0 + rows) * C), wte_v = wte, dlnf(rows * C);
    std::vector<int32_t> targets_v(targets.begin() + r0, targets.begin() + r0 + rows);
    std::vector<float> dloss_v(dloss.begin() + r0, dloss.begin() + r0 + rows), losses(rows);
    std::vector<float> scratch(lm_head_loss_scratch_elems(BackendKind::kCPU, dtype_of<D>(), rows, Vp, chunk_rows));
    backend.lm_head_loss({.lnf = dview(lnf_v, {rows, C}),
                          .wte = dview(wte_v, {Vp, C}),
                          .targets = view(targets_v, {rows}),
                          .dloss = view(dloss_v, {rows}),
                          .losses = view(losses, {rows}),
                          .dlnf = dview(dlnf, {rows, C}),
                          .dwte = dwte,
                          .scratch = view(scratch, {static_cast<int64_t>(scratch.size())}),
                          .vocab_start = 0,
                          .vocab_valid_local = HeadData::valid,
                          .chunk_rows = chunk_rows});
    for (const D& x : dlnf) losses.push_back(to_float(x));
    return losses;
}

template <class D>
void check_head(OpMode mode) {
    constexpr int64_t N = HeadData::N, C = HeadData::C, Vp = HeadData::Vp;
    auto backend = make_cpu_backend(mode);
    const auto lnf = to_d<D>(random_floats(N * C, 41, -2.0f, 2.0f)), wte = to_d<D>(random_floats(Vp * C, 42));
    const auto targets = random_ints(N, 43, 0, HeadData::valid - 1);
    const std::vector<float> dloss(N, 0.25f);
    // Old values small enough for most elements to move in bf16.
    const std::vector<float> old = random_old<D>(Vp * C, 44, 0.1f);
    // One chunk (chunk_rows >= N): the whole call's contribution rounded in once.
    for (int64_t chunk_rows : {int64_t{0}, N}) {
        const Run<D> run = [&](Grads<D>& g) {
            return run_head<D>(*backend, lnf, wte, targets, dloss, 0, N, chunk_rows, g.t(0, {Vp, C}));
        };
        expect_once_rounded<D>(label<D>("lm_head_loss", mode) + fmt::format(" chunk_rows {}", chunk_rows), {old},
                               {true}, run);
    }
    // Chunks of 10 rows (the last 7): each chunk's contribution rounded in once, in chunk order. The emulation runs
    // each chunk as a call of its own on an fp32 dwte at 0 and rounds its result in.
    constexpr int64_t R = 10;
    std::vector<D> dwte = to_d<D>(old), want = to_d<D>(old);
    std::vector<float> summed(Vp * C, 0.0f);  // the chunks' contributions added in fp32, to round once
    const std::vector<float> outputs = run_head<D>(*backend, lnf, wte, targets, dloss, 0, N, R, dview(dwte, {Vp, C}));
    std::vector<float> emulated_outputs(N), emulated_dlnf;
    for (int64_t r0 = 0; r0 < N; r0 += R) {
        const int64_t rows = std::min(R, N - r0);
        std::vector<float> c(Vp * C, 0.0f);
        const std::vector<float> out = run_head<D>(*backend, lnf, wte, targets, dloss, r0, rows, R, view(c, {Vp, C}));
        for (size_t i = 0; i < c.size(); ++i) {
            want[i] = from_float<D>(to_float(want[i]) + c[i]);
            summed[i] += c[i];
        }
        std::copy_n(out.begin(), rows, emulated_outputs.begin() + r0);
        emulated_dlnf.insert(emulated_dlnf.end(), out.begin() + rows, out.end());
    }
    emulated_outputs.insert(emulated_outputs.end(), emulated_dlnf.begin(), emulated_dlnf.end());
    int64_t mismatches = 0, rounded_once_differs = 0;
    for (size_t i = 0; i < dwte.size(); ++i) {
        mismatches += bits(dwte[i]) != bits(want[i]);
        rounded_once_differs += bits(from_float<D>(old[i] + summed[i])) != bits(want[i]);
    }
    EXPECT_EQ(mismatches, 0) << label<D>("lm_head_loss", mode) << " in chunks of " << R;
    // Not vacuous: rounding the chunks' sum once would give other bits.
    EXPECT_GT(rounded_once_differs, 0) << label<D>("lm_head_loss", mode);
    EXPECT_TRUE(bit_identical(outputs, emulated_outputs)) << label<D>("lm_head_loss", mode) << " losses, dlnf";
}

MS_OP_TEST(Grad16, LmHeadLossRoundsOncePerChunk, kContract, OpKind::kLmHeadLoss) {
    for_each_half_and_mode([&](auto tag, OpMode mode) { check_head<decltype(tag)>(mode); });
}

// ---- sum_squares, adamw ----

template <class D>
void check_sum_squares(OpMode mode) {
    constexpr int64_t n = 300007;  // several of the fast path's 64K blocks, the last one partial
    auto backend = make_cpu_backend(mode);
    std::vector<D> x = to_d<D>(random_floats(n, 51, -3.0f, 3.0f));
    std::vector<float> widened(n);
    for (int64_t i = 0; i < n; ++i) widened[i] = to_float(x[i]);
    // Offsets into both buffers: the sums must not depend on the data's alignment.
    for (int64_t offset : {0, 1, 3}) {
        const double got = backend->sum_squares(Tensor(x.data() + offset, dtype_of<D>(), {n - offset}));
        const double want = backend->sum_squares(Tensor::f32(widened.data() + offset, {n - offset}));
        EXPECT_EQ(got, want) << label<D>("sum_squares", mode) << " offset " << offset;
    }
}

MS_OP_TEST(Grad16, SumSquaresOf16BitGradsIsTheirFp32Widening, kExact, OpKind::kSumSquares) {
    for_each_half_and_mode([&](auto tag, OpMode mode) { check_sum_squares<decltype(tag)>(mode); });
}

template <class D>
void check_adamw(OpMode mode, bool with_copy) {
    constexpr int64_t n = 1003;
    auto backend = make_cpu_backend(mode);
    std::vector<D> grad = to_d<D>(random_floats(n, 61, -2.0f, 2.0f));
    std::vector<float> widened(n);
    for (int64_t i = 0; i < n; ++i) widened[i] = to_float(grad[i]);
    const auto step = [&](const Tensor& g) {
        std::vector<float> param = random_floats(n, 62), m = random_floats(n, 63, -0.1f, 0.1f);
        std::vector<float> v = random_floats(n, 64, 0.0f, 0.1f);
        std::vector<bf16> copy(n);
        backend->adamw({.param = view(param, {n}),
                        .grad = g,
                        .m = view(m, {n}),
                        .v = view(v, {n}),
                        .lr = 1e-2f,
                        .beta1 = 0.9f,
                        .beta2 = 0.95f,
                        .eps = 1e-8f,
                        .weight_decay = 0.1f,
                        .grad_scale = 0.7f,
                        .step = 3,
                        .param_copy = with_copy ? dview(copy, {n}) : Tensor{}});
        for (const bf16& c : copy) param.push_back(to_float(c));
        param.insert(param.end(), m.begin(), m.end());
        param.insert(param.end(), v.begin(), v.end());
        return param;
    };
    EXPECT_TRUE(bit_identical(step(dview(grad, {n})), step(view(widened, {n}))))
        << label<D>("adamw", mode) << " param_copy " << with_copy;
}

MS_OP_TEST(Grad16, AdamWOn16BitGradsIsItsFp32Widening, kExact, OpKind::kAdamW) {
    for_each_half_and_mode([&](auto tag, OpMode mode) {
        check_adamw<decltype(tag)>(mode, false);
        check_adamw<decltype(tag)>(mode, true);
    });
}

// ---- refusals ----

TEST(Grad16DeathTest, AGradientOfAThirdDtypeIsRefused) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    auto backend = make_cpu_backend(OpMode::kFast);
    std::vector<bf16> x(12), y(12), z(12);
    std::vector<fp16> h(12);
    std::vector<int32_t> ids(12);
    std::vector<float> f(12), mean(3), rstd(3);
    EXPECT_DEATH(
        backend->matmul_backward({.dout = dview(x, {3, 4}),
                                  .inp = dview(y, {3, 3}),
                                  .weight = dview(z, {4, 3}),
                                  .dinp = {},
                                  .dweight = dview(h, {4, 3}),
                                  .dbias = {},
                                  .accumulate = Accumulate::kOverwrite}),
        "matmul_backward: dweight is fp16, but a parameter gradient is fp32 or the op's activation dtype bf16");
    EXPECT_DEATH(backend->matmul_backward({.dout = dview(x, {3, 4}),
                                           .inp = dview(y, {3, 3}),
                                           .weight = dview(z, {4, 3}),
                                           .dinp = {},
                                           .dweight = dview(z, {4, 3}),
                                           .dbias = dview(h, {4}),
                                           .accumulate = Accumulate::kOverwrite}),
                 "matmul_backward: dbias is fp16, but a parameter gradient is fp32 or the op's activation dtype bf16");
    EXPECT_DEATH(backend->layernorm_backward({.dout = dview(x, {3, 4}),
                                              .inp = dview(y, {3, 4}),
                                              .weight = dview(z, {4}),
                                              .mean = view(mean, {3}),
                                              .rstd = view(rstd, {3}),
                                              .dinp = dview(y, {3, 4}),
                                              .dweight = dview(z, {4}),
                                              .dbias = view(ids, {4}),
                                              .accumulate = Accumulate::kOverwrite}),
                 "layernorm_backward: dbias is int32, but a parameter gradient is fp32 or the op's activation dtype");
    EXPECT_DEATH(backend->embedding_backward({.tokens = view(ids, {3}),
                                              .dout = dview(x, {3, 4}),
                                              .dtable = dview(h, {3, 4}),
                                              .dpos = {},
                                              .vocab_start = 0,
                                              .T = 3}),
                 "embedding_backward: dtable is fp16, but a parameter gradient is fp32 or the op's activation dtype");
    // fp32 activations take fp32 gradients only.
    EXPECT_DEATH(backend->layernorm_backward({.dout = view(f, {3, 4}),
                                              .inp = view(f, {3, 4}),
                                              .weight = view(f, {4}),
                                              .mean = view(mean, {3}),
                                              .rstd = view(rstd, {3}),
                                              .dinp = view(f, {3, 4}),
                                              .dweight = dview(z, {4}),
                                              .dbias = view(f, {4}),
                                              .accumulate = Accumulate::kOverwrite}),
                 "layernorm_backward: dweight is bf16, but a parameter gradient is fp32 or the op's activation dtype "
                 "fp32");
    EXPECT_DEATH(backend->sum_squares(view(ids, {12})), "sum_squares: x is int32, but it takes gradients");
    EXPECT_DEATH(backend->adamw({.param = view(f, {12}),
                                 .grad = view(ids, {12}),
                                 .m = view(f, {12}),
                                 .v = view(f, {12}),
                                 .lr = 1e-3f,
                                 .beta1 = 0.9f,
                                 .beta2 = 0.95f,
                                 .eps = 1e-8f,
                                 .weight_decay = 0.0f,
                                 .grad_scale = 1.0f,
                                 .step = 1,
                                 .param_copy = {}}),
                 "adamw: grad is int32, but gradients are fp32, bf16 or fp16");
}

TEST(Grad16DeathTest, LmHeadLossRefusesAThirdDtypeForDwte) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    auto backend = make_cpu_backend(OpMode::kFast);
    std::vector<bf16> lnf(12), wte(20), dlnf(12);
    std::vector<fp16> dwte(20);
    std::vector<int32_t> targets(3);
    std::vector<float> dloss(3), losses(3), scratch(64);
    EXPECT_DEATH(backend->lm_head_loss({.lnf = dview(lnf, {3, 4}),
                                        .wte = dview(wte, {5, 4}),
                                        .targets = view(targets, {3}),
                                        .dloss = view(dloss, {3}),
                                        .losses = view(losses, {3}),
                                        .dlnf = dview(dlnf, {3, 4}),
                                        .dwte = dview(dwte, {5, 4}),
                                        .scratch = view(scratch, {64}),
                                        .vocab_start = 0,
                                        .vocab_valid_local = 5}),
                 "lm_head_loss: dwte is fp16, but a parameter gradient is fp32 or the op's activation dtype bf16");
}

}  // namespace
}  // namespace ms::test
