// test_cuda_emu_ops.cpp: the CUDA kernels for the loss, the embedding, the gradient norm, attention and the Linear
// layer, run on the CPU emulation (engine/backends/cuda/emu/cuda_emu.h) against their CPU twins in OpMode::kReference.
//
// As in test_cuda_emu.cpp: shapes that are not multiples of any block, guarded output buffers, determinism (two
// runs bit-identical), and scale-free errors (max |cuda - cpu| / max |cpu|) with tolerances set from the values
// MS_OP_TEST_VERBOSE=1 prints. The CPU reference works in double, the kernels mostly in float.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

#include "engine/backends/cuda/kernels/attention.cuh"
#include "engine/backends/cuda/kernels/cross_entropy.cuh"
#include "engine/backends/cuda/kernels/embedding.cuh"
#include "engine/backends/cuda/kernels/matmul.cuh"
#include "engine/backends/cuda/kernels/sum_squares.cuh"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

const cudaStream_t kStream = nullptr;  // the kernels run synchronously on the emulation

void expect_close(const char* what, double err, double tol) {
    if (std::getenv("MS_OP_TEST_VERBOSE")) std::printf("  %-32s err %.2e (tol %.0e)\n", what, err, tol);
    EXPECT_LE(err, tol) << what;
}

// ---- cross-entropy ----

struct CrossEntropyCase {
    int N, Vp, valid;
    int64_t vocab_start;
};

TEST(CudaEmuKernels, CrossEntropyMatchesTheCpuReferenceAndIsDeterministic) {
    // Vp = 300: a partial stride of 256 threads and a masked tail; 777 columns, all valid, on a shard at 1000;
    // valid = 0: a shard that is all padding.
    for (const CrossEntropyCase& s :
         {CrossEntropyCase{37, 300, 290, 0}, CrossEntropyCase{5, 777, 777, 1000}, CrossEntropyCase{3, 40, 0, 0}}) {
        const int N = s.N, Vp = s.Vp;
        SCOPED_TRACE(testing::Message() << "N " << N << " Vp " << Vp << " valid " << s.valid);
        auto logits = random_floats(N * Vp, 1, -8.0f, 8.0f);
        // Targets inside the shard, in its padded tail, and on other shards.
        auto targets = random_ints(N, 2, 0, static_cast<int32_t>(s.vocab_start + Vp + 50));
        auto dloss = random_floats(N, 3, 0.01f, 0.1f);
        auto cpu = make_cpu_backend(OpMode::kReference);
        std::vector<float> max_ref(N), sum_ref(N), target_ref(N);
        CrossEntropyForwardArgs fa{.logits = view(logits, {N, Vp}),
                                   .targets = view(targets, {N}),
                                   .row_max = view(max_ref, {N}),
                                   .sum_exp = view(sum_ref, {N}),
                                   .target_logit = view(target_ref, {N}),
                                   .vocab_start = s.vocab_start,
                                   .vocab_valid_local = s.valid,
                                   .phase = CrossEntropyPhase::kMax};
        cpu->cross_entropy_forward(fa);
        fa.phase = CrossEntropyPhase::kSumExp;
        cpu->cross_entropy_forward(fa);
        auto dlogits_ref = logits;
        cpu->cross_entropy_backward({.logits = view(dlogits_ref, {N, Vp}),
                                     .targets = view(targets, {N}),
                                     .row_max = view(max_ref, {N}),
                                     .sum_exp = view(sum_ref, {N}),
                                     .dloss = view(dloss, {N}),
                                     .vocab_start = s.vocab_start,
                                     .vocab_valid_local = s.valid});

        std::vector<float> first_sum, first_dlogits;
        for (int run = 0; run < 2; ++run) {
            Guarded row_max(N, NAN), sum_exp(N, NAN), target_logit(N, NAN);
            cuda::cross_entropy_forward(row_max.data(), nullptr, nullptr, logits.data(), nullptr, N, Vp, s.vocab_start,
                                        s.valid, cuda::CrossEntropyPhase::kMax, kStream);
            // The max is exact: the same floats, compared.
            EXPECT_TRUE(bit_identical(row_max.values(), max_ref));
            cuda::cross_entropy_forward(row_max.data(), sum_exp.data(), target_logit.data(), logits.data(),
                                        targets.data(), N, Vp, s.vocab_start, s.valid, cuda::CrossEntropyPhase::kSumExp,
                                        kStream);
            EXPECT_TRUE(bit_identical(target_logit.values(), target_ref));
            // Measured 7.2e-8: float sums of 2-4 exps per thread, then a 256-lane tree.
            expect_close("cross_entropy sum_exp", max_rel_error(sum_exp.values(), sum_ref), 1e-6);
            // Both pieces in one read (an online max; each thread's sum rescaled as its max grows): the same max and
            // target logit, the sum to the same tolerance (measured 7.2e-8).
            Guarded max1(N, NAN), sum1(N, NAN), target1(N, NAN);
            cuda::cross_entropy_forward(max1.data(), sum1.data(), target1.data(), logits.data(), targets.data(), N, Vp,
                                        s.vocab_start, s.valid, cuda::CrossEntropyPhase::kMaxSumExp, kStream);
            EXPECT_TRUE(bit_identical(max1.values(), max_ref));
            EXPECT_TRUE(bit_identical(target1.values(), target_ref));
            expect_close("cross_entropy max+sum_exp sum", max_rel_error(sum1.values(), sum_ref), 1e-6);
            EXPECT_TRUE(max1.guards_intact() && sum1.guards_intact() && target1.guards_intact());
            Guarded dlogits(logits);
            cuda::cross_entropy_backward(dlogits.data(), targets.data(), max_ref.data(), sum_ref.data(), dloss.data(),
                                         N, Vp, s.vocab_start, s.valid, kStream);
            // Measured 4.8e-9: one expf and one product per element in float.
            expect_close("cross_entropy dlogits", max_rel_error(dlogits.values(), dlogits_ref), 1e-6);
            const std::vector<float> d = dlogits.values();
            for (int n = 0; n < N; ++n) {
                for (int j = s.valid; j < Vp; ++j) ASSERT_EQ(d[n * Vp + j], 0.0f) << "masked column " << j;
            }
            EXPECT_TRUE(row_max.guards_intact() && sum_exp.guards_intact() && target_logit.guards_intact() &&
                        dlogits.guards_intact());
            if (run == 0) {
                first_sum = sum_exp.values();
                first_dlogits = d;
            } else {
                EXPECT_TRUE(bit_identical(sum_exp.values(), first_sum));
                EXPECT_TRUE(bit_identical(d, first_dlogits));
            }
        }
    }
}

// ---- embedding ----

struct EmbeddingCase {
    int B, T, C, V_local;
    int64_t vocab_start;
};

TEST(CudaEmuKernels, EmbeddingMatchesTheCpuBitForBit) {
    // The backward's blocks own 64-row vocabulary slices and walk the tokens in rounds of 512. 1100 local rows: 18
    // slices, the last partial; C = 53, 70 and 200: partial column blocks; 185 tokens: one partial round; 1200
    // tokens: three rounds, the last partial, with half of them on five rows of the first slice and more on the rows
    // either side of the slices' boundary at 64 (text is skewed so: frequent tokens share the low ids); tokens from
    // other shards on both sides.
    for (const EmbeddingCase& s :
         {EmbeddingCase{5, 37, 53, 1100, 0}, EmbeddingCase{3, 7, 200, 40, 30}, EmbeddingCase{4, 300, 70, 700, 100}}) {
        const int N = s.B * s.T, C = s.C, V = s.V_local, T = s.T;
        SCOPED_TRACE(testing::Message() << "N " << N << " C " << C << " V_local " << V);
        // Few distinct ids so that rows repeat and their sums have many terms.
        auto tokens = random_ints(N, 1, 0, static_cast<int32_t>(s.vocab_start + V + 20));
        if (V > 100 && N < 512) {
            for (int n = 0; n < N; n += 3) tokens[n] = 1050 + n % 7;  // a later slice
        }
        if (N >= 512) {
            for (int n = 0; n < N; n += 2) tokens[n] = static_cast<int32_t>(s.vocab_start) + n % 5;
            for (int n = 1; n < N; n += 6) tokens[n] = static_cast<int32_t>(s.vocab_start) + 63 + n % 2;
        }
        auto table = random_floats(static_cast<size_t>(V) * C, 2), pos = random_floats(T * C, 3);
        auto dout = random_floats(N * C, 4);
        const auto dtable0 = random_floats(static_cast<size_t>(V) * C, 5), dpos0 = random_floats(T * C, 6);
        auto cpu = make_cpu_backend(OpMode::kReference);
        for (bool with_pos : {false, true}) {
            std::vector<float> out_ref(N * C);
            cpu->embedding_forward({.tokens = view(tokens, {N}),
                                    .table = view(table, {V, C}),
                                    .pos = with_pos ? view(pos, {T, C}) : Tensor{},
                                    .out = view(out_ref, {N, C}),
                                    .vocab_start = s.vocab_start,
                                    .T = T});
            Guarded out(N * C, NAN);
            cuda::embedding_forward(out.data(), tokens.data(), table.data(), with_pos ? pos.data() : nullptr, N, C, V,
                                    s.vocab_start, T, kStream);
            EXPECT_TRUE(bit_identical(out.values(), out_ref)) << "pos " << with_pos;
            EXPECT_TRUE(out.guards_intact());

            auto dtable_ref = dtable0, dpos_ref = dpos0;
            cpu->embedding_backward({.tokens = view(tokens, {N}),
                                     .dout = view(dout, {N, C}),
                                     .dtable = view(dtable_ref, {V, C}),
                                     .dpos = with_pos ? view(dpos_ref, {T, C}) : Tensor{},
                                     .vocab_start = s.vocab_start,
                                     .T = T});
            Guarded dtable(dtable0), dpos(dpos0);
            cuda::embedding_backward(dtable.data(), with_pos ? dpos.data() : nullptr, tokens.data(), dout.data(), N, C,
                                     V, s.vocab_start, T, kStream);
            // Every element is summed in the CPU's order, so the bits agree (and so two runs do).
            EXPECT_TRUE(bit_identical(dtable.values(), dtable_ref)) << "pos " << with_pos;
            EXPECT_TRUE(bit_identical(dpos.values(), dpos_ref)) << "pos " << with_pos;  // untouched without pos
            EXPECT_TRUE(dtable.guards_intact() && dpos.guards_intact());
        }
    }
}

// ---- sum of squares ----

TEST(CudaEmuKernels, SumSquaresMatchesTheCpuReferenceAndIsDeterministic) {
    // 0 and 1 elements, a partial block, and 2.5 chunks of 65536.
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1001}, int64_t{163840}}) {
        SCOPED_TRACE(testing::Message() << "n " << n);
        auto x = random_floats(static_cast<size_t>(n), 1, -3.0f, 3.0f);
        const double expected = make_cpu_backend(OpMode::kReference)->sum_squares(Tensor::f32(x.data(), {n}));
        long double exact = 0.0L;  // the reference's single running double sum is itself off by up to 2.3e-13 here
        for (float v : x) exact += static_cast<long double>(v) * v;
        std::vector<double> scratch(cuda::sum_squares_scratch_doubles(n) + 1, NAN);
        double first = 0.0;
        for (int run = 0; run < 2; ++run) {
            double out = NAN;
            cuda::sum_squares(&out, scratch.data(), x.data(), n, kStream);
            // Measured 1.3e-13 against the CPU reference and 7.7e-16 against the long-double sum: the kernel's
            // chunked, 256-lane sums round less than the reference's one running sum of 163840 terms.
            expect_close("sum_squares vs cpu", std::fabs(out - expected) / std::max(expected, 1e-300), 1e-12);
            expect_close("sum_squares vs long double",
                         static_cast<double>(std::fabs(out - exact) / std::max(exact, 1e-300L)), 1e-14);
            if (run == 0) {
                first = out;
            } else {
                EXPECT_EQ(out, first);
            }
        }
        EXPECT_TRUE(std::isnan(scratch.back()));  // the scratch it asked for was enough
    }
}

// ---- attention ----

struct AttentionCase {
    int B, T, NH, HS;
};

TEST(CudaEmuKernels, AttentionMatchesTheCpuReferenceAndIsDeterministic) {
    // T = 37: three query/key tiles of 16, the last partial; HS = 24: a head size that is not a multiple of the
    // 16-thread tile row; HS = 64: the widest head the tiles hold; T = 5: a single partial tile.
    for (const AttentionCase& s :
         {AttentionCase{2, 37, 3, 24}, AttentionCase{1, 20, 2, 64}, AttentionCase{3, 5, 1, 8}}) {
        const int B = s.B, T = s.T, NH = s.NH, HS = s.HS, C = NH * HS;
        SCOPED_TRACE(testing::Message() << "B " << B << " T " << T << " NH " << NH << " HS " << HS);
        auto qkv = random_floats(B * T * 3 * C, 1, -2.0f, 2.0f), dout = random_floats(B * T * C, 2);
        auto cpu = make_cpu_backend(OpMode::kReference);
        std::vector<float> out_ref(B * T * C), lse_ref(B * NH * T), dqkv_ref(B * T * 3 * C);
        cpu->attention_forward({.qkv = view(qkv, {B, T, 3 * C}),
                                .out = view(out_ref, {B, T, C}),
                                .lse = view(lse_ref, {B, NH, T}),
                                .NH = NH});
        cpu->attention_backward({.dout = view(dout, {B, T, C}),
                                 .qkv = view(qkv, {B, T, 3 * C}),
                                 .out = view(out_ref, {B, T, C}),
                                 .lse = view(lse_ref, {B, NH, T}),
                                 .dqkv = view(dqkv_ref, {B, T, 3 * C}),
                                 .NH = NH});
        std::vector<float> first_out, first_dqkv;
        for (int run = 0; run < 2; ++run) {
            Guarded out(B * T * C, NAN), lse(B * NH * T, NAN), dqkv(B * T * 3 * C, NAN);
            cuda::attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, HS, kStream);
            // Measured up to 4.2e-7 (out) and 1.4e-7 (lse): float dot products of HS terms and float online sums.
            expect_close("attention out", max_rel_error(out.values(), out_ref), 2e-6);
            expect_close("attention lse", max_rel_error(lse.values(), lse_ref), 2e-6);
            // The CPU's out and lse, so that only the backward is compared; dqkv starts as NaN: all of it is written.
            cuda::attention_backward(dqkv.data(), dout.data(), qkv.data(), out_ref.data(), lse_ref.data(), B, T, NH, HS,
                                     kStream);
            // Measured up to 3.5e-7: P recomputed in float from the saved lse, then float sums over T keys/queries.
            expect_close("attention dqkv", max_rel_error(dqkv.values(), dqkv_ref), 2e-6);
            EXPECT_TRUE(out.guards_intact() && lse.guards_intact() && dqkv.guards_intact());
            if (run == 0) {
                first_out = out.values();
                first_dqkv = dqkv.values();
            } else {
                EXPECT_TRUE(bit_identical(out.values(), first_out));
                EXPECT_TRUE(bit_identical(dqkv.values(), first_dqkv));
            }
        }
    }
}

// ---- matmul ----

struct MatmulCase {
    int N, K, M;
};

TEST(CudaEmuKernels, MatmulMatchesTheCpuReferenceAndIsDeterministic) {
    // No dimension a multiple of the 16 x 16 tiles; K = 5 is shorter than one inner tile.
    for (const MatmulCase& s : {MatmulCase{37, 53, 29}, MatmulCase{20, 5, 70}}) {
        const int N = s.N, K = s.K, M = s.M;
        SCOPED_TRACE(testing::Message() << "N " << N << " K " << K << " M " << M);
        auto inp = random_floats(N * K, 1), weight = random_floats(M * K, 2), bias = random_floats(M, 3);
        auto dout = random_floats(N * M, 4);
        const auto dinp0 = random_floats(N * K, 5), dweight0 = random_floats(M * K, 6), dbias0 = random_floats(M, 7);
        auto cpu = make_cpu_backend(OpMode::kReference);
        for (bool with_bias : {false, true}) {
            std::vector<float> out_ref(N * M);
            cpu->matmul_forward({.inp = view(inp, {N, K}),
                                 .weight = view(weight, {M, K}),
                                 .bias = with_bias ? view(bias, {M}) : Tensor{},
                                 .out = view(out_ref, {N, M})});
            Guarded out(N * M, NAN);
            cuda::matmul_forward(out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr, N, K, M,
                                 kStream);
            EXPECT_TRUE(out.guards_intact());
            // Measured up to 3.3e-7: one float dot product of K terms per element.
            expect_close("matmul out", max_rel_error(out.values(), out_ref), 1e-6);
        }
        std::vector<float> dweight_full;  // dweight of the full backward, for the one without dinp and dbias
        for (Accumulate acc : {Accumulate::kOverwrite, Accumulate::kAdd}) {
            const bool add = acc == Accumulate::kAdd;
            std::vector<float> dinp_ref = add ? dinp0 : std::vector<float>(N * K), dweight_ref = dweight0,
                               dbias_ref = dbias0;
            cpu->matmul_backward({.dout = view(dout, {N, M}),
                                  .inp = view(inp, {N, K}),
                                  .weight = view(weight, {M, K}),
                                  .dinp = view(dinp_ref, {N, K}),
                                  .dweight = view(dweight_ref, {M, K}),
                                  .dbias = view(dbias_ref, {M}),
                                  .accumulate = acc});
            std::vector<float> first_dinp, first_dweight;
            for (int run = 0; run < 2; ++run) {
                Guarded dinp = add ? Guarded(dinp0) : Guarded(N * K, NAN);  // kOverwrite must not read dinp
                Guarded dweight(dweight0), dbias(dbias0);
                cuda::matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(),
                                      N, K, M, add ? cuda::DinpWrite::kAdd : cuda::DinpWrite::kOverwrite, kStream);
                EXPECT_TRUE(dinp.guards_intact() && dweight.guards_intact() && dbias.guards_intact());
                // Measured up to 2.2e-7: float sums over M (dinp) or N (dweight, dbias) terms.
                expect_close(add ? "matmul dinp (+=)" : "matmul dinp (=)", max_rel_error(dinp.values(), dinp_ref),
                             1e-6);
                expect_close("matmul dweight", max_rel_error(dweight.values(), dweight_ref), 1e-6);
                expect_close("matmul dbias", max_rel_error(dbias.values(), dbias_ref), 1e-6);
                if (run == 0) {
                    first_dinp = dinp.values();
                    first_dweight = dweight.values();
                } else {
                    EXPECT_TRUE(bit_identical(dinp.values(), first_dinp));
                    EXPECT_TRUE(bit_identical(dweight.values(), first_dweight));
                }
            }
            dweight_full = first_dweight;
        }
        // Without dinp and dbias (the first layer's inputs need no gradient): only dweight changes.
        Guarded dweight(dweight0);
        cuda::matmul_backward(nullptr, dweight.data(), nullptr, dout.data(), inp.data(), weight.data(), N, K, M,
                              cuda::DinpWrite::kOverwrite, kStream);
        EXPECT_TRUE(bit_identical(dweight.values(), dweight_full));
        EXPECT_TRUE(dweight.guards_intact());
    }
}

}  // namespace
}  // namespace ms::test
