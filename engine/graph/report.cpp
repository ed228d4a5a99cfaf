// report.cpp: the graph in words and bytes (report.h).
#include "engine/graph/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <vector>

namespace ms::graph {
namespace {

std::string human(int64_t bytes) {
    if (bytes >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1 << 30));
    if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
    if (bytes >= (int64_t{1} << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / (1 << 10));
    return fmt::format("{} B", bytes);
}

}  // namespace

Bytes op_bytes(const Graph& g, const Node& n) {
    Bytes b;
    for (TensorId t : n.in)
        if (t != kNoTensor) b.read += g.info(t).bytes();
    for (size_t i = 0; i < n.out.size(); ++i) {
        const TensorId t = n.out[i];
        if (t == kNoTensor) continue;
        const TensorInfo& info = g.info(t);
        b.written += info.bytes();
        const bool in_place = std::find(n.in.begin(), n.in.end(), t) != n.in.end();  // already counted as read
        const bool accumulates = info.role == Role::kGradient || info.role == Role::kHeadGradient ||
                                 (i == 0 && n.accumulate == Accumulate::kAdd);
        if (accumulates && !in_place) b.read += info.bytes();
    }
    if (n.op == OpCode::kLmHeadLoss && n.chunk_rows > 0) {
        // each chunk of rows streams the weight, and with the backward reads and writes its gradient, again
        const int64_t chunks = (g.info(n.in[0]).shape[0] + n.chunk_rows - 1) / n.chunk_rows;
        const int64_t w = g.info(n.in[1]).bytes(), dw = n.out[2] == kNoTensor ? 0 : g.info(n.out[2]).bytes();
        b.read += (chunks - 1) * (w + dw);
        b.written += (chunks - 1) * dw;
    }
    return b;
}

GraphTotals graph_totals(const Graph& g) {
    GraphTotals t;
    int first_layer = -1, last_layer = -1;
    for (const Node& n : g.nodes) {
        if (n.layer < 0) continue;
        if (first_layer < 0) first_layer = n.layer;
        last_layer = std::max(last_layer, n.layer);
    }
    const int forward = g.num_forward();
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& n = g.nodes[i];
        const Bytes b = op_bytes(g, n);
        (n.phase == Phase::kForward ? t.forward : t.backward) += b;
        if (n.layer >= 0 && n.layer == first_layer) t.layer += b;
        // the head: forward ops after the last layer's, and backward ops before the last layer's backward
        bool head = false;
        if (n.layer < 0 && last_layer >= 0) {
            bool after = true;  // forward: no layer op after it; backward: no layer op before it
            if (static_cast<int>(i) < forward) {
                for (int j = static_cast<int>(i) + 1; j < forward && after; ++j) after = g.nodes[j].layer < 0;
            } else {
                for (int j = forward; j < static_cast<int>(i) && after; ++j) after = g.nodes[j].layer < 0;
            }
            head = after;
        }
        if (head) t.head += b;
    }
    t.ops = static_cast<int>(g.nodes.size());
    return t;
}

std::string op_table(const Graph& g) {
    std::string s = fmt::format("  {:<3} {:<22} {:<22} {:>10} {:>10}  tensors\n", "", "op", "label", "read", "written");
    for (const Node& n : g.nodes) {
        const Bytes b = op_bytes(g, n);
        std::string tensors;
        for (TensorId t : n.in)
            if (t != kNoTensor) tensors += (tensors.empty() ? "" : " ") + g.info(t).name;
        tensors += " ->";
        for (TensorId t : n.out)
            if (t != kNoTensor) tensors += " " + g.info(t).name;
        s += fmt::format("  {:<3} {:<22} {:<22} {:>10} {:>10}  {}{}\n", n.phase == Phase::kForward ? "fwd" : "bwd",
                         op_name(n.op), n.label, human(b.read), human(b.written), tensors,
                         n.accumulate == Accumulate::kAdd ? " (+=)" : "");
    }
    return s;
}

std::string to_dot(const Graph& g, const std::string& title) {
    std::string s =
        fmt::format("digraph \"{}\" {{\n  rankdir=TB;\n  node [shape=box, style=filled, fontname=Helvetica];\n", title);
    std::map<TensorId, int> writer;  // the latest op that wrote each tensor
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& n = g.nodes[i];
        s += fmt::format("  op{} [label=\"{}\\n{}\", fillcolor=\"{}\"];\n", i, n.label, op_name(n.op),
                         n.phase == Phase::kForward ? "#cfe2ff" : "#ffe5cc");
        for (TensorId t : n.in) {
            if (t == kNoTensor || !writer.count(t)) continue;
            s += fmt::format("  op{} -> op{} [label=\"{}\", fontsize=9];\n", writer[t], i, g.info(t).name);
        }
        for (TensorId t : n.out)
            if (t != kNoTensor) writer[t] = static_cast<int>(i);
    }
    return s + "}\n";
}

}  // namespace ms::graph
