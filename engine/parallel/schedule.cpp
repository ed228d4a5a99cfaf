// schedule.cpp: the schedule generators (GPipe, Megatron's 1F1B and interleaved 1F1B) and the simulator.
// See schedule.h for the chunk layout and the send/recv placement rules.
#include "engine/parallel/schedule.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/core/check.h"

namespace ms {

namespace {

using Kind = Action::Kind;

// Appends one stage's actions. forward()/backward() wrap the compute in the receive it needs and the send it
// produces, so every generator below only decides the order of the computes.
class StageBuilder {
  public:
    StageBuilder(int pp, int v, int stage, std::vector<Action>& out) : pp_(pp), v_(v), stage_(stage), out_(out) {}

    void forward(int mb, int chunk) {
        const int k = chunk * pp_ + stage_;  // global model chunk
        if (k > 0 && stage_of(k - 1) != stage_) out_.push_back({Kind::kRecvActivation, mb, chunk, stage_of(k - 1)});
        out_.push_back({Kind::kForward, mb, chunk, -1});
        if (k + 1 < pp_ * v_ && stage_of(k + 1) != stage_) {
            out_.push_back({Kind::kSendActivation, mb, chunk, stage_of(k + 1)});
        }
    }

    void backward(int mb, int chunk) {
        const int k = chunk * pp_ + stage_;
        if (k + 1 < pp_ * v_ && stage_of(k + 1) != stage_) {
            out_.push_back({Kind::kRecvGrad, mb, chunk, stage_of(k + 1)});
        }
        out_.push_back({Kind::kBackward, mb, chunk, -1});
        if (k > 0 && stage_of(k - 1) != stage_) out_.push_back({Kind::kSendGrad, mb, chunk, stage_of(k - 1)});
    }

  private:
    int stage_of(int model_chunk) const { return model_chunk % pp_; }

    int pp_, v_, stage_;
    std::vector<Action>& out_;
};

void gpipe(StageBuilder& b, int m) {
    for (int mb = 0; mb < m; ++mb) b.forward(mb, 0);
    for (int mb = 0; mb < m; ++mb) b.backward(mb, 0);
}

// Megatron forward_backward_pipelining_without_interleaving.
void one_f_one_b(StageBuilder& b, int pp, int stage, int m) {
    const int num_warmup = std::min(pp - stage - 1, m);
    const int num_remaining = m - num_warmup;

    // Warm-up: forwards only, enough to fill the pipeline below this stage.
    for (int i = 0; i < num_warmup; ++i) b.forward(i, 0);

    // Steady state: one forward, then the backward of the oldest micro-batch in flight.
    for (int i = 0; i < num_remaining; ++i) {
        b.forward(num_warmup + i, 0);
        b.backward(i, 0);
    }

    // Cool-down: drain the backwards of the warm-up micro-batches.
    for (int i = num_remaining; i < m; ++i) b.backward(i, 0);
}

// Megatron forward_backward_pipelining_with_interleaving (m % pp == 0). Iteration k walks the micro-batches in
// groups of pp: within a group of pp * v iterations, pp micro-batches of chunk 0, then the same pp of chunk 1, ...
// Backwards visit the chunks in reverse (v - 1 first).
void interleaved(StageBuilder& b, int pp, int stage, int m, int v) {
    const int total = m * v;
    const auto microbatch_of = [&](int k) { return k / (pp * v) * pp + k % pp; };
    const auto chunk_of = [&](int k, bool forward) {
        const int c = k % (pp * v) / pp;
        return forward ? c : v - 1 - c;
    };
    // With m == pp Megatron runs every forward first ("all_warmup_microbatches").
    const int num_warmup = m == pp ? total : std::min(2 * (pp - stage - 1) + (v - 1) * pp, total);
    const int num_remaining = total - num_warmup;

    // Warm-up: forwards only.
    for (int k = 0; k < num_warmup; ++k) b.forward(microbatch_of(k), chunk_of(k, true));

    // Steady state: forward iteration k + num_warmup, then backward iteration k.
    for (int k = 0; k < num_remaining; ++k) {
        b.forward(microbatch_of(k + num_warmup), chunk_of(k + num_warmup, true));
        b.backward(microbatch_of(k), chunk_of(k, false));
    }

    // Cool-down: the remaining backwards.
    for (int k = num_remaining; k < total; ++k) b.backward(microbatch_of(k), chunk_of(k, false));
}

}  // namespace

std::string schedule_error(ScheduleKind kind, int pp, int microbatches, int virtual_stages) {
    const int m = microbatches, v = virtual_stages;
    if (pp < 1 || m < 1 || v < 1) {
        return fmt::format(
            "config error: a pipeline schedule needs pipeline_model_parallel_size({}), the number of micro-batches "
            "({}) and virtual_pipeline_model_parallel_size({}) all >= 1",
            pp, m, v);
    }
    if (kind != ScheduleKind::kInterleaved1F1B && v != 1) {
        return fmt::format(
            "config error: the {} schedule runs one model chunk per stage, got "
            "virtual_pipeline_model_parallel_size({})\n---> HINT: set parallel.pipeline_schedule = "
            "interleaved_1f1b, or virtual_pipeline_model_parallel_size = 1",
            to_string(kind), v);
    }
    if (kind == ScheduleKind::kInterleaved1F1B && m % pp != 0) {
        const int lower = m / pp * pp;
        return fmt::format(
            "config error: the interleaved_1f1b schedule needs the number of micro-batches ({}) to be a multiple of "
            "pipeline_model_parallel_size({})\n---> HINT: use {}{} micro-batches (global_batch_size / "
            "(micro_batch_size * dp)), or the 1f1b schedule",
            m, pp, lower > 0 ? fmt::format("{} or ", lower) : "", lower + pp);
    }
    return {};
}

void check_schedule(ScheduleKind kind, int pp, int microbatches, int virtual_stages) {
    if (std::string e = schedule_error(kind, pp, microbatches, virtual_stages); !e.empty()) throw UserError(e);
}

std::vector<std::vector<Action>> make_schedule(ScheduleKind kind, int pp, int microbatches, int virtual_stages) {
    const int m = microbatches, v = virtual_stages;
    // A precondition, not a user check: validate_config refused a bad layout with check_schedule's sentence.
    const std::string error = schedule_error(kind, pp, m, v);
    MS_CHECK(error.empty(), "{}", error);

    std::vector<std::vector<Action>> schedule(pp);
    for (int stage = 0; stage < pp; ++stage) {
        StageBuilder b(pp, v, stage, schedule[stage]);
        switch (kind) {
            case ScheduleKind::kGPipe:
                gpipe(b, m);
                break;
            case ScheduleKind::k1F1B:
                one_f_one_b(b, pp, stage, m);
                break;
            case ScheduleKind::kInterleaved1F1B:
                interleaved(b, pp, stage, m, v);
                break;
        }
    }
    return schedule;
}

int max_in_flight(const std::vector<Action>& actions) {
    int alive = 0, peak = 0;
    for (const Action& a : actions) {
        if (a.kind == Kind::kForward) peak = std::max(peak, ++alive);
        if (a.kind == Kind::kBackward) --alive;
    }
    return peak;
}

const char* to_string(ScheduleKind kind) {
    switch (kind) {
        case ScheduleKind::kGPipe:
            return "gpipe";
        case ScheduleKind::k1F1B:
            return "1f1b";
        case ScheduleKind::kInterleaved1F1B:
            return "interleaved_1f1b";
    }
    MS_UNREACHABLE("ScheduleKind {}", static_cast<int>(kind));
}

ScheduleKind parse_schedule_kind(const std::string& name) {
    for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved1F1B}) {
        if (name == to_string(k)) return k;
    }
    throw UserError(
        fmt::format("config error: parallel.pipeline_schedule = '{}' is not a schedule\n---> HINT: use gpipe, 1f1b or "
                    "interleaved_1f1b",
                    name));
}

std::string to_string(const Action& a) {
    switch (a.kind) {
        case Kind::kForward:
            return fmt::format("F mb{} c{}", a.microbatch, a.chunk);
        case Kind::kBackward:
            return fmt::format("B mb{} c{}", a.microbatch, a.chunk);
        case Kind::kSendActivation:
            return fmt::format("send-act mb{} c{} -> {}", a.microbatch, a.chunk, a.peer_stage);
        case Kind::kRecvActivation:
            return fmt::format("recv-act mb{} c{} <- {}", a.microbatch, a.chunk, a.peer_stage);
        case Kind::kSendGrad:
            return fmt::format("send-grad mb{} c{} -> {}", a.microbatch, a.chunk, a.peer_stage);
        case Kind::kRecvGrad:
            return fmt::format("recv-grad mb{} c{} <- {}", a.microbatch, a.chunk, a.peer_stage);
    }
    MS_UNREACHABLE("Action::Kind {}", static_cast<int>(a.kind));
}

SimResult simulate(const std::vector<std::vector<Action>>& schedule, double t_forward, double t_backward,
                   double t_comm) {
    const int pp = static_cast<int>(schedule.size());
    int v = 1, m = 1;
    for (const auto& actions : schedule) {
        for (const Action& a : actions) {
            MS_CHECK(a.microbatch >= 0 && a.chunk >= 0, "bad action {}", to_string(a));
            v = std::max(v, a.chunk + 1);
            m = std::max(m, a.microbatch + 1);
        }
    }
    const int num_chunks = pp * v;  // global model chunks

    // One mailbox per message: (activation | grad, micro-batch, producing model chunk). A message is identified by
    // its content, so the simulator does not assume in-order matching (the tests check that separately).
    struct Message {
        double sent_at = -1;  // < 0: not sent yet
        int from = -1, to = -1;
    };
    std::vector<Message> mailbox(2 * static_cast<size_t>(m) * num_chunks);
    const auto slot = [&](bool grad, int mb, int producer) -> Message* {
        if (producer < 0 || producer >= num_chunks) return nullptr;  // no such producer: never satisfied
        return &mailbox[(static_cast<size_t>(grad) * m + mb) * num_chunks + producer];
    };

    SimResult r;
    r.busy.assign(pp, 0.0);
    std::vector<double> clock(pp, 0.0);
    std::vector<size_t> pc(pp, 0);
    // Sweep the stages, running each as far as it can; a stage stops at a receive whose message is not there yet.
    // Clocks depend only on program order and send times, so the sweep order does not change the result.
    for (bool progress = true; progress;) {
        progress = false;
        for (int s = 0; s < pp; ++s) {
            for (; pc[s] < schedule[s].size(); ++pc[s], progress = true) {
                const Action& a = schedule[s][pc[s]];
                const int k = a.chunk * pp + s;
                if (a.kind == Kind::kForward || a.kind == Kind::kBackward) {
                    const double cost = (a.kind == Kind::kForward ? t_forward : t_backward) / v;
                    clock[s] += cost;
                    r.busy[s] += cost;
                } else if (a.kind == Kind::kSendActivation || a.kind == Kind::kSendGrad) {
                    Message* msg = slot(a.kind == Kind::kSendGrad, a.microbatch, k);
                    MS_CHECK(msg != nullptr, "stage {}: {} has no model chunk", s, to_string(a));
                    *msg = Message{clock[s], s, a.peer_stage};
                } else {
                    const bool grad = a.kind == Kind::kRecvGrad;
                    const Message* msg = slot(grad, a.microbatch, grad ? k + 1 : k - 1);
                    if (msg == nullptr || msg->sent_at < 0 || msg->from != a.peer_stage || msg->to != s) break;
                    clock[s] = std::max(clock[s], msg->sent_at + t_comm);
                }
            }
        }
    }

    double total_busy = 0;
    for (int s = 0; s < pp; ++s) {
        r.deadlock = r.deadlock || pc[s] < schedule[s].size();
        r.makespan = std::max(r.makespan, clock[s]);
        total_busy += r.busy[s];
    }
    r.bubble_fraction = r.makespan > 0 ? 1.0 - total_busy / pp / r.makespan : 0.0;
    return r;
}

}  // namespace ms
