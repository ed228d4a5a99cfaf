// schedule.h: pipeline-parallel schedules as data. A pure generator turns (kind, pp, micro-batches, virtual stages)
// into one list of actions per pipeline stage, in execution order; the executor (train/) walks its stage's list and
// a simulator over the same lists gives the theoretical bubble. No MPI, no threads.
//
// Model chunks. With v virtual stages the model is cut into pp * v chunks of equal depth; stage s runs its local
// chunks c = 0..v-1, which are the global model chunks k = c * pp + s (Megatron's interleaved layout). The
// activation of chunk k goes to chunk k + 1, i.e. from (stage s, chunk c) to (stage s + 1, chunk c), and from
// (stage pp - 1, chunk c) to (stage 0, chunk c + 1); gradients flow back the same edges. With v = 1 this is plain
// pipelining: stage s runs layers [s * L / pp, (s + 1) * L / pp).
//
// Communication is explicit and local to the compute it serves: a send follows right after the compute that
// produced the tensor, and the matching receive comes right before the compute that needs it. An executor can
// therefore post each receive when it reaches it and issue sends without waiting for the peer. Two properties make
// that safe, and the tests check both for every (pp, m, v) they cover:
//   - no deadlock with blocking receives and non-blocking sends (simulate() runs exactly those semantics);
//   - between any two stages and per direction, sends and receives happen in the same (micro-batch, chunk) order,
//     so a transport that matches messages in order (NCCL, MPI with one tag) pairs them correctly.
// A hand-off between two chunks on the same stage (only when pp == 1 and v > 1) stays in memory: no send/recv.
//
// Schedules:
//   kGPipe            all forwards (micro-batch order), then all backwards (same order). m activations in flight.
//   k1F1B             Megatron's non-interleaved 1F1B (PipeDream-Flush): warm-up of min(pp - s - 1, m) forwards,
//                     steady state of one forward + one backward, cool-down backwards. min(pp - s, m) in flight.
//   kInterleaved1F1B  Megatron's interleaved 1F1B over v chunks per stage. Requires m % pp == 0 (Megatron's
//                     original constraint, also enforced by config validation); warm-up
//                     min(2 (pp - s - 1) + (v - 1) pp, v m) chunk-forwards, or all v m when m == pp.
//                     In-flight peak: that warm-up + 1 chunk-activations (each 1/v of a stage's), v m when m == pp.
// Bubble share of the step with no communication cost, which simulate() reproduces exactly (tested for
// t_backward = 2 t_forward over pp 1..8, m 1..32, v 1..4; also exact for ratios 1, 1.5 and 3):
//   GPipe, 1F1B: (pp - 1) / (m + pp - 1)        interleaved: (pp - 1) / (v m + pp - 1)
// With t_comm > 0 the receives of the steady state sit on the critical path and the bubble grows (see
// bench/pipeline_bubble.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ms {

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved1F1B };

// One step of a stage's list. For compute actions, peer_stage is -1.
struct Action {
    enum class Kind : uint8_t { kForward, kBackward, kSendActivation, kRecvActivation, kSendGrad, kRecvGrad };
    Kind kind;
    int microbatch;  // 0..m-1
    int chunk;  // local model chunk on the executing stage, 0..v-1: the producer for a send, the consumer for a recv
    int peer_stage;  // the other stage of a send/recv; -1 for kForward / kBackward

    bool operator==(const Action&) const = default;
};

// The sentence (with a hint) saying why (kind, pp, microbatches, virtual_stages) is no schedule, or "": when pp,
// microbatches or virtual_stages is < 1, when virtual_stages != 1 for kGPipe / k1F1B, or when the interleaved
// schedule gets microbatches % pp != 0. check_schedule throws it as an ms::UserError (validate_config does, once).
std::string schedule_error(ScheduleKind kind, int pp, int microbatches, int virtual_stages);
void check_schedule(ScheduleKind kind, int pp, int microbatches, int virtual_stages);

// The schedule of every stage: result[s] is stage s's action list, in execution order. Requires a combination
// check_schedule accepts (fatal otherwise: the config validation refused any other).
std::vector<std::vector<Action>> make_schedule(ScheduleKind kind, int pp, int microbatches, int virtual_stages);

// The largest number of chunk-activations alive at once in one stage's list (forwards done whose backward is not
// yet done): what a memory planner must hold. For GPipe m, for 1F1B min(pp - s, m).
int max_in_flight(const std::vector<Action>& actions);

// "gpipe" | "1f1b" | "interleaved_1f1b" (the parallel.pipeline_schedule config values).
const char* to_string(ScheduleKind kind);
ScheduleKind parse_schedule_kind(const std::string& name);  // throws ms::UserError on an unknown name
std::string to_string(const Action& action);                // e.g. "F mb3 c1", "send-act mb3 c1 -> 2"

struct SimResult {
    double makespan = 0;         // time at which the last stage finishes
    std::vector<double> busy;    // (pp) compute time per stage
    double bubble_fraction = 0;  // 1 - mean(busy) / makespan: the idle share of the step
    bool deadlock = false;       // some stage waits forever on a receive (the other fields cover what did run)
};

// Runs every stage's list in order on its own clock. A forward costs t_forward / v and a backward t_backward / v
// (v = the number of local chunks in the schedule); sends are non-blocking and free; a receive blocks until the
// matching send (same micro-batch, same model-chunk edge, matching stages) has been issued, plus t_comm.
SimResult simulate(const std::vector<std::vector<Action>>& schedule, double t_forward, double t_backward,
                   double t_comm = 0);

}  // namespace ms
