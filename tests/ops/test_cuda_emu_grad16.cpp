// test_cuda_emu_grad16.cpp: 16-bit parameter gradients on the CUDA backend (the "cuda-emulated" build: the kernel
// sources on the CPU), the precision contract of engine/backends/backend.h: a parameter gradient (dweight, dbias,
// dtable, dpos, dwte) is fp32 or the activation dtype D, and a D gradient becomes from_float<D>(old + c) once per call
// (lm_head_loss: once per chunk of rows), c being what the same call adds into an fp32 gradient that starts at 0.
//
// For D = bf16 and fp16 each op runs twice on the same inputs: with fp32 gradients from 0, which gives c, and with D
// gradients holding random old values; the D gradients must equal from_float<D>(old + c) bit for bit, and every other
// output (dinp, dlnf, losses) must be the fp32-gradient run's bits. lm_head_loss's chunks: c of each chunk is the
// op on that chunk's rows alone (the same kernels on the same rows), the D gradient rounded after each chunk in turn.
// AdamW reads a bf16 / fp16 gradient as its fp32 widening: the same bits as the fp32 gradient holding those values.
// sum_squares of a 16-bit gradient: values k / 8, whose squares and sums are exact in double, compared with ==.
//
// What this covers: the emulation's matmul.cu tiled kernel for dweight (its G = D output rounds acc + old once) and
// matmul.cu's dbias kernel. On a GPU the products run on cuBLASLt (cublas_gemm.cpp): a D dweight is a D C with beta 1,
// a D dbias is BGRADB's fp32 column sums added by add_to_gradient (tested here on the emulation) or the fallback's
// GemmEx with a D C and beta 1, all the same definition; the equality with an fp32 run's c there holds up to the
// algorithm cuBLASLt picks for each C dtype (summation order), which only a GPU can check (tests/gpu).
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

#include "engine/backends/cuda/cuda_backend.h"
#include "engine/backends/cuda/kernels/matmul.cuh"
#include "engine/core/half.h"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

std::unique_ptr<Backend> make_cuda() {
    BackendOptions o;
    o.kind = BackendKind::kCUDA;
    return make_backend_with_cuda(o);
}

template <class S>
Tensor tview(std::vector<S>& v, std::initializer_list<int64_t> dims) {
    return Tensor(v.data(), dtype_of<S>(), dims);
}

// v converted to S, each element rounded once (from_float).
template <class S>
std::vector<S> to(const std::vector<float>& v) {
    std::vector<S> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = from_float<S>(v[i]);
    return out;
}

template <class S>
std::vector<float> widen(const std::vector<S>& v) {
    std::vector<float> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = to_float(v[i]);
    return out;
}

template <class S>
bool same_bits(const std::vector<S>& a, const std::vector<S>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(S)) == 0;
}

// from_float<D>(old + c) element by element: the contract's value of a D gradient after one call.
template <class D>
std::vector<D> once_rounded(const std::vector<D>& old, const std::vector<float>& c) {
    std::vector<D> out(old.size());
    for (size_t i = 0; i < old.size(); ++i) out[i] = from_float<D>(to_float(old[i]) + c[i]);
    return out;
}

// The D gradient after the call vs the contract's value; counts the mismatches, and the elements where the old value
// changed at all (so that a test whose c rounds away to nothing cannot pass vacuously).
template <class D>
void expect_once_rounded(const char* what, const std::vector<D>& got, const std::vector<D>& old,
                         const std::vector<float>& c) {
    const std::vector<D> want = once_rounded(old, c);
    ASSERT_EQ(got.size(), want.size());
    size_t wrong = 0, changed = 0, first = got.size();
    for (size_t i = 0; i < got.size(); ++i) {
        if (std::memcmp(&got[i], &want[i], sizeof(D)) != 0 && wrong++ == 0) first = i;
        if (std::memcmp(&want[i], &old[i], sizeof(D)) != 0) ++changed;
    }
    EXPECT_EQ(wrong, 0u) << what << " " << dtype_name(dtype_of<D>()) << ": first at " << first << ", got "
                         << (first < got.size() ? to_float(got[first]) : 0.0f) << " want "
                         << (first < got.size() ? to_float(want[first]) : 0.0f);
    EXPECT_GT(changed, got.size() / 2) << what << ": the contribution changed too few elements to test anything";
}

// ---- matmul_backward: dweight and dbias, with and without dbias, plain and through gelu_inp ----

template <class D>
void check_matmul() {
    const int64_t N = 37, K = 29, M = 23;  // no multiple of the 16-wide tiles
    auto cuda = make_cuda();
    std::vector<D> dout = to<D>(random_floats(N * M, 1)), inp = to<D>(random_floats(N * K, 2)),
                   weight = to<D>(random_floats(M * K, 3)), gelu_inp = to<D>(random_floats(N * K, 4, -3.0f, 3.0f));
    const std::vector<D> old_w = to<D>(random_floats(M * K, 5)), old_b = to<D>(random_floats(M, 6, -4.0f, 4.0f));
    for (bool with_bias : {true, false}) {
        for (bool with_gelu : {false, true}) {
            SCOPED_TRACE(testing::Message() << "dbias " << with_bias << ", gelu_inp " << with_gelu);
            const Accumulate acc = with_gelu ? Accumulate::kOverwrite : Accumulate::kAdd;
            // c: fp32 gradients from 0
            std::vector<float> c_w(M * K, 0.0f), c_b(M, 0.0f);
            std::vector<D> dinp_f32(N * K, from_float<D>(0.5f));
            cuda->matmul_backward({.dout = tview(dout, {N, M}),
                                   .inp = tview(inp, {N, K}),
                                   .weight = tview(weight, {M, K}),
                                   .dinp = tview(dinp_f32, {N, K}),
                                   .dweight = tview(c_w, {M, K}),
                                   .dbias = with_bias ? tview(c_b, {M}) : Tensor{},
                                   .accumulate = acc,
                                   .gelu_inp = with_gelu ? tview(gelu_inp, {N, K}) : Tensor{}});
            // D gradients holding old values
            std::vector<D> dw = old_w, db = old_b, dinp(N * K, from_float<D>(0.5f));
            cuda->matmul_backward({.dout = tview(dout, {N, M}),
                                   .inp = tview(inp, {N, K}),
                                   .weight = tview(weight, {M, K}),
                                   .dinp = tview(dinp, {N, K}),
                                   .dweight = tview(dw, {M, K}),
                                   .dbias = with_bias ? tview(db, {M}) : Tensor{},
                                   .accumulate = acc,
                                   .gelu_inp = with_gelu ? tview(gelu_inp, {N, K}) : Tensor{}});
            cuda->synchronize();
            expect_once_rounded("matmul dweight", dw, old_w, c_w);
            if (with_bias) {
                expect_once_rounded("matmul dbias", db, old_b, c_b);
            } else {
                EXPECT_TRUE(same_bits(db, old_b)) << "dbias undefined, yet its buffer changed";
            }
            EXPECT_TRUE(same_bits(dinp, dinp_f32)) << "dinp depends on the gradients' dtype";
        }
    }
}

MS_OP_TEST(CudaEmuGrad16, MatmulBackwardRoundsOldPlusContributionOnce, kContract, OpKind::kMatmulBackward) {
    check_matmul<bf16>();
    check_matmul<fp16>();
}

// ---- layernorm_backward ----

template <class D>
void check_layernorm(int64_t N, int64_t C) {
    SCOPED_TRACE(testing::Message() << "N " << N << ", C " << C);
    auto cuda = make_cuda();
    std::vector<D> inp = to<D>(random_floats(N * C, 1, -2.0f, 2.0f)), weight = to<D>(random_floats(C, 2)),
                   bias = to<D>(random_floats(C, 3)), out(N * C), dout = to<D>(random_floats(N * C, 4));
    std::vector<float> mean(N), rstd(N);
    cuda->layernorm_forward({.inp = tview(inp, {N, C}),
                             .weight = tview(weight, {C}),
                             .bias = tview(bias, {C}),
                             .out = tview(out, {N, C}),
                             .mean = tview(mean, {N}),
                             .rstd = tview(rstd, {N}),
                             .eps = 1e-5f});
    const std::vector<D> old_w = to<D>(random_floats(C, 5, -8.0f, 8.0f)),
                         old_b = to<D>(random_floats(C, 6, -8.0f, 8.0f));
    auto run = [&](Tensor dw, Tensor db, std::vector<D>& dinp) {
        cuda->layernorm_backward({.dout = tview(dout, {N, C}),
                                  .inp = tview(inp, {N, C}),
                                  .weight = tview(weight, {C}),
                                  .mean = tview(mean, {N}),
                                  .rstd = tview(rstd, {N}),
                                  .dinp = tview(dinp, {N, C}),
                                  .dweight = dw,
                                  .dbias = db,
                                  .accumulate = Accumulate::kAdd});
        cuda->synchronize();
    };
    std::vector<float> c_w(C, 0.0f), c_b(C, 0.0f);
    std::vector<D> dinp_f32 = to<D>(random_floats(N * C, 7)), dinp = dinp_f32;
    run(tview(c_w, {C}), tview(c_b, {C}), dinp_f32);
    std::vector<D> dw = old_w, db = old_b;
    run(tview(dw, {C}), tview(db, {C}), dinp);
    expect_once_rounded("layernorm dweight", dw, old_w, c_w);
    expect_once_rounded("layernorm dbias", db, old_b, c_b);
    EXPECT_TRUE(same_bits(dinp, dinp_f32)) << "dinp depends on the gradients' dtype";
}

MS_OP_TEST(CudaEmuGrad16, LayerNormBackwardRoundsOldPlusContributionOnce, kContract, OpKind::kLayerNormBackward) {
    // C = 45: the scalar kernels; C = 64: the packed ones (pack.cuh); N = 150: three chunks of partial sums
    for (const auto& [N, C] : {std::pair<int64_t, int64_t>{19, 45}, {150, 64}}) {
        check_layernorm<bf16>(N, C);
        check_layernorm<fp16>(N, C);
    }
}

// ---- embedding_backward: dtable (vocab_start != 0, tokens outside the shard) and dpos ----

template <class D>
void check_embedding() {
    const int64_t T = 7, N = 3 * T, C = 150, V_local = 70, vocab_start = 5;  // two column blocks, two row slices
    auto cuda = make_cuda();
    std::vector<int32_t> tokens = random_ints(N, 1, 0, 84);  // some below and above [5, 75)
    for (int64_t n = 0; n < 6; ++n) tokens[n] = 9;           // a row several tokens add to
    std::vector<D> dout = to<D>(random_floats(N * C, 2));
    const std::vector<D> old_t = to<D>(random_floats(V_local * C, 3)), old_p = to<D>(random_floats(T * C, 4));
    std::vector<float> c_t(V_local * C, 0.0f), c_p(T * C, 0.0f);
    cuda->embedding_backward({.tokens = tview(tokens, {N}),
                              .dout = tview(dout, {N, C}),
                              .dtable = tview(c_t, {V_local, C}),
                              .dpos = tview(c_p, {T, C}),
                              .vocab_start = vocab_start,
                              .T = T});
    std::vector<D> dt = old_t, dp = old_p;
    cuda->embedding_backward({.tokens = tview(tokens, {N}),
                              .dout = tview(dout, {N, C}),
                              .dtable = tview(dt, {V_local, C}),
                              .dpos = tview(dp, {T, C}),
                              .vocab_start = vocab_start,
                              .T = T});
    cuda->synchronize();
    // rows no token names get c = 0: from_float(old + 0) is old, so they are checked too
    const std::vector<D> want_t = once_rounded(old_t, c_t);
    EXPECT_TRUE(same_bits(dt, want_t)) << "embedding dtable " << dtype_name(dtype_of<D>());
    expect_once_rounded("embedding dpos", dp, old_p, c_p);
    size_t touched = 0;
    for (size_t i = 0; i < dt.size(); ++i) touched += std::memcmp(&dt[i], &old_t[i], sizeof(D)) != 0;
    EXPECT_GT(touched, static_cast<size_t>(5 * C)) << "too few dtable rows changed to test anything";
}

MS_OP_TEST(CudaEmuGrad16, EmbeddingBackwardRoundsOldPlusContributionOnce, kContract, OpKind::kEmbeddingBackward) {
    check_embedding<bf16>();
    check_embedding<fp16>();
}

// ---- lm_head_loss: dwte rounded once per chunk of rows ----

template <class D>
struct LmHead {
    int64_t N = 13, C = 24, Vp = 40, valid = 37;
    std::vector<D> lnf, wte;
    std::vector<int32_t> targets;
    std::vector<float> dloss;
    LmHead()
        : lnf(to<D>(random_floats(N * C, 1, -2.0f, 2.0f))),
          wte(to<D>(random_floats(Vp * C, 2))),
          targets(random_ints(N, 3, 0, 36)),
          dloss(N, 1.0f / 13) {}

    // The op on rows [r0, r0 + rows) in chunks of chunk_rows, dwte (fp32 or D) accumulated; losses and dlnf of
    // those rows returned through the out-parameters.
    template <class G>
    void run(Backend& be, int64_t r0, int64_t rows, int64_t chunk_rows, std::vector<G>& dwte,
             std::vector<float>& losses, std::vector<D>& dlnf) {
        const DType d = dtype_of<D>();
        std::vector<float> scratch(lm_head_loss_scratch_elems(BackendKind::kCUDA, d, rows, Vp, chunk_rows));
        losses.assign(rows, 0.0f);
        dlnf.assign(rows * C, D{});
        be.lm_head_loss({.lnf = Tensor(lnf.data() + r0 * C, d, {rows, C}),
                         .wte = tview(wte, {Vp, C}),
                         .targets = Tensor::i32(targets.data() + r0, {rows}),
                         .dloss = Tensor::f32(dloss.data() + r0, {rows}),
                         .losses = tview(losses, {rows}),
                         .dlnf = tview(dlnf, {rows, C}),
                         .dwte = tview(dwte, {Vp, C}),
                         .scratch = tview(scratch, {static_cast<int64_t>(scratch.size())}),
                         .vocab_start = 0,
                         .vocab_valid_local = valid,
                         .chunk_rows = chunk_rows});
        be.synchronize();
    }
};

template <class D>
void check_lm_head_loss(int64_t chunk_rows) {
    SCOPED_TRACE(testing::Message() << "chunk_rows " << chunk_rows);
    auto cuda = make_cuda();
    LmHead<D> h;
    const std::vector<D> old = to<D>(random_floats(h.Vp * h.C, 4, -0.05f, 0.05f));
    std::vector<float> losses_f32, losses;
    std::vector<D> dlnf_f32, dlnf;
    std::vector<float> dwte_f32(h.Vp * h.C, 0.0f);
    h.run(*cuda, 0, h.N, chunk_rows, dwte_f32, losses_f32, dlnf_f32);
    std::vector<D> dwte = old;
    h.run(*cuda, 0, h.N, chunk_rows, dwte, losses, dlnf);
    EXPECT_TRUE(bit_identical(losses, losses_f32)) << "losses depend on dwte's dtype";
    EXPECT_TRUE(same_bits(dlnf, dlnf_f32)) << "dlnf depends on dwte's dtype";
    // The contract, chunk by chunk: c_k is the op on chunk k's rows alone with an fp32 dwte from 0.
    std::vector<D> want = old;
    for (int64_t r0 = 0; r0 < h.N; r0 += chunk_rows) {
        const int64_t rows = std::min(chunk_rows, h.N - r0);
        std::vector<float> c(h.Vp * h.C, 0.0f), l;
        std::vector<D> dx;
        h.run(*cuda, r0, rows, rows, c, l, dx);
        want = once_rounded(want, c);
    }
    EXPECT_TRUE(same_bits(dwte, want)) << "lm_head_loss dwte " << dtype_name(dtype_of<D>());
    if (chunk_rows >= h.N) expect_once_rounded("lm_head_loss dwte", dwte, old, dwte_f32);
}

MS_OP_TEST(CudaEmuGrad16, LmHeadLossRoundsDwteOncePerChunk, kContract, OpKind::kLmHeadLoss) {
    for (int64_t chunk_rows : {int64_t{13}, int64_t{4}}) {  // one chunk; four chunks (4, 4, 4, 1 rows)
        check_lm_head_loss<bf16>(chunk_rows);
        check_lm_head_loss<fp16>(chunk_rows);
    }
}

// ---- the optimizer's side: adamw and sum_squares on 16-bit gradients ----

template <class G>
void check_adamw(bool with_copy) {
    SCOPED_TRACE(testing::Message() << "grad " << dtype_name(dtype_of<G>()) << ", param_copy " << with_copy);
    const int64_t n = 1037;
    auto cuda = make_cuda();
    std::vector<G> grad = to<G>(random_floats(n, 1, -3.0f, 3.0f));
    std::vector<float> grad_f32 = widen(grad);
    const std::vector<float> param0 = random_floats(n, 2), m0 = random_floats(n, 3, -0.1f, 0.1f),
                             v0 = random_floats(n, 4, 0.0f, 0.01f);
    struct State {
        std::vector<float> param, m, v;
        std::vector<bf16> copy;
    };
    auto step = [&](Tensor g) {
        State s{param0, m0, v0, std::vector<bf16>(n)};
        cuda->adamw({.param = tview(s.param, {n}),
                     .grad = g,
                     .m = tview(s.m, {n}),
                     .v = tview(s.v, {n}),
                     .lr = 1e-3f,
                     .beta1 = 0.9f,
                     .beta2 = 0.95f,
                     .eps = 1e-8f,
                     .weight_decay = 0.1f,
                     .grad_scale = 0.75f,
                     .step = 3,
                     .param_copy = with_copy ? tview(s.copy, {n}) : Tensor{}});
        cuda->synchronize();
        return s;
    };
    const State a = step(tview(grad, {n})), b = step(tview(grad_f32, {n}));
    EXPECT_TRUE(bit_identical(a.param, b.param));
    EXPECT_TRUE(bit_identical(a.m, b.m));
    EXPECT_TRUE(bit_identical(a.v, b.v));
    EXPECT_TRUE(same_bits(a.copy, b.copy));
    EXPECT_FALSE(bit_identical(a.param, param0)) << "the step changed nothing";
}

MS_OP_TEST(CudaEmuGrad16, AdamWReadsA16BitGradientAsItsFp32Widening, kExact, OpKind::kAdamW) {
    for (bool with_copy : {false, true}) {
        check_adamw<bf16>(with_copy);
        check_adamw<fp16>(with_copy);
    }
}

template <class G>
void check_sum_squares() {
    const int64_t n = (1 << 17) + 333;  // three of the kernel's chunks
    auto cuda = make_cuda();
    std::vector<G> x(n);
    double want = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const float v = static_cast<float>(i % 129 - 64) / 8.0f;  // k / 8, exact in bf16 and fp16
        x[i] = from_float<G>(v);
        want += static_cast<double>(v) * v;  // every partial sum a multiple of 1/64 below 2^40: exact
    }
    EXPECT_EQ(cuda->sum_squares(tview(x, {n})), want) << dtype_name(dtype_of<G>());
}

MS_OP_TEST(CudaEmuGrad16, SumSquaresOf16BitGradientsIsExact, kExact, OpKind::kSumSquares) {
    check_sum_squares<bf16>();
    check_sum_squares<fp16>();
}

// add_to_gradient: the GPU path's addition of cuBLASLt's fp32 bias gradient to a 16-bit dbias (cublas_gemm.cpp).
template <class G>
void check_add_to_gradient() {
    const int n = 333;
    const std::vector<G> old = to<G>(random_floats(n, 1));
    const std::vector<float> c = random_floats(n, 2, -0.1f, 0.1f);
    std::vector<G> g = old;
    cuda::add_to_gradient(g.data(), c.data(), n, nullptr);
    expect_once_rounded("add_to_gradient", g, old, c);
}

TEST(CudaEmuGrad16, AddToGradientRoundsOnce) {
    check_add_to_gradient<bf16>();
    check_add_to_gradient<fp16>();
    std::vector<float> g = random_floats(100, 3), c = random_floats(100, 4), want(100);
    for (size_t i = 0; i < g.size(); ++i) want[i] = g[i] + c[i];
    cuda::add_to_gradient(g.data(), c.data(), 100, nullptr);
    EXPECT_TRUE(bit_identical(g, want));
}

// ---- refusals: an op's gradients of two dtypes (one neither fp32 nor D: test_cuda_emu_mixed.cpp) ----

TEST(CudaEmuGrad16DeathTest, GradientsOfTwoDtypesAreRefused) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    auto cuda = make_cuda();
    std::vector<bf16> x(12), y(12), z(12);
    std::vector<float> f(4);
    EXPECT_DEATH(cuda->matmul_backward({.dout = tview(x, {3, 4}),
                                        .inp = tview(y, {3, 3}),
                                        .weight = tview(z, {4, 3}),
                                        .dinp = {},
                                        .dweight = tview(z, {4, 3}),
                                        .dbias = tview(f, {4}),
                                        .accumulate = Accumulate::kOverwrite}),
                 "matmul: dbias is fp32 but dweight is bf16: an op's parameter gradients share one dtype");
}

}  // namespace
}  // namespace ms::test
