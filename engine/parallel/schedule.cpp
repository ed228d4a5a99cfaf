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
// produces; the interleaved generator places them itself with the single actions (each a no-op where the
// neighbouring model chunk is on this stage or there is none).
class StageBuilder {
  public:
    StageBuilder(int pp, int v, int stage, std::vector<Action>& out) : pp_(pp), v_(v), stage_(stage), out_(out) {}

    void forward(int mb, int chunk) {
        recv_activation(mb, chunk);
        out_.push_back({Kind::kForward, mb, chunk, -1});
        send_activation(mb, chunk);
    }

    void backward(int mb, int chunk) {
        recv_grad(mb, chunk);
        out_.push_back({Kind::kBackward, mb, chunk, -1});
        send_grad(mb, chunk);
    }

    void forward_only(int mb, int chunk) { out_.push_back({Kind::kForward, mb, chunk, -1}); }
    void backward_only(int mb, int chunk) { out_.push_back({Kind::kBackward, mb, chunk, -1}); }
    void recv_activation(int mb, int chunk) { edge(Kind::kRecvActivation, mb, chunk, -1); }
    void send_activation(int mb, int chunk) { edge(Kind::kSendActivation, mb, chunk, +1); }
    void recv_grad(int mb, int chunk) { edge(Kind::kRecvGrad, mb, chunk, +1); }
    void send_grad(int mb, int chunk) { edge(Kind::kSendGrad, mb, chunk, -1); }

  private:
    int stage_of(int model_chunk) const { return model_chunk % pp_; }
    // The message of `kind` between local chunk `chunk` and the model chunk `step` away, if that one exists and
    // lives on another stage.
    void edge(Kind kind, int mb, int chunk, int step) {
        const int other = chunk * pp_ + stage_ + step;
        if (other >= 0 && other < pp_ * v_ && stage_of(other) != stage_) {
            out_.push_back({kind, mb, chunk, stage_of(other)});
        }
    }

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
// Backwards visit the chunks in reverse (v - 1 first). Communication as Megatron's: one batch after every warm-up
// forward, after every steady-state forward + backward pair and after every cool-down backward, holding the sends
// of what was just computed and the receives of the next iteration's inputs (send_forward_recv_forward,
// send_forward_backward_recv_forward_backward, send_backward_recv_backward), so a gradient is received one forward
// ahead of its backward.
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
    const auto recv_forward = [&](int k) {
        if (k < total) b.recv_activation(microbatch_of(k), chunk_of(k, true));
    };
    const auto recv_backward = [&](int k) {
        if (k < total) b.recv_grad(microbatch_of(k), chunk_of(k, false));
    };

    // Warm-up: forwards only; the last one also receives the first backward's gradient.
    recv_forward(0);
    for (int k = 0; k < num_warmup; ++k) {
        b.forward_only(microbatch_of(k), chunk_of(k, true));
        b.send_activation(microbatch_of(k), chunk_of(k, true));
        recv_forward(k + 1);
        if (k == num_warmup - 1 && num_remaining > 0) recv_backward(0);
    }

    // Steady state: forward iteration k + num_warmup, backward iteration k, then their batch.
    for (int k = 0; k < num_remaining; ++k) {
        const int f = k + num_warmup;
        b.forward_only(microbatch_of(f), chunk_of(f, true));
        b.backward_only(microbatch_of(k), chunk_of(k, false));
        b.send_activation(microbatch_of(f), chunk_of(f, true));
        b.send_grad(microbatch_of(k), chunk_of(k, false));
        recv_forward(f + 1);
        recv_backward(k + 1);
    }

    // Cool-down: the remaining backwards.
    if (num_remaining == 0) recv_backward(0);
    for (int k = num_remaining; k < total; ++k) {
        b.backward_only(microbatch_of(k), chunk_of(k, false));
        b.send_grad(microbatch_of(k), chunk_of(k, false));
        recv_backward(k + 1);
    }
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

std::vector<std::vector<Action>> make_forward_schedule(int pp, int virtual_stages) {
    MS_CHECK(pp >= 1 && virtual_stages >= 1, "a forward schedule needs pp {} and virtual stages {} >= 1", pp,
             virtual_stages);
    std::vector<std::vector<Action>> schedule(pp);
    for (int stage = 0; stage < pp; ++stage) {
        StageBuilder b(pp, virtual_stages, stage, schedule[stage]);
        for (int c = 0; c < virtual_stages; ++c) b.forward(0, c);
    }
    return schedule;
}

bool is_p2p(Kind kind) { return kind != Kind::kForward && kind != Kind::kBackward; }

bool ends_p2p_batch(const std::vector<Action>& actions, size_t i) {
    return is_p2p(actions[i].kind) && (i + 1 == actions.size() || !is_p2p(actions[i + 1].kind));
}

std::string check_in_order_p2p(const std::vector<std::vector<Action>>& schedule) {
    const int pp = static_cast<int>(schedule.size());
    // A message is (micro-batch, model chunk it leaves, model chunk it enters); a channel is (from stage, to stage).
    struct Message {
        int microbatch, from_chunk, to_chunk;
        bool operator==(const Message&) const = default;
    };
    struct Posted {
        size_t channel, index;
        bool send;
    };
    const auto channel = [pp](int from, int to) { return static_cast<size_t>(from) * pp + to; };
    std::vector<std::vector<Message>> sends(static_cast<size_t>(pp) * pp), recvs(sends.size());
    std::vector<size_t> pc(static_cast<size_t>(pp), 0);
    std::vector<std::vector<Posted>> batch(static_cast<size_t>(pp));  // each stage's posted, unfinished batch
    for (bool progress = true; progress;) {
        progress = false;
        for (int s = 0; s < pp; ++s) {
            const std::vector<Action>& list = schedule[static_cast<size_t>(s)];
            std::vector<Posted>& posted = batch[static_cast<size_t>(s)];
            size_t& i = pc[static_cast<size_t>(s)];
            while (i < list.size()) {
                if (!is_p2p(list[i].kind)) {
                    ++i, progress = true;
                    continue;
                }
                size_t end = i;
                while (!ends_p2p_batch(list, end)) ++end;
                if (posted.empty()) {
                    for (size_t j = i; j <= end; ++j) {
                        const Action& a = list[j];
                        const int k = a.chunk * pp + s;
                        const bool send = a.kind == Kind::kSendActivation || a.kind == Kind::kSendGrad;
                        const int from = send ? s : a.peer_stage, to = send ? a.peer_stage : s;
                        const int other = a.kind == Kind::kSendActivation || a.kind == Kind::kRecvGrad ? k + 1 : k - 1;
                        const Message m = send ? Message{a.microbatch, k, other} : Message{a.microbatch, other, k};
                        std::vector<Message>& queue = (send ? sends : recvs)[channel(from, to)];
                        posted.push_back({channel(from, to), queue.size(), send});
                        queue.push_back(m);
                    }
                    progress = true;
                }
                const bool matched = std::all_of(posted.begin(), posted.end(), [&](const Posted& p) {
                    return (p.send ? recvs : sends)[p.channel].size() > p.index;
                });
                if (!matched) break;
                posted.clear();
                i = end + 1;
            }
        }
    }
    for (int s = 0; s < pp; ++s) {
        const size_t i = pc[static_cast<size_t>(s)];
        if (i < schedule[static_cast<size_t>(s)].size()) {
            return fmt::format("stage {} waits forever on its batch at action {} ({})", s, i,
                               to_string(schedule[static_cast<size_t>(s)][i]));
        }
    }
    for (size_t ch = 0; ch < sends.size(); ++ch) {
        const int from = static_cast<int>(ch) / pp, to = static_cast<int>(ch) % pp;
        if (sends[ch].size() != recvs[ch].size()) {
            return fmt::format("stage {} sends {} messages to stage {}, which receives {}", from, sends[ch].size(), to,
                               recvs[ch].size());
        }
        for (size_t n = 0; n < sends[ch].size(); ++n) {
            const Message &a = sends[ch][n], &b = recvs[ch][n];
            if (!(a == b)) {
                return fmt::format(
                    "message {} from stage {} to stage {} is sent as mb{} chunk {} -> {} and received as mb{} chunk "
                    "{} -> {}",
                    n, from, to, a.microbatch, a.from_chunk, a.to_chunk, b.microbatch, b.from_chunk, b.to_chunk);
            }
        }
    }
    return {};
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

const char* to_string(Action::Kind kind) {
    switch (kind) {
        case Kind::kForward:
            return "F";
        case Kind::kBackward:
            return "B";
        case Kind::kSendActivation:
            return "send-act";
        case Kind::kRecvActivation:
            return "recv-act";
        case Kind::kSendGrad:
            return "send-grad";
        case Kind::kRecvGrad:
            return "recv-grad";
    }
    MS_UNREACHABLE("Action::Kind {}", static_cast<int>(kind));
}

std::string to_string(const Action& a) {
    const bool compute = a.kind == Kind::kForward || a.kind == Kind::kBackward;
    const bool sends = a.kind == Kind::kSendActivation || a.kind == Kind::kSendGrad;
    return compute ? fmt::format("{} mb{} c{}", to_string(a.kind), a.microbatch, a.chunk)
                   : fmt::format("{} mb{} c{} {} {}", to_string(a.kind), a.microbatch, a.chunk, sends ? "->" : "<-",
                                 a.peer_stage);
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
