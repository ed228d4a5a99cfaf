// plan_graph.cpp: plan --graph (plan_graph.h).
#include "engine/train/plan_graph.h"

#include <fmt/format.h>

#include <fstream>

#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/graph/report.h"
#include "engine/model/gpt_graph.h"

namespace ms {
namespace {

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

std::string change(int64_t before, int64_t after) {
    if (before == 0) return "-";
    return fmt::format("{:+.1f}%", 100.0 * static_cast<double>(after - before) / static_cast<double>(before));
}

}  // namespace

void log_chunk_graphs(const RunLayout& layout, const std::string& dot_path) {
    const int chunks = layout.pp() * layout.virtual_stages, Lc = layout.layers_per_chunk;
    std::string dot;
    for (int k = 0; k < chunks; ++k) {
        const GptPart part{k * Lc, Lc, k == 0, k == chunks - 1};
        GptGraphSpec spec{.shape = layout.shape,
                          .part = part,
                          .tp_size = layout.tp(),
                          .sequence_parallel = layout.sequence_parallel,
                          .act = layout.dtype,
                          .B = layout.micro_batch,
                          .T = layout.seq_length(),
                          .fuse = false,
                          .options = layout.graph};
        const std::vector<ParamInfo> table = gpt_param_table(layout.shape, layout.tp(), part);
        const graph::GraphTotals before = graph::graph_totals(build_gpt_graph(spec, table).g);
        spec.fuse = true;
        const GptGraph fused = build_gpt_graph(spec, table);
        const graph::GraphTotals after = graph::graph_totals(fused.g);
        log_info("\ngraph of chunk {} (layers {}-{}{}{}; micro-batch {} x {} tokens, tp {}{}, {}): {} ops", k,
                 part.first_layer, part.first_layer + Lc - 1, part.embedding ? ", embedding" : "",
                 part.head ? ", head and loss" : "", layout.micro_batch, layout.seq_length(), layout.tp(),
                 layout.sequence_parallel ? " sequence-parallel" : "", dtype_name(layout.dtype), after.ops);
        log_info("{}", graph::op_table(fused.g));
        for (const graph::PassReport* pass : {&fused.recompute, &fused.fusion}) {
            log_info("pass {}: {} rewrites", pass->pass, pass->steps.size());
            for (const std::string& step : pass->steps) log_info("  {}", step);
        }
        log_info("bytes moved (read + written; the graph's own accounting):   before fusion   after fusion");
        const std::pair<const char*, std::pair<int64_t, int64_t>> rows[] = {
            {"forward", {before.forward.moved(), after.forward.moved()}},
            {"backward", {before.backward.moved(), after.backward.moved()}},
            {"one layer, forward + backward", {before.layer.moved(), after.layer.moved()}},
            {"head and loss, forward + backward", {before.head.moved(), after.head.moved()}},
        };
        for (const auto& [what, v] : rows)
            log_info("  {:<40} {:>14} {:>14}  {}", what, mib(v.first), mib(v.second), change(v.first, v.second));
        if (!dot_path.empty()) dot += graph::to_dot(fused.g, fmt::format("chunk {}", k));
    }
    if (dot_path.empty()) return;
    std::ofstream out(dot_path);
    if (!out.good())
        throw UserError(fmt::format("plan --dot: cannot write '{}'; pass a path in a writable directory", dot_path));
    out << dot;
    log_info("\nwrote {} ({} digraph{}: `dot -Tsvg -O {}`)", dot_path, chunks, chunks == 1 ? "" : "s", dot_path);
}

}  // namespace ms
