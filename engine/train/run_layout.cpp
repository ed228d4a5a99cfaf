// run_layout.cpp: make_run_layout and the vocabulary resolution (see run_layout.h).
#include "engine/train/run_layout.h"

#include <fmt/format.h>

#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/data/dataset.h"
#include "engine/optim/grad_buckets.h"

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
    if (par.overlap_grad_reduce && d.dp > 1)
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
