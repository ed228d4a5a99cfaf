// watch_options.h: what bounds the waits of a process's communicators (comm/mpi/collective_watch.h), in a header
// without mpi.h so that the trainer can set it through MpiRuntime (comm/bootstrap.h).
#pragma once

#include <csignal>
#include <functional>
#include <string>

namespace ms {

struct CollectiveWatchOptions {
    double collective_timeout_s = 0;                          // 0: no deadline
    std::string trace_dir;                                    // where rank_XXXXX.json goes; empty: no dumps
    const volatile std::sig_atomic_t* signal_flag = nullptr;  // non-zero once a stop signal arrived
    // Called once, before CollectiveTimeoutError is thrown (after the dump): exit code and the error's message.
    std::function<void(int exit_code, const std::string& message)> on_fault;
};

}  // namespace ms
