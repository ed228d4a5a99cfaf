// search.h: `mindspeed-train plan --search` (docs/planner.md "Search"): the layouts of a config for a world size,
// ranked by simulated throughput (simulator.h).
//
// Enumerated, for the config's model and global batch: tensor parallelism (a divisor of the GPUs per node, so a tp
// group never leaves its node), with and without sequence parallelism when tp > 1; context parallelism (Llama: 1, 2,
// 4); pipeline stages (a divisor of the layers) with 1, 2 or 4 virtual stages (the interleaved schedule when more
// than 1, else 1F1B); the data-parallel size the rest leaves; micro-batches of 1, 2, 4 or 8 sequences;
// recomputation none, selective or full; ZeRO stage 0 or 1; and with dp > 1 the overlap of the gradient reduction
// (and, with ZeRO 1, of the parameter gather) off or on. Each candidate is pruned, in this order, for:
//   divisibility  the config's validation refuses it (its sentence is the reason): heads, layers, batch, vocabulary
//                 or world not divisible, an interleaved schedule whose micro-batches pp does not divide, ...
//   memory        the plan's largest rank (engine/train/plan.h) exceeds the budget per rank
//   bubble        the schedule's theoretical bubble (t_backward = 2 t_forward, free messages) exceeds max_bubble
// and the rest are simulated and ranked by tokens per second.
//
// With parallel.auto (config.h) the layout keys (layout_keys()) the config set explicitly are kept: each such axis
// takes only the config's value, so `plan --search` ranks what `parallel.auto: true` chooses from.
#pragma once

#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/sim/cost_model.h"
#include "engine/sim/simulator.h"

namespace ms::sim {

struct SearchOptions {
    int world_size = 1;
    int gpus_per_node = 8;
    double memory_bytes = 0;  // budget per rank
    double max_bubble = 0.25;
    int top = 5;
};

// One enumerated layout: the config overrides that make it, and a short label for tables.
struct SearchCandidate {
    Config cfg;
    std::string label;  // "tp 2 sp pp 2 vpp 1 dp 4 cp 1 mb 4 rc none zero 1 overlap"
};

enum class PruneReason : uint8_t { kDivisibility, kMemory, kBubble };
const char* prune_reason_name(PruneReason r);  // "divisibility", "memory", "bubble"

struct Pruned {
    std::string label;
    PruneReason reason;
    std::string why;         // the validation's sentence, the bytes against the budget, the bubble against the bound
    int64_t peak_bytes = 0;  // kMemory: the plan's largest rank
};

struct Ranked {
    std::string label;
    Config cfg;  // the candidate: the base config with its layout keys replaced
    SimulatedStep step;
    int64_t peak_bytes = 0;  // the plan's largest rank
};

struct SearchResult {
    int considered = 0;
    std::vector<Ranked> ranked;  // best first
    std::vector<Pruned> pruned;
};

// The keys a candidate sets (its layout): parallel.tensor_model_parallel_size, ... training.recompute_num_layers.
const std::vector<std::string>& layout_keys();
// The layout keys kept at the config's values: with parallel.auto, those among its explicit_keys; else none.
std::vector<std::string> kept_layout_keys(const Config& c);
// c's layout as `--set` overrides, one "--set key=value" per layout key, in layout_keys() order.
std::string layout_overrides(const Config& c);

// The candidates of `base` (its model, data and global batch kept; its parallel and recompute keys replaced, but for
// the kept ones).
std::vector<SearchCandidate> enumerate_layouts(const Config& base, const SearchOptions& o);

// Prunes and simulates the candidates on `cost`, nodes of gpus_per_node consecutive ranks.
SearchResult search_layouts(const Config& base, const CostModel& cost, const SearchOptions& o);

// The lines `plan --search` prints: the counts, the top o.top with their numbers, an example of each prune reason.
std::vector<std::string> search_report(const SearchResult& r, const SearchOptions& o);

// The memory budget per rank the search prunes against when neither `plan --memory-gb` nor anything else says:
// run.memory_limit_gb, else a device's memory (a profile's device_memory_bytes) less what a GPU rank keeps outside
// its arena (plan.h kDeviceReserveBytes), else the host's memory / ranks on a node (memory_budget_bytes).
double search_memory_budget(const Config& cfg, int64_t device_memory_bytes, int ranks_on_node);

// Why no candidate of r is ranked, one sentence with a hint (parallel.auto's error when nothing can run).
std::string no_layout_reason(const SearchResult& r, const SearchOptions& o, const Config& base);

}  // namespace ms::sim
