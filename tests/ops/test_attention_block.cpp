// test_attention_block.cpp: the CPU backend's ring attention blocks (AttentionBlockForwardArgs,
// AttentionBlockBackwardArgs), copy_columns, and ring attention on one rank (engine/graph/ring_attention.h).
//
// Checks: fast vs reference on the three kinds of block a ring runs (the rank's own causal block, all query rows
// against part of a block, part of the query rows against a whole block), merged in turn, in fp32 and bf16, with
// grouped-query heads; fast on 1 and 3 OpenMP threads bit-identical; two ranks' blocks compose to causal attention
// over the whole sequence, forward and backward (attention_block_check.h, shared with the CUDA emulation's test);
// overwrite, merge and += contracts; the ring on one rank equals attention_forward / attention_backward;
// copy_columns' conversions and offsets exactly.
// Tolerances: scale-free (max |got - want| / max |want|), about 10x what MS_OP_TEST_VERBOSE=1 prints.
#include <omp.h>

#include <vector>

#include "comm/self_communicator.h"
#include "engine/graph/ring_attention.h"
#include "tests/ops/attention_block_check.h"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

constexpr int64_t kB = 2, kT = 10, kNH = 4, kNKV = 2, kHS = 8;
constexpr int64_t kC = kNH * kHS, kW = (kNH + 2 * kNKV) * kHS, kWkv = 2 * kNKV * kHS;

// The sizes of the blocks run_blocks runs: the constants above by default; 21 rows of 24-wide heads reach past the
// fast path's 8-row tiles and 16-column chunks.
struct Dims {
    int64_t B = kB, T = kT, NH = kNH, NKV = kNKV, HS = kHS;
    int64_t C() const { return NH * HS; }
    int64_t W() const { return (NH + 2 * NKV) * HS; }
    int64_t Wkv() const { return 2 * NKV * HS; }
};

struct RingBlockInputs {
    explicit RingBlockInputs(const Dims& d = {})
        : dims(d),
          qkv(random_floats(d.B * d.T * d.W(), 11, -1.5f, 1.5f)),
          kv(random_floats(d.B * d.T * d.Wkv(), 12, -1.5f, 1.5f)),
          dout(random_floats(d.B * d.T * d.C(), 13)),
          dq0(random_floats(d.B * d.T * d.C(), 14)),
          dkv0(random_floats(d.B * d.T * d.Wkv(), 15)) {}
    Dims dims;
    std::vector<float> qkv, kv;  // kv: another rank's [K | V]
    std::vector<float> dout, dq0, dkv0;
};

struct RingBlockRun {
    std::vector<float> acc, lse, dq, dkv_own, dkv;
};

// The ring's three kinds of block in turn: the own causal block (from qkv itself), all rows against the first half
// of kv, the second half of the rows against all of kv; forward merged into acc/lse, backward accumulated from
// dq0 / dkv0 with the final statistics and out = acc rounded to D.
template <class D>
RingBlockRun run_blocks(Backend& be, const RingBlockInputs& in) {
    const Dims& n = in.dims;
    const int64_t B = n.B, T = n.T, NH = n.NH, C = n.C(), W = n.W(), Wkv = n.Wkv();
    auto qkv = to_d<D>(in.qkv), kv = to_d<D>(in.kv), dout = to_d<D>(in.dout);
    RingBlockRun r;
    r.acc.assign(B * T * C, 0.0f);
    r.lse.assign(B * NH * T, 0.0f);
    const auto forward = [&](const Tensor& source, int64_t column, int64_t q_begin, int64_t q_rows, int64_t kv_rows,
                             bool causal, bool merge) {
        be.attention_block_forward({.qkv = dview(qkv, {B, T, W}),
                                    .kv = source,
                                    .acc = view(r.acc, {B, T, C}),
                                    .lse = view(r.lse, {B, NH, T}),
                                    .kv_column = column,
                                    .q_begin = q_begin,
                                    .q_rows = q_rows,
                                    .kv_rows = kv_rows,
                                    .causal = causal,
                                    .merge = merge,
                                    .NH = NH,
                                    .NKV = n.NKV});
    };
    forward(dview(qkv, {B, T, W}), C, 0, T, T, true, false);
    forward(dview(kv, {B, T, Wkv}), 0, 0, T, T / 2, false, true);
    forward(dview(kv, {B, T, Wkv}), 0, T / 2, T - T / 2, T, false, true);
    std::vector<D> out = to_d<D>(r.acc);
    r.dq = in.dq0;
    r.dkv_own = in.dkv0;
    r.dkv = in.dkv0;
    const auto backward = [&](const Tensor& source, int64_t column, std::vector<float>& dkv, int64_t q_begin,
                              int64_t q_rows, int64_t kv_rows, bool causal) {
        be.attention_block_backward({.dout = dview(dout, {B, T, C}),
                                     .qkv = dview(qkv, {B, T, W}),
                                     .out = dview(out, {B, T, C}),
                                     .lse = view(r.lse, {B, NH, T}),
                                     .kv = source,
                                     .dq = view(r.dq, {B, T, C}),
                                     .dkv = view(dkv, {B, T, Wkv}),
                                     .kv_column = column,
                                     .q_begin = q_begin,
                                     .q_rows = q_rows,
                                     .kv_rows = kv_rows,
                                     .causal = causal,
                                     .NH = NH,
                                     .NKV = n.NKV});
    };
    backward(dview(qkv, {B, T, W}), C, r.dkv_own, 0, T, T, true);
    backward(dview(kv, {B, T, Wkv}), 0, r.dkv, 0, T, T / 2, false);
    backward(dview(kv, {B, T, Wkv}), 0, r.dkv, T / 2, T - T / 2, T, false);
    return r;
}

template <class D>
void blocks_fast_vs_reference(double tol_out, double tol_grad, const Dims& dims = {}) {
    const RingBlockInputs in(dims);
    auto ref = make_cpu_backend(OpMode::kReference), fast = make_cpu_backend(OpMode::kFast);
    const RingBlockRun r = run_blocks<D>(*ref, in), f = run_blocks<D>(*fast, in);
    const std::string d =
        std::string(dtype_name(dtype_of<D>())) + " T " + std::to_string(dims.T) + " HS " + std::to_string(dims.HS);
    expect_within("block acc " + d, OpMode::kFast, max_rel_error(f.acc, r.acc), tol_out);
    expect_within("block lse " + d, OpMode::kFast, max_rel_error(f.lse, r.lse), 1e-6);
    expect_within("block dq " + d, OpMode::kFast, max_rel_error(f.dq, r.dq), tol_grad);
    expect_within("block dkv own " + d, OpMode::kFast, max_rel_error(f.dkv_own, r.dkv_own), tol_grad);
    expect_within("block dkv " + d, OpMode::kFast, max_rel_error(f.dkv, r.dkv), tol_grad);
}

MS_OP_TEST(AttentionBlock, FastMatchesReference, kFastVsReference, OpKind::kAttentionBlockForward,
           OpKind::kAttentionBlockBackward) {
    blocks_fast_vs_reference<float>(2e-6, 2e-6);
    blocks_fast_vs_reference<bf16>(2e-6, 3e-6);  // the same 16-bit inputs widened: only fp32 vs double differs
    blocks_fast_vs_reference<fp16>(2e-6, 3e-6);
    blocks_fast_vs_reference<float>(2e-6, 2e-6, {.T = 21, .HS = 24});
}

MS_OP_TEST(AttentionBlock, FastIsThreadCountInvariant, kDeterminism, OpKind::kAttentionBlockForward,
           OpKind::kAttentionBlockBackward) {
    const RingBlockInputs in;
    auto fast = make_cpu_backend(OpMode::kFast);
    RingBlockRun one, three;
    with_threads(1, [&] { one = run_blocks<bf16>(*fast, in); });
    with_threads(3, [&] { three = run_blocks<bf16>(*fast, in); });
    const RingBlockInputs wide({.T = 21, .HS = 24});
    RingBlockRun wide_one, wide_three;
    with_threads(1, [&] { wide_one = run_blocks<float>(*fast, wide); });
    with_threads(3, [&] { wide_three = run_blocks<float>(*fast, wide); });
    EXPECT_TRUE(bit_identical(wide_one.acc, wide_three.acc) && bit_identical(wide_one.dq, wide_three.dq) &&
                bit_identical(wide_one.dkv, wide_three.dkv));
    EXPECT_TRUE(bit_identical(one.acc, three.acc) && bit_identical(one.lse, three.lse));
    EXPECT_TRUE(bit_identical(one.dq, three.dq) && bit_identical(one.dkv_own, three.dkv_own) &&
                bit_identical(one.dkv, three.dkv));
}

// Two ranks' blocks reproduce the backend's own causal attention over the whole sequence, forward and backward
// (attention_block_check.h), in both modes, fp32 and bf16 (whose error is that of rounding the inputs of the dq and
// dkv sums differently from attention_backward's, and of the output's bf16 rounding).
MS_OP_TEST(AttentionBlock, TwoRanksComposeToCausalAttention, kContract, OpKind::kAttentionBlockForward,
           OpKind::kAttentionBlockBackward) {
    for (OpMode mode : {OpMode::kReference, OpMode::kFast}) {
        auto be = make_cpu_backend(mode);
        for (int NKV : {2, 4}) {
            check_ring_composition(*be, DType::kF32, 2, 7, 4, NKV, 8, {2e-6, 1e-6, 2e-6}, mode_name(mode));
            check_ring_composition(*be, DType::kBF16, 2, 7, 4, NKV, 8, {2e-2, 1e-6, 2e-2}, mode_name(mode));
            check_ring_composition(*be, DType::kF32, 2, 21, 4, NKV, 24, {2e-6, 1e-6, 2e-6}, mode_name(mode));
        }
    }
}
// the backward's half of the composition: its dq and dkv are attention_backward's, itself checked against finite
// differences (test_cpu_ops.cpp)
static const bool kCompositionGradientRegistered = register_op_test(
    Check::kGradient, "AttentionBlock.TwoRanksComposeToCausalAttention", {OpKind::kAttentionBlockBackward});

// merge = false overwrites only the block's query rows; merge = true of a block with itself keeps the output and
// adds log 2 to the log-sum-exp (the same softmax twice); the backward adds into dq and dkv.
MS_OP_TEST(AttentionBlock, OverwriteMergeAndAccumulationContract, kContract, OpKind::kAttentionBlockForward,
           OpKind::kAttentionBlockBackward) {
    const RingBlockInputs in;
    auto be = make_cpu_backend(OpMode::kReference);
    std::vector<float> qkv = in.qkv, kv = in.kv;
    std::vector<float> acc(kB * kT * kC, 7.0f), lse(kB * kNH * kT, 7.0f);
    AttentionBlockForwardArgs a{.qkv = view(qkv, {kB, kT, kW}),
                                .kv = view(kv, {kB, kT, kWkv}),
                                .acc = view(acc, {kB, kT, kC}),
                                .lse = view(lse, {kB, kNH, kT}),
                                .kv_column = 0,
                                .q_begin = 3,
                                .q_rows = 4,
                                .kv_rows = kT,
                                .causal = false,
                                .merge = false,
                                .NH = kNH,
                                .NKV = kNKV};
    be->attention_block_forward(a);
    for (int64_t b = 0; b < kB; ++b) {
        for (int64_t t = 0; t < kT; ++t) {
            const bool inside = t >= 3 && t < 7;
            EXPECT_EQ(acc[(b * kT + t) * kC] == 7.0f, !inside) << "row " << t;
            EXPECT_EQ(lse[(b * kNH) * kT + t] == 7.0f, !inside) << "row " << t;
        }
    }
    const std::vector<float> acc1 = acc, lse1 = lse;
    a.merge = true;
    be->attention_block_forward(a);
    double out_err = 0, lse_err = 0;
    for (int64_t b = 0; b < kB; ++b) {
        for (int64_t t = 3; t < 7; ++t) {
            for (int64_t h = 0; h < kNH; ++h) {
                const size_t l = static_cast<size_t>((b * kNH + h) * kT + t);
                lse_err = std::max(lse_err, std::fabs(static_cast<double>(lse[l]) - lse1[l] - std::log(2.0)));
                for (int64_t d = 0; d < kHS; ++d) {
                    const size_t o = static_cast<size_t>((b * kT + t) * kC + h * kHS + d);
                    out_err = std::max(out_err, std::fabs(static_cast<double>(acc[o]) - acc1[o]));
                }
            }
        }
    }
    EXPECT_LE(out_err, 1e-6);
    EXPECT_LE(lse_err, 1e-6);
    // backward: from zero, then again from that: exactly twice (in fp32, x + x is exact)
    std::vector<float> dout = in.dout, dq(kB * kT * kC, 0.0f), dkv(kB * kT * kWkv, 0.0f);
    AttentionBlockBackwardArgs g{.dout = view(dout, {kB, kT, kC}),
                                 .qkv = view(qkv, {kB, kT, kW}),
                                 .out = view(acc, {kB, kT, kC}),
                                 .lse = view(lse, {kB, kNH, kT}),
                                 .kv = view(kv, {kB, kT, kWkv}),
                                 .dq = view(dq, {kB, kT, kC}),
                                 .dkv = view(dkv, {kB, kT, kWkv}),
                                 .kv_column = 0,
                                 .q_begin = 3,
                                 .q_rows = 4,
                                 .kv_rows = kT,
                                 .causal = false,
                                 .NH = kNH,
                                 .NKV = kNKV};
    be->attention_block_backward(g);
    const std::vector<float> dq1 = dq, dkv1 = dkv;
    be->attention_block_backward(g);
    for (size_t i = 0; i < dq.size(); ++i) ASSERT_EQ(dq[i], 2 * dq1[i]) << i;
    for (size_t i = 0; i < dkv.size(); ++i) ASSERT_EQ(dkv[i], 2 * dkv1[i]) << i;
    for (int64_t b = 0; b < kB; ++b)  // rows outside the block get nothing
        EXPECT_EQ(dq1[(b * kT + 1) * kC], 0.0f);
}

// The ring of one rank is the own causal block: attention_forward / attention_backward within rounding.
TEST(RingAttention, OneRankIsCausalAttention) {
    constexpr int64_t T = 12;
    SelfCommunicator self("cp");
    for (OpMode mode : {OpMode::kReference, OpMode::kFast}) {
        auto be = make_cpu_backend(mode);
        std::vector<float> qkv = random_floats(kB * T * kW, 31, -1.5f, 1.5f), dout = random_floats(kB * T * kC, 32);
        std::vector<float> out(kB * T * kC), lse(kB * kNH * T), dqkv(kB * T * kW);
        be->attention_forward({view(qkv, {kB, T, kW}), view(out, {kB, T, kC}), view(lse, {kB, kNH, T}), kNH, kNKV});
        be->attention_backward({view(dout, {kB, T, kC}), view(qkv, {kB, T, kW}), view(out, {kB, T, kC}),
                                view(lse, {kB, kNH, T}), view(dqkv, {kB, T, kW}), kNH, kNKV});
        const graph::RingAttentionShape s{.B = kB, .T = T, .NH = kNH, .NKV = kNKV, .HS = kHS, .act = DType::kF32};
        std::vector<float> scratch(
            static_cast<size_t>(std::max(graph::ring_forward_scratch_elems(s), graph::ring_backward_scratch_elems(s))));
        std::vector<float> rout(out.size()), rlse(lse.size()), rdqkv(dqkv.size(), 9.0f);
        graph::ring_attention_forward(*be, self, s, view(qkv, {kB, T, kW}), view(rout, {kB, T, kC}),
                                      view(rlse, {kB, kNH, T}), scratch.data());
        graph::ring_attention_backward(*be, self, s, view(dout, {kB, T, kC}), view(qkv, {kB, T, kW}),
                                       view(rout, {kB, T, kC}), view(rlse, {kB, kNH, T}), view(rdqkv, {kB, T, kW}),
                                       scratch.data());
        expect_within("ring out", mode, max_rel_error(rout, out), 2e-6);
        expect_within("ring lse", mode, max_rel_error(rlse, lse), 2e-6);
        expect_within("ring dqkv", mode, max_rel_error(rdqkv, dqkv), 2e-6);
    }
}

// fp32 -> bf16 rounds as from_float does, bf16 -> fp32 widens exactly, same-dtype copies bits; only the named
// columns are written.
void check_copy_columns(OpMode mode) {
    auto be = make_cpu_backend(mode);
    constexpr int64_t rows = 5, ws = 7, wd = 9;
    std::vector<float> src = random_floats(rows * ws, 41, -3.0f, 3.0f);
    std::vector<bf16> half(rows * wd, from_float<bf16>(5.0f));
    be->copy_columns({view(src, {rows, ws}), dview(half, {rows, wd}), 2, 4, 3});
    std::vector<float> back(rows * wd, -1.0f);
    be->copy_columns({dview(half, {rows, wd}), view(back, {rows, wd}), 0, 0, wd});
    std::vector<float> same(rows * ws, 0.0f);
    be->copy_columns({view(src, {rows, ws}), view(same, {rows, ws}), 1, 0, 6});
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < wd; ++c) {
            const float want = c >= 4 && c < 7 ? to_float(from_float<bf16>(src[r * ws + 2 + c - 4])) : 5.0f;
            ASSERT_EQ(back[r * wd + c], want) << "row " << r << " column " << c;
        }
        for (int64_t c = 0; c < ws; ++c) ASSERT_EQ(same[r * ws + c], c < 6 ? src[r * ws + 1 + c] : 0.0f);
    }
}

MS_OP_TEST(CopyColumns, ConvertsAndPlacesExactly, kExact, OpKind::kCopyColumns) { check_copy_columns(OpMode::kFast); }

// copy_columns has one loop for both modes (a conversion has one correct answer): both give the exact values.
MS_OP_TEST(CopyColumns, BothModesAreExact, kFastVsReference, OpKind::kCopyColumns) {
    check_copy_columns(OpMode::kReference);
    check_copy_columns(OpMode::kFast);
}
static const bool kCopyColumnsDeterminismRegistered =
    register_op_test(Check::kDeterminism, "CopyColumns.BothModesAreExact", {OpKind::kCopyColumns});

}  // namespace
}  // namespace ms::test
