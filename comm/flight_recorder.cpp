#include "comm/flight_recorder.h"

#include <fmt/format.h>

#include <chrono>
#include <ctime>

namespace ms {

const char* priority_name(Priority p) {
    switch (p) {
        case Priority::kLow:
            return "low";
        case Priority::kNormal:
            return "normal";
        case Priority::kHigh:
            return "high";
    }
    return "?";
}

const char* comm_op_name(CommOp op) {
    switch (op) {
        case CommOp::kAllReduce:
            return "all_reduce";
        case CommOp::kReduceScatter:
            return "reduce_scatter";
        case CommOp::kAllGather:
            return "all_gather";
        case CommOp::kBroadcast:
            return "broadcast";
        case CommOp::kSend:
            return "send";
        case CommOp::kRecv:
            return "recv";
        case CommOp::kAllToAll:
            return "all_to_all";
        case CommOp::kBarrier:
            return "barrier";
        case CommOp::kReduce:
            return "reduce";
        case CommOp::kCount:
            break;
    }
    return "?";
}

double unix_seconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string utc_iso8601(double t) {
    const auto secs = static_cast<std::time_t>(t);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[32];
    std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
    return fmt::format("{}.{:03d}Z", buf, static_cast<int>((t - static_cast<double>(secs)) * 1000.0));
}

int FlightRecorder::world_rank_of(int group_rank) const {
    return group_rank >= 0 && static_cast<size_t>(group_rank) < world_ranks_.size() ? world_ranks_[group_rank] : -1;
}

OpRecord* FlightRecorder::slot(uint64_t seq) {
    OpRecord& r = ring_[seq % kCapacity];
    return r.seq == seq ? &r : nullptr;
}

const OpRecord* FlightRecorder::find(uint64_t seq) const {
    const OpRecord& r = ring_[seq % kCapacity];
    return seq != 0 && r.seq == seq ? &r : nullptr;
}

uint64_t FlightRecorder::posted(CommOp op, uint64_t count, DType dtype, int peer, int tag, int messages,
                                bool mixed_p2p) {
    const std::lock_guard<std::mutex> lock(mu_);
    const uint64_t seq = next_seq_++;
    OpRecord& r = ring_[seq % kCapacity];
    r = OpRecord{};
    r.seq = seq;
    r.op = op;
    r.mixed_p2p = mixed_p2p;
    r.dtype = dtype;
    r.peer = peer;
    r.tag = tag;
    r.messages = messages;
    r.count = count;
    r.posted_at = unix_seconds();
    return seq;
}

void FlightRecorder::wait_started(uint64_t seq) {
    const std::lock_guard<std::mutex> lock(mu_);
    if (OpRecord* r = slot(seq); r && r->wait_started_at == 0) r->wait_started_at = unix_seconds();
}

void FlightRecorder::completed(uint64_t seq) {
    const std::lock_guard<std::mutex> lock(mu_);
    if (OpRecord* r = slot(seq)) {
        r->state = OpState::kCompleted;
        r->completed_at = unix_seconds();
    }
}

void FlightRecorder::timed_out(uint64_t seq) {
    const std::lock_guard<std::mutex> lock(mu_);
    if (OpRecord* r = slot(seq)) r->state = OpState::kTimedOut;
}

std::string FlightRecorder::describe(uint64_t seq) const {
    const std::lock_guard<std::mutex> lock(mu_);
    const OpRecord* r = find(seq);
    if (!r) return fmt::format("{} operation #{}", name_, seq);
    const char* op = r->mixed_p2p ? "send_recv" : comm_op_name(r->op);
    std::string where;
    if (r->op == CommOp::kSend || r->op == CommOp::kRecv) {
        where =
            fmt::format(" {} rank {} (world rank {}) tag {}", r->op == CommOp::kRecv && !r->mixed_p2p ? "from" : "with",
                        r->peer, world_rank_of(r->peer), r->tag);
        if (r->messages > 1) where += fmt::format(" and {} more messages", r->messages - 1);
    } else if (r->op == CommOp::kBroadcast) {
        where = fmt::format(" from root {}", r->peer);
    }
    return fmt::format("{} {} #{}{} ({} x {}, group of {}, this rank {})", name_, op, seq, where, r->count,
                       dtype_name(r->dtype), size_, rank_);
}

nlohmann::ordered_json FlightRecorder::record_json(const OpRecord& r) const {
    static constexpr const char* kStates[] = {"posted", "completed", "timed_out"};
    const auto stamp = [](double t) { return t > 0 ? nlohmann::ordered_json(t) : nlohmann::ordered_json(nullptr); };
    const double end = r.completed_at > 0 ? r.completed_at : unix_seconds();
    return {{"seq", r.seq},
            {"comm", name_},
            {"op", r.mixed_p2p ? "send_recv" : comm_op_name(r.op)},
            {"count", r.count},
            {"dtype", dtype_name(r.dtype)},
            {"peer", r.peer},
            {"peer_world_rank", world_rank_of(r.peer)},
            {"tag", r.tag},
            {"messages", r.messages},
            {"state", kStates[static_cast<int>(r.state)]},
            {"posted_at", stamp(r.posted_at)},
            {"wait_started_at", stamp(r.wait_started_at)},
            {"completed_at", stamp(r.completed_at)},
            {"waited_s", r.wait_started_at > 0 ? nlohmann::ordered_json(end - r.wait_started_at)
                                               : nlohmann::ordered_json(nullptr)}};
}

nlohmann::ordered_json FlightRecorder::to_json() const {
    const std::lock_guard<std::mutex> lock(mu_);
    nlohmann::ordered_json entries = nlohmann::ordered_json::array();
    const uint64_t first = next_seq_ > kCapacity ? next_seq_ - kCapacity : 1;
    for (uint64_t seq = first; seq < next_seq_; ++seq) {
        if (const OpRecord* r = find(seq)) entries.push_back(record_json(*r));
    }
    return {{"name", name_},          {"rank", rank_},     {"size", size_}, {"world_ranks", world_ranks_},
            {"last_seq", last_seq()}, {"entries", entries}};
}

void FlightRecorder::pending_json(nlohmann::ordered_json& out) const {
    const std::lock_guard<std::mutex> lock(mu_);
    const uint64_t first = next_seq_ > kCapacity ? next_seq_ - kCapacity : 1;
    for (uint64_t seq = first; seq < next_seq_; ++seq) {
        const OpRecord* r = find(seq);
        if (r && r->state != OpState::kCompleted) out.push_back(record_json(*r));
    }
}

}  // namespace ms
