// plan.h: the layout and memory planner behind `mindspeed-train plan` and the trainer's memory check. Pure
// arithmetic over the config: no MPI, nothing large allocated, nothing built per layer (a billion layers cost what
// one does, so the check runs before the model exists). Every byte count is an allocation the trainer makes
// from its per-rank arena (engine/train/trainer.cpp), with the same function computing it where one exists:
//   parameters, gradients  the flat buffers of PipelineModel: padded_flat_size(flat, dp) fp32 elements each, flat
//                          being the stage's local chunks (gpt_param_table()'s sizes, affine in the layer count)
//                          laid out back to back, each 16-element aligned; with mixed_precision bf16 / fp16 also the
//                          16-bit weights, the same elements at 2 bytes; on one pipeline stage of a tied model the
//                          output layer's gradient kept apart (GptGraphOptions::tied_grads_apart, head_grad_bytes()),
//                          and with overlapped buckets on a pipeline's first stage the buffer the last stage's
//                          average of it arrives in (tied_head_received)
//   optimizer              exp_avg + exp_avg_sq, fp32: the whole padded buffer (zero_stage 0) or its 1/dp shard (1)
//   comm                   none: the pipeline sends from and receives into the activation slots, and zero_stage 1's
//                          reduce-scatter works in place
//   activations            per local chunk, plan_gpt_memory(), the op graph's plan: slot bytes times the chunk's
//                          slots (the peak of its micro-batches in flight in the stage's schedule) plus one scratch
//                          block
// Not in the arena, so not here: token buffers (B*T int32 each) and small per-call bookkeeping. The MPI
// communicator holds no buffers (mpi_communicator.h).
#pragma once

#include <compare>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/config/config.h"
#include "engine/model/gpt.h"
#include "engine/optim/distributed_optimizer.h"
#include "engine/parallel/schedule.h"
#include "engine/sim/profile.h"
#include "engine/train/run_layout.h"

namespace ms {

struct NodeLayout;

// Which parallel groups span nodes (the lines `plan` prints), and a "warning: " line when a tensor-parallel group
// does: its collectives run in every layer.
std::vector<std::string> placement_report(const Topology& t, const NodeLayout& nodes);

struct PlanOptions {
    int world_size = 1;
    int ranks_per_node = 0;     // the node column, placement and default budget; 0: run.ranks_per_node, else 8
    double memory_gib = 0;      // per-rank budget; 0 -> run.memory_limit_gb, or physical memory / ranks on a node
    bool graph = false;         // --graph: also each model chunk's op graph, its passes and bytes (plan_graph.h)
    std::string dot_path = {};  // --dot FILE: and their Graphviz drawing (implies --graph)
    // --simulate: one training step simulated (engine/sim/simulator.h) on a cost model: --profile FILE (made by
    // `mindspeed-train calibrate`) or --device NAME (engine/sim/profile.h's estimates); one of them is required
    bool simulate = false;
    std::string profile_path = {};
    std::string device = {};
    // --search: instead of the config's layout, every layout of world_size ranks (ranks_per_node GPUs a node) ranked
    // by simulated throughput on that cost model, within memory_gib (default: the device's memory, engine/sim/search.h)
    bool search = false;
    int top = 5;
};

// What one rank of a pipeline stage holds (every tp and dp rank of a stage holds the same amounts).
struct StagePlan {
    std::string layers;                       // e.g. "0-5", or "0-2,12-14" with virtual stages
    int64_t params = 0;                       // elements of the tp rank's shard, summed over the local chunks
    int64_t padded = 0;                       // flat buffer elements: padded_flat_size of the chunks' aligned layout
    int64_t param_bytes = 0, grad_bytes = 0;  // fp32 parameters (0 with sharded master weights), gradients (fp32 or
                                              // 16-bit: GptGraphOptions::grads; zero_stage 2: its bucket slots and
                                              // kept gradients, sharded_grads.h)
    int64_t grad_shard_bytes = 0;             // zero_stage 2: the dp shard of the averaged gradients
    int grad_slots = 0;                       // zero_stage 2: its bucket slots, and of grad_bytes the gradients kept
    int64_t grad_kept_bytes = 0;              //   whole (sharded_grads.h)
    int64_t weight_bytes = 0;                 // the 16-bit weights (mixed precision; 0 in fp32)
    OptimizerBlocks optimizer;                // masters (sharded), moments, onebit_adam's buffers
    int64_t optimizer_bytes() const { return optimizer.total(); }
    std::vector<int64_t> slot_bytes;     // (v) one activation slot of each local chunk
    std::vector<int> slots;              // (v) activation slots of each local chunk
    std::vector<int64_t> scratch_bytes;  // (v) each local chunk's scratch block
    // (v) each local chunk's tied output-layer gradient kept apart (head_grad_bytes(): one pipeline stage, where
    // GptGraphOptions::tied_grads_apart; the first stage's chunk, where tied_head_received), else 0
    std::vector<int64_t> head_grad_bytes;
    int64_t activation_bytes = 0;             // sum over chunks of slot_bytes * slots + scratch_bytes
    int64_t comm_bytes() const { return 0; }  // pipeline p2p uses the slots, zero_stage 1 reduce-scatters in place
    int64_t all_grad_bytes() const;           // grad_bytes, grad_shard_bytes and the head_grad_bytes
    int64_t total_bytes() const {
        return param_bytes + all_grad_bytes() + weight_bytes + optimizer_bytes() + comm_bytes() + activation_bytes;
    }
    // Weights, gradients, master weights and optimizer state: what zero_stage and sharded masters divide.
    int64_t model_state_bytes() const { return param_bytes + all_grad_bytes() + weight_bytes + optimizer_bytes(); }
    // The arena allocations a rank of this stage makes, in the trainer's order (PipelineModel: params, grads, the
    // gradient shard, 16-bit weights, per chunk its scratch, slots and kept-apart head gradient; DistributedOptimizer:
    // optimizer_blocks()); no empty ones.
    std::vector<size_t> allocations() const;
};

struct PlanShape {
    int tp = 1, pp = 1, dp = 1, virtual_stages = 1;
    ScheduleKind kind = ScheduleKind::k1F1B;
    int num_microbatches = 1, micro_batch = 1, zero_stage = 0;
    int64_t grad_bucket_elems = 0;  // zero_stage 2's buckets (RunLayout::grad_bucket_elems)
    bool sequence_parallel = false;
    DType dtype = DType::kF32;   // mixed_precision.dtype: activations and the weights the ops read
    OptimizerConfig optimizer;   // its type (onebit_adam's buffers) and 1-bit chunk size
    GptGraphOptions graph = {};  // the fused LM head, recomputation: which ops the chunks' graphs run
    // Everything plan_stages reads besides the model: equal shapes plan the same bytes (a cache key).
    auto operator<=>(const PlanShape&) const = default;
};

// One entry per pipeline stage. Requires shape.L divisible by pp * virtual_stages (validate_config checks it).
std::vector<StagePlan> plan_stages(const GptShape& shape, const PlanShape& p);
// The plan's view of a run's layout.
PlanShape plan_shape(const RunLayout& layout);

// The per-stage memory table, one string per line (header, rule, a row per stage).
std::vector<std::string> stage_table(const std::vector<StagePlan>& stages);
// zero_stage 2 on a stage whose bucket slots and kept gradients outweigh what the shard saves: a warning that its
// gradients take more memory than zero_stage 1's whole buffer would, and the bucket size that would make them take
// less; "" otherwise (and for the other stages). plan and train print it.
std::string sharded_grads_warning(const std::vector<StagePlan>& stages, const PlanShape& p);
// Index of the stage with the largest total.
size_t largest_stage(const std::vector<StagePlan>& stages);
// What a rank on a GPU leaves outside its arena: the CUDA context, cuBLASLt's workspace, the backend's scratch
// (attention's dQ accumulator is the largest: B * T * C fp32) and NCCL's buffers.
inline constexpr double kDeviceReserveBytes = 1.5 * (1 << 30);
// The per-rank memory budget in bytes: run.memory_limit_gb when set; else, when the arena lives on a device
// (device.total_bytes > 0, Backend::device_memory()), the device's memory divided among the ranks that share it
// (ceil(ranks_on_node / device.devices), as local rank % devices assigns them) less kDeviceReserveBytes -- CUDA
// managed memory would let a larger arena be allocated and then page between host and device for the whole run; else
// physical memory / ranks_on_node.
double memory_budget_bytes(const Config& cfg, int ranks_on_node, const DeviceMemory& device = {});
// Where memory_budget_bytes() comes from, for messages: "run.memory_limit_gb", "physical memory / 8 rank(s) on a
// node" or "GPU memory 80.0 GiB / 1 rank(s) per device, less 1.5 GiB for the CUDA context, cuBLAS and NCCL".
std::string memory_budget_source(const Config& cfg, int ranks_on_node, const DeviceMemory& device = {});

// The validation iterations of global_batch samples run for `requested` (eval.eval_iters, or `eval --iters`, named by
// `key`): at most those that cover the split's split_samples once, with a warning when that is fewer. Past one pass
// samples only repeat, each with the same loss, so the mean learns nothing more (torchtitan's validation also ends
// with its data), and a count like 2e9 would never finish.
int64_t bound_eval_iters(int64_t requested, const std::string& key, int64_t split_samples, int64_t global_batch);

// Validates cfg for options.world_size (throws UserError) and prints the derived values, the rank layout, the
// per-stage memory, the schedule's bubble and whether the largest rank fits. Returns the exit code.
int run_plan(const Config& cfg, const PlanOptions& options);

// The op shapes (sim::op_shape) that `plan --search --world-size N` and `plan --simulate` of cfg on N ranks price,
// for each N of world_sizes (nodes of ranks_per_node ranks, 0: as plan takes it; the search's memory budget as plan's
// with a device of device_memory_bytes, 0: host memory): what `calibrate --world-size` measures. `cost` prices the
// layouts meanwhile; which shapes they hold does not depend on it.
std::vector<sim::OpShape> planned_op_shapes(const Config& cfg, const std::vector<int>& world_sizes, int ranks_per_node,
                                            const sim::CostModel& cost, int64_t device_memory_bytes);

}  // namespace ms
