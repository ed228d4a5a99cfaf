// ring_attention.cpp: see ring_attention.h for the ring's schedule.
#include "engine/graph/ring_attention.h"

#include <array>
#include <cstddef>
#include <utility>

#include "engine/core/check.h"

namespace ms::graph {
namespace {

constexpr int64_t kAlignBytes = 256;

int64_t align_bytes(int64_t bytes) { return (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes; }

// Elements of one packed [K | V] block and of one (B, T, NH*HS) output.
int64_t kv_elems(const RingAttentionShape& s) { return s.B * s.T * 2 * s.NKV * s.HS; }
int64_t out_elems(const RingAttentionShape& s) { return s.B * s.T * s.NH * s.HS; }
int64_t kv_block_bytes(const RingAttentionShape& s) {
    return align_bytes(kv_elems(s) * static_cast<int64_t>(dtype_size(s.act)));
}
int64_t f32_bytes(int64_t n) { return align_bytes(n * static_cast<int64_t>(sizeof(float))); }
int64_t as_f32_elems(int64_t bytes) { return bytes / static_cast<int64_t>(sizeof(float)); }

// Carves the scratch into buffers, in order.
class Carver {
  public:
    explicit Carver(float* scratch) : at_(reinterpret_cast<std::byte*>(scratch)) {}
    Tensor take(DType t, std::initializer_list<int64_t> dims, int64_t bytes) {
        Tensor out(at_, t, dims);
        at_ += bytes;
        return out;
    }

  private:
    std::byte* at_;
};

// The block of ring step `step` on this rank: which query rows see how many of its key rows (ring_attention.h).
struct BlockRows {
    int64_t q_begin, q_rows, kv_rows;
    bool causal;
};
BlockRows block_rows(int rank, int cp, int step, int64_t T, bool causal) {
    if (!causal) return {0, T, T, false};
    const int64_t c = T / 2;
    const int j = (rank - step + cp) % cp;
    if (step == 0) return {0, T, T, true};
    if (j < rank) return {0, T, c, false};
    return {c, c, T, false};
}

// What an exchange carries. The backward has a block's keys and values and an accumulator in flight at once between
// the same two ranks; every rank posts them in the same order, which is how NCCL matches them, and MPI's tags say
// which is which as well.
enum class Carries : int { kKeysValues = 0, kGradients = 1 };

// The exchange of one ring step: `send` to the next rank, `recv` from the previous one (nothing on one rank).
Handle exchange(Communicator& cp, const Tensor& send, const Tensor& recv, Carries what) {
    const int n = cp.size(), r = cp.rank(), tag = static_cast<int>(what);
    const std::array<P2POp, 2> ops = {
        P2POp{P2POp::Kind::kSend, (r + 1) % n, send.data, static_cast<size_t>(send.numel()), send.dtype, tag},
        P2POp{P2POp::Kind::kRecv, (r + n - 1) % n, recv.data, static_cast<size_t>(recv.numel()), recv.dtype, tag}};
    return cp.batch_send_recv(ops, Priority::kHigh);
}

// The two key/value blocks of the ring, carved first from the scratch, and the rank's own keys and values packed
// from qkv into the first.
std::array<Tensor, 2> kv_blocks(Backend& be, Carver& carve, const RingAttentionShape& s, const Tensor& qkv) {
    const int64_t W = (s.NH + 2 * s.NKV) * s.HS, Wkv = 2 * s.NKV * s.HS, rows = s.B * s.T;
    std::array<Tensor, 2> kv = {carve.take(s.act, {s.B, s.T, Wkv}, kv_block_bytes(s)),
                                carve.take(s.act, {s.B, s.T, Wkv}, kv_block_bytes(s))};
    be.copy_columns({Tensor(qkv.data, s.act, {rows, W}), Tensor(kv[0].data, s.act, {rows, Wkv}), s.NH * s.HS, 0, Wkv});
    return kv;
}

void check_shape(const RingAttentionShape& s, int cp) {
    MS_CHECK(s.T % 2 == 0 || cp == 1 || !s.causal, "ring attention: {} local rows are not two chunks", s.T);
    MS_CHECK(s.NKV >= 1 && s.NH % s.NKV == 0, "ring attention: NKV {} does not divide NH {}", s.NKV, s.NH);
}

}  // namespace

int64_t ring_forward_scratch_elems(const RingAttentionShape& s) {
    return as_f32_elems(2 * kv_block_bytes(s) + f32_bytes(out_elems(s)));
}

int64_t ring_backward_scratch_elems(const RingAttentionShape& s) {
    return as_f32_elems(2 * kv_block_bytes(s) + 3 * f32_bytes(kv_elems(s)) + f32_bytes(out_elems(s)));
}

void ring_attention_forward(Backend& be, Communicator& cp, const RingAttentionShape& s, const Tensor& qkv,
                            const Tensor& out, const Tensor& lse, float* scratch) {
    const int n = cp.size(), rank = cp.rank();
    check_shape(s, n);
    const int64_t C = s.NH * s.HS;
    Carver carve(scratch);
    const std::array<Tensor, 2> kv = kv_blocks(be, carve, s, qkv);
    const Tensor acc = carve.take(DType::kF32, {s.B, s.T, C}, f32_bytes(out_elems(s)));
    for (int step = 0; step < n; ++step) {
        const Tensor& here = kv[static_cast<size_t>(step % 2)];
        Handle next;
        if (step + 1 < n) next = exchange(cp, here, kv[static_cast<size_t>((step + 1) % 2)], Carries::kKeysValues);
        const BlockRows b = block_rows(rank, n, step, s.T, s.causal);
        be.attention_block_forward({.qkv = qkv,
                                    .kv = here,
                                    .acc = acc,
                                    .lse = lse,
                                    .kv_column = 0,
                                    .q_begin = b.q_begin,
                                    .q_rows = b.q_rows,
                                    .kv_rows = b.kv_rows,
                                    .causal = b.causal,
                                    .merge = step > 0,
                                    .NH = s.NH,
                                    .NKV = s.NKV});
        next.wait();
    }
    be.cast({Tensor(acc.data, DType::kF32, {out_elems(s)}), Tensor(out.data, out.dtype, {out_elems(s)})});
}

void ring_attention_backward(Backend& be, Communicator& cp, const RingAttentionShape& s, const Tensor& dout,
                             const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dqkv,
                             float* scratch) {
    const int n = cp.size(), rank = cp.rank();
    check_shape(s, n);
    const int64_t W = (s.NH + 2 * s.NKV) * s.HS, Wkv = 2 * s.NKV * s.HS, C = s.NH * s.HS;
    Carver carve(scratch);
    const std::array<Tensor, 2> kv = kv_blocks(be, carve, s, qkv);
    // the travelling accumulators (one in flight, one arriving) and this step's own part of a block's gradient
    std::array<Tensor, 2> dkv = {carve.take(DType::kF32, {s.B, s.T, Wkv}, f32_bytes(kv_elems(s))),
                                 carve.take(DType::kF32, {s.B, s.T, Wkv}, f32_bytes(kv_elems(s)))};
    const Tensor part = carve.take(DType::kF32, {s.B, s.T, Wkv}, f32_bytes(kv_elems(s)));
    const Tensor dq = carve.take(DType::kF32, {s.B, s.T, C}, f32_bytes(out_elems(s)));
    const auto flat = [&](const Tensor& t) { return Tensor(t.data, DType::kF32, {kv_elems(s)}); };
    be.zero(dkv[0]);
    be.zero(dq);
    Handle gradients;  // the accumulator exchange of the previous step, in flight during this step's compute
    for (int step = 0; step < n; ++step) {
        const size_t here = static_cast<size_t>(step % 2), other = 1 - here;
        Handle next;
        if (step + 1 < n) next = exchange(cp, kv[here], kv[other], Carries::kKeysValues);
        // Step 0 adds into its own block's accumulator; later steps into `part`, added to the block's accumulator
        // once it has arrived, so that its exchange runs behind this compute.
        if (step > 0) be.zero(part);
        const BlockRows b = block_rows(rank, n, step, s.T, s.causal);
        be.attention_block_backward({.dout = dout,
                                     .qkv = qkv,
                                     .out = out,
                                     .lse = lse,
                                     .kv = kv[here],
                                     .dq = dq,
                                     .dkv = step > 0 ? part : dkv[here],
                                     .kv_column = 0,
                                     .q_begin = b.q_begin,
                                     .q_rows = b.q_rows,
                                     .kv_rows = b.kv_rows,
                                     .causal = b.causal,
                                     .NH = s.NH,
                                     .NKV = s.NKV});
        gradients.wait();
        if (step > 0) be.residual_forward({flat(dkv[here]), flat(part), flat(dkv[here]), {}});
        // the block's gradients go on with it; the last exchange brings every rank its own
        if (n > 1) gradients = exchange(cp, dkv[here], dkv[other], Carries::kGradients);
        next.wait();
    }
    gradients.wait();
    // after n steps (n exchanges of the accumulators) this rank's own block's gradients are in dkv[n % 2]
    const Tensor& own = dkv[static_cast<size_t>(n > 1 ? n % 2 : 0)];
    be.copy_columns({Tensor(dq.data, DType::kF32, {s.B * s.T, C}), Tensor(dqkv.data, s.act, {s.B * s.T, W}), 0, 0, C});
    be.copy_columns(
        {Tensor(own.data, DType::kF32, {s.B * s.T, Wkv}), Tensor(dqkv.data, s.act, {s.B * s.T, W}), 0, C, Wkv});
}

}  // namespace ms::graph
