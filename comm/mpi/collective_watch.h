// collective_watch.h: bounded waits for the MPI communicators of one process, and their flight recorders
// (docs/formats.md).
//
// One CollectiveWatch is shared by MPI_COMM_WORLD's MpiCommunicator and every communicator split from it
// (MpiRuntime owns it). A Handle's wait polls its MPI requests with MPI_Testall on the calling thread instead of
// blocking in MPI_Waitall, so the main thread is never stuck inside MPI: when the requests are not complete
// collective_timeout_s after the wait began, the watch
//   1. marks the operation timed_out in its communicator's flight recorder,
//   2. tells every other rank over the notice channel and holds the roll call that names the lost ranks (below),
//   3. dumps every communicator's flight recorder to <trace_dir>/rank_XXXXX.json,
//   4. calls on_fault(18, message, lost ranks) (the trainer records exit_status.json and events.jsonl there), and
//   5. throws CollectiveTimeoutError (exit code 18).
// From then on the watch is aborted: every wait throws again at once (a destructor's wait swallows it), MPI
// requests still in flight are abandoned (their buffers and datatypes are never freed), and neither the
// communicators nor MpiRuntime call MPI_Comm_free / MPI_Finalize, which would wait for the peers that are gone.
//
// The notice channel: a duplicate of MPI_COMM_WORLD on which every rank keeps one receive posted for a message
// {kind, sender, subject, state}. A rank that times out sends "timed out" to every other rank there, so each rank
// still polling a wait (also one blocked on a healthy peer that is itself blocked) ends the same way within a
// millisecond, with its own flight-recorder dump, instead of hanging until its own deadline or until the launcher
// kills it. A rank that computes (or hangs) outside a wait sees the notice at its next wait.
//
// The roll call names the rank to blame. The rank that timed out, and every rank its notice ends, sends one message
// to every other rank over the notice channel and then listens for kRollCallSeconds (less once every rank was
// heard, or each silent one is on this host and dead or stopped): a message received is proof of life, since a rank
// answers only from a wait's poll. A rank that was not heard -- SIGSTOPped inside the collective, asleep outside any
// wait, dead -- is lost. Before it leaves, each survivor tells the others which ranks it found lost ("lost" notices),
// and a rank still listening adopts them: the launcher resumes a stopped rank as soon as the first survivor exits,
// and the resumed rank's answer must not clear it. So every survivor names the same lost ranks by world rank, host
// and coordinates (tp, pp, dp: CollectiveWatchOptions) in its error and in on_fault, as PyTorch's flight-recorder
// analysis does after the fact. On the lost rank's own host the watch reads its state from /proc (stopped, dead,
// alive but silent). When every rank answered, no rank is hung: the ranks wait in different collectives. Nothing of
// this runs before a wait fails: a healthy wait only tests the receive.
//
// A signal (signal_flag set, e.g. mpirun's SIGTERM after a peer crashed) that arrives while a wait is blocked and
// that wait is still not complete kSignalRollCallSeconds later starts a roll call. A rank on this host that did not
// answer and is dead or stopped is lost: the wait fails with exit code 18 naming it (its on_fault records the
// status before the launcher's SIGKILL, 1 s after its SIGTERM under Open MPI). Otherwise (a preemption, a peer that
// is busy, a silent rank on another host, which may be computing) the wait goes on and, still blocked 0.5 s after
// the signal, dumps the flight recorders (reason: the signal), once: the last chance to leave a trace. A healthy
// collective completes in far less once its peers are alive, so preemption does not dump.
//
// Cost per wait: MPI_Testall and a steady-clock read per poll, the notice receive tested at most every 1 ms. No
// allocation. collective_timeout_s = 0 waits without a deadline (still polling, still honouring notices).
#pragma once

#include <mpi.h>

#include <array>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/flight_recorder.h"
#include "comm/watch_options.h"

namespace ms {

class CollectiveWatch {
  public:
    // Where a world rank runs, learnt once when the notice channel opens.
    struct Peer {
        std::string host;
        int pid = 0;
    };

    CollectiveWatch(int world_rank, std::string host);
    ~CollectiveWatch();
    CollectiveWatch(const CollectiveWatch&) = delete;
    CollectiveWatch& operator=(const CollectiveWatch&) = delete;

    void set_options(CollectiveWatchOptions options) { options_ = std::move(options); }
    const CollectiveWatchOptions& options() const { return options_; }

    // Collective over `world` (MpiRuntime, once): gathers every rank's host and pid, duplicates `world` for the
    // notice channel and posts the receive.
    void open_notice_channel(MPI_Comm world);
    const std::vector<Peer>& peers() const { return peers_; }  // by world rank
    // Cancels the receive and frees the channel (not when aborted: see the top of this file).
    void close_notice_channel();

    void add(const FlightRecorder* recorder);
    void remove(const FlightRecorder* recorder);
    // A part of every dump beside the recorders: dump() writes section() under `key` (the communication engine's
    // queue: comm/comm_engine.h). The section must not block, and may be called on any thread that dumps.
    void add_section(std::string key, std::function<nlohmann::ordered_json()> section);

    // Completes all `n` requests of operation `seq` of `recorder`, or throws CollectiveTimeoutError.
    void wait(int n, MPI_Request* requests, FlightRecorder& recorder, uint64_t seq);
    bool aborted() const { return aborted_; }

    // Writes every registered recorder to <trace_dir>/rank_XXXXX.json (when trace_dir is set); returns the path or
    // "". Never throws. Also called by MpiRuntime's abort hook (MS_CHECK, MPI errors) before MPI_Abort.
    std::string dump(const std::string& reason) noexcept;

  private:
    // A notice is {kind, sender's world rank, subject, state}: kLost says that the sender found world rank `subject`
    // lost, in state `state` (an index into the states of LostRank::state, from 1).
    enum Notice : int { kTimedOut = 1, kRollCall = 2, kHere = 3, kLost = 4 };
    using Message = std::array<int, 4>;

    [[noreturn]] void fail(const std::string& message, FlightRecorder* recorder, uint64_t seq,
                           const std::vector<LostRank>& lost);
    // Receives every message that has arrived: notes who is alive, answers roll calls, keeps a timeout notice.
    void drain_notices();
    // Sends `m` to `to` (-1: every other rank); errors ignored (a peer may be gone). `m` lives until the sends end.
    void send_notice(const Message& m, int to);
    // Sends `kind` to every other rank, listens for the others, and returns the ranks not heard from and those
    // another rank reported lost.
    std::vector<LostRank> roll_call(Notice kind);
    // Tells every other rank which ranks this one found lost (so that a rank still in its roll call names the same
    // ones, even when the launcher resumes a stopped one meanwhile), then lets its messages leave.
    void report_lost(const std::vector<LostRank>& lost);
    LostRank lost_rank(int world_rank) const;
    // "world rank 3 (host h, tp 0, pp 1, dp 1) is hung: ..." or, with nobody lost, why not.
    std::string blame(const std::vector<LostRank>& lost, const char* none) const;
    std::string name(int world_rank) const;  // "world rank 3 (host h, tp 0, pp 1, dp 1)"

    // One wait at a time: the communication engine's thread waits here only for an operation past the timeout,
    // while the main thread may wait on world (comm/comm_engine.h).
    std::mutex wait_mu_;
    int world_rank_;
    std::string host_;
    CollectiveWatchOptions options_;
    std::vector<const FlightRecorder*> recorders_;
    std::vector<std::pair<std::string, std::function<nlohmann::ordered_json()>>> sections_;
    bool aborted_ = false;
    std::string abort_message_;
    bool dumped_on_signal_ = false, rolled_on_signal_ = false;
    std::vector<Peer> peers_;
    MPI_Comm notice_comm_ = MPI_COMM_NULL;
    MPI_Request notice_recv_ = MPI_REQUEST_NULL;
    Message notice_in_ = {};
    std::array<Message, kLost> notice_out_ = {};  // kTimedOut .. kHere, by kind - 1
    std::vector<Message> lost_out_;               // kLost, by subject
    std::vector<MPI_Request> sends_;
    std::vector<double> heard_at_;  // by world rank: when a message of it was last received (0: never)
    std::vector<int> reported_;     // by world rank: the state another rank reported it lost in (0: not reported)
    int timeout_origin_ = -1;       // the first rank that announced a timeout
};

}  // namespace ms
