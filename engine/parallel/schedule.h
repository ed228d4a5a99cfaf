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
// Communication is explicit and next to the compute it serves: in GPipe and 1F1B a send follows right after the
// compute that produced the tensor and the matching receive comes right before the compute that needs it; the
// interleaved schedule, as Megatron's, communicates once after each warm-up forward, each steady-state forward +
// backward pair and each cool-down backward, so a send sits in the first batch after its compute and a receive in
// the last batch before its compute (a gradient one forward ahead of its backward). Two properties make that
// safe with blocking receives and non-blocking sends, and the tests check both for every (pp, m, v) they cover:
//   - no deadlock with blocking receives and non-blocking sends (simulate() runs exactly those semantics);
//   - between any two stages and per direction, sends and receives happen in the same (micro-batch, chunk) order,
//     so a transport that matches messages in order (NCCL, MPI with one tag) pairs them correctly.
// A hand-off between two chunks on the same stage (only when pp == 1 and v > 1) stays in memory: no send/recv.
//
// Point-to-point batches. A maximal run of consecutive send/recv actions in a stage's list is one batch: the
// executor issues its sends and receives together (one Communicator::batch_send_recv) and waits for it before the
// next action, as Megatron's batched p2p does. The placement above makes those runs Megatron's combined calls:
// send-act + recv-grad (send_forward_recv_backward), send-grad + recv-act (send_backward_recv_forward), send-act +
// recv-act in a warm-up (send_forward_recv_forward), and in the interleaved schedule the sends of a forward +
// backward pair with the receives of the next pair (send_forward_backward_recv_forward_backward); every receive is
// thereby posted with the send before it, not after it. check_in_order_p2p() proves, for a whole
// schedule, that these batches cannot deadlock and pair the right messages under NCCL's semantics, where a
// batch's sends and receives complete together, a send completes only once the peer has posted its receive, and
// messages from one rank to another match in issue order whatever their direction (no tags).
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

// The forward of one micro-batch through every model chunk in order, for evaluation: stage s runs its local
// chunks 0..v-1, each between its receive and its send, as make_schedule's lists do.
std::vector<std::vector<Action>> make_forward_schedule(int pp, int virtual_stages);

bool is_p2p(Action::Kind kind);  // a send or a receive
// Whether action i of a stage's list closes a point-to-point batch: it is a send or a receive and the next action
// (if any) is not.
bool ends_p2p_batch(const std::vector<Action>& actions, size_t i);

// Runs every stage's list with its batches under NCCL's point-to-point semantics (above): a stage posts a batch's
// operations when it reaches the batch and moves on once each of them is matched by the peer's operation of the
// same position on the same (from, to) channel; computes never wait. Returns "" when every stage finishes and every
// channel's n-th send and n-th receive carry the same message (micro-batch, model-chunk edge, direction), else a
// sentence naming the stage that waits forever or the first mismatched message.
std::string check_in_order_p2p(const std::vector<std::vector<Action>>& schedule);

// The largest number of chunk-activations alive at once in one stage's list (forwards done whose backward is not
// yet done): what a memory planner must hold. For GPipe m, for 1F1B min(pp - s, m).
int max_in_flight(const std::vector<Action>& actions);

// "gpipe" | "1f1b" | "interleaved_1f1b" (the parallel.pipeline_schedule config values).
const char* to_string(ScheduleKind kind);
ScheduleKind parse_schedule_kind(const std::string& name);  // throws ms::UserError on an unknown name
std::string to_string(const Action& action);                // e.g. "F mb3 c1", "send-act mb3 c1 -> 2"
const char* to_string(Action::Kind kind);  // "F", "B", "send-act", "recv-act", "send-grad", "recv-grad"

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
