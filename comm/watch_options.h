// watch_options.h: what bounds the waits of a process's communicators (comm/mpi/collective_watch.h), in a header
// without mpi.h so that the trainer can set it through MpiRuntime (comm/bootstrap.h).
#pragma once

#include <csignal>
#include <functional>
#include <string>
#include <vector>

namespace ms {

// A rank that did not answer the other ranks' roll call when a collective could not complete
// (comm/mpi/collective_watch.h): the rank to blame, named by world rank, host and (when the layout is known) its
// coordinates.
struct LostRank {
    int world_rank = -1;
    std::string host;
    int tp = -1, pp = -1, dp = -1;  // -1: the layout is not known (CollectiveWatchOptions::tp_size == 0)
    // "stopped" (SIGSTOP, seen in /proc on its host), "dead" (its process is gone), "alive, silent" (its process
    // runs but never came to a wait: hung or computing outside any collective), "silent" (on another host: hung,
    // stopped or dead)
    std::string state;
};

struct CollectiveWatchOptions {
    double collective_timeout_s = 0;                          // 0: no deadline
    std::string trace_dir;                                    // where rank_XXXXX.json goes; empty: no dumps
    const volatile std::sig_atomic_t* signal_flag = nullptr;  // non-zero once a stop signal arrived
    // The layout (comm/process_groups.h: rank = tp_rank + tp * (dp_rank + dp * pp_rank)), so that a lost rank is
    // named by its coordinates too; 0: world ranks and hosts only.
    int tp_size = 0, dp_size = 0;
    // Called once, before CollectiveTimeoutError is thrown (after the dump): exit code, the error's message and the
    // ranks that never answered (empty when every rank did, or none could be asked).
    std::function<void(int exit_code, const std::string& message, const std::vector<LostRank>& lost)> on_fault;
};

}  // namespace ms
