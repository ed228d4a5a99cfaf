// search.cpp: plan --search (search.h).
#include "engine/sim/search.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>

#include "comm/nodes.h"
#include "engine/core/check.h"
#include "engine/parallel/schedule.h"
#include "engine/train/plan.h"
#include "engine/train/run_layout.h"

namespace ms::sim {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::vector<int> divisors(int n, int at_most) {
    std::vector<int> d;
    for (int i = 1; i <= std::min(n, at_most); ++i)
        if (n % i == 0) d.push_back(i);
    return d;
}

std::string candidate_label(const Config& c, int world) {
    const ParallelConfig& p = c.parallel;
    const int dp = world / (p.tensor_model_parallel_size * p.pipeline_model_parallel_size * p.context_parallel_size);
    return fmt::format("tp {}{} pp {} vpp {} dp {} cp {} mb {} rc {} zero {}{}", p.tensor_model_parallel_size,
                       p.sequence_parallel ? " sp" : "", p.pipeline_model_parallel_size,
                       p.virtual_pipeline_model_parallel_size, dp, p.context_parallel_size, c.training.micro_batch_size,
                       c.training.recompute_granularity, p.zero_stage, p.overlap_grad_reduce ? " overlap" : "");
}

// Everything plan_stages reads besides the model (the same for every candidate): the candidates that differ only in
// their overlap options share a plan.
std::string plan_key(const PlanShape& p) {
    const GptGraphOptions& g = p.graph;
    return fmt::format("tp {} pp {} dp {} v {} {} m {} mb {} zero {} sp {} {} | {} {} {} {} {} {} {}", p.tp, p.pp, p.dp,
                       p.virtual_stages, to_string(p.kind), p.num_microbatches, p.micro_batch, p.zero_stage,
                       p.sequence_parallel, dtype_name(p.dtype), static_cast<int>(g.recompute.granularity),
                       static_cast<int>(g.recompute.method), g.recompute.num_layers, g.lm_head_loss_fusion,
                       dtype_name(g.grads), g.context_parallel, static_cast<int>(g.backend));
}

}  // namespace

const char* prune_reason_name(PruneReason r) {
    switch (r) {
        case PruneReason::kDivisibility:
            return "divisibility";
        case PruneReason::kMemory:
            return "memory";
        case PruneReason::kBubble:
            return "bubble";
    }
    return "?";
}

std::vector<SearchCandidate> enumerate_layouts(const Config& base, const SearchOptions& o) {
    const int world = o.world_size, L = base.model.num_layers;
    const bool llama = base.model.arch == "llama";
    std::vector<SearchCandidate> out;
    for (int tp : divisors(o.gpus_per_node, world)) {
        for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp) {
            for (int cp : llama ? std::vector<int>{1, 2, 4} : std::vector<int>{1}) {
                if (world % (tp * cp) != 0) continue;
                for (int pp : divisors(L, world / (tp * cp))) {
                    if ((world / (tp * cp)) % pp != 0) continue;
                    const int dp = world / (tp * cp * pp);
                    for (int v : {1, 2, 4}) {
                        if (v > 1 && (pp == 1 || L % (pp * v) != 0)) continue;
                        for (int mb : {1, 2, 4, 8}) {
                            for (const char* rc : {"none", "selective", "full"}) {
                                for (int zero = 0; zero <= (dp > 1 ? 1 : 0); ++zero) {
                                    for (int overlap = 0; overlap <= (dp > 1 ? 1 : 0); ++overlap) {
                                        Config c = base;
                                        ParallelConfig& p = c.parallel;
                                        p.tensor_model_parallel_size = tp;
                                        p.sequence_parallel = sp == 1;
                                        p.context_parallel_size = cp;
                                        p.pipeline_model_parallel_size = pp;
                                        p.data_parallel_size = 0;
                                        p.virtual_pipeline_model_parallel_size = v;
                                        p.pipeline_schedule = v > 1 ? "interleaved_1f1b" : "1f1b";
                                        p.zero_stage = zero;
                                        p.overlap_grad_reduce = overlap == 1;
                                        p.overlap_param_gather = overlap == 1 && zero == 1;
                                        c.training.micro_batch_size = mb;
                                        c.training.recompute_granularity = rc;
                                        c.training.recompute_method = "uniform";
                                        c.training.recompute_num_layers = 1;
                                        c.run.ranks_per_node = std::min(o.gpus_per_node, world);
                                        out.push_back({c, candidate_label(c, world)});
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    return out;
}

SearchResult search_layouts(const Config& base, const CostModel& cost, const SearchOptions& o) {
    const NodeLayout nodes = nodes_by_count(o.world_size, std::min(o.gpus_per_node, o.world_size));
    SearchResult r;
    ChunkCostCache cache;  // the candidates differ in a few keys: most of their chunks were timed before
    std::map<std::string, std::vector<StagePlan>> plans;
    for (const SearchCandidate& c : enumerate_layouts(base, o)) {
        ++r.considered;
        RunLayout layout;
        try {
            layout = make_run_layout(c.cfg, o.world_size);
        } catch (const UserError& e) {
            r.pruned.push_back({c.label, PruneReason::kDivisibility, e.what()});
            continue;
        }
        const PlanShape shape = plan_shape(layout);
        auto planned = plans.try_emplace(plan_key(shape));
        if (planned.second) planned.first->second = plan_stages(layout.shape, shape);
        const std::vector<StagePlan>& stages = planned.first->second;
        const size_t largest = largest_stage(stages);
        const int64_t peak = stages[largest].total_bytes();
        if (static_cast<double>(peak) > o.memory_bytes) {
            r.pruned.push_back({c.label, PruneReason::kMemory,
                                fmt::format("stage {} needs {:.2f} GiB per rank, over the {:.2f} GiB budget", largest,
                                            static_cast<double>(peak) / kGiB, o.memory_bytes / kGiB)});
            continue;
        }
        const SimResult bubble =
            simulate(make_schedule(layout.schedule, layout.pp(), layout.num_microbatches, layout.virtual_stages), 1, 2);
        if (bubble.bubble_fraction > o.max_bubble) {
            r.pruned.push_back(
                {c.label, PruneReason::kBubble,
                 fmt::format("{} micro-batches over {} stages idle {:.1f}% of the schedule, over {:.0f}%",
                             layout.num_microbatches, layout.pp(), 100.0 * bubble.bubble_fraction,
                             100.0 * o.max_bubble)});
            continue;
        }
        r.ranked.push_back({c.label, simulate_step(layout, cost, nodes, &cache, &stages), peak});
    }
    std::stable_sort(r.ranked.begin(), r.ranked.end(),
                     [](const Ranked& a, const Ranked& b) { return a.step.tokens_per_s > b.step.tokens_per_s; });
    return r;
}

std::vector<std::string> search_report(const SearchResult& r, const SearchOptions& o) {
    std::array<int, 3> counts{};
    std::array<const Pruned*, 3> first{};
    for (const Pruned& p : r.pruned) {
        const auto i = static_cast<size_t>(p.reason);
        if (counts[i]++ == 0) first[i] = &p;
    }
    const int nodes = (o.world_size + o.gpus_per_node - 1) / o.gpus_per_node;
    std::vector<std::string> lines = {fmt::format(
        "search: {} layouts of {} ranks ({} node(s) of {} GPUs, {:.2f} GiB per rank): {} simulated; pruned {} for "
        "divisibility, {} for memory, {} for a theoretical bubble over {:.0f}%",
        r.considered, o.world_size, nodes, std::min(o.gpus_per_node, o.world_size), o.memory_bytes / kGiB,
        r.ranked.size(), counts[0], counts[1], counts[2], 100.0 * o.max_bubble)};
    const size_t top = std::min(r.ranked.size(), static_cast<size_t>(std::max(0, o.top)));
    if (top > 0) {
        size_t w = 6;
        for (size_t i = 0; i < top; ++i) w = std::max(w, r.ranked[i].label.size());
        lines.push_back(fmt::format("  {:>4}  {:<{}}  {:>10}  {:>10}  {:>6}  {:>6}  {:>13}  {:>10}", "rank", "layout",
                                    w, "step ms", "tokens/s", "MFU", "bubble", "exposed comm", "memory GiB"));
        for (size_t i = 0; i < top; ++i) {
            const Ranked& c = r.ranked[i];
            lines.push_back(fmt::format(
                "  {:>4}  {:<{}}  {:>10.2f}  {:>10.0f}  {:>5.1f}%  {:>5.1f}%  {:>12.1f}%  {:>10.2f}", i + 1, c.label, w,
                1e3 * c.step.step_seconds, c.step.tokens_per_s, 100.0 * c.step.mfu, 100.0 * c.step.bubble_fraction,
                100.0 * c.step.comm_exposed_share(), static_cast<double>(c.peak_bytes) / kGiB));
        }
    } else {
        lines.push_back("  no layout fits; hint: more ranks, a larger --memory-gb, or a smaller micro-batch or model");
    }
    for (size_t i = 0; i < counts.size(); ++i) {
        if (first[i] == nullptr) continue;
        lines.push_back(fmt::format("  pruned for {} ({}), e.g. {}: {}", prune_reason_name(static_cast<PruneReason>(i)),
                                    counts[i], first[i]->label, first[i]->why));
    }
    return lines;
}

}  // namespace ms::sim
