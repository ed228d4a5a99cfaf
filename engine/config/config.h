// config.h: the resolved run configuration, one struct per YAML section (docs/design.md §7).
//
// Key names are Megatron's flags in snake_case (docs/formats.md). Defaults live here,
// next to each field. load_config() fills it from YAML + `--set section.key=value` overrides, strictly:
// an unknown key, a wrong type or an impossible value throws ms::UserError (exit code 2) naming the key,
// the value, the constraint and a hint. validate_config() checks the combinations and computes the derived
// values. Also accepted: aliases parallel.use_distributed_optimizer (-> zero_stage 1) and mixed_precision.bf16 /
// fp16 (-> dtype); `null` or `auto` for the keys whose 0 means "derived"; `$${` for a literal `${`.
// The key table, per-value constraints and emission order live in config_schema.cpp.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/dtype.h"

namespace ms {

struct RunConfig {
    std::string name = "run";
    std::string output_dir = "runs/${run.name}";  // metrics.jsonl, resolved config, ...
    uint64_t seed = 1234;
    std::string backend = "cpu";  // cpu | cuda
    std::string comm = "auto";    // auto | mpi | nccl (auto: nccl on cuda when this binary has NCCL, else mpi)
    int num_threads = 0;          // CPU backend threads; 0: OMP_NUM_THREADS, else the node's cores over its ranks
    double memory_limit_gb = 0;   // GiB per rank train checks its plan against; 0 = physical memory / ranks on node
    int ranks_per_node = 0;       // 0 = the ranks sharing a host form a node; N = nodes of N consecutive ranks
};

struct ModelConfig {
    // gpt: GPT-2 (LayerNorm, learned positions, GELU-tanh, biases, tied head); llama: RMSNorm (layernorm_epsilon),
    // rotary positions, grouped-query attention, SwiGLU (gate and up each ffn_hidden_size wide), no biases, untied
    // output layer
    std::string arch = "gpt";  // gpt | llama | clip (the clip: section) | alphazero (the selfplay: section)
    int num_layers = 12;
    int hidden_size = 768;
    int num_attention_heads = 12;
    int ffn_hidden_size = 0;  // 0 -> 4 * hidden_size
    int seq_length = 1024;
    int max_position_embeddings = 0;  // 0 -> seq_length
    int vocab_size = 0;               // 0 -> from the data source (synthetic / byte tokenizer / GPT-2 BPE)
    int make_vocab_size_divisible_by = 128;
    // true: the output layer is a weight of its own (lm_head.weight; Llama 3 8B and up, Megatron's
    // --untie-embeddings-and-output-weights); false: it is the token embedding (GPT-2, Llama 3.2 1B and 3B)
    bool untie_embeddings_and_output_weights = false;
    // llama: key/value heads of grouped-query attention (Megatron's num_query_groups); 0 = num_attention_heads
    int num_query_groups = 0;
    double rotary_base = 10000.0;  // llama: RoPE's theta (Llama 3: 500000)
    // llama: Llama 3.1's RoPE frequency scaling (transformers' rope_type "llama3"); factor 0 = off
    double rope_scaling_factor = 0.0;
    double rope_low_freq_factor = 1.0;
    double rope_high_freq_factor = 4.0;
    double rope_original_max_position_embeddings = 8192.0;
    float layernorm_epsilon = 1e-5f;
    float init_method_std = 0.02f;
    float hidden_dropout = 0.0f;     // only 0 is supported on this backend
    float attention_dropout = 0.0f;  // only 0 is supported on this backend
    // The LM head's matmul and its cross-entropy (forward and backward) as one op over chunks of rows, so the
    // (tokens, padded vocabulary) logits are never held (tensor parallelism of one; others run the ops as written).
    bool cross_entropy_loss_fusion = true;
};

struct ParallelConfig {
    int tensor_model_parallel_size = 1;
    int pipeline_model_parallel_size = 1;
    int data_parallel_size = 0;  // 0 = auto (world / (tp * pp * cp)); if given it must match
    // Megatron's context parallelism: each sequence split over this many ranks (engine/parallel/context_split.h),
    // attention as a ring passing key/value blocks (engine/graph/ring_attention.h)
    int context_parallel_size = 1;
    int zero_stage = 0;
    // Megatron's DDP options: the data-parallel gradient reduction in buckets of bucket_size elements (0: Megatron's
    // max(40M, 1M x dp)), each started as soon as the last micro-batch's backward has finished its gradients.
    bool overlap_grad_reduce = false;
    int64_t bucket_size = 0;
    // auto | on | off: the dp all-reduce inside each node, then across nodes on 1/(ranks per node) of the data, then
    // inside the node again (comm/hierarchical_communicator.h); auto where dp spans nodes with more than one of its
    // ranks on each, on: that or an error
    std::string hierarchical_dp = "auto";
    // zero_stage 1 with overlap_grad_reduce: the all-gather of the updated parameters in the same buckets, each
    // waited only when the next step's forward first reads one of its parameters.
    bool overlap_param_gather = false;
    // The communication engine (comm/comm_engine.h): a progress thread that issues the tp/pp/dp/mp/embd operations
    // in priority order, the data-parallel ones cut into pieces of at most comm_chunk_bytes.
    bool comm_engine = false;
    int64_t comm_chunk_bytes = int64_t{4} << 20;
    bool sequence_parallel = false;
    std::string pipeline_schedule = "1f1b";  // gpipe | 1f1b | interleaved_1f1b
    int virtual_pipeline_model_parallel_size = 1;
    // parallel.auto (`auto` is a C++ keyword): the layout -- tp, sp, cp, pp, vpp, dp, the micro-batch, recomputation,
    // ZeRO stage and overlap -- is the layout search's first choice (engine/sim/search.h) for the launch's ranks,
    // made by resolve_auto_layout (engine/train/run_layout.h) before the run's layout is built; those keys set beside
    // it (in the file or by --set) are kept as set and the search chooses the rest (docs/planner.md "parallel.auto").
    bool auto_layout = false;
    // The search's cost model: a profile file `mindspeed-train calibrate` wrote, or a built-in estimate (a100-80g,
    // h100, h200); empty: on run.backend: cuda the estimate of the GPU the run finds, on the CPU a config error.
    std::string auto_profile;
};

struct TrainingConfig {
    int micro_batch_size = 4;
    int global_batch_size = 0;  // 0 -> micro_batch_size * dp
    int64_t train_iters = 100;
    float clip_grad = 1.0f;  // 0 disables clipping
    // Activation recomputation (engine/graph/recompute_options.h): none | full | selective; uniform | block.
    std::string recompute_granularity = "none";
    std::string recompute_method = "uniform";
    int recompute_num_layers = 1;  // uniform: layers per group (1); block: the first layers of each model chunk
};

// Megatron's precision flags. bf16 / fp16: 16-bit model weights and activations, fp32 master weights and optimizer
// state, fp32 gradients unless grad_reduce_in_fp32 is false. fp16 scales the loss (dynamic unless loss_scale > 0) and
// skips steps whose gradients overflow.
struct MixedPrecisionConfig {
    std::string dtype = "fp32";                // fp32 | bf16 | fp16
    bool grad_reduce_in_fp32 = true;           // false (bf16 / fp16): gradients accumulated and reduced in dtype
    double loss_scale = 0;                     // fp16: a fixed loss scale; 0 (or null) = dynamic loss scaling
    double initial_loss_scale = 4294967296.0;  // fp16 dynamic: the first scale (2^32)
    double min_loss_scale = 1.0;               // fp16 dynamic: the scale never drops below this
    int loss_scale_window = 1000;              // fp16 dynamic: steps without overflow before the scale doubles
    int hysteresis = 2;                        // fp16 dynamic: overflowing steps tolerated before the scale halves
};

// The model's activation and weight dtype for mixed_precision.dtype (fp32, bf16 or fp16).
inline DType model_dtype(const MixedPrecisionConfig& mp) {
    return mp.dtype == "bf16" ? DType::kBF16 : mp.dtype == "fp16" ? DType::kF16 : DType::kF32;
}
// The dtype parameter gradients are accumulated and reduced in: fp32, or the model's with grad_reduce_in_fp32 false.
inline DType grad_dtype(const MixedPrecisionConfig& mp) {
    return mp.grad_reduce_in_fp32 ? DType::kF32 : model_dtype(mp);
}

struct OptimizerConfig {
    std::string type = "adamw";  // adamw | onebit_adam
    float lr = 3e-4f;
    float min_lr = 0.0f;
    float weight_decay = 0.1f;
    float adam_beta1 = 0.9f;
    float adam_beta2 = 0.95f;
    float adam_eps = 1e-8f;
    // onebit_adam (engine/optim/distributed_optimizer.h): AdamW for the first freeze_step steps (DeepSpeed's key),
    // then the variance frozen and the momentum averaged over dp compressed to 1 bit per element, with one scale per
    // piece of at most onebit_chunk_size elements of a parameter.
    int64_t freeze_step = 0;
    int64_t onebit_chunk_size = 2048;
    bool onebit_adam() const { return type == "onebit_adam"; }
    auto operator<=>(const OptimizerConfig&) const = default;
};

struct LrScheduleConfig {
    std::string lr_decay_style = "cosine";  // constant | linear | cosine
    int64_t lr_warmup_iters = 0;
    int64_t lr_decay_iters = 0;  // 0 -> train_iters
};

struct SyntheticConfig {
    int vocab_size = 32;  // symbols of the Markov chain (tokens 0..vocab_size-1)
    int branching = 4;    // successors per state
    uint64_t seed = 7;    // the language itself (independent of run.seed)
    int64_t num_tokens = 1 << 20;
};

struct DataConfig {
    std::string source = "synthetic";    // synthetic | megatron | llmc | nanogpt; model.arch clip: shapes | webdataset
    std::vector<std::string> data_path;  // prefix (megatron) or file(s) (llmc, nanogpt)
    std::string split = "969,30,1";      // train,valid,test weights
    SyntheticConfig synthetic;
};

struct CheckpointConfig {
    std::string save;           // directory of iter_XXXXXXX/ checkpoints (engine/ckpt/checkpoint.h); "" = none
    std::string load;           // auto-resume from here when it holds a committed checkpoint (often = save)
    int64_t save_interval = 0;  // save every N iterations (and always at the end of training when save is set)
    int keep_latest_k = 2;      // committed checkpoints kept after each save; 0 keeps all; 1 is refused (no fallback)
    std::string verify_on_load = "full";  // quick: sizes | full: sizes and XXH64 of every file before resuming
};

struct LoggingConfig {
    int64_t log_interval = 10;
    std::string metrics_file = "${run.output_dir}/metrics.jsonl";
    double peak_flops = 0;        // FLOP/s used for MFU; 0 -> measured by an sgemm probe at start
    std::string tensorboard_dir;  // TensorBoard event files (engine/train/tensorboard.h); empty: none
    std::string trace_dir;        // a Chrome/Perfetto timeline per rank, merged (engine/train/trace.h); empty: none
    // the iterations trace_dir records: "N" or "FIRST:LAST", inclusive
    std::string trace_steps = "2:3";
};

struct EvalConfig {
    int64_t eval_interval = 0;  // validation loss every N iterations; 0 disables
    int64_t eval_iters = 10;    // validation micro-batches (of global_batch_size samples) per evaluation
    int sample_tokens = 0;      // tokens generated at the end of training; 0 disables
    float sample_temperature = 1.0f;
    int sample_top_k = 0;  // 0 = no top-k truncation
    std::string sample_prompt;
};

// How a run ends when something goes wrong (engine/train/reliability.h; README "Exit codes").
struct ReliabilityConfig {
    std::string nan_policy = "fail";    // NaN/Inf in a loss or gradient: fail (exit 17) | skip (no optimizer step)
    double collective_timeout_s = 600;  // a wait on a collective longer than this ends the run with 18; 0 = never
    std::string inject;  // fault injection for tests: "<crash|hang|nan|sigterm>@step=S[,rank=R]"; MS_INJECT wins
};

// The link model (comm/link_model.h, docs/communication.md): every communication takes the time it would over
// NVLink-like links inside a node and InfiniBand-like links between nodes (run.ranks_per_node), scaled for the CPU.
// It only delays operations, so results are unchanged. Off for real runs.
struct LinkModelConfig {
    bool enabled = false;
    double intra_node_latency_us = 10;         // per message or ring step
    double intra_node_bandwidth_gbps = 1;      // GB/s (1e9 bytes)
    double inter_node_latency_us = 100;        // 10x the intra-node latency
    double inter_node_bandwidth_gbps = 0.125;  // 1/8 of the intra-node bandwidth
    bool contention = false;  // a rank's link of each class carries one transfer at a time (LinkOccupancy)
};

// Diagnosis choices that change numerics: config keys, so they are part of the config hash (docs/style.md
// "Switches"). They were the environment variables MS_CUDA_TF32, MS_CUDA_GELU_EPILOGUE, MS_CUDA_ATTENTION and
// MS_CUDA_ATTENTION_BWD, which a run now refuses (engine/core/switches.h). Only the CUDA backend reads them
// (BackendOptions::cuda, engine/backends/backend.h); the defaults are the production path.
struct DebugConfig {
    bool cuda_tf32 = false;          // fp32 GEMMs on TF32 tensor cores (PyTorch's allow_tf32); false: true fp32
    bool cuda_gelu_epilogue = true;  // the MLP's GELU / dGELU in cuBLASLt's epilogues; false: gelu.cu's kernels
    std::string cuda_attention = "tensor_cores";  // tensor_cores | scalar: the kernels of bf16 / fp16 attention
    std::string cuda_attention_bwd = "fused";     // fused | split: the tensor-core backward (one kernel or two)
};

// model.arch: clip (engine/clip/clip_model.h): an image tower (a ViT) and a causal text tower trained contrastively.
// `preset` gives every shape key left at 0: tiny (the demo: 32-pixel images, two 64-wide layers per tower), vit-b16
// (CLIP's ViT-B/16 with its 12-layer, 512-wide text transformer), vit-h14 (open_clip's ViT-H-14: 32 layers 1280 wide,
// text 24 layers 1024 wide). Captions are byte-level (256 bytes and an end-of-text token).
struct ClipConfig {
    std::string preset = "tiny";  // tiny | vit-b16 | vit-h14 | none (every shape key set)
    int embed_dim = 0;            // the shared embedding both projections map to
    int image_size = 0;           // pixels per side, after the resize and centre crop
    int patch_size = 0;
    int vision_layers = 0, vision_width = 0, vision_heads = 0, vision_mlp = 0;  // vision_mlp 0: 4 * width
    int context_length = 0;                                                     // caption tokens, end-of-text included
    int text_layers = 0, text_width = 0, text_heads = 0, text_mlp = 0;          // text_mlp 0: 4 * width
    float init_logit_scale = 2.6592600f;                                        // log(1 / 0.07), CLIP's
    float max_logit_scale = 100.0f;  // the scale exp(logit_scale) is clamped to
    // zero-shot classification: each class name put into every template ("{}" is replaced), the class's text
    // feature the normalised mean of the templates' (CLIP's prompt ensembling)
    std::vector<std::string> templates = {"a {}"};
    std::vector<std::string> eval_data_path;  // webdataset: the held-out shards zero-shot and recall are measured on
    int64_t eval_samples = 512;               // held-out samples per evaluation (all of them when fewer)
    bool skip_bad_samples = false;            // webdataset: count and skip a bad sample instead of stopping
    // Cross-modal layers (0: none): text rows attending to their image's rows, ending in an image-text matching
    // head trained on hard negatives from the contrastive similarities; its loss is added times itm_weight
    int cross_modal_layers = 0;
    float itm_weight = 1.0f;
};

// model.arch: alphazero (engine/selfplay/, `mindspeed-train selfplay`): a policy/value network over a board's cells
// (the model: section's layers, hidden size, heads and ffn), trained on its own games of tree search. Each iteration
// plays games_per_iteration games, adds their positions to the replay buffer and takes train_steps optimizer steps on
// training.global_batch_size positions drawn from it; training.train_iters counts iterations.
struct SelfPlayConfig {
    std::string game = "connect4";
    // The stages, "<rows>x<cols>:<simulations per move>", boards growing: the run starts on the first and moves on
    // when it scores promote_score against promote_against there
    std::vector<std::string> curriculum = {"6x7:64"};
    std::string max_board;  // the largest board the network embeds, "<rows>x<cols>" (empty: the curriculum's last)
    // The network's input also marks each cell where a stone can be dropped now and where a stone of either side
    // would complete four (engine/model/policy_value.h)
    bool threat_features = false;
    int64_t games_per_iteration = 64;  // over all data-parallel ranks
    int games_per_group = 32;          // games one batched search advances together: what one forward serves
    int leaves_per_wave = 4;           // leaves one game's tree sends per wave, spread by virtual loss
    float virtual_loss = 1.0f;
    bool reuse_tree = true;  // a move's search starts from the subtree the game's previous search built under it
    // How self-play's searches choose at the root: puct (AlphaZero: Dirichlet noise, moves and policy targets from
    // the visit counts) | gumbel (Gumbel AlphaZero: sequential halving, the search's move, completed-Q policy
    // targets; the noise and temperature keys are not used). Evaluation matches always search with PUCT.
    std::string search = "puct";
    float c_puct = 1.5f;
    float dirichlet_alpha = 1.0f;  // the root noise's concentration (search: puct)
    float noise_fraction = 0.25f;  // of the root's priors replaced by the noise (search: puct)
    int temperature_moves = 8;     // (search: puct) moves chosen in proportion to the visits; the rest the most visited
    // Playout-cap randomisation (KataGo): each self-play move searches fully (the stage's simulations, with noise;
    // its position kept for training) with probability full_search_fraction, else fast_simulations without noise
    // (not kept). 1: every move searches fully
    float full_search_fraction = 1.0f;
    int fast_simulations = 0;
    float value_from_search = 0.0f;   // w: a position's value target is (1 - w) * outcome + w * its search's value
    int64_t replay_capacity = 50000;  // positions kept (the newest)
    int train_steps = 20;             // optimizer steps per iteration
    int eval_interval = 5;            // iterations between evaluations (0: at the end only)
    int eval_games = 100;             // games per opponent, half with each colour
    int eval_simulations = 64;        // the agent's search in evaluation games (no noise, the most visited move)
    int final_eval_games = 0;         // the last iteration's evaluation (0: eval_games)
    int final_eval_simulations = 0;   // and its search (0: eval_simulations)
    int eval_opening_moves = 2;       // random first plies of each pair of evaluation games, one game per colour
    std::vector<std::string> eval_opponents = {"random", "alphabeta:4"};  // random | alphabeta:<depth>
    std::string promote_against = "random";  // the opponent whose score advances the curriculum
    float promote_score = 0.95f;             // wins plus half the draws, over the evaluation's games against it
};

struct Config {
    int schema_version = 1;
    RunConfig run;
    ModelConfig model;
    ParallelConfig parallel;
    TrainingConfig training;
    MixedPrecisionConfig mixed_precision;
    OptimizerConfig optimizer;
    LrScheduleConfig lr_schedule;
    DataConfig data;
    CheckpointConfig checkpoint;
    LoggingConfig logging;
    EvalConfig eval;
    ReliabilityConfig reliability;
    LinkModelConfig link_model;
    DebugConfig debug;
    ClipConfig clip;
    SelfPlayConfig selfplay;
    // The keys the file and --set gave a value (an alias counts as its target), sorted; load_config fills it. Not a
    // key: neither config_to_yaml nor the hash sees it. parallel.auto keeps the layout keys among them.
    std::vector<std::string> explicit_keys;
};

// Values computed from a Config and the world size; printed at start.
struct DerivedConfig {
    int world_size = 1;
    int dp = 1;  // every rank holding the same model shard: the data-parallel replicas x cp (topology.h)
    int cp = 1;  // parallel.context_parallel_size
    int replicas() const { return dp / cp; }  // the data-parallel ranks that read different samples
    int padded_vocab = 0;                     // ceil(V / (make_vocab_size_divisible_by * tp)) * that
    int ffn_hidden = 0;
    int num_microbatches = 1;  // global_batch / (micro_batch * replicas)
    int64_t tokens_per_step = 0;
    int64_t num_parameters = 0;  // with the padded vocabulary
};

// Load YAML from `path` (may be empty: defaults only), apply `overrides` ("section.key=value" each),
// resolve ${ENV}, ${ENV:-default} and ${section.key} references. Throws UserError on any problem.
Config load_config(const std::string& path, const std::vector<std::string>& overrides);
// The same for YAML text in memory; `name` stands for the file in messages ("name:line:col").
Config load_config_text(const std::string& yaml, const std::string& name, const std::vector<std::string>& overrides);

// Check every value and combination; fill `vocab_size` before calling if it comes from the data.
// world_size is the number of ranks. Throws UserError with a sentence and a hint.
DerivedConfig validate_config(const Config& cfg, int world_size);

// The resolved config as YAML (for --print-config and the run directory).
std::string config_to_yaml(const Config& cfg);
// The config hash every rank checks against rank 0's and the run records: name_hash (philox.h) of config_to_yaml(),
// so every key, the debug: section included, is part of it.
uint64_t config_hash(const Config& cfg);

}  // namespace ms
