// comm_engine.h: the communication engine (parallel.comm_engine, docs/communication.md): one progress thread per
// rank that issues and completes the operations of the groups it wraps, in priority order.
//
// Priorities. Critical operations (Priority::kHigh and kNormal: tensor- and sequence-parallel collectives, pipeline
// send/recv, the gradient norm's scalars) are issued as soon as they are queued. Background ones (kLow: data-
// parallel gradient buckets, ZeRO-1 gathers) are cut into pieces of at most chunk_bytes (all_reduce, reduce and
// broadcast: contiguous pieces; the block-wise collectives and point-to-point go whole), and at most one background
// piece is in flight at a time. So a critical operation queued behind a large background one waits for at most one
// piece on a shared link (link_model.contention), instead of the whole operation.
//
// Order. The operations of one communicator are issued in the order they were queued, whatever their priority (MPI
// and NCCL need the same order on every member), so priority orders operations of different groups: a critical
// operation queued behind background ones of its own group waits for them to be issued (not completed).
//
// Threads. The engine's thread makes every call on the wrapped communicators once they are wrapped (issue and test;
// MPI_THREAD_MULTIPLE, since the caller's thread still uses world); the caller's thread queues and waits on a
// condition variable. Nothing blocks the engine's thread: it tests what is in flight, sleeping kPollSeconds between
// rounds, so a rank never sits inside one operation while a peer waits for another that this rank has not issued.
// On MPI the thread is also what progresses non-blocking collectives while the caller computes.
//
// Timeouts. A piece in flight for longer than timeout_s is waited through its communicator's own bounded wait on
// the engine's thread (for MPI the collective watch: roll call, flight-recorder dump, exit code 18), so a hung peer
// ends the run after between one and two timeouts. The error reaches every waiting caller, and every later
// operation fails with it at once.
//
// Results are those of the wrapped communicators: a background all_reduce cut into pieces reduces each element
// once, as the whole one does (bit-identical for 2 ranks; with more, MPI may pick another algorithm for a smaller
// message, which may add in another order). Stats: the inner communicators' op and byte counters, added to the
// wrapper's when an operation completes; the wait time is the caller's (the exposed communication); the time an
// operation spends queued in the engine goes to CommEngineOptions::on_queued.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>

#include "comm/communicator.h"
#include "comm/process_groups.h"

namespace ms {

struct CommEngineOptions {
    int64_t chunk_bytes = int64_t{4} << 20;  // parallel.comm_chunk_bytes: a background piece at most
    double timeout_s = 0;                    // reliability.collective_timeout_s; 0: never
    // Told, when an operation completes, the seconds it spent in the engine off the wire: queued before its first
    // piece and between pieces (the wrapped communicators count only the pieces' own times). The trainer adds them
    // to the group's total communication time (comm_matrix.h), which is then from the caller's issue to completion.
    // Called on the engine's thread; may be empty.
    std::function<void(std::string_view group, double seconds)> on_queued;
};

// What the engine did so far (tests, the start-up log).
struct CommEngineStats {
    int64_t critical_ops = 0;       // issued at once
    int64_t background_ops = 0;     // queued as background
    int64_t background_pieces = 0;  // the pieces they were cut into
};

class CommEngine {
  public:
    static constexpr double kPollSeconds = 100e-6;      // between rounds of tests while something is in flight
    static constexpr size_t kMaxPiecesInFlight = 1024;  // reserved up front; more only costs an allocation
    static constexpr size_t kPooledOps = 32;            // operation states each wrapped communicator makes up front

    explicit CommEngine(CommEngineOptions options);
    ~CommEngine();  // after every wrapped communicator (they share the engine)
    CommEngine(const CommEngine&) = delete;
    CommEngine& operator=(const CommEngine&) = delete;

    // `inner`'s operations, through the engine. split() of the result wraps the child too.
    static std::unique_ptr<Communicator> wrap(const std::shared_ptr<CommEngine>& engine,
                                              std::unique_ptr<Communicator> inner);
    CommEngineStats stats() const;
    // What the engine holds, for the flight-recorder dumps: {"queued": [{comm, op, count, dtype, priority, pieces,
    // issued, queued_at}] in each communicator's order, "pieces_in_flight", "background_in_flight", "stats"}. Never
    // blocks: called on the engine's own thread while it holds its lock (a fatal error there), it says so instead.
    nlohmann::ordered_json queue_json() const;

    struct Impl;  // comm_engine.cpp
    Impl& impl() { return *impl_; }

  private:
    std::unique_ptr<Impl> impl_;
};

// Wraps tp, pp, dp, mp and embd of `groups` (world stays the caller's) in one engine. Needs MPI_THREAD_MULTIPLE
// (the caller checks: bootstrap.h). Returns the engine.
std::shared_ptr<CommEngine> schedule_groups(ProcessGroups& groups, const CommEngineOptions& options);

}  // namespace ms
