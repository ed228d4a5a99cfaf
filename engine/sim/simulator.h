// simulator.h: a discrete-event simulation of one training step (`mindspeed-train plan --simulate`,
// docs/planner.md "Simulator"). Pure code over the program lists the trainer runs: each model chunk's op graph as
// the trainer builds it (engine/model/gpt_graph.h), the pipeline schedule's action lists (the same generator,
// engine/parallel/schedule.h), the data-parallel gradient buckets (engine/optim/grad_buckets.h) and the link model
// (comm/link_model.h). No MPI, no threads, nothing large allocated.
//
// One representative rank per pipeline stage: tp rank 0, cp rank 0 of data-parallel replica 0. Every tp, cp and dp
// rank of a stage runs the same programs on the same sizes, so its clock is the same; the groups it belongs to
// (and so which links its collectives cross) are taken from that rank.
//
// Two layers:
//   step_inputs()     the layout and a CostModel to StepInputs: per stage and local chunk the forward and backward
//                     seconds of one micro-batch (the sum of its ops; tensor-parallel collectives and context
//                     parallelism's ring exchanges on the critical path, timed on the links), when each parameter's
//                     gradient is final in the backward and when each parameter is first read in the forward, the
//                     point-to-point message times, the data-parallel collectives as affine functions of bytes.
//   simulate_stages() the step over StepInputs, in this order on every stage:
//     1. zero the gradient buffer (CostModel::memory_seconds);
//     2. the schedule's actions: a forward or backward takes its chunk's time; a run of sends and receives is one
//        batch (schedule.h): the stage posts its sends and receives at the batch's start and leaves the batch when
//        every receive has arrived (max(its posting, the matching send's posting) + the message time) and every
//        send has had its message time (sends do not wait for the peer's receive: a lower bound);
//     3. the tied embedding's gradient all-reduce between the first and the last stage (pp > 1, tied output layer);
//     4. the data-parallel gradient reduction: without overlap_grad_reduce one collective of the whole buffer after
//        the backward (zero_stage 0 an all-reduce, 1 a reduce-scatter; hierarchical_dp: reduce-scatter in the node,
//        all-reduce across nodes on 1/L, all-gather in the node); with it the buckets, each issued when its last
//        gradient is final in the last micro-batch's backward (deferred ones -- the tied embedding, sequence
//        parallelism's LayerNorms -- after step 3), one at a time on the stage's dp link in the order they are
//        ready (the communication engine keeps one background piece in flight); exposed is what ends after the
//        backward;
//     5. the scalar all-reduces every step makes (the loss over pp and dp, the gradient norm over dp and mp): they
//        synchronise the stages;
//     6. the optimizer over the stage's parameters (its dp shard with zero_stage 1), then zero_stage 1's gather of
//        the updated parameters: whole after the update, or with overlap_param_gather in the buckets from the flat
//        buffer's start, each waited by the next step's first read of its parameters in the first forward (its
//        lateness, the largest over the buckets, is exposed).
//   The step ends when the last stage's optimizer (and exposed gather) does.
//     7. oversubscribed hosts (CostModel::oversubscription s > 1: the ranks on a node want s times its cores): the
//        step is at least s x (the mean over the stages of a rank's compute -- forwards, backwards, zeroing and the
//        optimizer, without their communication -- + the mean exposed communication). On a CPU host the cores run
//        every rank's compute and MPI's shared-memory copies, and Open MPI, oversubscribed, yields the core of a
//        rank that waits (mpi_yield_when_idle), so the cores are shared by the ranks that work, a pipeline's bubble
//        filled by the other stages' work. In step 2 the stages' forwards and backwards share pp / s cores: the k
//        stages computing at a moment each progress at min(1, (pp / s) / k) of their speed, so the schedule's
//        dependencies decide how much of the bubble the other stages can fill. The step is the longer of the bound
//        and steps 1-6.
// What is not modelled: background (dp) traffic delaying critical (tp, pp) traffic on a shared link (the
// communication engine cuts it into pieces so a critical operation waits for one piece at most), kernel launch
// gaps, the host's data loading, 1-bit Adam's compression (timed as AdamW) and the step-boundary checks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comm/nodes.h"
#include "engine/model/gpt_graph.h"
#include "engine/sim/cost_model.h"
#include "engine/train/run_layout.h"

namespace ms {
struct StagePlan;  // engine/train/plan.h
}  // namespace ms

namespace ms::sim {

// A stretch of a stage's flat parameter (or gradient) buffer and the seconds into a chunk's forward (when it is
// first read) or backward (when its gradient is final).
struct RangeAt {
    double at = 0;
    int64_t begin = 0, end = 0;
};

// The seconds of a collective of n bytes: fixed + n * per_byte (every ring and chain of comm/link_model.h is affine
// in its bytes).
struct Affine {
    double fixed = 0, per_byte = 0;
    double operator()(double bytes) const { return fixed + bytes * per_byte; }
};

// One local chunk, one micro-batch.
struct ChunkCost {
    double forward = 0, backward = 0;            // seconds, compute and critical communication
    double forward_comm = 0, backward_comm = 0;  // of which communication (tp collectives, the cp ring's exposed part)
    std::vector<RangeAt> params_read = {};       // first read, seconds into the forward
    std::vector<RangeAt> grads_final = {};       // final, seconds into the backward (of the last micro-batch)
};

struct StageInput {
    std::vector<ChunkCost> chunks;                      // (v) local chunks
    std::vector<std::pair<int64_t, int64_t>> params;    // the stage's parameters in the flat buffer, sorted
    std::vector<std::pair<int64_t, int64_t>> deferred;  // gradients final only after the pipeline (step 3)
    int64_t padded = 0;                                 // flat buffer elements (padded for the dp shards)
    double zero_seconds = 0, optimizer_seconds = 0;
    double embd_seconds = 0;   // the tied embedding's all-reduce (0: none)
    int64_t memory_bytes = 0;  // per rank, from the plan (engine/train/plan.h)
};

// The data-parallel group's collectives as the stage's representative rank runs them.
struct DpCosts {
    int size = 1;  // ranks of the dp group (context ranks included)
    int zero_stage = 0;
    double grad_bytes_per_elem = 4;
    double param_bytes_per_elem = 4;  // what zero_stage 1 gathers: fp32 parameters, or 16-bit sharded-master weights
    Affine reduce_whole;              // the whole buffer without buckets: all-reduce (0) or reduce-scatter (1)
    Affine reduce_bucket;             // one bucket: all-reduce (0); with zero_stage 1 one reduce per owner part
    Affine gather_whole;              // zero_stage 1: the all-gather of the updated parameters
    Affine gather_part;               // overlap_param_gather: one broadcast per owner part
    int64_t bucket_elems = 0;         // overlap_grad_reduce: elements per bucket; 0: one collective after the backward
    bool param_gather_overlap = false;
};

struct StepInputs {
    ScheduleKind schedule = ScheduleKind::k1F1B;
    int microbatches = 1, virtual_stages = 1;
    std::vector<StageInput> stages;                // (pp)
    std::vector<std::vector<double>> p2p_seconds;  // (pp, pp) one activation or gradient message between stages
    DpCosts dp;
    double scalar_seconds = 0;    // step 5: the scalar all-reduces, summed
    double oversubscription = 1;  // step 7: CostModel::oversubscription of the ranks on the fullest node
    // for the throughput numbers
    double tokens_per_step = 0, flops_per_token = 0, peak_flops = 0;
    int world_size = 1;
};

struct StageResult {
    double pipeline_end = 0;  // seconds from the step's start to its last action
    double busy = 0;          // in forwards and backwards (their tp and cp communication included)
    double tp_comm = 0;       // tp collectives and the cp ring's exposed exchanges (all on the critical path)
    double p2p = 0;           // point-to-point messages, summed (their waits are the bubble)
    double embd = 0;
    double dp_total = 0, dp_exposed = 0;          // gradient reduction: modelled, and past the backward
    double gather_total = 0, gather_exposed = 0;  // zero_stage 1's parameter gather
    double optimizer = 0, zero = 0;
    int buckets = 0;  // overlap_grad_reduce's buckets (0: one collective)
    int64_t memory_bytes = 0;
    double comm_total() const { return tp_comm + embd + dp_total + gather_total; }
    double comm_exposed() const { return tp_comm + embd + dp_exposed + gather_exposed; }
};

struct SimulatedStep {
    double step_seconds = 0;
    double pipeline_seconds = 0;  // the longest stage's schedule (from its start after zeroing)
    double bubble_fraction = 0;   // 1 - mean(busy) / pipeline_seconds: idle share of the schedule
    double scalar_seconds = 0;
    double comm_total_seconds = 0, comm_exposed_seconds = 0;  // means over the stages, scalars included
    double comm_total_share() const { return step_seconds > 0 ? comm_total_seconds / step_seconds : 0; }
    double comm_exposed_share() const { return step_seconds > 0 ? comm_exposed_seconds / step_seconds : 0; }
    double shared_cores_seconds = 0;  // steps 1-6, the stages' computes sharing pp / s cores (step 7)
    double oversubscription = 1;      // step 7's s
    double host_compute_seconds = 0;  // step 7: a rank's compute, mean over the stages, on cores of its own
    double host_bound_seconds = 0;    // step 7: s x (host_compute_seconds + comm_exposed_seconds); 0 when s <= 1
    double tokens_per_s = 0;
    double mfu = 0;  // model FLOPs per second over world_size * peak (the trainer's per-rank MFU), a fraction
    std::vector<StageResult> stages;
};

// The step over hand-set or derived inputs (the header's steps 1-6).
SimulatedStep simulate_stages(const StepInputs& in);

// Chunks already timed, keyed by everything that changes a chunk's graph (the builder's spec) or its links, with
// chunk-local offsets; for one cost model (the search's candidates share most of their chunks).
struct ChunkCostCache {
    struct Key {
        GptGraphSpec spec;
        int cp = 1;
        LinkClass tp_ring = LinkClass::kIntraNode, cp_ring = LinkClass::kIntraNode;
        auto operator<=>(const Key&) const = default;
    };
    struct Entry {
        ChunkCost cost;
        std::vector<std::pair<int64_t, int64_t>> deferred;  // sequence parallelism's LayerNorm gradients
    };
    std::map<Key, Entry> entries;
};

// The inputs of a run: each chunk's graph for a full micro-batch, timed by `cost`, on the links of `nodes`. `plan`:
// the run's plan_stages() when the caller has it (else it is made here).
StepInputs step_inputs(const RunLayout& layout, const CostModel& cost, const NodeLayout& nodes,
                       ChunkCostCache* cache = nullptr, const std::vector<StagePlan>* plan = nullptr);

// step_inputs then simulate_stages.
SimulatedStep simulate_step(const RunLayout& layout, const CostModel& cost, const NodeLayout& nodes,
                            ChunkCostCache* cache = nullptr, const std::vector<StagePlan>* plan = nullptr);

// The lines `plan --simulate` prints.
std::vector<std::string> step_report(const SimulatedStep& step, const RunLayout& layout);

}  // namespace ms::sim
