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
    std::string why;  // the validation's sentence, the bytes against the budget, the bubble against the bound
};

struct Ranked {
    std::string label;
    SimulatedStep step;
    int64_t peak_bytes = 0;  // the plan's largest rank
};

struct SearchResult {
    int considered = 0;
    std::vector<Ranked> ranked;  // best first
    std::vector<Pruned> pruned;
};

// The candidates of `base` (its model, data and global batch kept; its parallel and recompute keys replaced).
std::vector<SearchCandidate> enumerate_layouts(const Config& base, const SearchOptions& o);

// Prunes and simulates the candidates on `cost`, nodes of gpus_per_node consecutive ranks.
SearchResult search_layouts(const Config& base, const CostModel& cost, const SearchOptions& o);

// The lines `plan --search` prints: the counts, the top o.top with their numbers, an example of each prune reason.
std::vector<std::string> search_report(const SearchResult& r, const SearchOptions& o);

}  // namespace ms::sim
