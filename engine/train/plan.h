// plan.h: the layout and memory planner behind `mindspeed-train plan`. Pure arithmetic over the config: no MPI,
// nothing large allocated. Every byte count mirrors an allocation the trainer makes on one rank:
//   parameters, gradients  the flat buffers of PipelineModel: padded_flat_size(flat, dp) fp32 elements each, flat
//                          being the stage's local chunks laid out back to back, each 16-element aligned
//   optimizer              exp_avg + exp_avg_sq, fp32: the whole padded buffer (zero_stage 0) or its 1/dp shard (1)
//   activations            per local chunk, one Gpt activation slot (gpt_activation_slot_bytes) times the chunk's
//                          slots: the peak of its micro-batches in flight in the stage's schedule
// Left out as small: the zero_stage 1 reduce-scatter buffer (padded/dp fp32), token buffers, communication staging.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/model/gpt.h"
#include "engine/parallel/schedule.h"

namespace ms {

struct PlanOptions {
    int world_size = 1;
    int ranks_per_node = 8;  // for the node column and the default memory budget
    double memory_gib = 0;   // per-rank budget; 0 -> physical memory / ranks on a node
};

// Bytes of one activation slot of a Gpt holding `part` on one of tp_size ranks, for micro_batch sequences of
// shape.T tokens. Mirrors the `layout` lambda of Gpt's constructor (engine/model/gpt.cpp) buffer for buffer;
// sequence_parallel is Gpt::Options::sequence_parallel (two more (N, C) staging buffers).
int64_t gpt_activation_slot_bytes(const GptShape& shape, const GptPart& part, int tp_size, int micro_batch,
                                  bool sequence_parallel = false);

// What one rank of a pipeline stage holds (every tp and dp rank of a stage holds the same amounts).
struct StagePlan {
    std::string layers;  // e.g. "0-5", or "0-2,12-14" with virtual stages
    int64_t params = 0;  // elements of the tp rank's shard, summed over the local chunks
    int64_t padded = 0;  // flat buffer elements: padded_flat_size of the chunks' aligned layout
    int64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
    std::vector<int64_t> slot_bytes;  // (v) one activation slot of each local chunk
    std::vector<int> slots;           // (v) activation slots of each local chunk
    int64_t activation_bytes = 0;
    int64_t total_bytes() const { return param_bytes + grad_bytes + optimizer_bytes + activation_bytes; }
};

struct PlanShape {
    int tp = 1, pp = 1, dp = 1, virtual_stages = 1;
    ScheduleKind kind = ScheduleKind::k1F1B;
    int num_microbatches = 1, micro_batch = 1, zero_stage = 0;
    bool sequence_parallel = false;
};

// One entry per pipeline stage. Requires shape.L divisible by pp * virtual_stages (validate_config checks it).
std::vector<StagePlan> plan_stages(const GptShape& shape, const PlanShape& p);

// Validates cfg for options.world_size (throws UserError) and prints the derived values, the rank layout, the
// per-stage memory, the schedule's bubble and whether the largest rank fits. Returns the exit code.
int run_plan(const Config& cfg, const PlanOptions& options);

}  // namespace ms
