// plan.cpp: `mindspeed-train plan` -- derived values, rank layout, per-stage memory and bubble (see plan.h).
#include "engine/train/plan.h"

#include <unistd.h>

#include <algorithm>
#include <memory>

#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/data/dataset.h"
#include "engine/optim/distributed_optimizer.h"
#include "engine/parallel/topology.h"
#include "engine/train/trainer.h"

namespace ms {
namespace {

constexpr int64_t kAlign = 16;  // Gpt's kParamAlign and PipelineModel's kChunkAlign
constexpr int kMaxRankRows = 64;

int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// As the trainer builds it (engine/train/trainer.cpp).
GptShape make_shape(const Config& cfg, const DerivedConfig& d) {
    GptShape s;
    s.L = cfg.model.num_layers;
    s.C = cfg.model.hidden_size;
    s.NH = cfg.model.num_attention_heads;
    s.T = cfg.model.max_position_embeddings > 0 ? cfg.model.max_position_embeddings : cfg.model.seq_length;
    s.V = cfg.model.vocab_size;
    s.Vp = d.padded_vocab;
    s.F = d.ffn_hidden;
    s.eps = cfg.model.layernorm_epsilon;
    return s;
}

// The most micro-batches of each local chunk whose forward is done and backward is not (as PipelineModel counts).
std::vector<int> peak_in_flight(const std::vector<Action>& actions, int chunks) {
    std::vector<int> live(static_cast<size_t>(chunks), 0), peak(static_cast<size_t>(chunks), 1);
    for (const Action& a : actions) {
        if (a.kind == Action::Kind::kForward) peak[a.chunk] = std::max(peak[a.chunk], ++live[a.chunk]);
        if (a.kind == Action::Kind::kBackward) --live[a.chunk];
    }
    return peak;
}

std::string human_bytes(double b) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, ++u;
    return fmt::format("{:.2f} {}", b, units[u]);
}

// Right-aligned columns under a header and a rule.
void print_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
    std::vector<size_t> w(header.size());
    for (size_t i = 0; i < header.size(); ++i) w[i] = header[i].size();
    for (const auto& r : rows)
        for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
    auto line = [&](const std::vector<std::string>& cells) {
        std::string s;
        for (size_t i = 0; i < cells.size(); ++i) s += fmt::format("{}{:>{}}", i ? "  " : "", cells[i], w[i]);
        log_info("{}", s);
    };
    line(header);
    size_t width = 2 * (w.size() - 1);
    for (size_t x : w) width += x;
    log_info("{}", std::string(width, '-'));
    for (const auto& r : rows) line(r);
}

}  // namespace

int64_t gpt_activation_slot_bytes(const GptShape& s, const GptPart& part, int tp, int micro_batch,
                                  bool sequence_parallel) {
    const int64_t N = static_cast<int64_t>(micro_batch) * s.T, C = s.C;
    const int64_t NHl = s.NH / tp, Cl = NHl * (s.C / s.NH), Fl = s.F / tp, Vl = part.head ? s.Vp / tp : 0;
    const int layers = part.num_layers < 0 ? s.L - part.first_layer : part.num_layers;
    int64_t used = 0;
    auto take = [&](int64_t n) { used += align_up(n, kAlign); };
    for (int l = 0; l < layers; ++l) {
        for (int64_t n : {N * C, N, N, N * 3 * Cl, N * Cl, N * NHl, N * C})  // ln1 mean rstd qkv atty lse res2
            take(n);
        for (int64_t n : {N * C, N, N, N * Fl, N * Fl, N * C}) take(n);  // ln2 mean rstd fch fch_gelu res3
    }
    for (int64_t n : {N * C, N * C, N, N, N * Vl, N, N, 2 * N, N, N, N})  // encoded lnf mean rstd logits losses
        take(n);                                                          //   row_max sum_exp dloss tokens targets
    for (int64_t n : {N * C, N * C, N * C, N * Cl, N * 3 * Cl, N * Fl, N * C, N * C})  // proj_out dres dln datty
        take(n);                                                                       //   dqkv dfch dout dinp
    if (sequence_parallel) take(N * C), take(N * C);                                   // sp_local sp_full
    return used * static_cast<int64_t>(sizeof(float));
}

std::vector<StagePlan> plan_stages(const GptShape& shape, const PlanShape& p) {
    const int v = p.virtual_stages, K = p.pp * v, Lc = shape.L / K;
    const auto schedule = make_schedule(p.kind, p.pp, p.num_microbatches, v);
    std::vector<StagePlan> stages(static_cast<size_t>(p.pp));
    for (int s = 0; s < p.pp; ++s) {
        StagePlan& st = stages[static_cast<size_t>(s)];
        st.slots = peak_in_flight(schedule[static_cast<size_t>(s)], v);
        int64_t flat = 0;
        for (int c = 0; c < v; ++c) {
            const int k = c * p.pp + s;  // model chunk of local chunk c
            const GptPart part{k * Lc, Lc, k == 0, k == K - 1};
            st.layers +=
                fmt::format("{}{}", c ? "," : "",
                            Lc == 1 ? fmt::format("{}", k * Lc) : fmt::format("{}-{}", k * Lc, (k + 1) * Lc - 1));
            const auto table = gpt_param_table(shape, 0.02f, p.tp, part);
            for (const ParamInfo& info : table) st.params += info.numel;
            flat = align_up(flat + table.back().offset + table.back().numel, kAlign);
            st.slot_bytes.push_back(gpt_activation_slot_bytes(shape, part, p.tp, p.micro_batch, p.sequence_parallel));
            st.activation_bytes += st.slot_bytes.back() * st.slots[static_cast<size_t>(c)];
        }
        st.padded = padded_flat_size(flat, p.dp);
        st.param_bytes = st.grad_bytes = 4 * st.padded;
        st.optimizer_bytes = 8 * (p.zero_stage == 1 ? st.padded / p.dp : st.padded);
    }
    return stages;
}

int run_plan(const Config& cfg, int world_size) { return run_plan(cfg, PlanOptions{.world_size = world_size}); }

int run_plan(const Config& cfg_in, const PlanOptions& o) {
    Config cfg = cfg_in;
    if (cfg.model.vocab_size == 0) {  // from the data, as train resolves it
        std::unique_ptr<TokenSource> source = open_token_source(cfg.data, 0);
        cfg.model.vocab_size = source->vocab_size();
    }
    const DerivedConfig d = validate_config(cfg, o.world_size);
    const ParallelConfig& par = cfg.parallel;
    const int tp = par.tensor_model_parallel_size, pp = par.pipeline_model_parallel_size;
    const int rpn = std::max(1, o.ranks_per_node);
    log_info(
        "derived: world size {} = tp {} x pp {} x dp {} | padded vocab {} (vocab {}, multiple of {}) | "
        "ffn hidden {}",
        d.world_size, tp, pp, d.dp, d.padded_vocab, cfg.model.vocab_size, cfg.model.make_vocab_size_divisible_by,
        d.ffn_hidden);
    log_info(
        "derived: global batch {} = micro batch {} x {} micro-batches x dp {} | tokens per step {} | "
        "parameters {} ({:.2f} M)",
        cfg.training.micro_batch_size * d.num_microbatches * d.dp, cfg.training.micro_batch_size, d.num_microbatches,
        d.dp, d.tokens_per_step, d.num_parameters, static_cast<double>(d.num_parameters) / 1e6);

    log_info("\nranks (order tp-dp-pp: rank = tp + {} * (dp + {} * pp); node = rank / {} ranks per node)", tp, d.dp,
             rpn);
    const Topology topo{tp, d.dp, pp};
    std::vector<std::vector<std::string>> rows;
    for (int r = 0; r < std::min(o.world_size, kMaxRankRows); ++r) {
        const Coord c = topo.coord_of(r);
        rows.push_back({fmt::format("{}", r), fmt::format("{}", c.tp), fmt::format("{}", c.pp), fmt::format("{}", c.dp),
                        fmt::format("{}", r / rpn)});
    }
    print_table({"rank", "tp", "pp", "dp", "node"}, rows);
    if (o.world_size > kMaxRankRows) log_info("... {} more", o.world_size - kMaxRankRows);

    const ScheduleKind kind = parse_schedule_kind(par.pipeline_schedule);
    const int v = par.virtual_pipeline_model_parallel_size, m = d.num_microbatches;
    const GptShape shape = make_shape(cfg, d);
    const auto stages = plan_stages(shape, PlanShape{tp, pp, d.dp, v, kind, m, cfg.training.micro_batch_size,
                                                     par.zero_stage, par.sequence_parallel});
    log_info("\nmemory per rank by pipeline stage (fp32; parameters are one tp rank's shard; zero_stage {}, dp {})",
             par.zero_stage, d.dp);
    rows.clear();
    size_t largest = 0;
    for (size_t s = 0; s < stages.size(); ++s) {
        const StagePlan& st = stages[s];
        std::string acts;
        for (size_t c = 0; c < st.slots.size(); ++c)
            acts += fmt::format("{}{} x {}", c ? " + " : "", human_bytes(static_cast<double>(st.slot_bytes[c])),
                                st.slots[c]);
        rows.push_back({fmt::format("{}", s), st.layers, fmt::format("{}", st.params),
                        human_bytes(static_cast<double>(st.param_bytes)),
                        human_bytes(static_cast<double>(st.grad_bytes)),
                        human_bytes(static_cast<double>(st.optimizer_bytes)), acts,
                        human_bytes(static_cast<double>(st.total_bytes()))});
        if (st.total_bytes() > stages[largest].total_bytes()) largest = s;
    }
    print_table(
        {"stage", "layers", "parameters", "param bytes", "grad bytes", "optimizer", "activations (slot x n)", "total"},
        rows);
    const SimResult sim = simulate(make_schedule(kind, pp, m, v), 1, 2);
    log_info(
        "\nbubble: {}, pp {}, micro-batches {}, virtual stages {}: {:.2f}% of the step (theoretical: "
        "t_backward = 2 t_forward, free communication)",
        to_string(kind), pp, m, v, 100.0 * sim.bubble_fraction);

    const double gib = 1024.0 * 1024.0 * 1024.0;
    const double on_node = std::min(rpn, o.world_size);
    const double budget = o.memory_gib > 0 ? o.memory_gib * gib
                                           : static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
                                                 static_cast<double>(sysconf(_SC_PAGESIZE)) / on_node;
    const double peak = static_cast<double>(stages[largest].total_bytes());
    log_info("largest per-rank total: {} (stage {}) against {} per rank ({}): {}", human_bytes(peak), largest,
             human_bytes(budget),
             o.memory_gib > 0 ? std::string("--memory-gb")
                              : fmt::format("physical memory / {} ranks on a node", static_cast<int>(on_node)),
             peak <= budget ? "fits" : "does not fit");
    return kExitOk;
}

}  // namespace ms
