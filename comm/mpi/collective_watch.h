// collective_watch.h: bounded waits for the MPI communicators of one process, and their flight recorders
// (reference/ecosystem-reliability.md A6.1, B6).
//
// One CollectiveWatch is shared by MPI_COMM_WORLD's MpiCommunicator and every communicator split from it
// (MpiRuntime owns it). A Handle's wait polls its MPI requests with MPI_Testall on the calling thread instead of
// blocking in MPI_Waitall, so the main thread is never stuck inside MPI: when the requests are not complete
// collective_timeout_s after the wait began, the watch
//   1. marks the operation timed_out in its communicator's flight recorder,
//   2. tells every other rank over the notice channel (below),
//   3. dumps every communicator's flight recorder to <trace_dir>/rank_XXXXX.json,
//   4. calls on_fault(18, message) (the trainer records exit_status.json and events.jsonl there), and
//   5. throws CollectiveTimeoutError (exit code 18).
// From then on the watch is aborted: every wait throws again at once (a destructor's wait swallows it), MPI
// requests still in flight are abandoned (their buffers and datatypes are never freed), and neither the
// communicators nor MpiRuntime call MPI_Comm_free / MPI_Finalize, which would wait for the peers that are gone.
//
// The notice channel: a duplicate of MPI_COMM_WORLD on which every rank keeps one receive posted. A rank that
// times out sends its world rank to every other rank there, so each rank still polling a wait (also one blocked on
// a healthy peer that is itself blocked) ends the same way within a millisecond, with its own flight-recorder
// dump, instead of hanging until its own deadline or until the launcher kills it. A rank that computes (or
// hangs) outside a wait sees the notice at its next wait.
//
// A signal (signal_flag set, e.g. mpirun's SIGTERM after a peer crashed) that arrives while a wait is blocked and
// that wait is still not complete 0.5 s later also dumps the flight recorders (reason: the signal), once: under
// Open MPI the SIGKILL follows the SIGTERM by 1 s, so this is the last chance to leave a trace. A healthy
// collective completes in far less once its peers are alive, so preemption does not dump.
//
// Cost per wait: MPI_Testall and a steady-clock read per poll, the notice receive tested at most every 1 ms. No
// allocation. collective_timeout_s = 0 waits without a deadline (still polling, still honouring notices).
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "comm/flight_recorder.h"
#include "comm/watch_options.h"

namespace ms {

class CollectiveWatch {
  public:
    CollectiveWatch(int world_rank, std::string host);
    ~CollectiveWatch();
    CollectiveWatch(const CollectiveWatch&) = delete;
    CollectiveWatch& operator=(const CollectiveWatch&) = delete;

    void set_options(CollectiveWatchOptions options) { options_ = std::move(options); }
    const CollectiveWatchOptions& options() const { return options_; }

    // Collective over `world` (MpiRuntime, once): duplicates it for the notice channel and posts the receive.
    void open_notice_channel(MPI_Comm world);
    // Cancels the receive and frees the channel (not when aborted: see the top of this file).
    void close_notice_channel();

    void add(const FlightRecorder* recorder);
    void remove(const FlightRecorder* recorder);

    // Completes all `n` requests of operation `seq` of `recorder`, or throws CollectiveTimeoutError.
    void wait(int n, MPI_Request* requests, FlightRecorder& recorder, uint64_t seq);
    bool aborted() const { return aborted_; }

    // Writes every registered recorder to <trace_dir>/rank_XXXXX.json (when trace_dir is set); returns the path or
    // "". Never throws. Also called by MpiRuntime's abort hook (MS_CHECK, MPI errors) before MPI_Abort.
    std::string dump(const std::string& reason) noexcept;

  private:
    [[noreturn]] void fail(const std::string& message, FlightRecorder* recorder, uint64_t seq);
    void notify_peers();
    int received_notice();  // the world rank that sent one, or -1

    int world_rank_;
    std::string host_;
    CollectiveWatchOptions options_;
    std::vector<const FlightRecorder*> recorders_;
    bool aborted_ = false;
    std::string abort_message_;
    bool dumped_on_signal_ = false;
    MPI_Comm notice_comm_ = MPI_COMM_NULL;
    MPI_Request notice_recv_ = MPI_REQUEST_NULL;
    int notice_in_ = -1, notice_out_ = -1;
};

}  // namespace ms
