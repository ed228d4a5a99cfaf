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

}  // namespace

PassReport fuse(Graph& g) {
    PassReport r{.pass = "fusion", .steps = {}};
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
