// program.cpp: compiling a chunk's graph to flat programs (program.h).
#include "engine/graph/program.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "comm/self_communicator.h"
#include "engine/core/check.h"

namespace ms::graph {
namespace {

class Compiler {
  public:
    Compiler(const Graph& g, const MemoryPlan& plan, const Bindings& at, Backend& be, Communicator& tp,
             double* loss_sum, Communicator* cp)
        : g_(g), plan_(plan), at_(at), be_(be), tp_(tp), loss_sum_(loss_sum), cp_(cp) {}

    void* address(TensorId t) const {
        const TensorInfo& i = g_.info(t);
        if (i.role == Role::kParameter) return at_.weights + i.param_offset * static_cast<int64_t>(dtype_size(i.dtype));
        if (i.role == Role::kGradient) {
            MS_CHECK(at_.grads != nullptr && at_.grads->dtype() == i.dtype,
                     "graph program: gradient '{}' ({}) has no memory of its dtype bound", i.name, dtype_name(i.dtype));
            return at_.grads->at(i.param_offset, i.numel());
        }
        if (i.role == Role::kHeadGradient) {
            MS_CHECK(at_.head_grads != nullptr, "graph program: '{}' is kept apart, but no buffer is bound for it",
                     i.name);
            return at_.head_grads + i.param_offset * static_cast<int64_t>(dtype_size(i.dtype));
        }
        const MemoryPlan::Place p = plan_.place(g_, t);
        MS_CHECK(p.group != MemGroup::kNone, "graph program: tensor '{}' has no memory in the plan", i.name);
        return (p.group == MemGroup::kSlot ? at_.slot : at_.scratch) + p.offset;
    }
    // t viewed with these dims (its element count), or an undefined tensor for kNoTensor
    Tensor view(TensorId t, std::initializer_list<int64_t> dims) const {
        if (t == kNoTensor) return {};
        Tensor v(address(t), g_.info(t).dtype, dims);
        MS_CHECK(v.numel() == g_.info(t).numel(), "graph program: '{}' viewed as {} elements, holds {}",
                 g_.info(t).name, v.numel(), g_.info(t).numel());
        return v;
    }
    Tensor rows(TensorId t) const {  // (rows, cols) or (rows)
        if (t == kNoTensor) return {};
        const auto& s = g_.info(t).shape;
        return s.size() == 1 ? view(t, {s[0]}) : view(t, {s[0], s[1]});
    }
    int64_t dim(TensorId t, size_t d) const { return g_.info(t).shape.at(d); }
    // The first rows of t (a position table, of which a call uses its T rows)
    Tensor leading_rows(TensorId t, int64_t count) const {
        if (t == kNoTensor) return {};
        MS_CHECK(count <= dim(t, 0), "graph program: {} rows of '{}', which has {}", count, g_.info(t).name, dim(t, 0));
        return Tensor(address(t), g_.info(t).dtype, {count, dim(t, 1)});
    }

    Program::Step step(const Node& n);

  private:
    const Graph& g_;
    const MemoryPlan& plan_;
    Bindings at_;
    Backend& be_;
    Communicator& tp_;
    double* loss_sum_;
    Communicator* cp_;
};

Program::Step Compiler::step(const Node& n) {
    const auto in = [&](size_t i) { return i < n.in.size() ? n.in[i] : kNoTensor; };
    const auto out = [&](size_t i) { return i < n.out.size() ? n.out[i] : kNoTensor; };
    Backend* be = &be_;
    Communicator* tp = &tp_;
    const std::string label = fmt::format("{} {}", n.label, op_name(n.op));
    switch (n.op) {
        case OpCode::kLoadTokens:
        case OpCode::kLoadTargets:
        case OpCode::kLoadRows: {
            int32_t* dst = static_cast<int32_t*>(address(out(0)));
            const int64_t count = g_.info(out(0)).numel(), vocab = n.vocab_valid;
            const OpCode what = n.op;
            return {label, [=](const RunArgs& r) {
                        const int32_t* src = what == OpCode::kLoadTokens    ? r.tokens
                                             : what == OpCode::kLoadTargets ? r.targets
                                                                            : r.rows;
                        be->synchronize();  // an earlier call's ops may still read the buffer
                        for (int64_t i = 0; i < count; ++i) {
                            MS_CHECK(src[i] >= 0 && src[i] < vocab, "{} {} at {} outside [0, {})",
                                     what == OpCode::kLoadTokens    ? "token"
                                     : what == OpCode::kLoadTargets ? "target"
                                                                    : "row",
                                     src[i], i, vocab);
                            dst[i] = src[i];
                        }
                    }};
        }
        case OpCode::kGatherRows: {  // an embedding lookup whose table is the activation
            EmbeddingForwardArgs a{view(in(1), {g_.info(in(1)).numel()}), rows(in(0)), Tensor(), rows(out(0)), 0, 1};
            return {label, [=](const RunArgs&) { be->embedding_forward(a); }};
        }
        case OpCode::kGatherRowsBackward: {  // the lookup's backward (+=), into dx zeroed first unless accumulating
            EmbeddingBackwardArgs a{view(in(0), {g_.info(in(0)).numel()}), rows(in(1)), rows(out(0)), Tensor(), 0, 1};
            const bool overwrite = n.accumulate == Accumulate::kOverwrite;
            return {label, [=](const RunArgs&) {
                        if (overwrite) be->zero(a.dtable);
                        be->embedding_backward(a);
                    }};
        }
        case OpCode::kLoadConstant: {
            float* dst = static_cast<float*>(address(out(0)));
            MS_CHECK(static_cast<int64_t>(n.constant.size()) == g_.info(out(0)).numel() &&
                         g_.info(out(0)).dtype == DType::kF32,
                     "graph program: '{}' holds {} values for {} fp32 elements", n.label, n.constant.size(),
                     g_.info(out(0)).numel());
            const std::vector<float> values = n.constant;
            return {label, [=](const RunArgs&) {
                        be->synchronize();  // an earlier call's ops may still read the buffer
                        std::copy(values.begin(), values.end(), dst);
                    }};
        }
        case OpCode::kRmsNorm: {
            RmsNormForwardArgs a{rows(in(0)), rows(in(1)), rows(out(0)), rows(out(1)), n.eps};
            return {label, [=](const RunArgs&) { be->rmsnorm_forward(a); }};
        }
        case OpCode::kRmsNormBackward: {
            RmsNormBackwardArgs a{rows(in(0)),  rows(in(1)),  rows(in(2)), rows(in(3)),
                                  rows(out(0)), rows(out(1)), n.accumulate};
            return {label, [=](const RunArgs&) { be->rmsnorm_backward(a); }};
        }
        case OpCode::kRope:
        case OpCode::kRopeBackward: {
            RopeArgs a{.qkv = rows(in(0)),
                       .table = rows(in(1)),
                       .positions = {},
                       .T = n.T,
                       .NH = n.NH,
                       .NKV = n.NKV,
                       .direction = n.op == OpCode::kRope ? RopeDirection::kForward : RopeDirection::kInverse};
            return {label, [=](const RunArgs&) { be->rope(a); }};
        }
        case OpCode::kSwiGlu: {
            SwiGluForwardArgs a{rows(in(0)), rows(out(0))};
            return {label, [=](const RunArgs&) { be->swiglu_forward(a); }};
        }
        case OpCode::kSwiGluBackward: {
            SwiGluBackwardArgs a{rows(in(0)), rows(in(1)), rows(out(0))};
            return {label, [=](const RunArgs&) { be->swiglu_backward(a); }};
        }
        case OpCode::kEmbedding: {
            const int64_t T = n.T;
            EmbeddingForwardArgs a{view(in(0), {g_.info(in(0)).numel()}),
                                   rows(in(1)),
                                   n.pos_on_this_rank ? leading_rows(in(2), T) : Tensor(),
                                   rows(out(0)),
                                   n.vocab_start,
                                   T};
            return {label, [=](const RunArgs&) { be->embedding_forward(a); }};
        }
        case OpCode::kLayerNorm:
        case OpCode::kResidualLayerNorm: {
            const bool fused = n.op == OpCode::kResidualLayerNorm;
            const size_t w = fused ? 3 : 1, o = fused ? 1 : 0;
            LayerNormForwardArgs a{.inp = fused ? Tensor() : rows(in(0)),
                                   .weight = rows(in(w)),
                                   .bias = rows(in(w + 1)),
                                   .out = rows(out(o)),
                                   .mean = rows(out(o + 1)),
                                   .rstd = rows(out(o + 2)),
                                   .eps = n.eps};
            if (fused) {
                a.residual_a = rows(in(0));
                a.residual_b = rows(in(1));
                a.residual_bias = rows(in(2));
                a.residual_out = rows(out(0));
            }
            return {label, [=](const RunArgs&) { be->layernorm_forward(a); }};
        }
        case OpCode::kMatmul:
        case OpCode::kMatmulGelu: {
            MatmulForwardArgs a{rows(in(0)), rows(in(1)), rows(in(2)), rows(out(0)), rows(out(1))};
            return {label, [=](const RunArgs&) { be->matmul_forward(a); }};
        }
        case OpCode::kGelu: {
            GeluForwardArgs a{view(in(0), {g_.info(in(0)).numel()}), view(out(0), {g_.info(out(0)).numel()})};
            return {label, [=](const RunArgs&) { be->gelu_forward(a); }};
        }
        case OpCode::kAttention: {
            const int64_t B = n.B, T = n.T;
            AttentionForwardArgs a{view(in(0), {B, T, dim(in(0), 1)}), view(out(0), {B, T, dim(out(0), 1)}),
                                   view(out(1), {B, n.NH, T}), n.NH, n.NKV};
            return {label, [=](const RunArgs&) { be->attention_forward(a); }};
        }
        case OpCode::kRingAttention:
        case OpCode::kRingAttentionBackward: {
            // without a context group, the whole sequence on this rank: a ring of one
            static SelfCommunicator one_rank("attention");
            Communicator* cp = cp_ != nullptr ? cp_ : &one_rank;
            const RingAttentionShape s = ring_attention_shape(g_, n);
            const int64_t B = n.B, T = n.T, W = (s.NH + 2 * s.NKV) * s.HS, C = s.NH * s.HS;
            const Tensor lse = n.op == OpCode::kRingAttention ? view(out(1), {B, s.NH, T}) : view(in(3), {B, s.NH, T});
            float* scratch = static_cast<float*>(address(n.op == OpCode::kRingAttention ? out(2) : out(1)));
            if (n.op == OpCode::kRingAttention) {
                const Tensor qkv = view(in(0), {B, T, W}), y = view(out(0), {B, T, C});
                return {label, [=](const RunArgs&) { ring_attention_forward(*be, *cp, s, qkv, y, lse, scratch); }};
            }
            const Tensor dy = view(in(0), {B, T, C}), qkv = view(in(1), {B, T, W}), y = view(in(2), {B, T, C}),
                         dqkv = view(out(0), {B, T, W});
            return {label,
                    [=](const RunArgs&) { ring_attention_backward(*be, *cp, s, dy, qkv, y, lse, dqkv, scratch); }};
        }
        case OpCode::kCrossAttention:
        case OpCode::kCrossAttentionBackward: {
            const CrossAttentionShape s = cross_attention_shape(g_, n);
            const int64_t B = n.B, T = n.T, S = n.S, C = s.NH * s.HS;
            if (n.op == OpCode::kCrossAttention) {
                const Tensor q = view(in(0), {B, T, C}), kv = view(in(1), {B, S, 2 * C}), y = view(out(0), {B, T, C}),
                             lse = view(out(1), {B, s.NH, T});
                float* scratch = static_cast<float*>(address(out(2)));
                return {label, [=](const RunArgs&) { cross_attention_forward(*be, s, q, kv, y, lse, scratch); }};
            }
            const Tensor dy = view(in(0), {B, T, C}), q = view(in(1), {B, T, C}), kv = view(in(2), {B, S, 2 * C}),
                         y = view(in(3), {B, T, C}), lse = view(in(4), {B, s.NH, T}), dq = view(out(0), {B, T, C}),
                         dkv = view(out(1), {B, S, 2 * C});
            float* scratch = static_cast<float*>(address(out(2)));
            return {label,
                    [=](const RunArgs&) { cross_attention_backward(*be, s, dy, q, kv, y, lse, dq, dkv, scratch); }};
        }
        case OpCode::kResidual: {
            const int64_t count = g_.info(out(0)).numel();
            ResidualForwardArgs a{view(in(0), {count}), view(in(1), {count}), view(out(0), {count}), rows(in(2))};
            return {label, [=](const RunArgs&) { be->residual_forward(a); }};
        }
        case OpCode::kCrossEntropy: {
            const TensorId logits = in(0), sums = out(1);
            const int64_t N = dim(logits, 0);
            float* s = sums == kNoTensor ? nullptr : static_cast<float*>(address(sums));
            CrossEntropyForwardArgs a{rows(logits),
                                      view(in(1), {N}),
                                      rows(n.ce_phase == CrossEntropyPhase::kSumExp ? in(2) : out(0)),
                                      s ? Tensor::f32(s, {N}) : Tensor(),
                                      s ? Tensor::f32(s + N, {N}) : Tensor(),
                                      n.vocab_start,
                                      n.vocab_valid,
                                      n.ce_phase};
            return {label, [=](const RunArgs&) { be->cross_entropy_forward(a); }};
        }
        case OpCode::kLoss: {
            const int64_t N = dim(in(2), 0);
            const float* row_max = static_cast<const float*>(address(in(2)));
            const float* sums = static_cast<const float*>(address(in(3)));
            float* losses = static_cast<float*>(address(out(0)));
            double* total = loss_sum_;
            MS_CHECK(total != nullptr, "graph program: a loss op needs somewhere to put the loss");
            return {label, [=](const RunArgs&) {
                        be->synchronize();  // the host reads the kernels' statistics
                        double sum = 0;
                        for (int64_t i = 0; i < N; ++i) {
                            losses[i] = std::log(sums[i]) + row_max[i] - sums[N + i];
                            sum += losses[i];
                        }
                        *total = sum;
                    }};
        }
        case OpCode::kLossGradient: {
            float* dloss = static_cast<float*>(address(out(0)));
            const int64_t N = g_.info(out(0)).numel();
            return {label, [=](const RunArgs& r) {
                        if (r.loss_scale == 0.0f) return;  // a forward no backward follows
                        be->synchronize();  // the previous call's cross-entropy backward may still read it
                        const float d = r.loss_scale / static_cast<float>(N);
                        for (int64_t i = 0; i < N; ++i) dloss[i] = d;
                    }};
        }
        case OpCode::kLmHeadLoss: {
            const int64_t N = dim(in(0), 0);
            LmHeadLossArgs a{.lnf = rows(in(0)),
                             .wte = rows(in(1)),
                             .targets = view(in(2), {N}),
                             .dloss = rows(in(3)),
                             .losses = rows(out(0)),
                             .dlnf = rows(out(1)),
                             .dwte = rows(out(2)),
                             .scratch = rows(out(3)),
                             .vocab_start = n.vocab_start,
                             .vocab_valid_local = n.vocab_valid,
                             .chunk_rows = n.chunk_rows};
            LmHeadLossArgs forward_only = a;  // what a forward no backward follows computes
            forward_only.dloss = forward_only.dlnf = forward_only.dwte = Tensor();
            const float* losses = static_cast<const float*>(address(out(0)));
            double* total = loss_sum_;
            MS_CHECK(total != nullptr, "graph program: a loss op needs somewhere to put the loss");
            return {label, [=](const RunArgs& r) {
                        be->lm_head_loss(r.loss_scale == 0.0f ? forward_only : a);
                        be->synchronize();  // the host reads the losses
                        double sum = 0;
                        for (int64_t i = 0; i < N; ++i) sum += losses[i];
                        *total = sum;
                    }};
        }
        case OpCode::kCrossEntropyBackward: {
            const int64_t N = dim(in(0), 0);
            const float* sums = static_cast<const float*>(address(in(3)));
            CrossEntropyBackwardArgs a{
                rows(in(0)), view(in(1), {N}), rows(in(2)),  Tensor::f32(const_cast<float*>(sums), {N}),
                rows(in(4)), n.vocab_start,    n.vocab_valid};
            return {label, [=](const RunArgs&) { be->cross_entropy_backward(a); }};
        }
        case OpCode::kMatmulBackward: {
            MatmulBackwardArgs a{rows(in(0)),  rows(in(1)),  rows(in(2)),  rows(out(0)),
                                 rows(out(1)), rows(out(2)), n.accumulate, rows(in(3))};
            return {label, [=](const RunArgs&) { be->matmul_backward(a); }};
        }
        case OpCode::kGeluBackward: {
            const int64_t count = g_.info(in(0)).numel();
            GeluBackwardArgs a{view(in(0), {count}), view(in(1), {count}), view(out(0), {count})};
            return {label, [=](const RunArgs&) { be->gelu_backward(a); }};
        }
        case OpCode::kAttentionBackward: {
            const int64_t B = n.B, T = n.T, cols = dim(in(0), 1), qkv = dim(in(1), 1);
            AttentionBackwardArgs a{view(in(0), {B, T, cols}),
                                    view(in(1), {B, T, qkv}),
                                    view(in(2), {B, T, cols}),
                                    view(in(3), {B, n.NH, T}),
                                    view(out(0), {B, T, qkv}),
                                    n.NH,
                                    n.NKV};
            return {label, [=](const RunArgs&) { be->attention_backward(a); }};
        }
        case OpCode::kLayerNormBackward: {
            LayerNormBackwardArgs a{rows(in(0)),  rows(in(1)),  rows(in(2)),  rows(in(3)), rows(in(4)),
                                    rows(out(0)), rows(out(1)), rows(out(2)), n.accumulate};
            return {label, [=](const RunArgs&) { be->layernorm_backward(a); }};
        }
        case OpCode::kEmbeddingBackward: {
            const int64_t T = n.T;
            EmbeddingBackwardArgs a{view(in(0), {g_.info(in(0)).numel()}),
                                    rows(in(1)),
                                    rows(out(0)),
                                    leading_rows(out(1), T),
                                    n.vocab_start,
                                    T};
            return {label, [=](const RunArgs&) { be->embedding_backward(a); }};
        }
        case OpCode::kTpCopy:
            return {label, [](const RunArgs&) {}};
        case OpCode::kAllReduce: {
            void* data = address(in(0));
            const DType t = g_.info(in(0)).dtype;
            const size_t count = static_cast<size_t>(g_.info(in(0)).numel());
            const ReduceOp op = n.reduce;
            return {label, [=](const RunArgs&) {
                        visit_float(t, [&](auto z) {
                            using T = decltype(z);
                            tp->all_reduce(std::span<T>(static_cast<T*>(data), count), op, Priority::kHigh).wait();
                        });
                    }};
        }
        case OpCode::kAllGather:
        case OpCode::kReduceScatter: {
            const bool gather = n.op == OpCode::kAllGather;
            const void* src = address(in(0));
            void* dst = address(out(0));
            const DType t = g_.info(in(0)).dtype;
            const size_t local = static_cast<size_t>(g_.info(gather ? in(0) : out(0)).numel());
            const size_t full = local * static_cast<size_t>(tp_.size());
            return {
                label, [=](const RunArgs&) {
                    visit_float(t, [&](auto z) {
                        using T = decltype(z);
                        const T* s = static_cast<const T*>(src);
                        T* d = static_cast<T*>(dst);
                        if (gather) {
                            tp->all_gather(std::span<const T>(s, local), std::span<T>(d, full), Priority::kHigh).wait();
                        } else {
                            tp->reduce_scatter(std::span<const T>(s, full), std::span<T>(d, local), ReduceOp::kSum,
                                               Priority::kHigh)
                                .wait();
                        }
                    });
                }};
        }
        case OpCode::kBiasGradient:
            MS_UNREACHABLE(
                "graph program: '{}' keeps an unfused bias gradient, which no backend op computes: run the "
                "fusion pass (passes.h) first",
                n.label);
        default:
            break;
    }
    MS_UNREACHABLE("graph program: no backend call for {} ('{}')", op_name(n.op), n.label);
}

}  // namespace

Program compile_program(const Graph& g, Phase phase, const MemoryPlan& plan, const Bindings& at, Backend& backend,
                        Communicator& tp, double* loss_sum, Communicator* cp) {
    Compiler c(g, plan, at, backend, tp, loss_sum, cp);
    std::vector<Program::Step> steps;
    std::vector<size_t> step_of_node(g.nodes.size(), 0);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        if (g.nodes[i].phase != phase) continue;
        step_of_node[i] = steps.size();
        steps.push_back(c.step(g.nodes[i]));
    }
    std::vector<std::vector<GradRange>> needed_before(steps.size());
    std::vector<char> read(g.tensors.size(), 0);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        if (g.nodes[i].phase != phase) continue;
        for (TensorId t : g.nodes[i].in) {
            if (t == kNoTensor || read[static_cast<size_t>(t)]) continue;
            const TensorInfo& info = g.info(t);
            if (info.role != Role::kParameter) continue;
            read[static_cast<size_t>(t)] = 1;
            needed_before[step_of_node[i]].push_back({info.param_offset, info.param_offset + info.numel()});
        }
    }
    if (phase != Phase::kBackward || steps.empty()) return Program(std::move(steps), {}, std::move(needed_before));
    std::vector<int> first_writer(g.tensors.size(), -1), last_writer(g.tensors.size(), -1);
    for (size_t i = 0; i < g.nodes.size(); ++i)
        for (TensorId t : g.nodes[i].out) {
            if (t == kNoTensor) continue;
            last_writer[static_cast<size_t>(t)] = static_cast<int>(i);
            if (first_writer[static_cast<size_t>(t)] < 0 && g.nodes[i].phase == Phase::kBackward)
                first_writer[static_cast<size_t>(t)] = static_cast<int>(i);
        }
    std::vector<std::vector<GradRange>> final_after(steps.size()), written_before(steps.size());
    for (size_t t = 0; t < g.tensors.size(); ++t) {
        const TensorInfo& info = g.tensors[t];
        const int w = last_writer[t];
        const bool head_apart = info.role == Role::kHeadGradient;
        if ((info.role != Role::kGradient && !head_apart) || w < 0) continue;
        const GradRange range{info.param_offset, info.param_offset + info.numel(), head_apart};
        const size_t at_step =
            g.nodes[static_cast<size_t>(w)].phase == Phase::kBackward ? step_of_node[static_cast<size_t>(w)] : 0;
        final_after[at_step].push_back(range);
        if (first_writer[t] >= 0 && !head_apart)
            written_before[step_of_node[static_cast<size_t>(first_writer[t])]].push_back(range);
    }
    return Program(std::move(steps), std::move(final_after), std::move(needed_before), std::move(written_before));
}

GradWrites grad_writes(const Graph& g) {
    // every gradient tensor's range, with its writers: how many, the first in node order, any in the forward
    struct Written {
        GradRange range;
        int writers = 0, first = -1;
        bool in_forward = false;
    };
    std::vector<Written> ranges;
    for (size_t i = 0; i < g.nodes.size(); ++i)
        for (TensorId t : g.nodes[i].out) {
            if (t == kNoTensor || g.info(t).role != Role::kGradient) continue;
            const TensorInfo& info = g.info(t);
            const GradRange r{info.param_offset, info.param_offset + info.numel()};
            auto it = std::find_if(ranges.begin(), ranges.end(), [&](const Written& w) { return w.range == r; });
            if (it == ranges.end()) it = ranges.insert(ranges.end(), Written{r, 0, static_cast<int>(i), false});
            ++it->writers;
            it->in_forward = it->in_forward || g.nodes[i].phase == Phase::kForward;
        }
    // ranges that overlap another one are not one tensor's alone
    std::vector<char> overlaps(ranges.size(), 0);
    for (size_t a = 0; a < ranges.size(); ++a)
        for (size_t b = a + 1; b < ranges.size(); ++b)
            if (ranges[a].range.begin < ranges[b].range.end && ranges[b].range.begin < ranges[a].range.end)
                overlaps[a] = overlaps[b] = 1;
    std::vector<size_t> order(ranges.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a].first < ranges[b].first; });
    GradWrites out;
    int group = -1;  // the writer of out.once.back()
    for (size_t i : order) {
        const Written& w = ranges[i];
        if (w.writers != 1 || w.in_forward || overlaps[i]) {
            out.kept.push_back(w.range);
            continue;
        }
        if (w.first != group) out.once.emplace_back();
        group = w.first;
        out.once.back().push_back(w.range);
    }
    return out;
}

}  // namespace ms::graph
