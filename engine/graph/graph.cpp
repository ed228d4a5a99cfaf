// graph.cpp: the graph's bookkeeping, its text form, and the backward derived from per-op gradient rules
// (graph.h).
#include "engine/graph/graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "engine/core/check.h"

namespace ms::graph {

const char* op_name(OpCode op) {
    switch (op) {
        case OpCode::kEmbedding:
            return "embedding";
        case OpCode::kLayerNorm:
            return "layernorm";
        case OpCode::kMatmul:
            return "matmul";
        case OpCode::kGelu:
            return "gelu";
        case OpCode::kAttention:
            return "attention";
        case OpCode::kResidual:
            return "residual";
        case OpCode::kCrossEntropy:
            return "cross_entropy";
        case OpCode::kLoss:
            return "loss";
        case OpCode::kLoadTokens:
            return "load_tokens";
        case OpCode::kLoadTargets:
            return "load_targets";
        case OpCode::kLoadConstant:
            return "load_constant";
        case OpCode::kRmsNorm:
            return "rmsnorm";
        case OpCode::kRope:
            return "rope";
        case OpCode::kSwiGlu:
            return "swiglu";
        case OpCode::kRingAttention:
            return "ring_attention";
        case OpCode::kRingAttentionBackward:
            return "ring_attention_backward";
        case OpCode::kLoadRows:
            return "load_rows";
        case OpCode::kCrossAttention:
            return "cross_attention";
        case OpCode::kCrossAttentionBackward:
            return "cross_attention_backward";
        case OpCode::kGatherRows:
            return "gather_rows";
        case OpCode::kGatherRowsBackward:
            return "gather_rows_backward";
        case OpCode::kRmsNormBackward:
            return "rmsnorm_backward";
        case OpCode::kRopeBackward:
            return "rope_backward";
        case OpCode::kSwiGluBackward:
            return "swiglu_backward";
        case OpCode::kResidualLayerNorm:
            return "residual+layernorm";
        case OpCode::kMatmulGelu:
            return "matmul+gelu";
        case OpCode::kLmHeadLoss:
            return "lm_head+cross_entropy";
        case OpCode::kEmbeddingBackward:
            return "embedding_backward";
        case OpCode::kLayerNormBackward:
            return "layernorm_backward";
        case OpCode::kMatmulBackward:
            return "matmul_backward";
        case OpCode::kGeluBackward:
            return "gelu_backward";
        case OpCode::kAttentionBackward:
            return "attention_backward";
        case OpCode::kBiasGradient:
            return "bias_gradient";
        case OpCode::kLossGradient:
            return "loss_gradient";
        case OpCode::kCrossEntropyBackward:
            return "cross_entropy_backward";
        case OpCode::kTpCopy:
            return "tp_copy";
        case OpCode::kAllReduce:
            return "all_reduce";
        case OpCode::kAllGather:
            return "all_gather";
        case OpCode::kReduceScatter:
            return "reduce_scatter";
    }
    return "?";
}

TensorId Graph::add_tensor(TensorInfo info) {
    const TensorId id = static_cast<TensorId>(tensors.size());
    MS_CHECK(by_name.emplace(info.name, id).second, "graph: two tensors named '{}'", info.name);
    tensors.push_back(std::move(info));
    grad_of.push_back(kNoTensor);
    return id;
}

TensorId Graph::find(const std::string& name) const {
    const auto it = by_name.find(name);
    return it == by_name.end() ? kNoTensor : it->second;
}

int Graph::num_forward() const {
    int n = 0;
    while (n < static_cast<int>(nodes.size()) && nodes[static_cast<size_t>(n)].phase == Phase::kForward) ++n;
    return n;
}

std::string describe(const Graph& g) {
    std::string s;
    auto tensor = [&](TensorId t) {
        if (t == kNoTensor) return std::string("-");
        const TensorInfo& i = g.info(t);
        std::string dims;
        for (size_t d = 0; d < i.shape.size(); ++d) dims += fmt::format("{}{}", d ? "x" : "", i.shape[d]);
        return fmt::format("{} ({} {})", i.name, dims, dtype_name(i.dtype));
    };
    for (const Node& n : g.nodes) {
        s += fmt::format("[{}] {:<22} {:<20}", n.phase == Phase::kForward ? "fwd" : "bwd", op_name(n.op), n.label);
        s += " in:";
        // appended piecewise: GCC 12's -Wrestrict misreads " " + std::string here
        for (TensorId t : n.in) s.append(" ").append(tensor(t));
        s += "  out:";
        for (TensorId t : n.out) s.append(" ").append(tensor(t));
        if (n.accumulate == Accumulate::kAdd) s += "  (+=)";
        s += "\n";
    }
    return s;
}

RingAttentionShape ring_attention_shape(const Graph& g, const Node& n) {
    const TensorInfo& qkv = g.info(n.op == OpCode::kRingAttention ? n.in.at(0) : n.in.at(1));
    const int64_t nkv = n.NKV == 0 ? n.NH : n.NKV;
    return {.B = n.B,
            .T = n.T,
            .NH = n.NH,
            .NKV = nkv,
            .HS = qkv.shape.at(1) / (n.NH + 2 * nkv),
            .act = qkv.dtype,
            .causal = n.causal};
}

CrossAttentionShape cross_attention_shape(const Graph& g, const Node& n) {
    const TensorInfo& q = g.info(n.op == OpCode::kCrossAttention ? n.in.at(0) : n.in.at(1));
    return {.B = n.B, .T = n.T, .S = n.S, .NH = n.NH, .HS = q.shape.at(1) / n.NH, .act = q.dtype};
}

namespace {

// The backward under construction: appends nodes, creates and looks up gradients.
class Differentiator {
  public:
    explicit Differentiator(Graph& g) : g_(g) {}

    TensorId grad(TensorId t) const { return g_.grad_of.at(static_cast<size_t>(t)); }
    // The gradient of x for an op to write: the existing one (accumulated into) or a new one (overwritten).
    std::pair<TensorId, Accumulate> grad_to_write(TensorId x) {
        if (grad(x) != kNoTensor) return {grad(x), Accumulate::kAdd};
        return {new_grad(x), Accumulate::kOverwrite};
    }
    // A new gradient for x, which must not have one yet (ops that cannot accumulate); it belongs to the layer of
    // the op whose backward makes it.
    TensorId new_grad(TensorId x) {
        MS_CHECK(grad(x) == kNoTensor, "graph backward: '{}' already has a gradient and this op cannot add to it",
                 g_.info(x).name);
        const TensorInfo& i = g_.info(x);
        TensorInfo d{.name = i.grad_name.empty() ? "d." + i.name : i.grad_name,
                     .shape = i.shape,
                     .dtype = i.dtype,
                     .layer = layer_};
        const TensorId t = g_.add_tensor(std::move(d));
        g_.grad_of[static_cast<size_t>(x)] = t;
        return t;
    }
    // The gradient of x is the gradient y already has (identity): no op, no memory.
    void alias(TensorId x, TensorId dy) {
        MS_CHECK(grad(x) == kNoTensor, "graph backward: '{}' gets an identity gradient after another one",
                 g_.info(x).name);
        g_.grad_of[static_cast<size_t>(x)] = dy;
    }
    TensorId param_grad(TensorId p) const { return p == kNoTensor ? kNoTensor : grad(p); }
    void tp_partial(TensorId param) {
        if (param == kNoTensor) return;
        const int index = g_.info(param).param;
        auto& v = g_.tp_partial_grad_params;
        if (std::find(v.begin(), v.end(), index) == v.end()) v.push_back(index);
    }
    Node& emit(const Node& forward, OpCode op, std::vector<TensorId> in, std::vector<TensorId> out,
               Accumulate acc = Accumulate::kOverwrite) {
        Node n = forward;  // keeps the attributes and the label
        n.op = op;
        n.phase = Phase::kBackward;
        n.in = std::move(in);
        n.out = std::move(out);
        n.accumulate = acc;
        backward_.push_back(std::move(n));
        return backward_.back();
    }
    std::vector<Node> take() { return std::move(backward_); }

    void apply(const Node& f);

  private:
    Graph& g_;
    std::vector<Node> backward_;
    int layer_ = -1;  // of the forward op being differentiated
};

void Differentiator::apply(const Node& f) {
    layer_ = f.layer;
    const auto in = [&](size_t i) { return i < f.in.size() ? f.in[i] : kNoTensor; };
    switch (f.op) {
        case OpCode::kLoss: {  // losses = log(sum_exp) + max - target: the seed of the backward
            const TensorId logits = in(0), targets = in(1), row_max = in(2), sums = in(3);
            const int64_t rows = g_.info(row_max).shape[0];
            const TensorId dloss = g_.add_tensor({.name = "dloss", .shape = {rows}, .dtype = DType::kF32});
            emit(f, OpCode::kLossGradient, {}, {dloss});
            emit(f, OpCode::kCrossEntropyBackward, {logits, targets, row_max, sums, dloss}, {logits});
            g_.grad_of[static_cast<size_t>(logits)] = logits;  // dlogits overwrite the logits
            return;
        }
        case OpCode::kMatmul: {
            const auto [dx, acc] =
                g_.info(in(0)).no_grad ? std::pair{kNoTensor, Accumulate::kOverwrite} : grad_to_write(in(0));
            emit(f, OpCode::kMatmulBackward, {grad(f.out[0]), in(0), in(1)}, {dx, param_grad(in(1)), param_grad(in(2))},
                 acc);
            return;
        }
        case OpCode::kGelu:
            emit(f, OpCode::kGeluBackward, {in(0), grad(f.out[0])}, {new_grad(in(0))});
            return;
        case OpCode::kAttention:
            emit(f, OpCode::kAttentionBackward, {grad(f.out[0]), in(0), f.out[0], f.out[1]}, {new_grad(in(0))});
            return;
        case OpCode::kRingAttention: {
            const TensorId dqkv = new_grad(in(0));
            const TensorId scratch = g_.add_tensor({.name = "d." + g_.info(f.out[2]).name,
                                                    .shape = {ring_backward_scratch_elems(ring_attention_shape(g_, f))},
                                                    .dtype = DType::kF32,
                                                    .layer = f.layer});
            emit(f, OpCode::kRingAttentionBackward, {grad(f.out[0]), in(0), f.out[0], f.out[1]}, {dqkv, scratch});
            return;
        }
        case OpCode::kCrossAttention: {
            const TensorId dq = new_grad(in(0)), dkv = new_grad(in(1));
            const TensorId scratch =
                g_.add_tensor({.name = "d." + g_.info(f.out[2]).name,
                               .shape = {cross_backward_scratch_elems(cross_attention_shape(g_, f))},
                               .dtype = DType::kF32,
                               .layer = f.layer});
            emit(f, OpCode::kCrossAttentionBackward, {grad(f.out[0]), in(0), in(1), f.out[0], f.out[1]},
                 {dq, dkv, scratch});
            return;
        }
        case OpCode::kRmsNorm: {
            const auto [dx, acc] = grad_to_write(in(0));
            emit(f, OpCode::kRmsNormBackward, {grad(f.out[0]), in(0), in(1), f.out[1]}, {dx, param_grad(in(1))}, acc);
            if (f.tp_rows) tp_partial(in(1));
            return;
        }
        case OpCode::kRope:  // in place: the gradient of the rotated qkv is rotated back where it is
            emit(f, OpCode::kRopeBackward, {grad(f.out[0]), in(1)}, {grad(f.out[0])});
            return;
        case OpCode::kSwiGlu:
            emit(f, OpCode::kSwiGluBackward, {grad(f.out[0]), in(0)}, {new_grad(in(0))});
            return;
        case OpCode::kResidual: {  // y = a + (b + bias)
            const TensorId dy = grad(f.out[0]);
            alias(in(0), dy);
            alias(in(1), dy);
            if (in(2) != kNoTensor) {
                emit(f, OpCode::kBiasGradient, {dy}, {param_grad(in(2))});
                if (f.tp_rows) tp_partial(in(2));
            }
            return;
        }
        case OpCode::kLayerNorm: {
            const auto [dx, acc] = grad_to_write(in(0));
            emit(f, OpCode::kLayerNormBackward, {grad(f.out[0]), in(0), in(1), f.out[1], f.out[2]},
                 {dx, param_grad(in(1)), param_grad(in(2))}, acc);
            if (f.tp_rows) {
                tp_partial(in(1));
                tp_partial(in(2));
            }
            return;
        }
        case OpCode::kGatherRows: {
            const auto [dx, acc] = grad_to_write(in(0));
            emit(f, OpCode::kGatherRowsBackward, {in(1), grad(f.out[0])}, {dx}, acc);
            return;
        }
        case OpCode::kEmbedding:
            emit(f, OpCode::kEmbeddingBackward, {in(0), grad(f.out[0])}, {param_grad(in(1)), param_grad(in(2))});
            return;
        case OpCode::kTpCopy:  // identity forward: the gradient's partial sums are all-reduced
            emit(f, OpCode::kAllReduce, {grad(f.out[0])}, {grad(f.out[0])}).reduce = ReduceOp::kSum;
            return;
        case OpCode::kAllReduce:  // identity backward (the all-reduce wrote its input: same tensor, same gradient)
            return;
        case OpCode::kAllGather:
            emit(f, OpCode::kReduceScatter, {grad(f.out[0])}, {new_grad(in(0))});
            return;
        case OpCode::kReduceScatter:
            emit(f, OpCode::kAllGather, {grad(f.out[0])}, {new_grad(in(0))});
            return;
        default:
            MS_UNREACHABLE("graph backward: no gradient rule for {} ('{}')", op_name(f.op), f.label);
    }
}

// True when the backward must visit f: the loss, or an op with an output that has a gradient.
bool needs_backward(const Graph& g, const Node& f) {
    if (f.op == OpCode::kLoss) return true;
    return std::any_of(f.out.begin(), f.out.end(),
                       [&](TensorId t) { return t != kNoTensor && g.grad_of[static_cast<size_t>(t)] != kNoTensor; });
}

}  // namespace

void derive_backward(Graph& g) {
    MS_CHECK(g.num_forward() == static_cast<int>(g.nodes.size()), "graph backward: the graph has a backward already");
    Differentiator d(g);
    for (int i = static_cast<int>(g.nodes.size()) - 1; i >= 0; --i) {
        const Node f = g.nodes[static_cast<size_t>(i)];  // a copy: apply() may grow g.tensors, not g.nodes
        if (needs_backward(g, f)) d.apply(f);
    }
    for (Node& n : d.take()) g.nodes.push_back(std::move(n));
}

}  // namespace ms::graph
