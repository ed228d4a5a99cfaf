// test_cpu_ops_contract.cpp: the accumulation contract of backend.h and each op's documented semantics, in both
// modes: parameter gradients are +=; dinp is = or += per Accumulate (a NaN prefill must not survive kOverwrite);
// ops that may alias do; padded vocab columns get exactly 0; attention is causal; vocab-parallel pieces on two
// shards (vocab_start != 0) combine to the single-shard result.
#include <cmath>
#include <limits>

#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

constexpr OpMode kModes[] = {OpMode::kReference, OpMode::kFast};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

bool any_nan(const std::vector<float>& v) {
    for (float x : v) {
        if (std::isnan(x)) return true;
    }
    return false;
}

// base + delta, elementwise.
std::vector<float> plus(const std::vector<float>& base, const std::vector<float>& delta) {
    std::vector<float> sum(base.size());
    for (size_t i = 0; i < base.size(); ++i) sum[i] = base[i] + delta[i];
    return sum;
}

MS_OP_TEST(Contract, MatmulAccumulation, kContract, OpKind::kMatmulBackward) {
    const int64_t N = 9, K = 11, M = 7;
    auto inp = random_floats(N * K, 1), weight = random_floats(M * K, 2), dout = random_floats(N * M, 3);
    const auto prefill_dinp = random_floats(N * K, 4), prefill_dw = random_floats(M * K, 5);
    const auto prefill_db = random_floats(M, 6);
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        auto run = [&](std::vector<float>* dinp, std::vector<float>& dw, std::vector<float>& db, Accumulate acc) {
            backend->matmul_backward({.dout = view(dout, {N, M}),
                                      .inp = view(inp, {N, K}),
                                      .weight = view(weight, {M, K}),
                                      .dinp = dinp ? view(*dinp, {N, K}) : Tensor(),
                                      .dweight = view(dw, {M, K}),
                                      .dbias = view(db, {M}),
                                      .accumulate = acc});
        };
        // From zero: the plain gradients.
        std::vector<float> dinp0(N * K), dw0(M * K), db0(M);
        run(&dinp0, dw0, db0, Accumulate::kOverwrite);
        // kOverwrite over NaN gives the same dinp; dweight and dbias add onto what was there.
        std::vector<float> dinp(N * K, kNaN), dw = prefill_dw, db = prefill_db;
        run(&dinp, dw, db, Accumulate::kOverwrite);
        EXPECT_FALSE(any_nan(dinp)) << mode_name(mode);
        // Measured 0 on this shape (the prefill is added exactly where the sum is); 1e-6 allows one float rounding.
        expect_within("matmul kOverwrite dinp", mode, max_rel_error(dinp, dinp0), 1e-6);
        expect_within("matmul dweight +=", mode, max_rel_error(dw, plus(prefill_dw, dw0)), 1e-6);
        expect_within("matmul dbias +=", mode, max_rel_error(db, plus(prefill_db, db0)), 1e-6);
        // kAdd adds onto dinp.
        dinp = prefill_dinp;
        run(&dinp, dw, db, Accumulate::kAdd);
        expect_within("matmul kAdd dinp", mode, max_rel_error(dinp, plus(prefill_dinp, dinp0)), 1e-6);
        // No dinp: the parameter gradients are still accumulated.
        std::vector<float> dw_only(M * K), db_only(M);
        run(nullptr, dw_only, db_only, Accumulate::kOverwrite);
        EXPECT_EQ(dw_only, dw0) << mode_name(mode);
        EXPECT_EQ(db_only, db0) << mode_name(mode);
    }
}

MS_OP_TEST(Contract, LayerNormAccumulation, kContract, OpKind::kLayerNormBackward) {
    const int64_t N = 6, C = 19;
    auto inp = random_floats(N * C, 1), weight = random_floats(C, 2), bias = random_floats(C, 3);
    auto dout = random_floats(N * C, 4);
    const auto prefill_dinp = random_floats(N * C, 5), prefill_dw = random_floats(C, 6),
               prefill_db = random_floats(C, 7);
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        std::vector<float> out(N * C), mean(N), rstd(N);
        backend->layernorm_forward({.inp = view(inp, {N, C}),
                                    .weight = view(weight, {C}),
                                    .bias = view(bias, {C}),
                                    .out = view(out, {N, C}),
                                    .mean = view(mean, {N}),
                                    .rstd = view(rstd, {N}),
                                    .eps = 1e-5f});
        auto run = [&](std::vector<float>& dinp, std::vector<float>& dw, std::vector<float>& db, Accumulate acc) {
            backend->layernorm_backward({.dout = view(dout, {N, C}),
                                         .inp = view(inp, {N, C}),
                                         .weight = view(weight, {C}),
                                         .mean = view(mean, {N}),
                                         .rstd = view(rstd, {N}),
                                         .dinp = view(dinp, {N, C}),
                                         .dweight = view(dw, {C}),
                                         .dbias = view(db, {C}),
                                         .accumulate = acc});
        };
        std::vector<float> dinp0(N * C), dw0(C), db0(C);
        run(dinp0, dw0, db0, Accumulate::kOverwrite);
        std::vector<float> dinp(N * C, kNaN), dw = prefill_dw, db = prefill_db;
        run(dinp, dw, db, Accumulate::kOverwrite);
        EXPECT_EQ(dinp, dinp0) << mode_name(mode);
        // Measured 0 (dweight, dbias) and 5.5e-8 (fast kAdd dinp); 1e-6 allows a float rounding or two.
        expect_within("layernorm dweight +=", mode, max_rel_error(dw, plus(prefill_dw, dw0)), 1e-6);
        expect_within("layernorm dbias +=", mode, max_rel_error(db, plus(prefill_db, db0)), 1e-6);
        dinp = prefill_dinp;
        run(dinp, dw, db, Accumulate::kAdd);
        expect_within("layernorm kAdd dinp", mode, max_rel_error(dinp, plus(prefill_dinp, dinp0)), 1e-6);
    }
}

MS_OP_TEST(Contract, EmbeddingAccumulation, kContract, OpKind::kEmbeddingBackward) {
    const int64_t T = 4, N = 12, C = 5, V_local = 6, vocab_start = 10;
    // Ids 10..15 live here (id 14 never occurs); 3, 20, 16 and 0 live on other shards.
    std::vector<int32_t> tokens = {10, 11, 3, 15, 10, 20, 12, 12, 16, 0, 13, 10};
    auto dout = random_floats(N * C, 1);
    const auto prefill_table = random_floats(V_local * C, 2), prefill_pos = random_floats(T * C, 3);
    for (OpMode mode : kModes) {
        std::vector<float> dtable = prefill_table, dpos = prefill_pos;
        make_cpu_backend(mode)->embedding_backward({.tokens = view(tokens, {N}),
                                                    .dout = view(dout, {N, C}),
                                                    .dtable = view(dtable, {V_local, C}),
                                                    .dpos = view(dpos, {T, C}),
                                                    .vocab_start = vocab_start,
                                                    .T = T});
        // Expected, summed here in the same order (so exact): dtable[id - 10] += dout[n], dpos[n % T] += dout[n].
        std::vector<float> want_table = prefill_table, want_pos = prefill_pos;
        for (int64_t n = 0; n < N; ++n) {
            for (int64_t c = 0; c < C; ++c) {
                const int64_t row = tokens[n] - vocab_start;
                if (row >= 0 && row < V_local) want_table[row * C + c] += dout[n * C + c];
                want_pos[(n % T) * C + c] += dout[n * C + c];
            }
        }
        EXPECT_EQ(dtable, want_table) << mode_name(mode);
        EXPECT_EQ(dpos, want_pos) << mode_name(mode);
        // Row 4 (id 14) has no token: untouched, bit for bit.
        for (int64_t c = 0; c < C; ++c) EXPECT_EQ(dtable[4 * C + c], prefill_table[4 * C + c]);
    }
}

MS_OP_TEST(Contract, AttentionCausalAndOverwrite, kContract, OpKind::kAttentionForward, OpKind::kAttentionBackward) {
    const int64_t B = 2, T = 9, NH = 3, HS = 5, C = NH * HS, t0 = 6;
    const auto qkv0 = random_floats(B * T * 3 * C, 1, -2.0f, 2.0f);
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        auto forward = [&](std::vector<float>& qkv, std::vector<float>& out, std::vector<float>& lse) {
            backend->attention_forward(
                {.qkv = view(qkv, {B, T, 3 * C}), .out = view(out, {B, T, C}), .lse = view(lse, {B, NH, T}), .NH = NH});
        };
        std::vector<float> qkv = qkv0, out(B * T * C), lse(B * NH * T);
        forward(qkv, out, lse);
        // Change every Q, K, V value of token t0 (in both batches): outputs before t0 must not move by one bit.
        std::vector<float> qkv_changed = qkv0, out_changed(out.size()), lse_changed(lse.size());
        for (int64_t b = 0; b < B; ++b) {
            for (int64_t j = 0; j < 3 * C; ++j) qkv_changed[(b * T + t0) * 3 * C + j] += 1.5f;
        }
        forward(qkv_changed, out_changed, lse_changed);
        bool later_rows_changed = false;
        for (int64_t b = 0; b < B; ++b) {
            for (int64_t t = 0; t < T; ++t) {
                for (int64_t j = 0; j < C; ++j) {
                    const int64_t i = (b * T + t) * C + j;
                    if (t < t0) {
                        EXPECT_EQ(out[i], out_changed[i]) << mode_name(mode) << " b " << b << " t " << t;
                    }
                    if (t >= t0 && out[i] != out_changed[i]) later_rows_changed = true;
                }
                for (int64_t h = 0; h < NH; ++h) {
                    const int64_t i = (b * NH + h) * T + t;
                    if (t < t0) {
                        EXPECT_EQ(lse[i], lse_changed[i]) << mode_name(mode);
                    }
                }
            }
        }
        EXPECT_TRUE(later_rows_changed) << mode_name(mode);
        // dqkv is overwritten: NaN or earlier values must not leak in.
        auto dout = random_floats(B * T * C, 2);
        std::vector<float> dqkv_clean(qkv.size()), dqkv_nan(qkv.size(), kNaN);
        for (std::vector<float>* dqkv : {&dqkv_clean, &dqkv_nan}) {
            backend->attention_backward({.dout = view(dout, {B, T, C}),
                                         .qkv = view(qkv, {B, T, 3 * C}),
                                         .out = view(out, {B, T, C}),
                                         .lse = view(lse, {B, NH, T}),
                                         .dqkv = view(*dqkv, {B, T, 3 * C}),
                                         .NH = NH});
        }
        EXPECT_EQ(dqkv_nan, dqkv_clean) << mode_name(mode);
    }
}

MS_OP_TEST(Contract, GeluOverwriteAndAlias, kContract, OpKind::kGeluBackward, OpKind::kGeluForward) {
    const int64_t n = 101;
    auto inp = random_floats(n, 1, -4.0f, 4.0f);
    const auto dout0 = random_floats(n, 2);
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        std::vector<float> dout = dout0, dinp(n, kNaN);
        backend->gelu_backward({.inp = view(inp, {n}), .dout = view(dout, {n}), .dinp = view(dinp, {n})});
        EXPECT_FALSE(any_nan(dinp)) << mode_name(mode);
        // dinp may alias dout.
        std::vector<float> inplace = dout0;
        backend->gelu_backward({.inp = view(inp, {n}), .dout = view(inplace, {n}), .dinp = view(inplace, {n})});
        EXPECT_EQ(inplace, dinp) << mode_name(mode);
    }
}

MS_OP_TEST(Contract, ResidualAlias, kContract, OpKind::kResidualForward) {
    const int64_t n = 333;
    const auto a0 = random_floats(n, 1);
    auto b = random_floats(n, 2);
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        std::vector<float> a = a0, out(n);
        backend->residual_forward({.a = view(a, {n}), .b = view(b, {n}), .out = view(out, {n}), .bias = {}});
        backend->residual_forward(
            {.a = view(a, {n}), .b = view(b, {n}), .out = view(a, {n}), .bias = {}});  // out aliases a
        EXPECT_EQ(a, out) << mode_name(mode);
    }
}

// Padded columns hold garbage (huge values, NaN): max, sum and target logit ignore them, their gradient is 0.
MS_OP_TEST(Contract, CrossEntropyMaskedColumns, kContract, OpKind::kCrossEntropyForward,
           OpKind::kCrossEntropyBackward) {
    const int64_t N = 5, Vp = 13, valid = 10;
    const auto clean = random_floats(N * Vp, 1, -3.0f, 3.0f);
    std::vector<float> dirty = clean;
    for (int64_t n = 0; n < N; ++n) {
        dirty[n * Vp + 10] = 1e30f;
        dirty[n * Vp + 11] = kNaN;
        dirty[n * Vp + 12] = -1e30f;
    }
    auto targets = random_ints(N, 2, 0, static_cast<int32_t>(valid - 1));
    auto dloss = random_floats(N, 3, 0.1f, 1.0f);
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        auto stats = [&](std::vector<float>& logits) {
            std::vector<float> row_max(N), sum_exp(N), target_logit(N);
            for (CrossEntropyPhase phase : {CrossEntropyPhase::kMax, CrossEntropyPhase::kSumExp}) {
                backend->cross_entropy_forward({.logits = view(logits, {N, Vp}),
                                                .targets = view(targets, {N}),
                                                .row_max = view(row_max, {N}),
                                                .sum_exp = view(sum_exp, {N}),
                                                .target_logit = view(target_logit, {N}),
                                                .vocab_start = 0,
                                                .vocab_valid_local = valid,
                                                .phase = phase});
            }
            backend->cross_entropy_backward({.logits = view(logits, {N, Vp}),
                                             .targets = view(targets, {N}),
                                             .row_max = view(row_max, {N}),
                                             .sum_exp = view(sum_exp, {N}),
                                             .dloss = view(dloss, {N}),
                                             .vocab_start = 0,
                                             .vocab_valid_local = valid});
            std::vector<float> all = row_max;
            all.insert(all.end(), sum_exp.begin(), sum_exp.end());
            all.insert(all.end(), target_logit.begin(), target_logit.end());
            all.insert(all.end(), logits.begin(), logits.end());  // now dlogits
            return all;
        };
        std::vector<float> clean_logits = clean, dirty_logits = dirty;
        EXPECT_EQ(stats(dirty_logits), stats(clean_logits)) << mode_name(mode);
        for (int64_t n = 0; n < N; ++n) {
            for (int64_t j = valid; j < Vp; ++j) EXPECT_EQ(dirty_logits[n * Vp + j], 0.0f) << mode_name(mode);
        }
    }
}

// Two shards of 8 padded columns each (vocab 13: shard 0 holds ids 0..7, shard 1 ids 8..12 plus 3 padding),
// combined as TP would (max of maxes, then sums), against one shard holding the 13 ids.
MS_OP_TEST(Contract, CrossEntropyVocabParallel, kContract, OpKind::kCrossEntropyForward,
           OpKind::kCrossEntropyBackward) {
    const int64_t N = 7, V = 13, Vp_local = 8;
    const auto full = random_floats(N * V, 1, -4.0f, 4.0f);
    auto targets = random_ints(N, 2, 0, static_cast<int32_t>(V - 1));
    auto dloss = random_floats(N, 3, 0.1f, 1.0f);
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        const auto loss_and_grad = [&](std::vector<std::vector<float>>& shards, int64_t width,
                                       const std::vector<int64_t>& starts, const std::vector<int64_t>& valids) {
            std::vector<float> row_max(N, -INFINITY), sum_exp(N), target_logit(N), local(N), local2(N);
            for (size_t s = 0; s < shards.size(); ++s) {  // kMax, then all-reduce max
                backend->cross_entropy_forward({.logits = view(shards[s], {N, width}),
                                                .targets = view(targets, {N}),
                                                .row_max = view(local, {N}),
                                                .sum_exp = Tensor(),
                                                .target_logit = Tensor(),
                                                .vocab_start = starts[s],
                                                .vocab_valid_local = valids[s],
                                                .phase = CrossEntropyPhase::kMax});
                for (int64_t n = 0; n < N; ++n) row_max[n] = std::max(row_max[n], local[n]);
            }
            for (size_t s = 0; s < shards.size(); ++s) {  // kSumExp with the global max, then all-reduce sums
                backend->cross_entropy_forward({.logits = view(shards[s], {N, width}),
                                                .targets = view(targets, {N}),
                                                .row_max = view(row_max, {N}),
                                                .sum_exp = view(local, {N}),
                                                .target_logit = view(local2, {N}),
                                                .vocab_start = starts[s],
                                                .vocab_valid_local = valids[s],
                                                .phase = CrossEntropyPhase::kSumExp});
                for (int64_t n = 0; n < N; ++n) {
                    sum_exp[n] += local[n];
                    target_logit[n] += local2[n];
                }
            }
            std::vector<float> result;  // losses, then the gradient columns of ids 0..V-1
            for (int64_t n = 0; n < N; ++n) result.push_back(std::log(sum_exp[n]) + row_max[n] - target_logit[n]);
            for (size_t s = 0; s < shards.size(); ++s) {
                backend->cross_entropy_backward({.logits = view(shards[s], {N, width}),
                                                 .targets = view(targets, {N}),
                                                 .row_max = view(row_max, {N}),
                                                 .sum_exp = view(sum_exp, {N}),
                                                 .dloss = view(dloss, {N}),
                                                 .vocab_start = starts[s],
                                                 .vocab_valid_local = valids[s]});
            }
            for (int64_t n = 0; n < N; ++n) {
                for (int64_t id = 0; id < V; ++id) {
                    const size_t s = static_cast<size_t>(id / width);
                    result.push_back(shards[s][n * width + (id - starts[s])]);
                }
            }
            return result;
        };
        std::vector<std::vector<float>> one = {full};
        std::vector<std::vector<float>> two(2, std::vector<float>(N * Vp_local, 777.0f));  // 777: padding
        for (int64_t n = 0; n < N; ++n) {
            for (int64_t id = 0; id < V; ++id) two[id / Vp_local][n * Vp_local + id % Vp_local] = full[n * V + id];
        }
        const auto want = loss_and_grad(one, V, {0}, {V});
        const auto got = loss_and_grad(two, Vp_local, {0, Vp_local}, {Vp_local, V - Vp_local});
        // Measured 1.9e-9 / 3.7e-9: the sums are split in two before the float add; ~30x headroom.
        expect_within("cross_entropy two shards", mode, max_rel_error(got, want), 1e-7);
        for (int64_t n = 0; n < N; ++n) {
            for (int64_t j = V - Vp_local; j < Vp_local; ++j) EXPECT_EQ(two[1][n * Vp_local + j], 0.0f);
        }
    }
}

// kMaxSumExp (a tensor-parallel group of one) writes what kMax then kSumExp write, bit for bit, in both modes; the
// fp32, bf16 and fp16 logits all take it.
MS_OP_TEST(Contract, CrossEntropyMaxSumExpIsThePieces, kContract, OpKind::kCrossEntropyForward) {
    const int64_t N = 9, Vp = 200, valid = 190;
    auto logits = random_floats(N * Vp, 1, -6.0f, 6.0f);
    auto targets = random_ints(N, 2, 0, static_cast<int32_t>(Vp + 5));  // some in the padded tail or beyond
    for (OpMode mode : kModes) {
        auto backend = make_cpu_backend(mode);
        for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
            std::vector<uint16_t> half(static_cast<size_t>(N * Vp));
            Tensor l = view(logits, {N, Vp});
            if (d != DType::kF32) {
                l = Tensor(half.data(), d, {N, Vp});
                backend->cast({view(logits, {N * Vp}), Tensor(half.data(), d, {N * Vp})});
            }
            std::vector<float> stats[2];
            for (int fused = 0; fused < 2; ++fused) {
                std::vector<float> row_max(N, NAN), sum_exp(N, NAN), target_logit(N, NAN);
                CrossEntropyForwardArgs a{.logits = l,
                                          .targets = view(targets, {N}),
                                          .row_max = view(row_max, {N}),
                                          .sum_exp = view(sum_exp, {N}),
                                          .target_logit = view(target_logit, {N}),
                                          .vocab_start = 0,
                                          .vocab_valid_local = valid,
                                          .phase = CrossEntropyPhase::kMaxSumExp};
                if (fused) {
                    backend->cross_entropy_forward(a);
                } else {
                    a.phase = CrossEntropyPhase::kMax;
                    backend->cross_entropy_forward(a);
                    a.phase = CrossEntropyPhase::kSumExp;
                    backend->cross_entropy_forward(a);
                }
                stats[fused] = row_max;
                stats[fused].insert(stats[fused].end(), sum_exp.begin(), sum_exp.end());
                stats[fused].insert(stats[fused].end(), target_logit.begin(), target_logit.end());
            }
            EXPECT_TRUE(bit_identical(stats[1], stats[0])) << dtype_name(d);
        }
    }
}

}  // namespace
}  // namespace ms::test
