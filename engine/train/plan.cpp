// plan.cpp: `mindspeed-train plan` -- derived values, rank layout, per-stage memory and bubble (see plan.h).
#include "engine/train/plan.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>

#include "comm/nodes.h"
#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/data/dataset.h"
#include "engine/model/gpt_graph.h"
#include "engine/optim/distributed_optimizer.h"
#include "engine/sim/profile.h"
#include "engine/sim/search.h"
#include "engine/sim/simulator.h"
#include "engine/train/pipeline.h"
#include "engine/train/plan_graph.h"
#include "engine/train/trainer.h"
#include "memory/arena.h"

namespace ms {
namespace {

constexpr int64_t kAlign = 16;  // Gpt's kParamAlign and PipelineModel's kChunkAlign
constexpr int kMaxRankRows = 64;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

std::string bytes_cell(int64_t b) { return format_bytes(static_cast<size_t>(b)); }

// Right-aligned columns under a header and a rule, one string per line.
std::vector<std::string> table_lines(const std::vector<std::string>& header,
                                     const std::vector<std::vector<std::string>>& rows) {
    std::vector<size_t> w(header.size());
    for (size_t i = 0; i < header.size(); ++i) w[i] = header[i].size();
    for (const auto& r : rows)
        for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
    auto line = [&](const std::vector<std::string>& cells) {
        std::string s;
        for (size_t i = 0; i < cells.size(); ++i) s += fmt::format("{}{:>{}}", i ? "  " : "", cells[i], w[i]);
        return s;
    };
    std::vector<std::string> lines{line(header)};
    size_t width = 2 * (w.size() - 1);
    for (size_t x : w) width += x;
    lines.push_back(std::string(width, '-'));
    for (const auto& r : rows) lines.push_back(line(r));
    return lines;
}

// A chunk's parameter elements and the length of its flat buffer (gpt_param_table: 16-aligned entries back to back).
struct ChunkParams {
    int64_t params = 0, flat = 0;
};

ChunkParams table_params(const std::vector<ParamInfo>& table) {
    ChunkParams c;
    for (const ParamInfo& info : table) c.params += info.numel;
    if (!table.empty()) c.flat = align_up(table.back().offset + table.back().numel, kAlign);
    return c;
}

// gpt_param_table() of the chunk without building it layer by layer: every layer adds the same 16-aligned entries,
// so the table's sizes are affine in its layer count -- read from the table of the chunk's ends alone and of one
// layer more. A billion layers cost what one does, and nothing per layer exists before the memory check.
ChunkParams chunk_params(const GptShape& shape, int tp, const GptPart& part) {
    const GptPart ends{part.first_layer, 0, part.embedding, part.head};
    const GptPart one{part.first_layer, 1, part.embedding, part.head};
    const ChunkParams c0 = table_params(gpt_param_table(shape, tp, ends));
    const ChunkParams c1 = table_params(gpt_param_table(shape, tp, one));
    const int64_t layers = part.num_layers;
    return {c0.params + layers * (c1.params - c0.params), c0.flat + layers * (c1.flat - c0.flat)};
}

void print_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
    for (const std::string& l : table_lines(header, rows)) log_info("{}", l);
}

// plan --simulate's cost model: the profile file, else the device's estimate; neither is a user error that says how
// to make one.
std::unique_ptr<sim::ProfileCostModel> plan_cost_model(const PlanOptions& o, BackendKind backend) {
    if (!o.profile_path.empty() && !o.device.empty())
        throw UserError("plan: --profile and --device both given; hint: pass one of them");
    if (!o.profile_path.empty()) return std::make_unique<sim::ProfileCostModel>(sim::load_profile(o.profile_path));
    if (!o.device.empty()) return std::make_unique<sim::ProfileCostModel>(sim::estimate_profile(o.device));
    std::string devices;
    for (const std::string& d : sim::estimate_profile_names()) devices += (devices.empty() ? "" : "|") + d;
    throw UserError(fmt::format(
        "plan --simulate and --search need a cost model and got neither --profile nor --device; hint: {}, or pass "
        "--device {} for an estimate from published peaks",
        backend == BackendKind::kCPU
            ? "run `mindspeed-train calibrate` first (it measures this machine's ops and links into a profile) and "
              "pass --profile with its file"
            : "pass --profile with a file `mindspeed-train calibrate` wrote on the GPU you plan for",
        devices));
}

// A cost model that notes the shape of every op it is asked about, and lets `inner` price it.
class ShapeRecorder : public sim::CostModel {
  public:
    explicit ShapeRecorder(const sim::CostModel& inner) : inner_(inner) {}
    std::string describe() const override { return inner_.describe(); }
    double op_seconds(const graph::Graph& g, const graph::Node& n) const override {
        if (const std::optional<sim::OpShape> s = sim::op_shape(g, n)) shapes.insert(*s);
        act = g.act;
        return inner_.op_seconds(g, n);
    }
    double optimizer_seconds(int64_t elements, DType weights) const override {
        return inner_.optimizer_seconds(elements, weights);
    }
    double memory_seconds(int64_t bytes) const override { return inner_.memory_seconds(bytes); }
    double peak_flops(DType act) const override { return inner_.peak_flops(act); }
    LinkModel links() const override { return inner_.links(); }
    double oversubscription(int ranks_per_host) const override { return inner_.oversubscription(ranks_per_host); }

    mutable std::set<sim::OpShape> shapes;
    mutable DType act = DType::kF32;  // the graphs' activation dtype

  private:
    const sim::CostModel& inner_;
};

// One line on how the profile priced the shapes the recorder saw: as measured (DTypeTable::shape_seconds), or by
// its families' curves.
std::string shape_coverage(const ShapeRecorder& seen, const sim::Profile& p) {
    const sim::DTypeTable* t = p.table(seen.act);
    size_t held = 0;
    for (const sim::OpShape& s : seen.shapes) held += t != nullptr && t->measured_seconds(s) != nullptr ? 1 : 0;
    if (held == seen.shapes.size())
        return fmt::format("op shapes: all {} matmul, attention and LM-head shapes priced as the profile measured them",
                           held);
    return fmt::format(
        "op shapes: {} of {} matmul, attention and LM-head shapes priced as the profile measured them, {} by its "
        "curves (interpolated by work alone; `mindspeed-train calibrate --config FILE --world-size N` measures a "
        "model's own shapes)",
        held, seen.shapes.size(), seen.shapes.size() - held);
}

// The simulated step's lines (docs/planner.md "Simulator").
void log_simulation(const RunLayout& layout, const NodeLayout& nodes, const sim::ProfileCostModel& cost) {
    const ShapeRecorder seen(cost);
    const sim::SimulatedStep step = sim::simulate_step(layout, seen, nodes);
    log_info(
        "\nsimulated step (cost model: {}; one rank per pipeline stage stands for its tp, cp and dp ranks, which run "
        "the same programs):",
        cost.describe());
    log_info("  {}", shape_coverage(seen, cost.profile()));
    for (const std::string& line : sim::step_report(step, layout)) log_info("{}", line);
}

// The search's options for `world` ranks in nodes of ranks_per_node. The budget per rank: memory_gib (--memory-gb)
// when given, else search_memory_budget's -- run.memory_limit_gb, a device of device_memory_bytes less what a GPU rank
// keeps outside its arena, or the host's memory / ranks on a node.
sim::SearchOptions search_options(const Config& cfg, int world, int ranks_per_node, double memory_gib,
                                  int64_t device_memory_bytes) {
    sim::SearchOptions so{.world_size = world, .gpus_per_node = ranks_per_node};
    so.memory_bytes = memory_gib > 0
                          ? memory_gib * kGiB
                          : sim::search_memory_budget(cfg, device_memory_bytes, std::min(ranks_per_node, world));
    return so;
}

int run_search(const Config& cfg, const PlanOptions& o, int ranks_per_node) {
    const std::unique_ptr<sim::ProfileCostModel> cost = plan_cost_model(o, parse_backend_kind(cfg.run.backend));
    sim::SearchOptions so =
        search_options(cfg, o.world_size, ranks_per_node, o.memory_gib, cost->profile().device_memory_bytes);
    so.top = o.top;
    log_info("cost model: {}", cost->describe());
    const ShapeRecorder seen(*cost);
    const sim::SearchResult result = sim::search_layouts(cfg, seen, so);
    log_info("{}", shape_coverage(seen, cost->profile()));
    for (const std::string& line : sim::search_report(result, so)) log_info("{}", line);
    return kExitOk;
}

}  // namespace

PlanShape plan_shape(const RunLayout& l) {
    PlanShape p;
    p.tp = l.tp();
    p.pp = l.pp();
    p.dp = l.topology.dp;  // the optimizer's shards: every rank of the same model shard, context ranks included
    p.virtual_stages = l.virtual_stages;
    p.kind = l.schedule;
    p.num_microbatches = l.num_microbatches;
    p.micro_batch = l.micro_batch;
    p.zero_stage = l.zero_stage;
    if (l.zero_stage == 2) p.grad_bucket_elems = l.grad_bucket_elems;
    p.optimizer = l.optimizer;
    p.sequence_parallel = l.sequence_parallel;
    p.dtype = l.dtype;
    p.graph = l.graph;
    return p;
}

int64_t StagePlan::all_grad_bytes() const {
    int64_t b = grad_bytes + grad_shard_bytes;
    for (int64_t h : head_grad_bytes) b += h;
    return b;
}

std::vector<size_t> StagePlan::allocations() const {
    std::vector<size_t> a;
    auto add = [&](int64_t bytes) {
        if (bytes > 0) a.push_back(static_cast<size_t>(bytes));
    };
    add(param_bytes);
    add(grad_bytes);
    add(grad_shard_bytes);
    add(weight_bytes);
    for (size_t c = 0; c < slots.size(); ++c) {
        add(scratch_bytes[c]);
        for (int i = 0; i < slots[c]; ++i) add(slot_bytes[c]);
        add(head_grad_bytes[c]);
    }
    add(optimizer.master);
    add(optimizer.exp_avg);
    add(optimizer.exp_avg_sq);
    for (size_t b : optimizer.onebit) add(static_cast<int64_t>(b));
    return a;
}

std::vector<StagePlan> plan_stages(const GptShape& shape, const PlanShape& p) {
    const int v = p.virtual_stages, K = p.pp * v, Lc = shape.L / K;
    const auto schedule = make_schedule(p.kind, p.pp, p.num_microbatches, v);
    std::vector<StagePlan> stages(static_cast<size_t>(p.pp));
    std::map<std::tuple<int, bool, bool>, std::pair<int64_t, int64_t>> activations;  // slot, scratch bytes
    for (int s = 0; s < p.pp; ++s) {
        StagePlan& st = stages[static_cast<size_t>(s)];
        st.slots = pipeline_activation_slots(schedule[static_cast<size_t>(s)], v);
        int64_t flat = 0;
        for (int c = 0; c < v; ++c) {
            const int k = c * p.pp + s;  // model chunk of local chunk c
            const GptPart part{k * Lc, Lc, k == 0, k == K - 1};
            st.layers +=
                fmt::format("{}{}", c ? "," : "",
                            Lc == 1 ? fmt::format("{}", k * Lc) : fmt::format("{}-{}", k * Lc, (k + 1) * Lc - 1));
            const ChunkParams chunk = chunk_params(shape, p.tp, part);
            st.params += chunk.params;
            flat = align_up(flat + chunk.flat, kAlign);
            // chunks of the same depth and ends plan the same bytes: a middle chunk is planned once
            const std::tuple<int, bool, bool> kind{part.num_layers, part.embedding, part.head};
            auto planned = activations.try_emplace(kind);
            if (planned.second) {
                const graph::MemoryPlan act =
                    plan_gpt_memory(shape, part, p.tp, p.micro_batch, p.sequence_parallel, p.dtype, p.graph);
                planned.first->second = {static_cast<int64_t>(act.slot_bytes()),
                                         static_cast<int64_t>(act.scratch_bytes())};
            }
            const auto [slot, scratch] = planned.first->second;
            st.slot_bytes.push_back(slot);
            st.scratch_bytes.push_back(scratch);
            st.head_grad_bytes.push_back(head_grad_bytes(shape, part, p.tp, p.graph));
            st.activation_bytes += slot * st.slots[static_cast<size_t>(c)] + scratch;
        }
        st.padded = padded_flat_size(flat, p.dp);
        st.param_bytes = shards_master_weights(p.zero_stage, p.dtype) ? 0 : 4 * st.padded;
        const auto grad_elem = static_cast<int64_t>(dtype_size(p.graph.grads));
        if (p.zero_stage == 2) {
            const ShardedGradLayout g =
                stage_sharded_grad_layout(shape, stage_params(shape, p.tp, p.pp, s, v), p.tp, p.pp, p.sequence_parallel,
                                          p.dtype, p.graph, p.dp, p.grad_bucket_elems);
            st.grad_bytes = grad_elem * g.buffer_elems();
            st.grad_shard_bytes = grad_elem * g.shard_elems;
            st.grad_slots = g.slots;
            st.grad_kept_bytes = grad_elem * g.kept_elems;
        } else {
            st.grad_bytes = grad_elem * st.padded;
        }
        st.weight_bytes = p.dtype == DType::kF32 ? 0 : static_cast<int64_t>(dtype_size(p.dtype)) * st.padded;
        // onebit_adam's chunks need the stage's table; the other optimizers only its length (the table of a billion
        // layers is never built)
        const std::vector<ParamInfo> table =
            p.optimizer.onebit_adam() ? stage_params(shape, p.tp, p.pp, s, v).table : std::vector<ParamInfo>{};
        st.optimizer = optimizer_blocks(table, flat, p.optimizer, p.zero_stage, p.dtype, p.dp);
    }
    return stages;
}

std::vector<std::string> stage_table(const std::vector<StagePlan>& stages) {
    std::vector<std::vector<std::string>> rows;
    for (size_t s = 0; s < stages.size(); ++s) {
        const StagePlan& st = stages[s];
        std::string acts;
        for (size_t c = 0; c < st.slots.size(); ++c)
            acts += fmt::format("{}{} x {} + {}", c ? " + " : "", bytes_cell(st.slot_bytes[c]), st.slots[c],
                                bytes_cell(st.scratch_bytes[c]));
        // fp32 parameters + 16-bit weights, either absent; the fp32 master shard + the moments
        const auto sum_cell = [](int64_t a, int64_t b) {
            return a == 0 || b == 0 ? bytes_cell(a + b) : bytes_cell(a) + " + " + bytes_cell(b);
        };
        const std::string params = sum_cell(st.param_bytes, st.weight_bytes);
        const OptimizerBlocks& o = st.optimizer;
        std::string optimizer = sum_cell(o.master, o.exp_avg + o.exp_avg_sq);
        if (!o.onebit.empty()) optimizer += " + " + bytes_cell(o.onebit_bytes());
        rows.push_back({fmt::format("{}", s), st.layers, fmt::format("{}", st.params), params,
                        sum_cell(st.grad_bytes, st.all_grad_bytes() - st.grad_bytes), optimizer,
                        bytes_cell(st.comm_bytes()), acts, bytes_cell(st.total_bytes())});
    }
    return table_lines({"stage", "layers", "parameters", "param bytes", "grad bytes", "optimizer", "comm",
                        "activations (slot x n + scratch)", "total"},
                       rows);
}

std::string sharded_grads_warning(const std::vector<StagePlan>& stages, const PlanShape& p) {
    if (p.zero_stage != 2) return "";
    const auto g = static_cast<int64_t>(dtype_size(p.graph.grads));
    for (size_t s = 0; s < stages.size(); ++s) {
        const StagePlan& st = stages[s];
        const int64_t zero1 = g * st.padded, zero2 = st.grad_bytes + st.grad_shard_bytes;
        if (zero2 <= zero1) continue;
        // the longest bucket below which the slots, the kept gradients and the shard fit in zero_stage 1's buffer
        const int64_t fits =
            std::max<int64_t>(0, zero1 - st.grad_shard_bytes - st.grad_kept_bytes) / (g * std::max(1, st.grad_slots));
        return fmt::format(
            "zero_stage 2 keeps {} of gradients per rank on stage {} ({} bucket slots, {} of gradients kept whole, "
            "the dp shard), more than zero_stage 1's whole buffer of {}: buckets of {} elements are large beside the "
            "stage's {} parameters\n---> HINT: set parallel.bucket_size well below {} elements, or zero_stage: 1",
            format_bytes(static_cast<size_t>(zero2)), s, st.grad_slots,
            format_bytes(static_cast<size_t>(st.grad_kept_bytes)), format_bytes(static_cast<size_t>(zero1)),
            p.grad_bucket_elems, st.params, fits);
    }
    return "";
}

size_t largest_stage(const std::vector<StagePlan>& stages) {
    size_t largest = 0;
    for (size_t s = 0; s < stages.size(); ++s)
        if (stages[s].total_bytes() > stages[largest].total_bytes()) largest = s;
    return largest;
}

namespace {

int ranks_per_device(int ranks_on_node, const DeviceMemory& device) {
    const int ranks = std::max(1, ranks_on_node), devices = std::max(1, device.devices);
    return (ranks + devices - 1) / devices;
}

}  // namespace

double memory_budget_bytes(const Config& cfg, int ranks_on_node, const DeviceMemory& device) {
    if (cfg.run.memory_limit_gb > 0) return cfg.run.memory_limit_gb * kGiB;
    if (device.total_bytes > 0) {
        return std::max(0.0, static_cast<double>(device.total_bytes) / ranks_per_device(ranks_on_node, device) -
                                 kDeviceReserveBytes);
    }
    return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE)) /
           std::max(1, ranks_on_node);
}

std::string memory_budget_source(const Config& cfg, int ranks_on_node, const DeviceMemory& device) {
    if (cfg.run.memory_limit_gb > 0) return "run.memory_limit_gb";
    if (device.total_bytes > 0) {
        return fmt::format(
            "GPU memory {:.1f} GiB / {} rank(s) per device, less {:.1f} GiB for the CUDA context, "
            "cuBLAS and NCCL",
            static_cast<double>(device.total_bytes) / kGiB, ranks_per_device(ranks_on_node, device),
            kDeviceReserveBytes / kGiB);
    }
    return fmt::format("physical memory / {} rank(s) on a node", std::max(1, ranks_on_node));
}

int64_t bound_eval_iters(int64_t requested, const std::string& key, int64_t split_samples, int64_t global_batch) {
    const int64_t one_pass = std::max<int64_t>(1, (split_samples + global_batch - 1) / global_batch);
    if (requested <= one_pass) return requested;
    log_warn(
        "{} = {} iterations of {} samples is more than the {} samples of the split: validating on {} iteration(s), "
        "every sample once (more would only repeat them)",
        key, requested, global_batch, split_samples, one_pass);
    return one_pass;
}

std::vector<std::string> placement_report(const Topology& t, const NodeLayout& nodes) {
    std::vector<std::string> lines = {
        fmt::format("\nplacement: {} node(s) of {} rank(s); groups whose ranks are on more than one node talk "
                    "over the network",
                    nodes.num_nodes, t.world() / nodes.num_nodes)};
    auto spans = [&](const std::vector<int>& g) {
        return std::any_of(g.begin(), g.end(), [&](int r) { return !nodes.same_node(r, g.front()); });
    };
    struct Kind {
        const char* name;
        std::vector<std::vector<int>> groups;
    };
    std::vector<std::vector<int>> embd;
    for (const std::vector<int>& g : t.groups(Axis::kPP))  // one embedding group per pp group (its first and last)
        if (g.size() > 1) embd.push_back({g.front(), g.back()});
    const Kind kinds[] = {{"tp", t.groups(Axis::kTP)},
                          {"cp", t.context_groups()},
                          {"dp", t.groups(Axis::kDP)},
                          {"pp", t.groups(Axis::kPP)},
                          {"embd", std::move(embd)}};
    for (const Kind& k : kinds) {
        if (k.groups.empty() || k.groups.front().size() < 2) continue;
        const auto crossing = std::count_if(k.groups.begin(), k.groups.end(), spans);
        lines.push_back(
            fmt::format("  {:<4} {} group(s) of {}: {}", k.name, k.groups.size(), k.groups.front().size(),
                        crossing == 0 ? std::string("each inside one node") : fmt::format("{} span nodes", crossing)));
    }
    const auto tp_crossing = std::count_if(kinds[0].groups.begin(), kinds[0].groups.end(), spans);
    if (t.tp > 1 && tp_crossing > 0) {
        lines.push_back(fmt::format(
            "warning: {} tensor-parallel group(s) of {} ranks span nodes: their all-reduces (all-gathers and "
            "reduce-scatters with sequence parallelism) run in every layer, forward and backward, over the network; "
            "hint: tensor_model_parallel_size({}) at most the ranks per node ({}), which divides it",
            tp_crossing, t.tp, t.tp, t.world() / nodes.num_nodes));
    }
    return lines;
}

int run_plan(const Config& cfg, int world_size) { return run_plan(cfg, PlanOptions{.world_size = world_size}); }

namespace {

// The config as train runs it: its vocabulary resolved from the data when model.vocab_size is 0.
Config resolved_config(const Config& cfg) {
    return cfg.model.vocab_size == 0 ? resolve_vocab(cfg, *open_token_source(cfg.data, 0)) : cfg;
}

// --ranks-per-node, else the config's run.ranks_per_node, else 8 (a DGX); nodes of consecutive ranks, which must
// divide a world larger than one node.
int plan_ranks_per_node(const Config& cfg, int ranks_per_node, int world_size) {
    const int rpn = ranks_per_node > 0 ? ranks_per_node : cfg.run.ranks_per_node > 0 ? cfg.run.ranks_per_node : 8;
    if (world_size > rpn && world_size % rpn != 0) {
        throw UserError(fmt::format(
            "plan: {} ranks per node do not divide the world size {}; hint: --ranks-per-node with a divisor of {} "
            "(or one at least the world size: a single node)",
            rpn, world_size, world_size));
    }
    return rpn;
}

}  // namespace

std::vector<sim::OpShape> planned_op_shapes(const Config& cfg_in, const std::vector<int>& world_sizes,
                                            int ranks_per_node, const sim::CostModel& cost,
                                            int64_t device_memory_bytes) {
    const Config cfg = resolved_config(cfg_in);
    ShapeRecorder recorder(cost);
    for (const int world : world_sizes) {
        const int rpn = plan_ranks_per_node(cfg, ranks_per_node, world);
        sim::search_layouts(cfg, recorder, search_options(cfg, world, rpn, 0, device_memory_bytes));
        // and the config's own layout, which plan --simulate prices whether or not the search keeps it (with
        // parallel.auto it is one of the search's)
        if (cfg.parallel.auto_layout) continue;
        RunLayout layout;
        try {
            layout = make_run_layout(cfg, world);
        } catch (const UserError&) {
            continue;  // not a layout of this world size
        }
        sim::simulate_step(layout, recorder, nodes_by_count(world, std::min(rpn, world)));
    }
    return {recorder.shapes.begin(), recorder.shapes.end()};
}

int run_plan(const Config& cfg_in, const PlanOptions& o) {
    Config cfg = resolved_config(cfg_in);  // as train does
    const int rpn = plan_ranks_per_node(cfg, o.ranks_per_node, o.world_size);
    if (o.search) return run_search(cfg, o, rpn);
    cfg = resolve_auto_layout(cfg, o.world_size, rpn, 0);  // parallel.auto: plan what train would run
    const RunLayout layout = make_run_layout(cfg, o.world_size);
    // the cost model first: a missing or bad profile ends plan before it prints anything
    const std::unique_ptr<sim::ProfileCostModel> cost = o.simulate ? plan_cost_model(o, layout.backend) : nullptr;
    const NodeLayout nodes = nodes_by_count(o.world_size, std::min(rpn, o.world_size));
    log_derived(layout, cfg);

    const Topology& t = layout.topology;
    log_info(
        "\nranks (order tp-cp-dp-pp: rank = tp + {} * (cp + {} * (dp + {} * pp)); node = rank / {} ranks per node)",
        t.tp, t.cp, t.replicas(), rpn);
    std::vector<std::vector<std::string>> rows;
    for (int r = 0; r < std::min(o.world_size, kMaxRankRows); ++r) {
        const Coord c = t.coord_of(r);
        rows.push_back({fmt::format("{}", r), fmt::format("{}", c.tp), fmt::format("{}", t.cp_rank(r)),
                        fmt::format("{}", c.pp), fmt::format("{}", t.replica(r)), fmt::format("{}", nodes.node(r))});
    }
    print_table({"rank", "tp", "cp", "pp", "dp", "node"}, rows);
    if (o.world_size > kMaxRankRows) log_info("... {} more", o.world_size - kMaxRankRows);
    for (const std::string& line : placement_report(layout.topology, nodes)) {
        if (line.starts_with("warning: "))
            log_warn("{}", line.substr(9));
        else
            log_info("{}", line);
    }

    const PlanShape ps = plan_shape(layout);
    const auto stages = plan_stages(layout.shape, ps);
    const std::string precision =
        ps.dtype == DType::kF32 ? std::string("fp32")
        : shards_master_weights(ps.zero_stage, ps.dtype)
            ? fmt::format("{0} activations; param bytes: {0} weights; optimizer: fp32 master shard + moments",
                          dtype_name(ps.dtype))
            : fmt::format("{0} activations; param bytes: fp32 master + {0} weights", dtype_name(ps.dtype));
    log_info(
        "\nmemory per rank by pipeline stage ({}; parameters are one tp rank's shard; zero_stage {}, sharded over {} "
        "ranks{}{}{})",
        precision, ps.zero_stage, ps.dp,
        t.cp > 1 ? fmt::format(" (dp {} x cp {}); activations of seq_length / cp = {} tokens", t.replicas(), t.cp,
                               layout.seq_length() / t.cp)
                 : std::string(),
        ps.zero_stage == 2 ? fmt::format("; grad bytes: buckets of {} elements in their slots and the gradients kept "
                                         "whole + the dp shard",
                                         ps.grad_bucket_elems)
                           : std::string(),
        ps.optimizer.onebit_adam() ? ", onebit_adam" : "");
    for (const std::string& line : stage_table(stages)) log_info("{}", line);
    if (const std::string w = sharded_grads_warning(stages, ps); !w.empty()) log_warn("{}", w);
    const SimResult sim = simulate(make_schedule(ps.kind, ps.pp, ps.num_microbatches, ps.virtual_stages), 1, 2);
    log_info(
        "\nbubble: {}, pp {}, micro-batches {}, virtual stages {}: {:.2f}% of the step (theoretical: "
        "t_backward = 2 t_forward, free communication)",
        to_string(ps.kind), ps.pp, ps.num_microbatches, ps.virtual_stages, 100.0 * sim.bubble_fraction);

    Config budget_cfg = cfg;
    if (o.memory_gib > 0) budget_cfg.run.memory_limit_gb = o.memory_gib;
    const int on_node = std::min(rpn, o.world_size);
    const double budget = memory_budget_bytes(budget_cfg, on_node);
    const size_t largest = largest_stage(stages);
    const int64_t peak = stages[largest].total_bytes();
    log_info("largest per-rank total: {} ({} B, stage {}) against {} per rank ({}): {}", bytes_cell(peak), peak,
             largest, format_bytes(static_cast<size_t>(budget)),
             o.memory_gib > 0 ? std::string("--memory-gb") : memory_budget_source(budget_cfg, on_node),
             static_cast<double>(peak) <= budget ? "fits" : "does not fit");
    if (layout.backend == BackendKind::kCUDA && o.memory_gib <= 0 && cfg.run.memory_limit_gb <= 0) {
        log_info(
            "run.backend is cuda: train checks against the GPU's memory / ranks per device, less {:.1f} GiB per rank; "
            "pass --memory-gb with that number to check it here (an 80 GiB GPU, one rank each: --memory-gb {:.1f})",
            kDeviceReserveBytes / kGiB, 80.0 - kDeviceReserveBytes / kGiB);
    }
    if (o.graph || !o.dot_path.empty()) log_chunk_graphs(layout, o.dot_path);
    if (o.simulate) log_simulation(layout, nodes, *cost);
    return kExitOk;
}

}  // namespace ms
