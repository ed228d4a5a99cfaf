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
#include "memory/arena.h"

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

namespace {

// The layout keys and their values as config text (what --set takes).
struct LayoutKey {
    std::string key;
    std::string (*text)(const Config& c);
};

const std::vector<LayoutKey>& layout_key_table() {
    static const std::vector<LayoutKey> keys = {
        {"parallel.tensor_model_parallel_size",
         [](const Config& c) { return std::to_string(c.parallel.tensor_model_parallel_size); }},
        {"parallel.sequence_parallel",
         [](const Config& c) { return std::string(c.parallel.sequence_parallel ? "true" : "false"); }},
        {"parallel.context_parallel_size",
         [](const Config& c) { return std::to_string(c.parallel.context_parallel_size); }},
        {"parallel.pipeline_model_parallel_size",
         [](const Config& c) { return std::to_string(c.parallel.pipeline_model_parallel_size); }},
        {"parallel.virtual_pipeline_model_parallel_size",
         [](const Config& c) { return std::to_string(c.parallel.virtual_pipeline_model_parallel_size); }},
        {"parallel.pipeline_schedule", [](const Config& c) { return c.parallel.pipeline_schedule; }},
        {"parallel.data_parallel_size", [](const Config& c) { return std::to_string(c.parallel.data_parallel_size); }},
        {"parallel.zero_stage", [](const Config& c) { return std::to_string(c.parallel.zero_stage); }},
        {"parallel.overlap_grad_reduce",
         [](const Config& c) { return std::string(c.parallel.overlap_grad_reduce ? "true" : "false"); }},
        {"parallel.overlap_param_gather",
         [](const Config& c) { return std::string(c.parallel.overlap_param_gather ? "true" : "false"); }},
        {"training.micro_batch_size", [](const Config& c) { return std::to_string(c.training.micro_batch_size); }},
        {"training.recompute_granularity", [](const Config& c) { return c.training.recompute_granularity; }},
        {"training.recompute_method", [](const Config& c) { return c.training.recompute_method; }},
        {"training.recompute_num_layers",
         [](const Config& c) { return std::to_string(c.training.recompute_num_layers); }},
    };
    return keys;
}

// One axis's values: the config's alone when the key is kept, else `searched`.
template <typename T>
std::vector<T> axis(const std::vector<std::string>& kept, const char* key, T base, std::vector<T> searched) {
    if (std::find(kept.begin(), kept.end(), key) != kept.end()) return {base};
    return searched;
}

}  // namespace

const std::vector<std::string>& layout_keys() {
    static const std::vector<std::string> keys = [] {
        std::vector<std::string> k;
        for (const LayoutKey& l : layout_key_table()) k.push_back(l.key);
        return k;
    }();
    return keys;
}

std::vector<std::string> kept_layout_keys(const Config& c) {
    std::vector<std::string> kept;
    if (!c.parallel.auto_layout) return kept;
    for (const std::string& k : layout_keys()) {
        // data_parallel_size 0 (or null, auto) asks for the derived value: nothing to keep
        if (k == "parallel.data_parallel_size" && c.parallel.data_parallel_size == 0) continue;
        if (std::find(c.explicit_keys.begin(), c.explicit_keys.end(), k) != c.explicit_keys.end()) kept.push_back(k);
    }
    return kept;
}

std::string layout_overrides(const Config& c) {
    std::string s;
    for (const LayoutKey& l : layout_key_table())
        s += fmt::format("{}--set {}={}", s.empty() ? "" : " ", l.key, l.text(c));
    return s;
}

std::vector<SearchCandidate> enumerate_layouts(const Config& base, const SearchOptions& o) {
    const int world = o.world_size, L = base.model.num_layers;
    const bool llama = base.model.arch == "llama";
    const std::vector<std::string> kept = kept_layout_keys(base);
    const ParallelConfig& b = base.parallel;
    const TrainingConfig& bt = base.training;
    auto is_kept = [&](const char* key) { return std::find(kept.begin(), kept.end(), key) != kept.end(); };
    std::vector<SearchCandidate> out;
    for (int tp : axis(kept, "parallel.tensor_model_parallel_size", b.tensor_model_parallel_size,
                       divisors(o.gpus_per_node, world))) {
        for (bool sp : axis(kept, "parallel.sequence_parallel", b.sequence_parallel,
                            tp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false})) {
            for (int cp : axis(kept, "parallel.context_parallel_size", b.context_parallel_size,
                               llama ? std::vector<int>{1, 2, 4} : std::vector<int>{1})) {
                if (world % (tp * cp) != 0) continue;
                for (int pp : axis(kept, "parallel.pipeline_model_parallel_size", b.pipeline_model_parallel_size,
                                   divisors(L, world / (tp * cp)))) {
                    if ((world / (tp * cp)) % pp != 0) continue;
                    const int dp = world / (tp * cp * pp);
                    if (is_kept("parallel.data_parallel_size") && dp != b.data_parallel_size) continue;
                    for (int v : axis(kept, "parallel.virtual_pipeline_model_parallel_size",
                                      b.virtual_pipeline_model_parallel_size, std::vector<int>{1, 2, 4})) {
                        if (!is_kept("parallel.virtual_pipeline_model_parallel_size") && v > 1 &&
                            (pp == 1 || L % (pp * v) != 0))
                            continue;
                        for (int mb : axis(kept, "training.micro_batch_size", bt.micro_batch_size,
                                           std::vector<int>{1, 2, 4, 8})) {
                            for (const std::string& rc :
                                 axis(kept, "training.recompute_granularity", bt.recompute_granularity,
                                      std::vector<std::string>{"none", "selective", "full"})) {
                                for (int zero : axis(kept, "parallel.zero_stage", b.zero_stage,
                                                     dp > 1 ? std::vector<int>{0, 1} : std::vector<int>{0})) {
                                    for (bool overlap :
                                         axis(kept, "parallel.overlap_grad_reduce", b.overlap_grad_reduce,
                                              dp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false})) {
                                        Config c = base;
                                        ParallelConfig& p = c.parallel;
                                        p.tensor_model_parallel_size = tp;
                                        p.sequence_parallel = sp;
                                        p.context_parallel_size = cp;
                                        p.pipeline_model_parallel_size = pp;
                                        p.data_parallel_size = dp;
                                        p.virtual_pipeline_model_parallel_size = v;
                                        p.pipeline_schedule = is_kept("parallel.pipeline_schedule")
                                                                  ? b.pipeline_schedule
                                                              : v > 1 ? "interleaved_1f1b"
                                                                      : "1f1b";
                                        p.zero_stage = zero;
                                        p.overlap_grad_reduce = overlap;
                                        p.overlap_param_gather = is_kept("parallel.overlap_param_gather")
                                                                     ? b.overlap_param_gather
                                                                     : overlap && zero == 1;
                                        c.training.micro_batch_size = mb;
                                        c.training.recompute_granularity = rc;
                                        if (!is_kept("training.recompute_method"))
                                            c.training.recompute_method = "uniform";
                                        if (!is_kept("training.recompute_num_layers"))
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
    std::map<PlanShape, std::vector<StagePlan>> plans;  // for one model: the shape is the rest of its key
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
        auto planned = plans.try_emplace(shape);
        if (planned.second) planned.first->second = plan_stages(layout.shape, shape);
        const std::vector<StagePlan>& stages = planned.first->second;
        const size_t largest = largest_stage(stages);
        const int64_t peak = stages[largest].total_bytes();
        if (static_cast<double>(peak) > o.memory_bytes) {
            r.pruned.push_back({c.label, PruneReason::kMemory,
                                fmt::format("stage {} needs {:.2f} GiB per rank, over the {:.2f} GiB budget", largest,
                                            static_cast<double>(peak) / kGiB, o.memory_bytes / kGiB),
                                peak});
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
        r.ranked.push_back({c.label, c.cfg, simulate_step(layout, cost, nodes, &cache, &stages), peak});
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

double search_memory_budget(const Config& cfg, int64_t device_memory_bytes, int ranks_on_node) {
    if (cfg.run.memory_limit_gb > 0) return cfg.run.memory_limit_gb * kGiB;
    if (device_memory_bytes > 0) return static_cast<double>(device_memory_bytes) - kDeviceReserveBytes;
    return memory_budget_bytes(cfg, ranks_on_node);
}

std::string no_layout_reason(const SearchResult& r, const SearchOptions& o, const Config& base) {
    const std::vector<std::string> kept = kept_layout_keys(base);
    std::string kept_text;
    for (const std::string& k : kept) kept_text += fmt::format("{}{}", kept_text.empty() ? "" : ", ", k);
    if (r.considered == 0) {
        return fmt::format(
            "no layout of {} ranks keeps the layout keys set beside parallel.auto ({}) with the ranks and layers "
            "this model has; hint: remove some of them (the search chooses what is not set), or change them so that "
            "tp x cp x pp divides the world size and pp the layers",
            o.world_size, kept_text);
    }
    std::array<int, 3> counts{};
    const Pruned* smallest = nullptr;  // the memory prune that needs the least
    const Pruned* refused = nullptr;   // the first validation sentence
    for (const Pruned& p : r.pruned) {
        ++counts[static_cast<size_t>(p.reason)];
        if (p.reason == PruneReason::kMemory && (smallest == nullptr || p.peak_bytes < smallest->peak_bytes))
            smallest = &p;
        if (p.reason == PruneReason::kDivisibility && refused == nullptr) refused = &p;
    }
    std::string why = fmt::format("none of the {} layouts of {} ranks can run:", r.considered, o.world_size);
    if (counts[0] > 0)
        why +=
            fmt::format(" {} refused by the config's checks (e.g. {}: {});", counts[0], refused->label, refused->why);
    if (counts[1] > 0) {
        why += fmt::format(" {} over the memory budget of {} per rank, the smallest ({}) needing {};", counts[1],
                           format_bytes(static_cast<size_t>(o.memory_bytes)), smallest->label,
                           format_bytes(static_cast<size_t>(smallest->peak_bytes)));
    }
    if (counts[2] > 0)
        why += fmt::format(" {} idle over {:.0f}% of the schedule (pipeline bubble);", counts[2], 100.0 * o.max_bubble);
    why += counts[1] > 0 ? " hint: more ranks, a smaller model, sequence or global batch, or (where the memory is "
                           "there) a larger run.memory_limit_gb"
                         : " hint: a global batch with more sequences per data-parallel rank, or another world size";
    if (!kept.empty()) why += fmt::format("; or fewer layout keys kept beside parallel.auto ({})", kept_text);
    return why;
}

}  // namespace ms::sim
