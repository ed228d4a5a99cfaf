// run_layout.cpp: make_run_layout and the vocabulary resolution (see run_layout.h).
#include "engine/train/run_layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/data/dataset.h"
#include "engine/optim/grad_buckets.h"
#include "engine/sim/profile.h"
#include "engine/sim/search.h"

namespace ms {

BackendKind parse_backend_kind(std::string_view name) {
    return name == "cuda" ? BackendKind::kCUDA : BackendKind::kCPU;
}

int64_t padded_vocab_size(int64_t vocab, int divisible_by, int tp) {
    const int64_t multiple = int64_t{divisible_by} * tp;
    return (vocab + multiple - 1) / multiple * multiple;
}

GptShape gpt_shape(const Config& cfg, const DerivedConfig& d) {
    GptShape s;
    s.L = cfg.model.num_layers;
    s.C = cfg.model.hidden_size;
    s.NH = cfg.model.num_attention_heads;
    s.T = cfg.model.max_position_embeddings > 0 ? cfg.model.max_position_embeddings : cfg.model.seq_length;
    s.S = cfg.model.seq_length;
    s.V = cfg.model.vocab_size;
    s.Vp = d.padded_vocab;
    s.F = d.ffn_hidden;
    s.eps = cfg.model.layernorm_epsilon;
    s.untied = cfg.model.untie_embeddings_and_output_weights;
    if (cfg.model.arch == "llama") {
        s.arch = ModelArch::kLlama;
        s.NKV = cfg.model.num_query_groups;
        s.rope_theta = cfg.model.rotary_base;
        s.rope_scaling = {.factor = cfg.model.rope_scaling_factor,
                          .low_freq_factor = cfg.model.rope_low_freq_factor,
                          .high_freq_factor = cfg.model.rope_high_freq_factor,
                          .original_max_position_embeddings = cfg.model.rope_original_max_position_embeddings};
    }
    return s;
}

RunLayout make_run_layout(const Config& cfg, int world_size) {
    const DerivedConfig d = validate_config(cfg, world_size);
    const ParallelConfig& par = cfg.parallel;
    RunLayout l;
    l.backend = parse_backend_kind(cfg.run.backend);
    l.comm = parse_comm_kind(cfg.run.comm);
    l.dtype = model_dtype(cfg.mixed_precision);
    l.schedule = parse_schedule_kind(par.pipeline_schedule);
    l.topology = Topology{par.tensor_model_parallel_size, d.dp, par.pipeline_model_parallel_size, d.cp};
    l.virtual_stages = par.virtual_pipeline_model_parallel_size;
    l.layers_per_chunk = cfg.model.num_layers / (par.pipeline_model_parallel_size * l.virtual_stages);
    l.sequence_parallel = par.sequence_parallel;
    l.zero_stage = par.zero_stage;
    l.optimizer = cfg.optimizer;
    if ((par.overlap_grad_reduce || par.zero_stage == 2) && d.dp > 1)  // zero_stage 2 reduces in buckets always
        l.grad_bucket_elems = par.bucket_size > 0 ? par.bucket_size : default_bucket_elems(d.dp);
    l.param_gather_overlap = par.overlap_param_gather && l.grad_bucket_elems > 0;
    l.hierarchical_dp = parse_hierarchical_dp(par.hierarchical_dp);
    l.micro_batch = cfg.training.micro_batch_size;
    l.num_microbatches = d.num_microbatches;
    l.global_batch = int64_t{l.micro_batch} * l.num_microbatches * d.replicas();
    l.num_parameters = d.num_parameters;
    l.shape = gpt_shape(cfg, d);
    l.graph.backend = l.backend;
    l.graph.lm_head_loss_fusion = cfg.model.cross_entropy_loss_fusion;
    l.graph.grads = grad_dtype(cfg.mixed_precision);
    l.graph.context_parallel = d.cp;
    // Where every pipeline layout must give one stage's bits -- fp32 on the CPU, the reference the equivalence tests
    // hold layouts to, and onebit_adam, whose sign bits amplify a last-bit difference -- one stage keeps its tied
    // output layer's gradient apart (Vp/tp x C more gradient memory); elsewhere (a GPU's norm, 16-bit activations)
    // layouts agree to a tolerance anyway, and the memory formulas of the README stay those of one gradient buffer.
    // zero_stage 2 is not layout-exact (sharded_grads.h), and keeps the tied embedding's gradient whole anyway.
    l.graph.tied_grads_apart =
        ((l.backend == BackendKind::kCPU && l.dtype == DType::kF32) || l.optimizer.onebit_adam()) && l.zero_stage != 2;
    // ... and where the buckets reduce the tied embedding's two parts apart, a pipeline's first stage receives the
    // last stage's average of the output layer's into a buffer of the same size (grad_buckets.h)
    l.graph.tied_head_received = l.graph.tied_grads_apart && l.grad_bucket_elems > 0 && l.topology.pp > 1;
    const TrainingConfig& t = cfg.training;
    using graph::RecomputeGranularity;
    l.graph.recompute.granularity = t.recompute_granularity == "full"        ? RecomputeGranularity::kFull
                                    : t.recompute_granularity == "selective" ? RecomputeGranularity::kSelective
                                                                             : RecomputeGranularity::kNone;
    l.graph.recompute.method =
        t.recompute_method == "block" ? graph::RecomputeMethod::kBlock : graph::RecomputeMethod::kUniform;
    l.graph.recompute.num_layers = t.recompute_num_layers;
    return l;
}

Config resolve_vocab(Config cfg, const TokenSource& source) {
    if (cfg.model.vocab_size == 0) {
        cfg.model.vocab_size = source.vocab_size();
    } else if (source.vocab_size() > cfg.model.vocab_size) {
        throw UserError(fmt::format(
            "config error: model.vocab_size({}) is smaller than the data's largest token id + 1 ({}) in {}\n"
            "---> HINT: set model.vocab_size to at least {} (or 0 to take it from the data)",
            cfg.model.vocab_size, source.vocab_size(), source.describe(), source.vocab_size()));
    }
    return cfg;
}

namespace {

// parallel.auto_profile's profile and the name auto_profile records: the file, the estimate it names, or (empty, on
// run.backend: cuda) the estimate whose device the GPU's name contains.
std::pair<sim::Profile, std::string> auto_profile(const Config& cfg, int local_rank) {
    const std::string& name = cfg.parallel.auto_profile;
    const std::vector<std::string> estimates = sim::estimate_profile_names();
    const std::string estimate_list = fmt::format("{}", fmt::join(estimates, ", "));
    const BackendKind backend = parse_backend_kind(cfg.run.backend);
    if (name.empty() && backend == BackendKind::kCPU) {
        throw UserError(
            "config error: parallel.auto is true on run.backend: cpu, and parallel.auto_profile is empty: the layout "
            "search needs this machine's op and link costs, and there is no built-in estimate of a CPU\n---> HINT: "
            "run `mindspeed-train calibrate --output cpu.json` once on this machine and set "
            "parallel.auto_profile: cpu.json");
    }
    if (name.empty()) {
        BackendOptions bo;
        bo.kind = backend;
        bo.local_rank = local_rank;
        bo.cuda = cuda_debug_options(cfg.debug);
        std::string device;
        try {
            device = make_backend(bo)->device_name();
        } catch (const UserError& e) {  // plan on a machine without the GPU, or a binary without CUDA
            throw UserError(fmt::format(
                "config error: parallel.auto is true and parallel.auto_profile is empty, which takes the built-in "
                "estimate of the run's GPU, but no GPU could be started here ({})\n---> HINT: set "
                "parallel.auto_profile to the estimate of the GPU the run is for ({}) or to a profile file "
                "`mindspeed-train calibrate` wrote on it",
                e.what(), estimate_list));
        }
        for (const std::string& e : estimates) {
            sim::Profile p = sim::estimate_profile(e);
            if (!device.empty() && device.find(p.device) != std::string::npos) return {std::move(p), e};
        }
        throw UserError(fmt::format(
            "config error: parallel.auto is true and parallel.auto_profile is empty, but there is no built-in "
            "estimate for this GPU ('{}'; the estimates are {})\n---> HINT: run `mindspeed-train calibrate "
            "--config <this config> --output gpu.json` on it and set parallel.auto_profile: gpu.json",
            device, estimate_list));
    }
    sim::Profile p;
    if (std::find(estimates.begin(), estimates.end(), name) != estimates.end()) {
        p = sim::estimate_profile(name);
    } else if (std::error_code ec; std::filesystem::is_regular_file(name, ec)) {
        p = sim::load_profile(name);
    } else {
        throw UserError(fmt::format(
            "config error: parallel.auto_profile = '{}' is neither a profile file (there is no such file) nor a "
            "built-in estimate ({})\n---> HINT: run `mindspeed-train calibrate --output {}` on the machine the run "
            "is for, or name an estimate",
            name, estimate_list, name));
    }
    if (p.backend != cfg.run.backend) {
        throw UserError(fmt::format(
            "config error: parallel.auto_profile '{}' holds the costs of the {} backend ({}) but run.backend is {}: "
            "the search would rank the layouts by another machine's costs\n---> HINT: a profile `mindspeed-train "
            "calibrate` measured on the {} backend, or a built-in estimate ({}) for run.backend: cuda",
            name, p.backend, p.device, cfg.run.backend, cfg.run.backend, estimate_list));
    }
    return {std::move(p), name};
}

}  // namespace

Config resolve_auto_layout(const Config& cfg, int world_size, int ranks_per_node, int local_rank) {
    if (!cfg.parallel.auto_layout) return cfg;
    auto [profile, profile_name] = auto_profile(cfg, local_rank);
    const sim::ProfileCostModel cost(std::move(profile));
    const int on_node = std::min(ranks_per_node, world_size);
    sim::SearchOptions so{.world_size = world_size, .gpus_per_node = ranks_per_node, .top = 1};
    so.memory_bytes = sim::search_memory_budget(cfg, cost.profile().device_memory_bytes, on_node);
    const sim::SearchResult r = sim::search_layouts(cfg, cost, so);
    if (r.ranked.empty()) throw UserError("config error: parallel.auto: " + sim::no_layout_reason(r, so, cfg));
    Config chosen = r.ranked.front().cfg;
    chosen.run.ranks_per_node = cfg.run.ranks_per_node;  // the search's nodes, not a key it chooses
    chosen.parallel.auto_profile = profile_name;
    const std::vector<std::string> kept = sim::kept_layout_keys(cfg);
    log_info("parallel.auto: the layout search's first choice on {}{}:", cost.describe(),
             kept.empty() ? std::string() : fmt::format(", keeping {} as set", fmt::join(kept, ", ")));
    for (const std::string& line : sim::search_report(r, so)) log_info("{}", line);
    log_info("parallel.auto: chosen layout: {}", sim::layout_overrides(chosen));
    return chosen;
}

void log_derived(const RunLayout& l, const Config& cfg) {
    log_info(
        "derived: world size {} = tp {} x pp {} x {}dp {} | padded vocab {} (vocab {}, multiple of {}) | "
        "ffn hidden {}",
        l.world_size(), l.tp(), l.pp(), l.cp() > 1 ? fmt::format("cp {} x ", l.cp()) : "", l.dp(), l.shape.Vp,
        l.shape.V, cfg.model.make_vocab_size_divisible_by, l.shape.F);
    log_info(
        "derived: global batch {} = micro batch {} x {} micro-batches x dp {} | tokens per step {} | "
        "parameters {} ({:.2f} M)",
        l.global_batch, l.micro_batch, l.num_microbatches, l.dp(), l.tokens_per_step(), l.num_parameters,
        static_cast<double>(l.num_parameters) / 1e6);
}

}  // namespace ms
