// flight_recorder.h: the last kCapacity operations of one communicator, for the post-mortem of a hang
// (docs/formats.md "Run files": PyTorch's NCCL flight recorder, torchtitan's comm_traces/).
//
// Each operation a communicator posts gets the next sequence number of that communicator (1, 2, ...; every member
// rank numbers the same collective the same, since calls are issued in the same order on every member) and a slot
// of a ring that is allocated once, at construction: recording costs a clock read and a few stores, no allocation.
// A record goes posted -> completed, or posted -> timed_out when a wait gave up on it. After a timeout, the ranks'
// dumps side by side show which rank never posted seq N on a group (its last seq there is lower) or which one is
// waiting in a different operation.
//
// Dump format (comm_traces/rank_XXXXX.json, written by CollectiveWatch::dump):
//   {"rank": r, "host": h, "pid": p, "time": "<UTC ISO 8601>", "reason": "...", "collective_timeout_s": t,
//    "pending": [<every record not completed, all communicators, oldest first>],
//    "communicators": [{"name": "dp", "rank": 0, "size": 2, "world_ranks": [0, 2], "last_seq": 57,
//                       "entries": [<oldest first>]}]}
// A record: {"seq", "comm", "op" ("all_reduce", "send", "recv", "send_recv", ...), "count" (elements of the
// operation; p2p: of its first message), "dtype", "peer" (p2p: the first message's peer; broadcast, reduce: the root;
// else -1; a rank in this group), "peer_world_rank", "tag" (p2p, else -1), "messages" (p2p batch size), "state"
// ("posted", "completed", "timed_out"), "posted_at", "wait_started_at", "completed_at" (Unix seconds; null when
// not yet), "waited_s"}.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"

namespace ms {

enum class OpState : uint8_t { kPosted, kCompleted, kTimedOut };

struct OpRecord {
    uint64_t seq = 0;  // 0: an empty slot
    CommOp op = CommOp::kCount;
    bool mixed_p2p = false;  // a batch of both sends and receives ("send_recv")
    DType dtype = DType::kF32;
    OpState state = OpState::kPosted;
    int32_t peer = -1;
    int32_t tag = -1;
    int32_t messages = 0;
    uint64_t count = 0;
    double posted_at = 0, wait_started_at = 0, completed_at = 0;  // Unix seconds; 0: not yet
};

class FlightRecorder {
  public:
    static constexpr size_t kCapacity = 64;

    FlightRecorder(std::string name, int rank, int size) : name_(std::move(name)), rank_(rank), size_(size) {}
    // The world rank of each member (by rank in this group), so that records name peers by world rank too.
    void set_world_ranks(std::vector<int> world_ranks) { world_ranks_ = std::move(world_ranks); }
    int world_rank_of(int group_rank) const;  // -1 when unknown

    // Records a posted operation and returns its sequence number.
    uint64_t posted(CommOp op, uint64_t count, DType dtype, int peer = -1, int tag = -1, int messages = 0,
                    bool mixed_p2p = false);
    void wait_started(uint64_t seq);  // the first time only
    void completed(uint64_t seq);
    void timed_out(uint64_t seq);

    // The record of seq while it is still in the ring, else nullptr.
    const OpRecord* find(uint64_t seq) const;
    uint64_t last_seq() const { return next_seq_ - 1; }
    const std::string& name() const { return name_; }
    // "dp all_reduce #57 (1 x fp32, group of 2, this rank 0)"; "pp recv #12 from rank 0 (world rank 1) tag 7 (...)"
    std::string describe(uint64_t seq) const;

    nlohmann::ordered_json record_json(const OpRecord& r) const;
    // {"name", "rank", "size", "last_seq", "entries"}
    nlohmann::ordered_json to_json() const;
    // Every record not completed, oldest first, appended to `out`.
    void pending_json(nlohmann::ordered_json& out) const;

  private:
    OpRecord* slot(uint64_t seq);

    // The communication engine's thread records the operations it issues while the main thread may dump
    // (comm/comm_engine.h).
    mutable std::mutex mu_;
    std::string name_;
    int rank_, size_;
    std::vector<int> world_ranks_;
    uint64_t next_seq_ = 1;
    std::array<OpRecord, kCapacity> ring_{};
};

const char* comm_op_name(CommOp op);           // "all_reduce", "reduce_scatter", ..., "barrier"
const char* priority_name(Priority p);         // "low", "normal", "high"
double unix_seconds();                         // wall clock, for timestamps that line up across ranks and hosts
std::string utc_iso8601(double unix_seconds);  // "2026-11-29T23:10:00.123Z"

}  // namespace ms
