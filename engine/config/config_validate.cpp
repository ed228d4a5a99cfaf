// config_validate.cpp: validate_config() -- the checks that involve more than one value, and the derived values.
//
// Order: single values (config_schema.cpp), then what this build can run (backend, precision, unsupported
// features), then shapes, parallel layout and batch arithmetic, then schedule/data/checkpoint consistency, and
// last the parallel axes this build cannot run yet -- so `plan` reports a structural mistake before "not
// supported yet". Every message names the keys, their values and the constraint, Megatron-style, plus a hint.
#include <fmt/format.h>

#include <limits>

#include "comm/nccl/comm_choice.h"
#include "engine/backends/backend.h"
#include "engine/config/config.h"
#include "engine/config/config_schema.h"
#include "engine/core/check.h"
#include "engine/parallel/schedule.h"
#include "engine/parallel/topology.h"
#include "engine/train/reliability.h"
#include "engine/train/run_layout.h"
#include "engine/train/trace.h"

namespace ms {
namespace {

using config_detail::config_error;

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
    config_error("", fmt::format(f, std::forward<Args>(args)...));
}

// Parameters of the GPT-2 architecture: token + position embeddings, per layer ln1 (2C), qkv (3C*C + 3C),
// attention projection (C*C + C), ln2 (2C), fc (F*C + F), fc projection (C*F + C), the final LayerNorm (2C), and
// an untied output layer's Vp*C. T = double gives an estimate that cannot overflow, checked before the exact int64.
template <typename T>
T count_parameters(T padded_vocab, T max_positions, T L, T C, T F, bool untied) {
    T per_layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (F * C + F) + (C * F + C);
    return (untied ? 2 : 1) * padded_vocab * C + max_positions * C + L * per_layer + 2 * C;
}

// Llama: the token embedding (and an untied output layer), per layer two RMSNorms (2C), q, k, v (C*C + 2*KVC*C with
// KVC = the key/value heads' width), o_proj (C*C), gate, up and down (3*F*C), and the final RMSNorm (C).
template <typename T>
T count_llama_parameters(T padded_vocab, T L, T C, T F, T KVC, bool untied) {
    return (untied ? 2 : 1) * padded_vocab * C + L * (2 * C + 2 * C * C + 2 * KVC * C + 3 * F * C) + C;
}

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
// eval.sample_tokens: at most this many context windows (see validate_config).
constexpr int64_t kSampleWindows = 16;

}  // namespace

DerivedConfig validate_config(const Config& cfg, int world_size) {
    const ModelConfig& m = cfg.model;
    const ParallelConfig& p = cfg.parallel;
    const TrainingConfig& t = cfg.training;
    config_detail::check_fields(cfg, nullptr);

    // ---- what this build can run ----
    // parallel.comm_engine: the progress thread drives MPI (comm/comm_engine.h); checked before what the binary has,
    // since no binary runs it on a GPU.
    if (p.comm_engine && (cfg.run.backend != "cpu" || cfg.run.comm == "nccl")) {
        fail(
            "parallel.comm_engine runs MPI from a progress thread, for run.backend: cpu with run.comm: mpi or auto "
            "(got backend {}, comm {}); on GPUs NCCL already runs on its own streams; hint: set comm_engine: false",
            cfg.run.backend, cfg.run.comm);
    }
    // A binary has the CUDA backend when it registered one (backend.h; apps/main.cpp does when built with CUDA).
    if (parse_backend_kind(cfg.run.backend) == BackendKind::kCUDA && cuda_backend_name() == nullptr) {
        fail(
            "run.backend = 'cuda' but this binary was built without the CUDA backend (CMake found no CUDA "
            "toolkit, or was given -DMS_ENABLE_CUDA=OFF); hint: rebuild with the CUDA toolkit installed and "
            "-DMS_ENABLE_CUDA=ON, or set run.backend: cpu");
    }
    // run.comm: nccl needs run.backend: cuda and a binary that registered NCCL (comm/nccl/comm_choice.h); auto
    // resolves at start-up (make_process_groups): nccl on cuda when the binary has it and every rank has a GPU of
    // its own, else mpi.
    if (const std::string e =
            comm_config_error(parse_comm_kind(cfg.run.comm), cfg.run.backend, nccl_registration() != nullptr);
        !e.empty()) {
        fail("{}", e);
    }
    // debug.cuda_*: only the CUDA backend reads them, so on another one a changed value would be silently ignored.
    if (parse_backend_kind(cfg.run.backend) != BackendKind::kCUDA) {
        const DebugConfig d = cfg.debug, def;
        const char* key = d.cuda_tf32 != def.cuda_tf32                     ? "debug.cuda_tf32"
                          : d.cuda_gelu_epilogue != def.cuda_gelu_epilogue ? "debug.cuda_gelu_epilogue"
                          : d.cuda_attention != def.cuda_attention         ? "debug.cuda_attention"
                          : d.cuda_attention_bwd != def.cuda_attention_bwd ? "debug.cuda_attention_bwd"
                                                                           : nullptr;
        if (key != nullptr) {
            fail(
                "{} is set but run.backend = '{}': only the CUDA backend reads it; hint: remove {}, or set "
                "run.backend: cuda",
                key, cfg.run.backend, key);
        }
    }
    // parallel.auto_profile: only the layout search reads it (resolve_auto_layout), so without parallel.auto it would
    // be silently ignored.
    if (!p.auto_layout && !p.auto_profile.empty()) {
        fail(
            "parallel.auto_profile = '{}' is set but parallel.auto is false: only the layout search reads it; hint: "
            "set parallel.auto: true to train with the layout it ranks first, or remove auto_profile",
            p.auto_profile);
    }
    if (cfg.mixed_precision.loss_scale > 0 && model_dtype(cfg.mixed_precision) != DType::kF16) {
        fail(
            "mixed_precision.loss_scale = {} is set but mixed_precision.dtype = '{}': loss scaling is for fp16 only "
            "(bf16 has fp32's exponent range); hint: remove loss_scale, or set mixed_precision.dtype: fp16",
            cfg.mixed_precision.loss_scale, cfg.mixed_precision.dtype);
    }
    if (!cfg.mixed_precision.grad_reduce_in_fp32 && model_dtype(cfg.mixed_precision) == DType::kF32) {
        fail(
            "mixed_precision.grad_reduce_in_fp32 = false asks for 16-bit gradients, but mixed_precision.dtype = "
            "'fp32': gradients take the model's dtype, so there is nothing narrower to keep; hint: set "
            "mixed_precision.dtype: bf16 (or fp16), or remove grad_reduce_in_fp32");
    }
    if (cfg.mixed_precision.min_loss_scale > cfg.mixed_precision.initial_loss_scale) {
        fail(
            "mixed_precision.min_loss_scale = {} exceeds mixed_precision.initial_loss_scale = {}; hint: lower "
            "min_loss_scale (Megatron's default is 1) or raise initial_loss_scale",
            cfg.mixed_precision.min_loss_scale, cfg.mixed_precision.initial_loss_scale);
    }
    const bool llama = m.arch == "llama";
    if (!llama && (m.num_query_groups != 0 || m.rope_scaling_factor != 0.0 || m.rotary_base != 10000.0)) {
        fail(
            "model.num_query_groups({}), rotary_base({}) and rope_scaling_factor({}) are Llama's (grouped-query "
            "attention, rotary positions), but model.arch is '{}'; hint: remove them, or set model.arch: llama",
            m.num_query_groups, m.rotary_base, m.rope_scaling_factor, m.arch);
    }
    if (llama && m.rope_scaling_factor != 0.0 && m.rope_scaling_factor != 1.0 &&
        !(m.rope_high_freq_factor > m.rope_low_freq_factor)) {
        fail(
            "model.rope_high_freq_factor({}) must exceed model.rope_low_freq_factor({}) when "
            "rope_scaling_factor({}) turns Llama 3's RoPE scaling on; hint: Llama 3.1 uses 4 and 1",
            m.rope_high_freq_factor, m.rope_low_freq_factor, m.rope_scaling_factor);
    }
    if (m.hidden_dropout != 0.0f || m.attention_dropout != 0.0f) {
        fail(
            "model.hidden_dropout = {} and model.attention_dropout = {}: dropout is not supported on this backend "
            "yet (both must be 0)",
            m.hidden_dropout, m.attention_dropout);
    }
    if (t.recompute_granularity == "full" && t.recompute_method == "uniform" && t.recompute_num_layers != 1) {
        fail(
            "training.recompute_num_layers = {} with recompute_method 'uniform': groups of layers recomputed together "
            "are not supported yet; use 1 (every layer recomputed on its own) or recompute_method 'block' (the first "
            "recompute_num_layers layers of each model chunk)",
            t.recompute_num_layers);
    }

    // ---- model shape ----
    if (m.vocab_size <= 0) {
        fail(
            "model.vocab_size is 0: set it, or let the data source fill it in before validation "
            "(the trainer does this for data.source = '{}')",
            cfg.data.source);
    }
    if (m.hidden_size % m.num_attention_heads != 0) {
        fail(
            "model.hidden_size({}) is not divisible by model.num_attention_heads({}); hint: the head size is "
            "hidden_size / num_attention_heads, e.g. 768 / 12 = 64",
            m.hidden_size, m.num_attention_heads);
    }
    const int kv_heads = m.num_query_groups > 0 ? m.num_query_groups : m.num_attention_heads;
    if (llama && m.num_attention_heads % kv_heads != 0) {
        fail(
            "model.num_query_groups({}) does not divide model.num_attention_heads({}); hint: grouped-query attention "
            "gives each key/value head num_attention_heads / num_query_groups query heads, so pick a divisor of {}",
            m.num_query_groups, m.num_attention_heads, m.num_attention_heads);
    }
    if (llama && (m.hidden_size / m.num_attention_heads) % 2 != 0) {
        fail(
            "model.hidden_size({}) / num_attention_heads({}) = {} is an odd head size, which rotary position "
            "embeddings cannot rotate (they pair column i with i + head_size / 2); hint: an even head size",
            m.hidden_size, m.num_attention_heads, m.hidden_size / m.num_attention_heads);
    }
    int max_positions = m.max_position_embeddings > 0 ? m.max_position_embeddings : m.seq_length;
    if (m.seq_length > max_positions) {
        fail(
            "model.seq_length({}) is larger than model.max_position_embeddings({}); hint: raise "
            "max_position_embeddings or set it to 0 (= seq_length)",
            m.seq_length, max_positions);
    }

    // ---- parallel layout ----
    // The split of the world into tp x dp x pp: make_topology is its one check (engine/parallel/topology.h).
    // Products of two keys are int64: each key may be as large as INT_MAX.
    const int tp = p.tensor_model_parallel_size, pp = p.pipeline_model_parallel_size;
    const int cp = p.context_parallel_size;
    const Topology topology = make_topology(world_size, tp, pp, cp);
    const int dp = topology.dp, replicas = topology.replicas();
    if (p.data_parallel_size != 0 && p.data_parallel_size != replicas) {
        fail(
            "parallel.data_parallel_size({}) does not match world size {} / (tensor_model_parallel_size({}) * "
            "pipeline_model_parallel_size({}) * context_parallel_size({})) = {}; hint: remove data_parallel_size "
            "(it is derived) or set it to {}",
            p.data_parallel_size, world_size, tp, pp, cp, replicas, replicas);
    }
    if (cp > 1) {
        if (!llama) {
            fail(
                "parallel.context_parallel_size({}) splits each sequence over ranks, which is built for model.arch: "
                "llama (rotary positions, computed for each rank's tokens); model.arch '{}' learns a position table "
                "that is not split; hint: set context_parallel_size: 1, or model.arch: llama",
                cp, m.arch);
        }
        if (m.seq_length % (2 * int64_t{cp}) != 0) {
            fail(
                "parallel.context_parallel_size({}) cuts each sequence into 2 * cp = {} chunks (rank r holds chunks r "
                "and {} - r, which balances causal attention), and model.seq_length({}) is not divisible by {}; hint: "
                "a seq_length that is a multiple of {}, or another context_parallel_size",
                cp, 2 * cp, 2 * cp - 1, m.seq_length, 2 * cp, 2 * cp);
        }
    }
    if (cfg.run.ranks_per_node > 0 && world_size % cfg.run.ranks_per_node != 0) {
        fail(
            "run.ranks_per_node({}) does not divide the world size {}: nodes of {} consecutive ranks would leave {} "
            "rank(s) without a whole node; hint: a divisor of {}, or 0 to take the nodes from the hosts the ranks "
            "run on",
            cfg.run.ranks_per_node, world_size, cfg.run.ranks_per_node, world_size % cfg.run.ranks_per_node,
            world_size);
    }
    if (m.num_attention_heads % tp != 0) {
        fail(
            "model.num_attention_heads({}) is not divisible by parallel.tensor_model_parallel_size({}); hint: "
            "each tensor-parallel rank holds num_attention_heads / tp whole heads",
            m.num_attention_heads, tp);
    }
    if (m.ffn_hidden_size == 0 && 4 * int64_t{m.hidden_size} > kIntMax) {
        fail(
            "model.ffn_hidden_size = 4 * hidden_size({}) = {} is more than a 32-bit size holds; hint: set "
            "model.ffn_hidden_size, or use a smaller hidden_size",
            m.hidden_size, 4 * int64_t{m.hidden_size});
    }
    if (llama && kv_heads % tp != 0) {
        fail(
            "model.num_query_groups({}) is not divisible by parallel.tensor_model_parallel_size({}); hint: each "
            "tensor-parallel rank holds num_query_groups / tp whole key/value heads (and their query heads)",
            kv_heads, tp);
    }
    const int ffn_hidden = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * m.hidden_size;
    if (ffn_hidden % tp != 0) {
        fail(
            "model.ffn_hidden_size({}{}) is not divisible by parallel.tensor_model_parallel_size({}); hint: each "
            "tensor-parallel rank holds ffn_hidden_size / tp columns of the MLP",
            ffn_hidden, m.ffn_hidden_size > 0 ? "" : " = 4 * hidden_size", tp);
    }
    const int vpp = p.virtual_pipeline_model_parallel_size;
    if (m.num_layers % (int64_t{pp} * vpp) != 0) {
        fail(
            "model.num_layers({}) is not divisible by parallel.pipeline_model_parallel_size({}) * "
            "virtual_pipeline_model_parallel_size({}) = {}; hint: every model chunk needs the same number of "
            "layers",
            m.num_layers, pp, vpp, int64_t{pp} * vpp);
    }
    const ScheduleKind schedule = parse_schedule_kind(p.pipeline_schedule);
    if ((vpp > 1) != (schedule == ScheduleKind::kInterleaved1F1B)) {
        fail(
            "parallel.pipeline_schedule = '{}' with parallel.virtual_pipeline_model_parallel_size({}): the "
            "interleaved_1f1b schedule needs virtual_pipeline_model_parallel_size > 1 and the other schedules "
            "need it to be 1",
            p.pipeline_schedule, vpp);
    }
    // As Megatron: interleaving needs stages to interleave; one stage's chunks would hand their activations to each
    // other with no message between them, which the pipeline does not do.
    if (schedule == ScheduleKind::kInterleaved1F1B && pp == 1) {
        fail(
            "parallel.pipeline_schedule = 'interleaved_1f1b' needs parallel.pipeline_model_parallel_size > 1 (got 1): "
            "it interleaves model chunks between stages; hint: use pipeline_model_parallel_size >= 2, or 1f1b with "
            "virtual_pipeline_model_parallel_size 1");
    }

    // ---- batch ----
    const int64_t micro_times_dp = int64_t{t.micro_batch_size} * replicas;
    if (t.global_batch_size == 0 && micro_times_dp > kIntMax) {
        fail(
            "training.global_batch_size = micro_batch_size({}) * data-parallel size({}) = {} is more than a 32-bit "
            "batch size holds; hint: use a smaller micro_batch_size",
            t.micro_batch_size, replicas, micro_times_dp);
    }
    const int global_batch = t.global_batch_size > 0 ? t.global_batch_size : static_cast<int>(micro_times_dp);
    if (global_batch % micro_times_dp != 0) {
        // the multiples either side of it (only the one above when it is below the first)
        const int64_t lower = global_batch / micro_times_dp * micro_times_dp, upper = lower + micro_times_dp;
        fail(
            "training.global_batch_size({}) is not divisible by training.micro_batch_size({}) * data-parallel "
            "size({}) = {}; hint: use a multiple of {}, e.g. {}",
            global_batch, t.micro_batch_size, replicas, micro_times_dp, micro_times_dp,
            lower > 0 ? fmt::format("{} or {}", lower, upper) : fmt::format("{}", upper));
    }
    const int num_microbatches = static_cast<int>(global_batch / micro_times_dp);
    // The schedule's own conditions (engine/parallel/schedule.h): the interleaved one needs a multiple of pp.
    check_schedule(schedule, pp, num_microbatches, vpp);

    // ---- schedule, data, checkpoints, eval ----
    const LrScheduleConfig& s = cfg.lr_schedule;
    if (s.lr_warmup_iters > t.train_iters) {
        fail(
            "lr_schedule.lr_warmup_iters({}) is larger than training.train_iters({}); hint: for a short run lower "
            "the warm-up too, e.g. --set lr_schedule.lr_warmup_iters={}",
            s.lr_warmup_iters, t.train_iters, t.train_iters / 10);
    }
    if (s.lr_decay_iters > 0 && s.lr_warmup_iters > s.lr_decay_iters) {
        fail("lr_schedule.lr_warmup_iters({}) is larger than lr_schedule.lr_decay_iters({})", s.lr_warmup_iters,
             s.lr_decay_iters);
    }
    if (cfg.optimizer.min_lr > cfg.optimizer.lr) {
        fail("optimizer.min_lr({}) is larger than optimizer.lr({}); hint: min_lr is the floor the schedule decays to",
             cfg.optimizer.min_lr, cfg.optimizer.lr);
    }
    if (cfg.data.source != "synthetic" && cfg.data.data_path.empty()) {
        fail("data.source = '{}' needs data.data_path (a {})", cfg.data.source,
             cfg.data.source == "megatron" ? "prefix of <prefix>.bin/.idx" : "token file or a list of them");
    }
    if (cfg.data.source == "synthetic" && cfg.data.synthetic.branching > cfg.data.synthetic.vocab_size) {
        fail("data.synthetic.branching({}) is larger than data.synthetic.vocab_size({})", cfg.data.synthetic.branching,
             cfg.data.synthetic.vocab_size);
    }
    if (cfg.checkpoint.save_interval > 0 && cfg.checkpoint.save.empty()) {
        fail("checkpoint.save_interval = {} but checkpoint.save is empty; hint: set checkpoint.save to a directory",
             cfg.checkpoint.save_interval);
    }
    if (cfg.eval.eval_interval > 0 && cfg.eval.eval_iters < 1) {
        fail("eval.eval_interval = {} needs eval.eval_iters >= 1, got {}", cfg.eval.eval_interval, cfg.eval.eval_iters);
    }
    // The end-of-run sample is text to read in the log, and every token costs a forward pass over the context window.
    // Megatron refuses more tokens than one window holds; this sampler slides its window, as nanoGPT's does, so a
    // sample may run a few windows long, but not a count that never finishes.
    if (cfg.eval.sample_tokens > kSampleWindows * int64_t{max_positions}) {
        fail(
            "eval.sample_tokens({}) is more than {} context windows of model.max_position_embeddings({}) tokens = {}; "
            "the end-of-run sample is text for the log, and each token costs a forward pass over the window; hint: "
            "at most {}, or 0 to skip sampling",
            cfg.eval.sample_tokens, kSampleWindows, max_positions, kSampleWindows * int64_t{max_positions},
            kSampleWindows * int64_t{max_positions});
    }
    if (const std::optional<TraceSteps> traced = parse_trace_steps(cfg.logging.trace_steps);
        !cfg.logging.trace_dir.empty() && traced && traced->first > t.train_iters) {
        fail(
            "logging.trace_steps('{}') starts after training.train_iters({}): nothing would be traced; hint: e.g. "
            "--set logging.trace_steps={}:{}",
            cfg.logging.trace_steps, t.train_iters, std::min<int64_t>(2, t.train_iters), t.train_iters);
    }
    // The fault-injection spec that applies (MS_INJECT overrides reliability.inject): its syntax, a rank this world
    // has and a step the run reaches.
    resolve_fault_injection(cfg.reliability, world_size, t.train_iters);

    if (cfg.optimizer.onebit_adam()) {
        const OptimizerConfig& o = cfg.optimizer;
        if (dp == 1) {
            fail(
                "optimizer.type onebit_adam compresses the data-parallel average of the momentum, and this layout has "
                "one data-parallel rank (world {} = tp {} x pp {}): there is nothing to compress; hint: use "
                "optimizer.type: adamw, or run on more ranks",
                world_size, tp, pp);
        }
        if (o.freeze_step < 1 || o.freeze_step >= t.train_iters) {
            fail(
                "optimizer.freeze_step({}) must be at least 1 and less than training.train_iters({}): onebit_adam runs "
                "AdamW for freeze_step steps to learn the variance it then freezes, and compresses only after them; "
                "hint: e.g. --set optimizer.freeze_step={} (DeepSpeed's tutorials freeze after 15-25% of the run)",
                o.freeze_step, t.train_iters, std::max<int64_t>(1, t.train_iters / 5));
        }
        if (!cfg.mixed_precision.grad_reduce_in_fp32) {
            fail(
                "optimizer.type onebit_adam folds each rank's own gradients into an fp32 momentum before compressing "
                "it, and mixed_precision.grad_reduce_in_fp32 = false keeps them in {}: it is not built for 16-bit "
                "gradients; hint: remove grad_reduce_in_fp32 (fp32 gradients), or use optimizer.type: adamw",
                cfg.mixed_precision.dtype);
        }
        if (p.overlap_grad_reduce) {
            fail(
                "optimizer.type onebit_adam averages the momentum, not the gradients, after its warm-up, so "
                "parallel.overlap_grad_reduce's gradient buckets have nothing to reduce; hint: set "
                "overlap_grad_reduce: false");
        }
    }

    if (p.zero_stage == 2 && dp == 1) {
        fail(
            "parallel.zero_stage 2 shards the gradients over the data-parallel ranks, and this layout has one (world "
            "{} "
            "= tp {} x pp {}): there is nothing to shard; hint: set zero_stage: 0, or run on more ranks",
            world_size, tp, pp);
    }
    if (p.zero_stage == 2 && cfg.optimizer.onebit_adam()) {
        fail(
            "optimizer.type onebit_adam keeps every rank's whole momentum and compresses it, and parallel.zero_stage 2 "
            "keeps only a shard of each gradient: they do not compose; hint: use zero_stage: 1 with onebit_adam (its "
            "state and masters are sharded), or optimizer.type: adamw");
    }

    // ---- parallel axes this build does not run yet ----
    if (p.overlap_param_gather && !(p.zero_stage == 2 || (p.zero_stage == 1 && p.overlap_grad_reduce))) {
        fail(
            "parallel.overlap_param_gather needs parallel.zero_stage 1 with parallel.overlap_grad_reduce, or "
            "zero_stage 2 (got zero_stage {}, overlap_grad_reduce {}): it overlaps the distributed optimizer's "
            "all-gather of the updated parameters, in the gradient buckets, with the next forward; hint: set "
            "zero_stage: 1 and overlap_grad_reduce: true, or overlap_param_gather: false",
            p.zero_stage, p.overlap_grad_reduce);
    }
    if (p.sequence_parallel && (static_cast<int64_t>(t.micro_batch_size) * (m.seq_length / cp)) % tp != 0) {
        fail(
            "parallel.sequence_parallel splits the micro_batch_size({}) * seq_length({}){} = {} rows of a micro-batch "
            "over tensor_model_parallel_size({}), which does not divide them; hint: pick a micro batch size or "
            "sequence length that makes the product a multiple of {}",
            t.micro_batch_size, m.seq_length, cp > 1 ? fmt::format(" / context_parallel_size({})", cp) : "",
            static_cast<int64_t>(t.micro_batch_size) * (m.seq_length / cp), tp, tp);
    }

    const int64_t multiple = int64_t{m.make_vocab_size_divisible_by} * tp;
    const int64_t padded_vocab = padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, tp);
    if (padded_vocab > kIntMax) {
        fail(
            "model.vocab_size({}) padded to a multiple of model.make_vocab_size_divisible_by({}) * "
            "parallel.tensor_model_parallel_size({}) = {} is {}, more than a 32-bit token id holds; hint: use a "
            "smaller make_vocab_size_divisible_by",
            m.vocab_size, m.make_vocab_size_divisible_by, tp, multiple, padded_vocab);
    }
    const auto parameters = [&]<typename T>(T) {
        if (llama)
            return count_llama_parameters<T>(padded_vocab, m.num_layers, m.hidden_size, ffn_hidden,
                                             T(m.hidden_size) / m.num_attention_heads * kv_heads,
                                             m.untie_embeddings_and_output_weights);
        return count_parameters<T>(padded_vocab, max_positions, m.num_layers, m.hidden_size, ffn_hidden,
                                   m.untie_embeddings_and_output_weights);
    };
    const double approx_parameters = parameters(0.0);
    if (approx_parameters > 0x1p62) {
        fail(
            "model.num_layers({}), hidden_size({}), ffn_hidden_size({}) and the padded vocabulary {} make {:.3g} "
            "parameters, more than 64-bit element counts hold; hint: a smaller model",
            m.num_layers, m.hidden_size, ffn_hidden, padded_vocab, approx_parameters);
    }
    DerivedConfig d;
    d.world_size = world_size;
    d.dp = dp;
    d.cp = cp;
    d.padded_vocab = static_cast<int>(padded_vocab);
    d.ffn_hidden = ffn_hidden;
    d.num_microbatches = num_microbatches;
    d.tokens_per_step = static_cast<int64_t>(global_batch) * m.seq_length;
    d.num_parameters = parameters(int64_t{0});
    return d;
}

}  // namespace ms
