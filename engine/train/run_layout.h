// run_layout.h: RunLayout, the run's parallel layout and every number derived from the config, built once from the
// validated Config and the world size (docs/design.md §7: derived values are computed once, printed, and checked
// where given) and passed down -- to the process groups, the memory plan, the model and the step loop -- instead of
// each recomputing it from the config's strings and sizes (docs/style.md "One place per fact").
//
// What lives here and nowhere else:
//   parsed config strings   run.backend, run.comm, mixed_precision.dtype, parallel.pipeline_schedule,
//                           parallel.hierarchical_dp as enums
//   the rank layout         the Topology (tp, dp, pp and the groups comm/process_groups.cpp splits)
//   the step's batch        micro-batches per step and rank, global batch (samples per step), tokens per step
//   the model's sizes       padded vocabulary, ffn hidden, parameter count, the GptShape, layers per model chunk
// The checks behind them run once, in validate_config (engine/config/config_validate.cpp), which make_run_layout
// calls: a layout that is built is a valid one, and nothing downstream validates it again.
#pragma once

#include <cstdint>
#include <string_view>

#include "comm/hierarchical_communicator.h"
#include "comm/nccl/comm_choice.h"
#include "engine/backends/backend.h"
#include "engine/config/config.h"
#include "engine/model/gpt.h"
#include "engine/parallel/schedule.h"
#include "engine/parallel/topology.h"

namespace ms {

class TokenSource;

struct RunLayout {
    // ---- parsed config strings ----
    BackendKind backend = BackendKind::kCPU;      // run.backend
    CommKind comm = CommKind::kMpi;               // run.comm (kAuto resolves in make_process_groups)
    DType dtype = DType::kF32;                    // mixed_precision.dtype: activations and the weights ops read
    ScheduleKind schedule = ScheduleKind::k1F1B;  // parallel.pipeline_schedule

    // ---- ranks ----
    Topology topology;         // tp, dp (derived: world / (tp * pp), cp of them one sample's context group), pp
    int virtual_stages = 1;    // model chunks per rank (parallel.virtual_pipeline_model_parallel_size)
    int layers_per_chunk = 1;  // num_layers / (pp * virtual_stages)
    bool sequence_parallel = false;
    int zero_stage = 0;
    OptimizerConfig optimizer;  // the validated optimizer section (its type and 1-bit chunks size the memory plan)
    // parallel.overlap_grad_reduce or zero_stage 2, with dp > 1: elements per gradient bucket (parallel.bucket_size
    // or Megatron's default); 0: the gradients are reduced in one piece after the backward
    int64_t grad_bucket_elems = 0;
    // parallel.overlap_param_gather with dp > 1: the updated parameters gathered in those buckets, each waited by the
    // next forward's first read (zero_stage 1)
    bool param_gather_overlap = false;
    HierarchicalDp hierarchical_dp = HierarchicalDp::kAuto;  // parallel.hierarchical_dp (resolved in train_setup)

    // ---- batch ----
    int micro_batch = 1;       // training.micro_batch_size: samples per micro-batch
    int num_microbatches = 1;  // per step and data-parallel replica: global_batch / (micro_batch * dp())
    int64_t global_batch = 1;  // samples per step: training.global_batch_size, or micro_batch * dp() when 0

    // ---- model ----
    // The model every rank builds its part of: V = model.vocab_size, resolved (from the data when 0: resolve_vocab);
    // Vp = V padded to a multiple of make_vocab_size_divisible_by * tp (docs/design.md §5); F = model.ffn_hidden_size
    // or 4 * hidden_size when 0; S = model.seq_length.
    GptShape shape;
    // which ops each chunk's graph runs: model.cross_entropy_loss_fusion, training.recompute_* (and the backend)
    GptGraphOptions graph;
    int64_t num_parameters = 0;  // with the padded vocabulary, each element once

    int world_size() const { return topology.world(); }
    int tp() const { return topology.tp; }
    int dp() const { return topology.replicas(); }  // the data-parallel replicas (Megatron's data_parallel_size)
    int cp() const { return topology.cp; }
    int pp() const { return topology.pp; }
    int seq_length() const { return shape.S; }  // tokens per sample
    int64_t tokens_per_step() const { return global_batch * shape.S; }
};

// Validates cfg for world_size ranks (validate_config: throws ms::UserError with the sentence) and derives the
// layout. cfg.model.vocab_size must be resolved first (resolve_vocab) when it comes from the data.
RunLayout make_run_layout(const Config& cfg, int world_size);

// run.backend's value as an enum ("cpu" or "cuda", which the config schema allows); the one parse of it.
BackendKind parse_backend_kind(std::string_view name);

// The vocabulary: model.vocab_size when set (it must hold every token of the data: ms::UserError otherwise), else
// the data's. train, plan and eval resolve it here.
Config resolve_vocab(Config cfg, const TokenSource& source);

// parallel.auto (docs/planner.md "parallel.auto"): cfg with its layout keys (sim::layout_keys(): tp, sp, cp, pp,
// vpp, schedule, dp, ZeRO stage, overlap, micro-batch, recomputation) those of the layout search's first choice for
// world_size ranks in nodes of ranks_per_node, on the cost model parallel.auto_profile names (a profile file or a
// built-in estimate; empty on run.backend: cuda: the estimate of the GPU of local_rank, found by starting the
// backend), and auto_profile set to what was used; the keys set beside parallel.auto are kept. Logs the choice
// (the search's first line, the chosen layout as --set overrides). cfg unchanged when parallel.auto is false.
// Pure code over the config and the profile: every rank computes the same choice, and the config hash that every
// rank checks against rank 0's covers it. cfg.model.vocab_size must be resolved first. Throws UserError with a
// sentence when there is no profile, or no layout can run.
Config resolve_auto_layout(const Config& cfg, int world_size, int ranks_per_node, int local_rank);

// The two "derived:" lines train and plan print (world split, padded vocabulary, global batch, parameters).
void log_derived(const RunLayout& layout, const Config& cfg);

// The vocabulary padded to a multiple of make_vocab_size_divisible_by * tp (docs/design.md §5), in 64 bits: the one
// formula (validate_config checks the result fits an int).
int64_t padded_vocab_size(int64_t vocab, int divisible_by, int tp);

// The model shape of a validated config (make_run_layout's; also for tools that validate a one-rank config).
GptShape gpt_shape(const Config& cfg, const DerivedConfig& d);

}  // namespace ms
