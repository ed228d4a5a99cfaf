// config_schema.cpp: the key table (paths, types, per-value constraints), value formatting and did-you-mean.
#include "engine/config/config_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <type_traits>

#include "engine/core/check.h"
#include "engine/train/trace.h"

namespace ms::config_detail {
namespace {

Constraint at_least(double lo) { return Constraint{.min = lo}; }
Constraint positive() { return Constraint{.min = 0, .min_open = true}; }
Constraint unit_interval_open() { return Constraint{.min = 0, .max = 1, .max_open = true}; }
Constraint one_of(std::vector<std::string_view> choices) { return Constraint{.choices = std::move(choices)}; }

const char* non_empty(const FieldPtr& ptr) {
    return std::get<std::string*>(ptr)->empty() ? "must not be empty" : nullptr;
}

// checkpoint.keep_latest_k: 0 keeps every checkpoint; otherwise at least 2 (atomic_dir.h keep_latest).
const char* keep_latest_k_value(const FieldPtr& ptr) {
    const int k = *std::get<int*>(ptr);
    return k == 0 || k >= 2 ? nullptr : "must be 0 (keep all) or >= 2";
}

// Megatron's --split: up to three non-negative weights "train,valid,test" with a positive sum.
const char* split_weights(const FieldPtr& ptr) {
    static constexpr const char* kPhrase = "must be 1 to 3 comma-separated non-negative weights with a positive sum";
    const std::string& s = *std::get<std::string*>(ptr);
    double sum = 0;
    int parts = 0;
    size_t begin = 0;
    while (true) {
        size_t end = s.find(',', begin);
        std::string part = s.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
        double w = 0;
        auto [p, ec] = std::from_chars(part.data(), part.data() + part.size(), w);
        if (part.empty() || ec != std::errc() || p != part.data() + part.size() || !(w >= 0) || !std::isfinite(w)) {
            return kPhrase;
        }
        sum += w;
        ++parts;
        if (end == std::string::npos) break;
        begin = end + 1;
    }
    return (parts <= 3 && sum > 0) ? nullptr : kPhrase;
}

// logging.trace_steps: "N" or "FIRST:LAST" (engine/train/trace.h).
const char* trace_steps_value(const FieldPtr& ptr) {
    return parse_trace_steps(*std::get<std::string*>(ptr)) ? nullptr : kTraceStepsPhrase;
}

std::string constraint_phrase(const Constraint& c) {
    if (c.phrase) return c.phrase;
    if (!c.choices.empty()) return fmt::format("must be one of: {}", fmt::join(c.choices, ", "));
    bool has_min = c.min > -1e300, has_max = c.max < 1e300;
    if (has_min && has_max) {
        return fmt::format("must be in {}{}, {}{}", c.min_open ? "(" : "[", c.min, c.max, c.max_open ? ")" : "]");
    }
    if (has_min) return fmt::format("must be {} {}", c.min_open ? ">" : ">=", c.min);
    if (has_max) return fmt::format("must be {} {}", c.max_open ? "<" : "<=", c.max);
    return "is invalid";
}

// nullptr when the value satisfies c, else the phrase describing the constraint.
std::string violation(const Field& f) {
    const Constraint& c = f.constraint;
    if (c.custom) {
        const char* p = c.custom(f.ptr);
        if (p) return p;
    }
    return std::visit(
        [&](auto* p) -> std::string {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<T, std::string>) {
                if (!c.choices.empty() && std::find(c.choices.begin(), c.choices.end(), *p) == c.choices.end()) {
                    return constraint_phrase(c);
                }
            } else if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
                double v = static_cast<double>(*p);
                if (std::is_floating_point_v<T> && !std::isfinite(v)) return "must be a finite number";
                bool low = c.min_open ? v <= c.min : v < c.min;
                bool high = c.max_open ? v >= c.max : v > c.max;
                if (low || high) return constraint_phrase(c);
            }
            return "";
        },
        f.ptr);
}

}  // namespace

std::vector<Field> config_fields(Config& c) {
    // clang-format off
    return {
        {"schema_version", &c.schema_version,
         Constraint{.min = 1, .max = 1, .phrase = "is not supported by this build (only schema_version 1)"}},

        {"run.name", &c.run.name, Constraint{.custom = non_empty}},
        {"run.output_dir", &c.run.output_dir, Constraint{.custom = non_empty}},
        {"run.seed", &c.run.seed, {}},
        {"run.backend", &c.run.backend, one_of({"cpu", "cuda"})},
        {"run.comm", &c.run.comm,
         Constraint{.choices = {"auto", "mpi", "nccl"},
                    .hint = "auto picks nccl on run.backend: cuda when this binary has NCCL, else mpi"}},
        {"run.num_threads", &c.run.num_threads, Constraint{.min = 0, .hint = "0 uses the OpenMP default"}},
        {"run.memory_limit_gb", &c.run.memory_limit_gb,
         Constraint{.min = 0, .hint = "0 means physical memory / ranks on the node"}},
        {"run.ranks_per_node", &c.run.ranks_per_node,
         Constraint{.min = 0, .hint = "0 takes the nodes from the hosts the ranks run on; N > 0 simulates nodes of N "
                                      "consecutive ranks"}},

        {"model.arch", &c.model.arch, one_of({"gpt", "llama", "clip", "alphazero"})},
        {"model.num_layers", &c.model.num_layers, at_least(1)},
        {"model.hidden_size", &c.model.hidden_size, at_least(1)},
        {"model.num_attention_heads", &c.model.num_attention_heads, at_least(1)},
        {"model.ffn_hidden_size", &c.model.ffn_hidden_size,
         Constraint{.min = 0, .hint = "0 or null means 4 * hidden_size"}, true},
        {"model.seq_length", &c.model.seq_length, at_least(1)},
        {"model.max_position_embeddings", &c.model.max_position_embeddings,
         Constraint{.min = 0, .hint = "0 or null means seq_length"}, true},
        {"model.vocab_size", &c.model.vocab_size,
         Constraint{.min = 0, .hint = "0 or null takes it from the data source"}, true},
        {"model.make_vocab_size_divisible_by", &c.model.make_vocab_size_divisible_by, at_least(1)},
        {"model.untie_embeddings_and_output_weights", &c.model.untie_embeddings_and_output_weights, {}},
        {"model.num_query_groups", &c.model.num_query_groups,
         Constraint{.min = 0, .hint = "0 or null means num_attention_heads (multi-head attention)"}, true},
        {"model.rotary_base", &c.model.rotary_base, Constraint{.min = 1, .min_open = true}},
        {"model.rope_scaling_factor", &c.model.rope_scaling_factor,
         Constraint{.min = 0, .hint = "0 (or 1) turns Llama 3's RoPE scaling off; Llama 3.1 uses 8"}},
        {"model.rope_low_freq_factor", &c.model.rope_low_freq_factor, positive()},
        {"model.rope_high_freq_factor", &c.model.rope_high_freq_factor, positive()},
        {"model.rope_original_max_position_embeddings", &c.model.rope_original_max_position_embeddings, positive()},
        {"model.layernorm_epsilon", &c.model.layernorm_epsilon, positive()},
        {"model.init_method_std", &c.model.init_method_std, positive()},
        {"model.hidden_dropout", &c.model.hidden_dropout, unit_interval_open()},
        {"model.attention_dropout", &c.model.attention_dropout, unit_interval_open()},
        {"model.cross_entropy_loss_fusion", &c.model.cross_entropy_loss_fusion, {}},

        {"parallel.tensor_model_parallel_size", &c.parallel.tensor_model_parallel_size, at_least(1)},
        {"parallel.pipeline_model_parallel_size", &c.parallel.pipeline_model_parallel_size, at_least(1)},
        {"parallel.data_parallel_size", &c.parallel.data_parallel_size,
         Constraint{.min = 0, .hint = "0, null or auto derives it as world_size / (tp * pp * cp)"}, true},
        {"parallel.context_parallel_size", &c.parallel.context_parallel_size, at_least(1)},
        {"parallel.zero_stage", &c.parallel.zero_stage,
         Constraint{.min = 0, .max = 2, .phrase = "is not supported (0, 1 or 2)",
                    .hint = "ZeRO-1 (= use_distributed_optimizer: true) shards the optimizer state, ZeRO-2 the "
                            "gradients too; stage 3 is not implemented"}},
        {"parallel.overlap_grad_reduce", &c.parallel.overlap_grad_reduce, {}},
        {"parallel.bucket_size", &c.parallel.bucket_size,
         Constraint{.min = 0, .hint = "0 or null means Megatron's max(40M, 1M x data-parallel size) elements"}, true},
        {"parallel.overlap_param_gather", &c.parallel.overlap_param_gather, {}},
        {"parallel.hierarchical_dp", &c.parallel.hierarchical_dp,
         Constraint{.choices = {"auto", "on", "off"},
                    .hint = "auto reduces dp gradients inside each node first where dp spans several nodes with more "
                            "than one of its ranks on each (nodes: run.ranks_per_node)"}},
        {"parallel.comm_engine", &c.parallel.comm_engine,
         Constraint{.hint = "true issues tp/pp/dp communication from a progress thread in priority order, "
                            "data-parallel traffic in pieces behind the critical path (docs/communication.md)"}},
        {"parallel.comm_chunk_bytes", &c.parallel.comm_chunk_bytes,
         Constraint{.min = 1024, .hint = "bytes per piece of a background (data-parallel) operation under "
                                         "parallel.comm_engine; a critical operation waits at most for one piece"}},
        {"parallel.sequence_parallel", &c.parallel.sequence_parallel, {}},
        {"parallel.pipeline_schedule", &c.parallel.pipeline_schedule, one_of({"gpipe", "1f1b", "interleaved_1f1b"})},
        {"parallel.virtual_pipeline_model_parallel_size", &c.parallel.virtual_pipeline_model_parallel_size,
         at_least(1)},
        {"parallel.auto", &c.parallel.auto_layout,
         Constraint{.hint = "true trains with the layout `mindspeed-train plan --search` ranks first for the "
                            "launch's ranks (docs/planner.md \"parallel.auto\"); the layout keys set beside it are "
                            "kept"}},
        {"parallel.auto_profile", &c.parallel.auto_profile,
         Constraint{.hint = "a profile file `mindspeed-train calibrate --output FILE` wrote, or a built-in estimate "
                            "(a100-80g, h100, h200); empty: the estimate of the run's GPU (run.backend: cuda)"}},

        {"training.micro_batch_size", &c.training.micro_batch_size, at_least(1)},
        {"training.global_batch_size", &c.training.global_batch_size,
         Constraint{.min = 0, .hint = "0 or null means micro_batch_size * data-parallel size"}, true},
        {"training.train_iters", &c.training.train_iters, at_least(1)},
        {"training.clip_grad", &c.training.clip_grad, Constraint{.min = 0, .hint = "0 disables clipping"}},
        {"training.recompute_granularity", &c.training.recompute_granularity,
         one_of({"none", "full", "selective"})},
        {"training.recompute_method", &c.training.recompute_method, one_of({"uniform", "block"})},
        {"training.recompute_num_layers", &c.training.recompute_num_layers, at_least(1)},

        {"mixed_precision.dtype", &c.mixed_precision.dtype, one_of({"fp32", "bf16", "fp16"})},
        {"mixed_precision.grad_reduce_in_fp32", &c.mixed_precision.grad_reduce_in_fp32, {}},
        {"mixed_precision.loss_scale", &c.mixed_precision.loss_scale,
         Constraint{.min = 0, .hint = "0 or null means dynamic loss scaling (fp16 only)"}, true},
        {"mixed_precision.initial_loss_scale", &c.mixed_precision.initial_loss_scale, positive()},
        {"mixed_precision.min_loss_scale", &c.mixed_precision.min_loss_scale, positive()},
        {"mixed_precision.loss_scale_window", &c.mixed_precision.loss_scale_window, at_least(1)},
        {"mixed_precision.hysteresis", &c.mixed_precision.hysteresis, at_least(1)},

        {"optimizer.type", &c.optimizer.type,
         Constraint{.choices = {"adamw", "onebit_adam"}, .hint = "Megatron's 'adam' is AdamW: write adamw"}},
        {"optimizer.freeze_step", &c.optimizer.freeze_step, at_least(0)},
        {"optimizer.onebit_chunk_size", &c.optimizer.onebit_chunk_size, at_least(32)},
        {"optimizer.lr", &c.optimizer.lr, at_least(0)},
        {"optimizer.min_lr", &c.optimizer.min_lr, at_least(0)},
        {"optimizer.weight_decay", &c.optimizer.weight_decay, at_least(0)},
        {"optimizer.adam_beta1", &c.optimizer.adam_beta1, unit_interval_open()},
        {"optimizer.adam_beta2", &c.optimizer.adam_beta2, unit_interval_open()},
        {"optimizer.adam_eps", &c.optimizer.adam_eps, positive()},

        {"lr_schedule.lr_decay_style", &c.lr_schedule.lr_decay_style, one_of({"constant", "linear", "cosine"})},
        {"lr_schedule.lr_warmup_iters", &c.lr_schedule.lr_warmup_iters, at_least(0)},
        {"lr_schedule.lr_decay_iters", &c.lr_schedule.lr_decay_iters,
         Constraint{.min = 0, .hint = "0 or null means train_iters"}, true},

        {"data.source", &c.data.source,
         Constraint{.choices = {"synthetic", "megatron", "llmc", "nanogpt", "shapes", "webdataset"},
                    .hint = "shapes and webdataset are image-text sources, for model.arch: clip"}},
        {"data.data_path", &c.data.data_path, {}},
        {"data.split", &c.data.split, Constraint{.custom = split_weights, .hint = "e.g. 969,30,1"}},
        {"data.synthetic.vocab_size", &c.data.synthetic.vocab_size, at_least(2)},
        {"data.synthetic.branching", &c.data.synthetic.branching, at_least(1)},
        {"data.synthetic.seed", &c.data.synthetic.seed, {}},
        {"data.synthetic.num_tokens", &c.data.synthetic.num_tokens, at_least(1)},

        {"checkpoint.save", &c.checkpoint.save, {}},
        {"checkpoint.load", &c.checkpoint.load, {}},
        {"checkpoint.save_interval", &c.checkpoint.save_interval, Constraint{.min = 0, .hint = "0 disables saving"}},
        {"checkpoint.keep_latest_k", &c.checkpoint.keep_latest_k,
         Constraint{.min = 0, .custom = keep_latest_k_value, .phrase = "must be 0 (keep all) or >= 2",
                    .hint = "with 1, a checkpoint corrupted on disk leaves nothing to fall back to (torchtitan "
                            "refuses it too)"}},
        {"checkpoint.verify_on_load", &c.checkpoint.verify_on_load,
         Constraint{.choices = {"quick", "full"},
                    .hint = "quick checks file sizes; full also checks every file's XXH64 (measured: +0.5 s for "
                            "GPT-2 124M's 1.4 GB from the page cache)"}},

        {"logging.log_interval", &c.logging.log_interval, at_least(1)},
        {"logging.metrics_file", &c.logging.metrics_file, {}},
        {"logging.peak_flops", &c.logging.peak_flops,
         Constraint{.min = 0, .hint = "0 measures it with an sgemm probe at start"}, true},
        {"logging.tensorboard_dir", &c.logging.tensorboard_dir, {}},
        {"logging.trace_dir", &c.logging.trace_dir, {}},
        {"logging.trace_steps", &c.logging.trace_steps,
         Constraint{.custom = trace_steps_value,
                    .phrase = kTraceStepsPhrase,
                    .hint = "e.g. 5:6 traces iterations 5 and 6 (Megatron's --profile-step-start/--profile-step-end)"}},

        {"eval.eval_interval", &c.eval.eval_interval, Constraint{.min = 0, .hint = "0 disables validation"}},
        {"eval.eval_iters", &c.eval.eval_iters, at_least(0)},
        {"eval.sample_tokens", &c.eval.sample_tokens, Constraint{.min = 0, .hint = "0 disables sampling"}},
        {"eval.sample_temperature", &c.eval.sample_temperature, positive()},
        {"eval.sample_top_k", &c.eval.sample_top_k, Constraint{.min = 0, .hint = "0 disables top-k"}},
        {"eval.sample_prompt", &c.eval.sample_prompt, {}},

        {"reliability.nan_policy", &c.reliability.nan_policy,
         Constraint{.choices = {"fail", "skip"},
                    .hint = "fail stops every rank with exit code 17; skip drops the optimizer step on every rank"}},
        {"reliability.collective_timeout_s", &c.reliability.collective_timeout_s,
         Constraint{.min = 0, .hint = "seconds a collective may wait before the run ends with exit code 18; 0 "
                                      "waits forever"}},
        {"reliability.inject", &c.reliability.inject, {}},

        {"link_model.enabled", &c.link_model.enabled,
         Constraint{.hint = "true delays every communication by its modelled time (docs/communication.md)"}},
        {"link_model.intra_node_latency_us", &c.link_model.intra_node_latency_us, at_least(0)},
        {"link_model.intra_node_bandwidth_gbps", &c.link_model.intra_node_bandwidth_gbps, positive()},
        {"link_model.inter_node_latency_us", &c.link_model.inter_node_latency_us, at_least(0)},
        {"link_model.inter_node_bandwidth_gbps", &c.link_model.inter_node_bandwidth_gbps, positive()},
        {"link_model.contention", &c.link_model.contention,
         Constraint{.hint = "true lets each rank's link of a class carry one transfer at a time, so a message "
                            "queued behind a large one waits for it (docs/communication.md)"}},

        {"debug.cuda_tf32", &c.debug.cuda_tf32,
         Constraint{.hint = "true runs run.backend: cuda's fp32 GEMMs on TF32 tensor cores (was MS_CUDA_TF32=1)"}},
        {"debug.cuda_gelu_epilogue", &c.debug.cuda_gelu_epilogue,
         Constraint{.hint = "false runs the MLP's GELU on gelu.cu's kernels instead of cuBLASLt's epilogues (was "
                            "MS_CUDA_GELU_EPILOGUE=0)"}},
        {"debug.cuda_attention", &c.debug.cuda_attention,
         Constraint{.choices = {"tensor_cores", "scalar"},
                    .hint = "scalar runs bf16 / fp16 attention on the scalar kernels, to tell a tensor-core kernel "
                            "fault from one elsewhere (was MS_CUDA_ATTENTION=scalar)"}},
        {"debug.cuda_attention_bwd", &c.debug.cuda_attention_bwd,
         Constraint{.choices = {"fused", "split"},
                    .hint = "split runs the tensor-core backward as two kernels, dQ then dK/dV (was "
                            "MS_CUDA_ATTENTION_BWD=split)"}},

        {"clip.preset", &c.clip.preset, one_of({"tiny", "vit-b16", "vit-h14", "none"})},
        {"clip.embed_dim", &c.clip.embed_dim, Constraint{.min = 0, .hint = "0 takes the preset's"}},
        {"clip.image_size", &c.clip.image_size, Constraint{.min = 0, .hint = "0 takes the preset's"}},
        {"clip.patch_size", &c.clip.patch_size, Constraint{.min = 0, .hint = "0 takes the preset's"}},
        {"clip.vision_layers", &c.clip.vision_layers, Constraint{.min = 0, .hint = "0 takes the preset's"}},
        {"clip.vision_width", &c.clip.vision_width, Constraint{.min = 0, .hint = "0 takes the preset's"}},
        {"clip.vision_heads", &c.clip.vision_heads, Constraint{.min = 0, .hint = "0 takes the preset's"}},
        {"clip.vision_mlp", &c.clip.vision_mlp, Constraint{.min = 0, .hint = "0 means 4 * vision_width"}},
        {"clip.context_length", &c.clip.context_length, Constraint{.min = 0, .hint = "0 takes the preset's"}},
        {"clip.text_layers", &c.clip.text_layers, Constraint{.min = 0, .hint = "0 takes the preset's"}},
        {"clip.text_width", &c.clip.text_width, Constraint{.min = 0, .hint = "0 takes the preset's"}},
        {"clip.text_heads", &c.clip.text_heads, Constraint{.min = 0, .hint = "0 takes the preset's"}},
        {"clip.text_mlp", &c.clip.text_mlp, Constraint{.min = 0, .hint = "0 means 4 * text_width"}},
        {"clip.init_logit_scale", &c.clip.init_logit_scale, {}},
        {"clip.max_logit_scale", &c.clip.max_logit_scale, positive()},
        {"clip.templates", &c.clip.templates, {}},
        {"clip.eval_data_path", &c.clip.eval_data_path, {}},
        {"clip.eval_samples", &c.clip.eval_samples, at_least(1)},
        {"clip.skip_bad_samples", &c.clip.skip_bad_samples, {}},
        {"clip.cross_modal_layers", &c.clip.cross_modal_layers,
         Constraint{.min = 0, .hint = "0 trains the towers contrastively alone"}},
        {"clip.itm_weight", &c.clip.itm_weight, Constraint{.min = 0, .hint = "the matching loss's weight in the total"}},

        {"selfplay.game", &c.selfplay.game, one_of({"connect4"})},
        {"selfplay.curriculum", &c.selfplay.curriculum, {}},
        {"selfplay.max_board", &c.selfplay.max_board, {}},
        {"selfplay.threat_features", &c.selfplay.threat_features, {}},
        {"selfplay.games_per_iteration", &c.selfplay.games_per_iteration, at_least(1)},
        {"selfplay.games_per_group", &c.selfplay.games_per_group, at_least(1)},
        {"selfplay.leaves_per_wave", &c.selfplay.leaves_per_wave, at_least(1)},
        {"selfplay.virtual_loss", &c.selfplay.virtual_loss, Constraint{.min = 0}},
        {"selfplay.reuse_tree", &c.selfplay.reuse_tree, {}},
        {"selfplay.search", &c.selfplay.search, one_of({"puct", "gumbel"})},
        {"selfplay.c_puct", &c.selfplay.c_puct, positive()},
        {"selfplay.dirichlet_alpha", &c.selfplay.dirichlet_alpha, positive()},
        {"selfplay.noise_fraction", &c.selfplay.noise_fraction, Constraint{.min = 0, .max = 1}},
        {"selfplay.temperature_moves", &c.selfplay.temperature_moves, Constraint{.min = 0}},
        {"selfplay.full_search_fraction", &c.selfplay.full_search_fraction,
         Constraint{.min = 0, .max = 1, .hint = "1 searches every move fully (no playout-cap randomisation)"}},
        {"selfplay.fast_simulations", &c.selfplay.fast_simulations,
         Constraint{.min = 0, .hint = "the fast searches' simulations, fewer than the stage's"}},
        {"selfplay.value_from_search", &c.selfplay.value_from_search,
         Constraint{.min = 0, .max = 1, .hint = "0 learns the game's outcome alone (AlphaZero)"}},
        {"selfplay.replay_capacity", &c.selfplay.replay_capacity, at_least(1)},
        {"selfplay.train_steps", &c.selfplay.train_steps, Constraint{.min = 0}},
        {"selfplay.eval_interval", &c.selfplay.eval_interval, Constraint{.min = 0, .hint = "0 evaluates at the end only"}},
        {"selfplay.eval_games", &c.selfplay.eval_games, at_least(2)},
        {"selfplay.eval_simulations", &c.selfplay.eval_simulations, at_least(1)},
        {"selfplay.final_eval_games", &c.selfplay.final_eval_games, Constraint{.min = 0, .hint = "0 means eval_games"}},
        {"selfplay.final_eval_simulations", &c.selfplay.final_eval_simulations,
         Constraint{.min = 0, .hint = "0 means eval_simulations"}},
        {"selfplay.eval_opening_moves", &c.selfplay.eval_opening_moves,
         Constraint{.min = 0, .max = 8, .hint = "0 starts every evaluation game from the empty board"}},
        {"selfplay.eval_opponents", &c.selfplay.eval_opponents, {}},
        {"selfplay.promote_against", &c.selfplay.promote_against, {}},
        {"selfplay.promote_score", &c.selfplay.promote_score, Constraint{.min = 0, .max = 1}},
    };
    // clang-format on
}

const std::vector<Alias>& config_aliases() {
    static const std::vector<Alias> kAliases = {
        {"parallel.use_distributed_optimizer", "parallel.zero_stage"},
        {"mixed_precision.bf16", "mixed_precision.dtype"},
        {"mixed_precision.fp16", "mixed_precision.dtype"},
    };
    return kAliases;
}

std::string type_name(const FieldPtr& ptr) {
    static constexpr const char* kNames[] = {"an integer",
                                             "an integer",
                                             "a non-negative integer",
                                             "a number",
                                             "a number",
                                             "a boolean (true or false)",
                                             "a string",
                                             "a string or a list of strings"};
    return kNames[ptr.index()];
}

std::string float_text(double v, bool single) {
    const std::string s = single ? fmt::format("{}", static_cast<float>(v)) : fmt::format("{}", v);
    if (s.find_first_of("na") != std::string::npos) return s;  // inf / nan: never valid, only shown in messages
    const size_t e = s.find('e');
    std::string mantissa = s.substr(0, e), exponent = e == std::string::npos ? "" : s.substr(e + 1);
    if (mantissa.find('.') == std::string::npos) mantissa += ".0";
    if (exponent.empty()) return mantissa;
    return mantissa + (exponent[0] == '-' || exponent[0] == '+' ? "e" : "e+") + exponent;
}

std::string value_text(const FieldPtr& ptr) {
    return std::visit(
        [](auto* p) -> std::string {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<T, std::string>) {
                return *p;
            } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
                return fmt::format("{}", fmt::join(*p, ","));
            } else if constexpr (std::is_same_v<T, bool>) {
                return *p ? "true" : "false";
            } else if constexpr (std::is_floating_point_v<T>) {
                return float_text(*p, std::is_same_v<T, float>);
            } else {
                return std::to_string(*p);
            }
        },
        ptr);
}

std::string value_for_message(const FieldPtr& ptr) {
    if (auto* s = std::get_if<std::string*>(&ptr)) return fmt::format("'{}'", **s);
    if (auto* l = std::get_if<std::vector<std::string>*>(&ptr)) return fmt::format("[{}]", fmt::join(**l, ", "));
    return value_text(ptr);
}

void check_fields(const Config& cfg, const std::map<std::string, std::string>* locs) {
    Config copy = cfg;
    for (const Field& f : config_fields(copy)) {
        std::string phrase = violation(f);
        if (phrase.empty()) continue;
        std::string loc;
        if (locs) {
            auto it = locs->find(std::string(f.path));
            if (it != locs->end()) loc = it->second;
        }
        std::string msg = fmt::format("{} = {} {}", f.path, value_for_message(f.ptr), phrase);
        if (f.constraint.hint) msg += fmt::format("; hint: {}", f.constraint.hint);
        config_error(loc, msg);
    }
}

void config_error(const std::string& loc, const std::string& msg) {
    if (loc.empty()) throw UserError("config error: " + msg);
    throw UserError(fmt::format("config error: {}: {}", loc, msg));
}

size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
            diag = up;
        }
    }
    return row[b.size()];
}

std::string closest_match(std::string_view key, const std::vector<std::string>& candidates) {
    // A typo is within about a third of the key's length; a truncated or partial key ("micro_batch",
    // "warmup") is a substring of the intended one.
    double best = 1e9;
    std::string best_name;
    for (const std::string& c : candidates) {
        double d = static_cast<double>(edit_distance(key, c));
        if (key.size() >= 4 && c.find(key) != std::string::npos) d = std::min(d, 0.5);
        if (d < best) {
            best = d;
            best_name = c;
        }
    }
    double limit = std::max<double>(2.0, static_cast<double>(key.size()) / 3.0);
    return best <= limit ? best_name : "";
}

}  // namespace ms::config_detail
