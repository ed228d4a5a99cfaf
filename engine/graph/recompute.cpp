// recompute.cpp: the activation recomputation pass (passes.h).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "engine/core/check.h"
#include "engine/graph/passes.h"

namespace ms::graph {
namespace {

// Selective recomputation's ops: normalisations, activations and the copies feeding column-parallel layers. Not
// RoPE: it rotates the qkv a matmul wrote in place, so running it again alone would rotate twice.
bool cheap(const Node& n) {
    return n.op == OpCode::kLayerNorm || n.op == OpCode::kRmsNorm || n.op == OpCode::kGelu || n.op == OpCode::kSwiGlu ||
           n.op == OpCode::kTpCopy || n.op == OpCode::kAllGather;
}

}  // namespace

PassReport recompute(Graph& g, const RecomputeOptions& o, int first_layer) {
    PassReport r{.pass = "recompute", .steps = {}};
    if (o.granularity == RecomputeGranularity::kNone) return r;
    std::set<int> layers;
    for (const Node& n : g.nodes)
        if (n.layer >= 0) layers.insert(n.layer);
    for (const int l : layers) {
        if (!o.recomputes(l - first_layer)) continue;
        const int forward = g.num_forward();
        // the layer's forward ops that may run again, and the tensors they write
        std::vector<int> segment;
        std::set<TensorId> written;
        for (int i = 0; i < forward; ++i) {
            const Node& n = g.nodes[static_cast<size_t>(i)];
            if (n.layer != l) continue;
            if (n.op == OpCode::kResidualLayerNorm || n.op == OpCode::kMatmulGelu)
                MS_UNREACHABLE("recompute: run it before the fusion pass ('{}')", n.label);
            if (o.granularity == RecomputeGranularity::kSelective && !cheap(n)) continue;
            segment.push_back(i);
            for (TensorId t : n.out) written.insert(t);
        }
        // what the layer's backward reads of them, and (walking back) the ops that make it
        std::set<TensorId> needed;
        int first_backward = -1;
        for (size_t i = static_cast<size_t>(forward); i < g.nodes.size(); ++i) {
            const Node& n = g.nodes[i];
            if (n.layer != l) continue;
            if (first_backward < 0) first_backward = static_cast<int>(i);
            for (TensorId t : n.in)
                if (written.count(t)) needed.insert(t);
        }
        if (first_backward < 0) continue;
        std::vector<int> kept;
        for (auto it = segment.rbegin(); it != segment.rend(); ++it) {
            const Node& n = g.nodes[static_cast<size_t>(*it)];
            const bool wanted = std::any_of(n.out.begin(), n.out.end(), [&](TensorId t) { return needed.count(t); });
            if (!wanted) continue;
            kept.push_back(*it);
            for (TensorId t : n.in)
                if (written.count(t)) needed.insert(t);
        }
        std::reverse(kept.begin(), kept.end());
        // fresh tensors for what runs again; the copies of the ops; the backward reads the fresh tensors
        std::map<TensorId, TensorId> fresh;
        auto make_fresh = [&](TensorId t) {
            TensorInfo info = g.info(t);
            info.name += ".recompute";
            info.role = Role::kActivation;
            info.grad_name.clear();
            fresh[t] = g.add_tensor(std::move(info));
        };
        for (TensorId t : needed) make_fresh(t);
        auto renamed = [&](TensorId t) { return fresh.count(t) ? fresh[t] : t; };
        std::vector<Node> copies;
        for (int i : kept) {
            Node n = g.nodes[static_cast<size_t>(i)];
            n.phase = Phase::kBackward;
            n.label += " (recompute)";
            for (TensorId& t : n.in) t = renamed(t);
            for (TensorId& t : n.out) {
                // outputs nobody reads again (a LayerNorm's statistics when only its output is needed) still get
                // fresh memory: the op writes them
                if (t != kNoTensor && !fresh.count(t)) make_fresh(t);
                t = renamed(t);
            }
            copies.push_back(std::move(n));
        }
        for (size_t i = static_cast<size_t>(forward); i < g.nodes.size(); ++i) {
            Node& n = g.nodes[i];
            if (n.layer != l) continue;
            for (TensorId& t : n.in) t = renamed(t);
        }
        g.nodes.insert(g.nodes.begin() + first_backward, copies.begin(), copies.end());
        r.steps.push_back(fmt::format("h.{}: {} forward ops run again before its backward; {} tensors no longer kept",
                                      l, copies.size(), needed.size()));
    }
    return r;
}

}  // namespace ms::graph
