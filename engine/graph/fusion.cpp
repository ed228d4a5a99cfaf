// fusion.cpp: the fusion pass (passes.h).
#include <fmt/format.h>

#include <algorithm>

#include "engine/core/check.h"
#include "engine/graph/passes.h"

namespace ms::graph {
namespace {

bool is(const Node& n, OpCode op) { return n.op == op; }

// residual (a, b, bias -> s) then layernorm (s, w, lb -> y, mean, rstd)
bool fuse_residual_layernorm(Graph& g, size_t i, PassReport& r) {
    if (i + 1 >= g.nodes.size()) return false;
    const Node& res = g.nodes[i];
    const Node& ln = g.nodes[i + 1];
    if (!is(res, OpCode::kResidual) || !is(ln, OpCode::kLayerNorm) || ln.in[0] != res.out[0]) return false;
    Node f = ln;
    f.op = OpCode::kResidualLayerNorm;
    f.in = {res.in[0], res.in[1], res.in[2], ln.in[1], ln.in[2]};
    f.out = {res.out[0], ln.out[0], ln.out[1], ln.out[2]};
    r.steps.push_back(fmt::format("{} + {}: residual + layernorm -> residual+layernorm", res.label, ln.label));
    g.nodes[i] = std::move(f);
    g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    return true;
}

// matmul (x, w, b -> pre) then gelu (pre -> y)
bool fuse_matmul_gelu(Graph& g, size_t i, PassReport& r) {
    if (i + 1 >= g.nodes.size()) return false;
    const Node& mm = g.nodes[i];
    const Node& gelu = g.nodes[i + 1];
    if (!is(mm, OpCode::kMatmul) || !is(gelu, OpCode::kGelu) || gelu.in[0] != mm.out[0]) return false;
    Node f = mm;
    f.op = OpCode::kMatmulGelu;
    f.out = {mm.out[0], gelu.out[0]};
    r.steps.push_back(fmt::format("{}: matmul + gelu -> matmul+gelu", mm.label));
    g.nodes[i] = std::move(f);
    g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    return true;
}

// matmul_backward (dy, x, w -> dx, dw, db) then gelu_backward (pre, dx -> dpre)
bool fuse_gelu_backward(Graph& g, size_t i, PassReport& r) {
    if (i + 1 >= g.nodes.size()) return false;
    const Node& mm = g.nodes[i];
    const Node& gelu = g.nodes[i + 1];
    if (!is(mm, OpCode::kMatmulBackward) || !is(gelu, OpCode::kGeluBackward) || mm.out[0] == kNoTensor ||
        gelu.in[1] != mm.out[0] || mm.accumulate != Accumulate::kOverwrite || mm.in.size() > 3)
        return false;
    Node f = mm;
    f.in.push_back(gelu.in[0]);  // the GELU's input
    f.out[0] = gelu.out[0];
    r.steps.push_back(fmt::format("{}: matmul_backward + gelu_backward -> matmul_backward through the GELU", mm.label));
    g.nodes[i] = std::move(f);
    g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    return true;
}

// bias_gradient (dy -> dbias) folded into the next matmul_backward whose dy is dy or its all-gather
bool fold_bias_gradient(Graph& g, size_t i, PassReport& r) {
    const Node& bg = g.nodes[i];
    if (!is(bg, OpCode::kBiasGradient)) return false;
    const TensorId dy = bg.in[0], dbias = bg.out[0];
    TensorId gathered = kNoTensor;
    for (size_t j = i + 1; j < g.nodes.size(); ++j) {
        Node& n = g.nodes[j];
        if (is(n, OpCode::kAllGather) && n.in[0] == dy) gathered = n.out[0];
        if (!is(n, OpCode::kMatmulBackward) || (n.in[0] != dy && n.in[0] != gathered)) continue;
        if (n.out[2] != kNoTensor) return false;
        n.out[2] = dbias;
        if (n.in[0] == gathered) {  // the sum over all rows: no longer a partial sum over tp
            const int param = g.info(dbias).param;
            auto& v = g.tp_partial_grad_params;
            v.erase(std::remove(v.begin(), v.end(), param), v.end());
        }
        r.steps.push_back(fmt::format("{}: bias_gradient -> dbias of {}", bg.label, n.label));
        g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i));
        return true;
    }
    return false;
}

// The index of the first op of kind `op` that writes t, or -1.
int writer(const Graph& g, TensorId t, OpCode op) {
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& n = g.nodes[i];
        if (n.op == op && std::find(n.out.begin(), n.out.end(), t) != n.out.end()) return static_cast<int>(i);
    }
    return -1;
}

// matmul -> logits, cross_entropy (one call: tp of one), loss; loss_gradient, cross_entropy_backward,
// matmul_backward of the logits -> loss_gradient, lm_head+cross_entropy in the forward
void fuse_lm_head_loss(Graph& g, const FuseOptions& o, PassReport& r) {
    int loss = -1;
    for (size_t i = 0; i < g.nodes.size(); ++i)
        if (g.nodes[i].op == OpCode::kLoss) loss = static_cast<int>(i);
    if (loss < 0) return;
    const Node loss_node = g.nodes[static_cast<size_t>(loss)];
    const TensorId logits = loss_node.in[0], targets = loss_node.in[1], sums = loss_node.in[3];
    const int ce = writer(g, sums, OpCode::kCrossEntropy), mm = writer(g, logits, OpCode::kMatmul);
    if (ce < 0 || mm < 0 || g.nodes[static_cast<size_t>(ce)].ce_phase != CrossEntropyPhase::kMaxSumExp) return;
    int grad = -1, ce_bwd = -1, mm_bwd = -1;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& n = g.nodes[i];
        if (n.op == OpCode::kLossGradient) grad = static_cast<int>(i);
        if (n.op == OpCode::kCrossEntropyBackward && n.in[0] == logits) ce_bwd = static_cast<int>(i);
        if (n.op == OpCode::kMatmulBackward && n.in[0] == logits) mm_bwd = static_cast<int>(i);
    }
    if (grad < 0 || ce_bwd < 0 || mm_bwd < 0) return;
    const Node& m = g.nodes[static_cast<size_t>(mm)];
    const Node& mb = g.nodes[static_cast<size_t>(mm_bwd)];
    if (mb.accumulate != Accumulate::kOverwrite) return;
    Node dloss = g.nodes[static_cast<size_t>(grad)];
    dloss.phase = Phase::kForward;
    const TensorId scratch = g.add_tensor({.name = "lm_head.scratch",
                                           .shape = {o.lm_head_scratch_elems},
                                           .dtype = DType::kF32,
                                           .role = Role::kActivation});
    Node f = loss_node;
    f.op = OpCode::kLmHeadLoss;
    f.label = m.label;
    f.in = {m.in[0], m.in[1], targets, dloss.out[0]};
    f.out = {loss_node.out[0], mb.out[0], mb.out[1], scratch};
    f.chunk_rows = o.lm_head_chunk_rows;
    f.vocab_start = g.nodes[static_cast<size_t>(ce)].vocab_start;
    f.vocab_valid = g.nodes[static_cast<size_t>(ce)].vocab_valid;
    // the fused pair takes the loss's place; the rest goes
    g.nodes[static_cast<size_t>(loss)] = f;
    g.nodes.insert(g.nodes.begin() + loss, dloss);
    std::vector<int> gone = {mm, ce, grad + 1, ce_bwd + 1, mm_bwd + 1};  // indices after the insertion
    std::sort(gone.rbegin(), gone.rend());
    for (int i : gone) g.nodes.erase(g.nodes.begin() + i);
    r.steps.push_back(
        fmt::format("{}: matmul + cross_entropy + loss, loss_gradient + cross_entropy_backward + matmul_backward -> "
                    "lm_head+cross_entropy in the forward, {} rows a chunk (the logits are never held)",
                    f.label, o.lm_head_chunk_rows));
}

}  // namespace

PassReport fuse(Graph& g, const FuseOptions& options) {
    PassReport r{.pass = "fusion", .steps = {}};
    if (options.lm_head_chunk_rows > 0) fuse_lm_head_loss(g, options, r);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        // each rule leaves node i fused (or removed); the loop then looks at what follows
        while (fold_bias_gradient(g, i, r)) {
        }
        if (i >= g.nodes.size()) break;
        fuse_residual_layernorm(g, i, r) || fuse_matmul_gelu(g, i, r) || fuse_gelu_backward(g, i, r);
    }
    return r;
}

}  // namespace ms::graph
