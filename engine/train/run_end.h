// run_end.h: how this process's run ends, as a launcher or a wrapper sees it -- the stop-signal flag and its
// handlers, and the exit record: the run files that say what happened. Process state (not a Reliability's), since
// apps/main.cpp records errors after the run's objects are gone and a second signal's handler writes the record
// itself. What the run does on a stop signal, phase by phase: engine/train/reliability.h.
//
// Run files in run.output_dir (JSON; times are UTC ISO 8601):
//   events.jsonl                 rank 0: one object per line {"time", "event", "rank", ...}, each line one
//                                write(2) to a file opened O_APPEND: start (config hash, layout, injection),
//                                checkpoint_loaded, checkpoint_saved, signal, nan_skip, nan_fail,
//                                collective_timeout, fault_injected, exit. A resumed run appends.
//   events/rank_XXXXX.jsonl      rank X > 0, only what it saw itself: an injected fault, a NaN it found, a timeout,
//                                a failing exit
//   exit_status.json             {code, reason, iteration, rank, host, time, requeue, failed_rank, [hung_ranks]}:
//                                rank 0's; when rank 0 ends without one (killed), the first other rank that fails
//                                writes it (and, when a collective found ranks lost, appends its exit event to
//                                events.jsonl, since rank 0 may be killed before it does).
//                                rank, host: the writer. failed_rank {rank, host, [tp, pp, dp], [state]}: the first
//                                failing rank -- the writer itself, a peer whose input or config differed, or the
//                                first rank a collective's roll call found lost. hung_ranks (exit code 18, when the
//                                roll call found any): every lost rank, each {rank, host, tp, pp, dp, state}, state
//                                "stopped", "dead", "alive, silent" (never came to a wait) or "silent" (another
//                                host). Written from the input checks on (arm_exit_record), so a data error or a
//                                config hash that differs between ranks leaves one too.
//   exit_status/rank_XXXXX.json  the same for every rank that ends through the trainer: a rank without one was
//                                killed (a crash, or the launcher tearing the job down)
//   comm_traces/rank_XXXXX.json  flight recorders (collective_watch.h)
//   comm_matrix.json             rank 0, when train ends normally: what every rank sent, by pair, group and link
//                                class (comm/comm_matrix.h, docs/communication.md)
// At start rank 0 deletes the previous run's exit_status files and moves its comm_traces/ to comm_traces.prev/,
// so that what a wrapper reads after this run is this run's.
#pragma once

#include <csignal>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/watch_options.h"

namespace ms {

// ---- signals ----

// SIGTERM, SIGUSR1 and SIGINT set the stop flag (the first signal's number); a second one ends the process at once
// (with its exit record once one is armed).
void install_signal_handlers();
int stop_signal();  // 0 until a stop signal arrived, then its number
const volatile std::sig_atomic_t* stop_signal_flag();
const char* signal_name(int sig);  // "SIGTERM", "SIGUSR1", ...

// ---- exit record ----

// Arms record_exit() as soon as run.output_dir and the ranks' hosts are known (the trainer, right after MPI is
// up), so that the input checks and the config-hash check leave a status too. hosts: by world rank, to name a
// failing peer. A Reliability adds the layout (coordinates) later.
void arm_exit_record(std::string output_dir, int rank, std::vector<std::string> hosts);

// "world rank 1 (host h)", with ", tp 0, pp 1, dp 0" once a Reliability knows the layout: how errors that can
// differ between ranks and the status name a rank (by the hosts arm_exit_record() was given).
std::string describe_rank(int world_rank);

// Writes exit_status.json, exit_status/rank_XXXXX.json and the exit event for this process, once: later calls
// do nothing. Does nothing before arm_exit_record() or a Reliability (no output directory yet). apps/main.cpp calls
// it for every RunError (with its failed_rank()); the trainer calls it before it throws or returns, so the files
// exist before MPI_Finalize (after which the launcher may kill the process). The failing rank is lost[0] when a
// collective found lost ranks (comm/watch_options.h), else failed_rank when another rank failed first, else this
// one.
void record_exit(int code, const std::string& reason, int failed_rank = -1, const std::vector<LostRank>& lost = {});

// For Reliability: the layout (coordinates name a rank) and this rank's host, re-arming the record for its run.
void set_exit_layout(const std::string& output_dir, int rank, std::string host, int tp_size, int dp_size);
// The iteration the record names (the one in progress).
void set_exit_iteration(int64_t it);
int64_t exit_iteration();
// Appends one event: on rank 0 to events.jsonl; on other ranks only when `local` (to events/rank_XXXXX.jsonl).
void record_event(const std::string& type, nlohmann::json fields, bool local);
// hung_ranks as the record writes them: {rank, host, tp, pp, dp, state} each.
nlohmann::json lost_ranks_json(const std::vector<LostRank>& lost);
// The code the record was written (or claimed by a second signal) with; none while the run has not ended.
std::optional<int> recorded_exit_code();

}  // namespace ms
