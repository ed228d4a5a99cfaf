// profiling_backend.cpp: ProfilingBackend (profiling_backend.h).
#include "engine/backends/profiling_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>
#include <utility>

#include "engine/core/timer.h"
#include "memory/arena_memory.h"

namespace ms {

namespace {

// Flag bits of a group's key: which optional parts the call had.
enum : uint32_t { kBias = 1, kGelu = 2, kDinp = 4, kAdd = 8, kResidual = 16, kCopy = 32, kBackward = 64 };

const char* op_name(OpKind op) {
    switch (op) {
        case OpKind::kEmbeddingForward:
            return "embedding forward";
        case OpKind::kEmbeddingBackward:
            return "embedding backward";
        case OpKind::kLayerNormForward:
        case OpKind::kLayerNormResidualForward:  // timed as layernorm forward with the kResidual flag
            return "layernorm forward";
        case OpKind::kLayerNormBackward:
            return "layernorm backward";
        case OpKind::kMatmulForward:
            return "matmul forward";
        case OpKind::kMatmulBackward:
            return "matmul backward";
        case OpKind::kAttentionForward:
            return "attention forward";
        case OpKind::kAttentionBackward:
            return "attention backward";
        case OpKind::kGeluForward:
            return "gelu forward";
        case OpKind::kGeluBackward:
            return "gelu backward";
        case OpKind::kResidualForward:
            return "residual";
        case OpKind::kCrossEntropyForward:
            return "cross-entropy forward";
        case OpKind::kCrossEntropyBackward:
            return "cross-entropy backward";
        case OpKind::kLmHeadLoss:
            return "lm head + loss";
        case OpKind::kAdamW:
            return "adamw";
        case OpKind::kSumSquares:
            return "sum of squares";
        case OpKind::kCast:
            return "cast";
        case OpKind::kRmsNormForward:
            return "rmsnorm forward";
        case OpKind::kRmsNormBackward:
            return "rmsnorm backward";
        case OpKind::kRope:
            return "rope";
        case OpKind::kSwiGluForward:
            return "swiglu forward";
        case OpKind::kSwiGluBackward:
            return "swiglu backward";
        case OpKind::kAttentionBlockForward:
            return "attention block forward";
        case OpKind::kAttentionBlockBackward:
            return "attention block backward";
        case OpKind::kCopyColumns:
            return "copy columns";
        case OpKind::kCount:
            break;
    }
    return "zero";  // kCount stands for zero(), which has no OpKind of its own
}

// The (N, K) rows x columns of a 2-D (or flattened) activation: every dim but the last, and the last.
std::pair<int64_t, int64_t> rows_cols(const Tensor& t) {
    if (t.ndim == 0) return {0, 0};
    const int64_t cols = t.shape[t.ndim - 1];
    return {cols == 0 ? 0 : t.numel() / cols, cols};
}

uint32_t flag(bool on, uint32_t bit) { return on ? bit : 0; }

std::string describe(OpKind op, const std::array<int64_t, 4>& d, uint32_t flags) {
    std::string s = op_name(op);
    switch (op) {
        case OpKind::kMatmulForward:
        case OpKind::kMatmulBackward:
            s += fmt::format(" N {} K {} M {}", d[0], d[1], d[2]);
            break;
        case OpKind::kAttentionForward:
        case OpKind::kAttentionBackward:
            s += fmt::format(" B {} T {} NH {} HS {}", d[0], d[1], d[2], d[3]);
            break;
        case OpKind::kLmHeadLoss:
            s += fmt::format(" N {} C {} Vp {}", d[0], d[1], d[2]);
            break;
        case OpKind::kCrossEntropyForward:  // d[1]: the phase + 1
            s += fmt::format(" n {} ({})", d[0], d[1] == 1 ? "max" : d[1] == 2 ? "sum-exp" : "max and sum-exp");
            break;
        default:
            if (d[0] > 0) s += fmt::format(" n {}", d[0]);
            break;
    }
    if (flags & kBias) s += " +bias";
    if (flags & kGelu) s += " +gelu";
    if (flags & kDinp) s += " +dinp";
    if (flags & kAdd) s += " (+=)";
    if (flags & kResidual) s += " +residual";
    if (flags & kCopy) s += " +16-bit copy";
    if (flags & kBackward) s += " +backward";
    return s;
}

}  // namespace

bool OpKey::operator<(const OpKey& o) const { return std::tie(op, dims, flags) < std::tie(o.op, o.dims, o.flags); }

std::string OpKey::describe() const { return ms::describe(op, dims, flags); }

ProfilingBackend::ProfilingBackend(std::unique_ptr<Backend> inner, Totals totals)
    : inner_(std::move(inner)), totals_on_(totals == Totals::kOn) {}

std::unique_ptr<ArenaMemory> ProfilingBackend::make_arena_memory(size_t bytes) {
    return inner_->make_arena_memory(bytes);
}

template <class F>
void ProfilingBackend::timed(const Key& key, F&& op) {
    const bool record = timeline_ != nullptr && timeline_->recording();
    if (!totals_on_ && !record) return op();
    inner_->synchronize();  // whatever the host issued before (e.g. a collective's wait) is not this op's
    const double t0 = now_seconds();
    op();
    inner_->synchronize();
    const double t1 = now_seconds();
    if (totals_on_) {
        Sums& t = totals_[key];  // allocates at a group's first call only
        ++t.calls;
        t.seconds += t1 - t0;
    }
    if (record) timeline_->op(key, t0, t1);
}

void ProfilingBackend::reset() { totals_.clear(); }

std::vector<ProfilingBackend::Row> ProfilingBackend::rows() const {
    std::vector<Row> out;
    for (const auto& [key, t] : totals_) out.push_back({describe(key.op, key.dims, key.flags), t.calls, t.seconds});
    std::stable_sort(out.begin(), out.end(), [](const Row& a, const Row& b) { return a.seconds > b.seconds; });
    return out;
}

std::vector<std::string> ProfilingBackend::table(double step_seconds, int64_t steps) const {
    const std::vector<Row> r = rows();
    const double per = steps > 0 ? 1e3 / static_cast<double>(steps) : 0.0;  // seconds -> ms per step
    std::vector<std::string> lines;
    lines.push_back(fmt::format("op profile over {} step(s) of {:.3f} ms (each op timed alone: MS_PROFILE_OPS=1)",
                                steps, step_seconds * per));
    lines.push_back(fmt::format("{:<58} {:>7} {:>12} {:>8}", "op", "calls", "ms/step", "% step"));
    double ops = 0.0;
    for (const Row& row : r) {
        ops += row.seconds;
        lines.push_back(fmt::format("{:<58} {:>7} {:>12.3f} {:>7.1f}%", row.op, row.calls, row.seconds * per,
                                    step_seconds > 0 ? 100.0 * row.seconds / step_seconds : 0.0));
    }
    const double rest = step_seconds - ops;
    lines.push_back(fmt::format("{:<58} {:>7} {:>12.3f} {:>7.1f}%", "(rest: host work, communication, waits)", "",
                                rest * per, step_seconds > 0 ? 100.0 * rest / step_seconds : 0.0));
    return lines;
}

void ProfilingBackend::embedding_forward(const EmbeddingForwardArgs& a) {
    timed({OpKind::kEmbeddingForward, {a.out.numel()}}, [&] { inner_->embedding_forward(a); });
}
void ProfilingBackend::embedding_backward(const EmbeddingBackwardArgs& a) {
    timed({OpKind::kEmbeddingBackward, {a.dout.numel()}}, [&] { inner_->embedding_backward(a); });
}
void ProfilingBackend::layernorm_forward(const LayerNormForwardArgs& a) {
    timed({OpKind::kLayerNormForward, {a.out.numel()}, flag(a.residual_out.defined(), kResidual)},
          [&] { inner_->layernorm_forward(a); });
}
void ProfilingBackend::layernorm_backward(const LayerNormBackwardArgs& a) {
    timed({OpKind::kLayerNormBackward, {a.dout.numel()}, flag(a.accumulate == Accumulate::kAdd, kAdd)},
          [&] { inner_->layernorm_backward(a); });
}
void ProfilingBackend::matmul_forward(const MatmulForwardArgs& a) {
    const auto [N, K] = rows_cols(a.inp);
    const int64_t M = a.weight.ndim > 0 ? a.weight.shape[0] : 0;
    timed({OpKind::kMatmulForward, {N, K, M}, flag(a.bias.defined(), kBias) | flag(a.gelu_out.defined(), kGelu)},
          [&] { inner_->matmul_forward(a); });
}
void ProfilingBackend::matmul_backward(const MatmulBackwardArgs& a) {
    const auto [N, K] = rows_cols(a.inp);
    const int64_t M = a.weight.ndim > 0 ? a.weight.shape[0] : 0;
    timed({OpKind::kMatmulBackward,
           {N, K, M},
           flag(a.dbias.defined(), kBias) | flag(a.gelu_inp.defined(), kGelu) | flag(a.dinp.defined(), kDinp) |
               flag(a.dinp.defined() && a.accumulate == Accumulate::kAdd, kAdd)},
          [&] { inner_->matmul_backward(a); });
}
void ProfilingBackend::attention_forward(const AttentionForwardArgs& a) {
    const int64_t B = a.qkv.ndim > 0 ? a.qkv.shape[0] : 0, T = a.qkv.ndim > 1 ? a.qkv.shape[1] : 0;
    const int64_t HS = a.NH > 0 && a.out.ndim > 2 ? a.out.shape[2] / a.NH : 0;
    timed({OpKind::kAttentionForward, {B, T, a.NH, HS}}, [&] { inner_->attention_forward(a); });
}
void ProfilingBackend::attention_backward(const AttentionBackwardArgs& a) {
    const int64_t B = a.qkv.ndim > 0 ? a.qkv.shape[0] : 0, T = a.qkv.ndim > 1 ? a.qkv.shape[1] : 0;
    const int64_t HS = a.NH > 0 && a.out.ndim > 2 ? a.out.shape[2] / a.NH : 0;
    timed({OpKind::kAttentionBackward, {B, T, a.NH, HS}}, [&] { inner_->attention_backward(a); });
}
void ProfilingBackend::gelu_forward(const GeluForwardArgs& a) {
    timed({OpKind::kGeluForward, {a.inp.numel()}}, [&] { inner_->gelu_forward(a); });
}
void ProfilingBackend::gelu_backward(const GeluBackwardArgs& a) {
    timed({OpKind::kGeluBackward, {a.inp.numel()}}, [&] { inner_->gelu_backward(a); });
}
void ProfilingBackend::residual_forward(const ResidualForwardArgs& a) {
    timed({OpKind::kResidualForward, {a.out.numel()}, flag(a.bias.defined(), kBias)},
          [&] { inner_->residual_forward(a); });
}
void ProfilingBackend::cross_entropy_forward(const CrossEntropyForwardArgs& a) {
    timed({OpKind::kCrossEntropyForward, {a.logits.numel(), static_cast<int64_t>(a.phase) + 1}},
          [&] { inner_->cross_entropy_forward(a); });
}
void ProfilingBackend::cross_entropy_backward(const CrossEntropyBackwardArgs& a) {
    timed({OpKind::kCrossEntropyBackward, {a.logits.numel()}}, [&] { inner_->cross_entropy_backward(a); });
}
void ProfilingBackend::lm_head_loss(const LmHeadLossArgs& a) {
    const auto [N, C] = rows_cols(a.lnf);
    const int64_t Vp = a.wte.ndim > 0 ? a.wte.shape[0] : 0;
    timed({OpKind::kLmHeadLoss, {N, C, Vp}, flag(a.dloss.defined(), kBackward)}, [&] { inner_->lm_head_loss(a); });
}
void ProfilingBackend::adamw(const AdamWArgs& a) {
    timed({OpKind::kAdamW, {a.param.numel()}, flag(a.param_copy.defined(), kCopy)}, [&] { inner_->adamw(a); });
}
double ProfilingBackend::sum_squares(const Tensor& x) {
    double r = 0.0;
    timed({OpKind::kSumSquares, {x.numel()}}, [&] { r = inner_->sum_squares(x); });
    return r;
}
void ProfilingBackend::cast(const CastArgs& a) {
    timed({OpKind::kCast, {a.src.numel()}}, [&] { inner_->cast(a); });
}
void ProfilingBackend::rmsnorm_forward(const RmsNormForwardArgs& a) {
    timed({OpKind::kRmsNormForward, {a.inp.numel()}}, [&] { inner_->rmsnorm_forward(a); });
}
void ProfilingBackend::rmsnorm_backward(const RmsNormBackwardArgs& a) {
    timed({OpKind::kRmsNormBackward, {a.inp.numel()}, flag(a.accumulate == Accumulate::kAdd, kAdd)},
          [&] { inner_->rmsnorm_backward(a); });
}
void ProfilingBackend::rope(const RopeArgs& a) {
    timed({OpKind::kRope, {a.qkv.numel()}, flag(a.direction == RopeDirection::kInverse, kBackward)},
          [&] { inner_->rope(a); });
}
void ProfilingBackend::swiglu_forward(const SwiGluForwardArgs& a) {
    timed({OpKind::kSwiGluForward, {a.out.numel()}}, [&] { inner_->swiglu_forward(a); });
}
void ProfilingBackend::swiglu_backward(const SwiGluBackwardArgs& a) {
    timed({OpKind::kSwiGluBackward, {a.dout.numel()}}, [&] { inner_->swiglu_backward(a); });
}
void ProfilingBackend::attention_block_forward(const AttentionBlockForwardArgs& a) {
    timed({OpKind::kAttentionBlockForward, {a.q_rows, a.kv_rows}}, [&] { inner_->attention_block_forward(a); });
}
void ProfilingBackend::attention_block_backward(const AttentionBlockBackwardArgs& a) {
    timed({OpKind::kAttentionBlockBackward, {a.q_rows, a.kv_rows}}, [&] { inner_->attention_block_backward(a); });
}
void ProfilingBackend::copy_columns(const CopyColumnsArgs& a) {
    timed({OpKind::kCopyColumns, {a.src.numel() == 0 ? 0 : a.src.dim(0), a.cols}}, [&] { inner_->copy_columns(a); });
}
void ProfilingBackend::zero(const Tensor& x) {
    timed({OpKind::kCount, {x.numel()}}, [&] { inner_->zero(x); });
}

}  // namespace ms
