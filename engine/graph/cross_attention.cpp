// cross_attention.cpp: see cross_attention.h.
#include "engine/graph/cross_attention.h"

#include <cstddef>

#include "engine/core/check.h"

namespace ms::graph {
namespace {

constexpr int64_t kAlignBytes = 256;

int64_t align_bytes(int64_t bytes) { return (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes; }
int64_t q_elems(const CrossAttentionShape& s) { return s.B * s.T * s.NH * s.HS; }
int64_t kv_elems(const CrossAttentionShape& s) { return s.B * s.S * 2 * s.NH * s.HS; }
int64_t qkv_bytes(const CrossAttentionShape& s) {
    return align_bytes(3 * q_elems(s) * static_cast<int64_t>(dtype_size(s.act)));
}
int64_t f32_bytes(int64_t n) { return align_bytes(n * static_cast<int64_t>(sizeof(float))); }
int64_t as_f32_elems(int64_t bytes) { return bytes / static_cast<int64_t>(sizeof(float)); }

// The scratch's first buffer: q packed into the query columns of a (B, T, 3*NH*HS) qkv tensor, the rest zero.
Tensor packed_qkv(Backend& be, const CrossAttentionShape& s, const Tensor& q, std::byte* at) {
    const int64_t C = s.NH * s.HS, rows = s.B * s.T;
    const Tensor qkv(at, s.act, {s.B, s.T, 3 * C});
    be.zero(qkv);
    be.copy_columns({Tensor(q.data, s.act, {rows, C}), Tensor(at, s.act, {rows, 3 * C}), 0, 0, C});
    return qkv;
}

void check_shape(const CrossAttentionShape& s, const Tensor& q, const Tensor& kv) {
    MS_CHECK(s.B >= 1 && s.T >= 1 && s.S >= 1 && s.NH >= 1 && s.HS >= 1, "cross attention: B {} T {} S {} NH {} HS {}",
             s.B, s.T, s.S, s.NH, s.HS);
    MS_CHECK(q.numel() == q_elems(s) && kv.numel() == kv_elems(s),
             "cross attention: q has {} elements (expected {}), kv {} (expected {})", q.numel(), q_elems(s), kv.numel(),
             kv_elems(s));
}

}  // namespace

int64_t cross_forward_scratch_elems(const CrossAttentionShape& s) {
    return as_f32_elems(qkv_bytes(s) + f32_bytes(q_elems(s)));
}

int64_t cross_backward_scratch_elems(const CrossAttentionShape& s) {
    return as_f32_elems(qkv_bytes(s) + f32_bytes(q_elems(s)) + f32_bytes(kv_elems(s)));
}

void cross_attention_forward(Backend& be, const CrossAttentionShape& s, const Tensor& q, const Tensor& kv,
                             const Tensor& out, const Tensor& lse, float* scratch) {
    check_shape(s, q, kv);
    auto* at = reinterpret_cast<std::byte*>(scratch);
    const Tensor qkv = packed_qkv(be, s, q, at);
    const Tensor acc(at + qkv_bytes(s), DType::kF32, {s.B, s.T, s.NH * s.HS});
    be.attention_block_forward({.qkv = qkv,
                                .kv = Tensor(kv.data, s.act, {s.B, s.S, 2 * s.NH * s.HS}),
                                .acc = acc,
                                .lse = lse,
                                .kv_column = 0,
                                .q_begin = 0,
                                .q_rows = s.T,
                                .kv_rows = s.S,
                                .causal = false,
                                .merge = false,
                                .NH = s.NH,
                                .NKV = s.NH});
    be.cast({Tensor(acc.data, DType::kF32, {q_elems(s)}), Tensor(out.data, out.dtype, {q_elems(s)})});
}

void cross_attention_backward(Backend& be, const CrossAttentionShape& s, const Tensor& dout, const Tensor& q,
                              const Tensor& kv, const Tensor& out, const Tensor& lse, const Tensor& dq,
                              const Tensor& dkv, float* scratch) {
    check_shape(s, q, kv);
    auto* at = reinterpret_cast<std::byte*>(scratch);
    const int64_t C = s.NH * s.HS;
    const Tensor qkv = packed_qkv(be, s, q, at);
    const Tensor dq32(at + qkv_bytes(s), DType::kF32, {s.B, s.T, C});
    const Tensor dkv32(at + qkv_bytes(s) + f32_bytes(q_elems(s)), DType::kF32, {s.B, s.S, 2 * C});
    be.zero(dq32);
    be.zero(dkv32);
    be.attention_block_backward({.dout = Tensor(dout.data, s.act, {s.B, s.T, C}),
                                 .qkv = qkv,
                                 .out = Tensor(out.data, s.act, {s.B, s.T, C}),
                                 .lse = lse,
                                 .kv = Tensor(kv.data, s.act, {s.B, s.S, 2 * C}),
                                 .dq = dq32,
                                 .dkv = dkv32,
                                 .kv_column = 0,
                                 .q_begin = 0,
                                 .q_rows = s.T,
                                 .kv_rows = s.S,
                                 .causal = false,
                                 .NH = s.NH,
                                 .NKV = s.NH});
    be.cast({Tensor(dq32.data, DType::kF32, {q_elems(s)}), Tensor(dq.data, dq.dtype, {q_elems(s)})});
    be.cast({Tensor(dkv32.data, DType::kF32, {kv_elems(s)}), Tensor(dkv.data, dkv.dtype, {kv_elems(s)})});
}

}  // namespace ms::graph
