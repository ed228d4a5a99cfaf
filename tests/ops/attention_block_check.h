// attention_block_check.h: what the ring-attention block tests share (backend.h, AttentionBlockForwardArgs; the CUDA
// emulation in tests/ops/test_cuda_emu_attention_block.cpp, the CPU backend's own tests): a block's shape, one forward
// and one backward through a Backend on given starting values, and check_ring_composition, which holds a backend's
// blocks to its own full causal attention.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/core/half.h"
#include "engine/core/tensor.h"
#include "tests/ops/attention_gqa_check.h"
#include "tests/ops/op_test_util.h"

namespace ms::test {

// One block: qkv (B, T, (NH + 2*NKV)*HS), kv (B, Tk, Wkv) with the keys and values at kv_column; the block's rows,
// keys and flags as AttentionBlockForwardArgs names them.
struct BlockShape {
    int B, T, Tk, Wkv, NH, NKV, HS;
    int kv_column, q_begin, q_rows, kv_rows;
    bool causal, merge;
    int C() const { return NH * HS; }
    int W() const { return (NH + 2 * NKV) * HS; }
    int Wd() const { return 2 * NKV * HS; }  // dkv's row width
    std::string tag() const {
        return "NKV " + std::to_string(NKV) + " T " + std::to_string(T) + " Tk " + std::to_string(Tk) + " rows [" +
               std::to_string(q_begin) + ", " + std::to_string(q_begin + q_rows) + ") keys " + std::to_string(kv_rows) +
               (causal ? " causal" : "") + (merge ? " merge" : "");
    }
};

// The inputs of a block, as fp32 values (stored as the activation dtype d, so rounded(d, ...) them first) and the
// starting fp32 acc / lse (forward) and dq / dkv (backward).
struct BlockInputs {
    std::vector<float> qkv, kv, acc, lse;  // kv unused when kv_is_qkv
    std::vector<float> dout, out, final_lse, dq, dkv;
    bool kv_is_qkv = false;  // kv is the qkv tensor itself (then Tk = T, Wkv = W)
};

struct BlockForwardResult {
    std::vector<float> acc, lse;
};
inline BlockForwardResult run_block_forward(Backend& be, DType d, const BlockShape& s, const BlockInputs& in) {
    TypedBuf qkv(d, in.qkv), kv(d, in.kv_is_qkv ? std::vector<float>{0.0f} : in.kv);
    TypedBuf acc(DType::kF32, in.acc), lse(DType::kF32, in.lse);
    const Tensor qkv_t = qkv.tensor({s.B, s.T, s.W()});
    be.attention_block_forward({.qkv = qkv_t,
                                .kv = in.kv_is_qkv ? qkv_t : kv.tensor({s.B, s.Tk, s.Wkv}),
                                .acc = acc.tensor({s.B, s.T, s.C()}),
                                .lse = lse.tensor({s.B, s.NH, s.T}),
                                .kv_column = s.kv_column,
                                .q_begin = s.q_begin,
                                .q_rows = s.q_rows,
                                .kv_rows = s.kv_rows,
                                .causal = s.causal,
                                .merge = s.merge,
                                .NH = s.NH,
                                .NKV = s.NKV});
    be.synchronize();
    return {acc.values(), lse.values()};
}

struct BlockBackwardResult {
    std::vector<float> dq, dkv;
};
inline BlockBackwardResult run_block_backward(Backend& be, DType d, const BlockShape& s, const BlockInputs& in) {
    TypedBuf qkv(d, in.qkv), kv(d, in.kv_is_qkv ? std::vector<float>{0.0f} : in.kv), dout(d, in.dout), out(d, in.out);
    TypedBuf lse(DType::kF32, in.final_lse), dq(DType::kF32, in.dq), dkv(DType::kF32, in.dkv);
    const Tensor qkv_t = qkv.tensor({s.B, s.T, s.W()});
    be.attention_block_backward({.dout = dout.tensor({s.B, s.T, s.C()}),
                                 .qkv = qkv_t,
                                 .out = out.tensor({s.B, s.T, s.C()}),
                                 .lse = lse.tensor({s.B, s.NH, s.T}),
                                 .kv = in.kv_is_qkv ? qkv_t : kv.tensor({s.B, s.Tk, s.Wkv}),
                                 .dq = dq.tensor({s.B, s.T, s.C()}),
                                 .dkv = dkv.tensor({s.B, s.Tk, s.Wd()}),
                                 .kv_column = s.kv_column,
                                 .q_begin = s.q_begin,
                                 .q_rows = s.q_rows,
                                 .kv_rows = s.kv_rows,
                                 .causal = s.causal,
                                 .NH = s.NH,
                                 .NKV = s.NKV});
    be.synchronize();
    return {dq.values(), dkv.values()};
}

// Rows [from, from + n) of each of the B sequences of a (B, T, width) tensor, as (B, n, width).
template <class X>
std::vector<X> sequence_rows(const std::vector<X>& m, int B, int T, int width, int from, int n) {
    std::vector<X> v;
    for (int b = 0; b < B; ++b) {
        const auto first = m.begin() + (static_cast<int64_t>(b) * T + from) * width;
        v.insert(v.end(), first, first + static_cast<int64_t>(n) * width);
    }
    return v;
}

// Scale-free tolerances of check_ring_composition (max |ring - full| / max |full|).
struct RingTolerance {
    double out, lse, dqkv;
};

// Context parallelism over two ranks, each with c of a sequence's T = 2c rows (chunk 0 = rows [0, c), chunk 1 =
// rows [c, 2c)), must reproduce the backend's own full causal attention on the T rows:
//   - a causal block over all T rows with kv the qkv itself is attention_forward;
//   - rank 0's rows: the causal block of chunk 0 alone;
//   - rank 1's rows: the causal block of chunk 1 alone (kv = its qkv, kv_column = C), merged with a full block of
//     chunk 1's queries against chunk 0's keys and values, which copy_columns packs as a (B, c, 2*NKV*HS) [K | V];
//     acc cast to the activation dtype is out, lse the full lse;
//   - backward from the composed out and lse: rank 0's causal block and rank 1's block against chunk 0 add into one
//     fp32 dkv of chunk 0 (the gradient that travels back around the ring), rank 1's causal block into chunk 1's;
//     copy_columns writes each rank's fp32 dq and dkv into a dqkv of the activation dtype, which must be
//     attention_backward's dqkv for those rows.
// B sequences, NH query and NKV key/value heads of size HS, activation dtype d.
inline void check_ring_composition(Backend& be, DType d, int B, int c, int NH, int NKV, int HS,
                                   const RingTolerance& tol, const std::string& label) {
    const int T = 2 * c, C = NH * HS, W = (NH + 2 * NKV) * HS, KV = 2 * NKV * HS;
    const std::string tag = label + " " + std::string(dtype_name(d)) + " B " + std::to_string(B) + " c " +
                            std::to_string(c) + " NH " + std::to_string(NH) + " NKV " + std::to_string(NKV) + " HS " +
                            std::to_string(HS);
    SCOPED_TRACE(tag);
    const std::vector<float> qkv = rounded(d, random_floats(size_t{1} * B * T * W, 71 + c + NKV, -2, 2));
    const std::vector<float> dout = rounded(d, random_floats(size_t{1} * B * T * C, 72 + c));
    const AttentionResult full = run_attention(be, d, B, T, NH, NKV, HS, qkv, dout);

    // The causal block over all T rows, kv = qkv: attention_forward's out and lse.
    {
        const BlockShape s{B, T, T, W, NH, NKV, HS, C, 0, T, T, true, false};
        BlockInputs in;
        in.qkv = qkv;
        in.kv_is_qkv = true;
        in.acc.assign(size_t{1} * B * T * C, NAN);
        in.lse.assign(size_t{1} * B * NH * T, NAN);
        const BlockForwardResult r = run_block_forward(be, d, s, in);
        expect_gqa_close(tag + " whole causal block out", gqa_error(rounded(d, r.acc), full.out), tol.out);
        expect_gqa_close(tag + " whole causal block lse", gqa_error(r.lse, full.lse), tol.lse);
    }

    // Each rank's qkv, and chunk 0's keys and values packed by copy_columns.
    const std::vector<float> qkv0 = sequence_rows(qkv, B, T, W, 0, c), qkv1 = sequence_rows(qkv, B, T, W, c, c);
    const std::vector<float> dout0 = sequence_rows(dout, B, T, C, 0, c), dout1 = sequence_rows(dout, B, T, C, c, c);
    const int64_t rows = int64_t{B} * c;
    TypedBuf qkv0_buf(d, qkv0), kv0_buf(d, size_t(rows) * KV);
    be.copy_columns({.src = qkv0_buf.tensor({rows, W}),
                     .dst = kv0_buf.tensor({rows, KV}),
                     .src_column = C,
                     .dst_column = 0,
                     .cols = KV});
    be.synchronize();
    const std::vector<float> kv0 = kv0_buf.values();
    EXPECT_TRUE(bit_identical(kv0, columns(qkv0, W, C, KV))) << "copy_columns of the keys and values";

    // Forward: rank 0 one causal block, rank 1 its causal block merged with the block against chunk 0.
    const BlockShape own{B, c, c, W, NH, NKV, HS, C, 0, c, c, true, false};
    const BlockShape remote{B, c, c, KV, NH, NKV, HS, 0, 0, c, c, false, true};
    BlockInputs r0, r1;
    r0.qkv = qkv0;
    r1.qkv = qkv1;
    r0.kv_is_qkv = r1.kv_is_qkv = true;
    r0.acc.assign(size_t(rows) * C, NAN);
    r0.lse.assign(size_t{1} * B * NH * c, NAN);
    r1.acc = r0.acc;
    r1.lse = r0.lse;
    const BlockForwardResult f0 = run_block_forward(be, d, own, r0);
    BlockForwardResult f1 = run_block_forward(be, d, own, r1);
    BlockInputs r1_remote = r1;
    r1_remote.kv = kv0;
    r1_remote.kv_is_qkv = false;
    r1_remote.acc = f1.acc;
    r1_remote.lse = f1.lse;
    f1 = run_block_forward(be, d, remote, r1_remote);

    // acc -> out through the backend's cast, as the ring does.
    auto to_out = [&](const std::vector<float>& acc) {
        TypedBuf src(DType::kF32, acc), dst(d, acc.size());
        be.cast({.src = src.tensor({static_cast<int64_t>(acc.size())}),
                 .dst = dst.tensor({static_cast<int64_t>(acc.size())})});
        be.synchronize();
        return dst.values();
    };
    const std::vector<float> out0 = to_out(f0.acc), out1 = to_out(f1.acc);
    expect_gqa_close(tag + " rank 0 out", gqa_error(out0, sequence_rows(full.out, B, T, C, 0, c)), tol.out);
    expect_gqa_close(tag + " rank 1 out", gqa_error(out1, sequence_rows(full.out, B, T, C, c, c)), tol.out);
    expect_gqa_close(tag + " rank 0 lse", gqa_error(f0.lse, sequence_rows(full.lse, B * NH, T, 1, 0, c)), tol.lse);
    expect_gqa_close(tag + " rank 1 lse", gqa_error(f1.lse, sequence_rows(full.lse, B * NH, T, 1, c, c)), tol.lse);

    // Backward. dkv0 collects chunk 0's key/value gradient from both ranks.
    const std::vector<float> zeros_q(size_t(rows) * C, 0.0f), zeros_kv(size_t(rows) * KV, 0.0f);
    r0.dout = dout0;
    r0.out = out0;
    r0.final_lse = f0.lse;
    r0.dq = zeros_q;
    r0.dkv = zeros_kv;
    const BlockBackwardResult b0 = run_block_backward(be, d, own, r0);
    r1.dout = dout1;
    r1.out = out1;
    r1.final_lse = f1.lse;
    r1.dq = zeros_q;
    r1.dkv = zeros_kv;
    const BlockBackwardResult b1_own = run_block_backward(be, d, own, r1);
    r1_remote.dout = dout1;
    r1_remote.out = out1;
    r1_remote.final_lse = f1.lse;
    r1_remote.dq = b1_own.dq;
    r1_remote.dkv = b0.dkv;
    const BlockBackwardResult b1_remote = run_block_backward(be, d, remote, r1_remote);

    // Each rank's fp32 dq and dkv into a dqkv of dtype d, by copy_columns.
    auto to_dqkv = [&](const std::vector<float>& dq, const std::vector<float>& dkv) {
        TypedBuf dq_buf(DType::kF32, dq), dkv_buf(DType::kF32, dkv), dqkv(d, size_t(rows) * W);
        be.copy_columns({.src = dq_buf.tensor({rows, C}), .dst = dqkv.tensor({rows, W}), .cols = C});
        be.copy_columns(
            {.src = dkv_buf.tensor({rows, KV}), .dst = dqkv.tensor({rows, W}), .dst_column = C, .cols = KV});
        be.synchronize();
        return dqkv.values();
    };
    const std::vector<float> dqkv0 = to_dqkv(b0.dq, b1_remote.dkv), dqkv1 = to_dqkv(b1_remote.dq, b1_own.dkv);
    expect_gqa_close(tag + " rank 0 dqkv", gqa_error(dqkv0, sequence_rows(full.dqkv, B, T, W, 0, c)), tol.dqkv);
    expect_gqa_close(tag + " rank 1 dqkv", gqa_error(dqkv1, sequence_rows(full.dqkv, B, T, W, c, c)), tol.dqkv);
}

}  // namespace ms::test
