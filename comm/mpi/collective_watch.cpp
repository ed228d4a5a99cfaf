#include "comm/mpi/collective_watch.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "comm/mpi/mpi_check.h"
#include "comm/process_groups.h"
#include "engine/core/timer.h"

namespace ms {
namespace {

constexpr int kNoticeTag = 18;                   // the exit code it announces
constexpr double kNoticePollSeconds = 1e-3;      // how often a wait tests the notice receive
constexpr double kSignalRollCallSeconds = 0.05;  // a wait still blocked this long after a signal holds a roll call
constexpr double kSignalDumpSeconds = 0.5;       // ... and this long after it dumps the recorders
// How long a roll call listens. Every survivor answers from a wait's 1 ms poll; the margin is for ranks that share
// oversubscribed cores. Under Open MPI the launcher's SIGKILL follows its SIGTERM by 1 s, and the signal path
// (kSignalRollCallSeconds + this) must end before it.
constexpr double kRollCallSeconds = 0.5;
constexpr double kNoticeSendSeconds = 0.5;     // how long a roll call lets its own messages go out
constexpr double kRollCallProcSeconds = 0.01;  // how often a roll call reads /proc for the silent ranks here
constexpr size_t kHostChars = 256;             // a host name as gathered: HOST_NAME_MAX (64) with room to spare

// LostRank::state, numbered from 1 in kLost notices.
constexpr const char* kStates[] = {"stopped", "dead", "alive, silent", "silent"};

int state_number(const std::string& state) {
    for (int i = 0; i < 4; ++i) {
        if (state == kStates[i]) return i + 1;
    }
    return 4;
}

// What /proc says of a process on this host: "stopped", "dead" or "alive, silent".
std::string process_state(int pid) {
    std::ifstream f(fmt::format("/proc/{}/stat", pid));
    std::string stat;
    if (!f || !std::getline(f, stat)) return "dead";
    const size_t paren = stat.rfind(')');  // "pid (comm) S ...": comm may hold spaces and parentheses
    const char state = paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : '?';
    if (state == 'T' || state == 't') return "stopped";
    if (state == 'Z' || state == 'X') return "dead";
    return "alive, silent";
}

// What a lost rank is, by its state, after its name.
std::string state_phrase(const std::string& state) {
    if (state == "stopped") return "is hung: its process is stopped (SIGSTOP), so it cannot answer";
    if (state == "dead") return "is dead: its process is gone (killed or crashed)";
    if (state == "alive, silent")
        return fmt::format(
            "is hung: its process runs but did not answer the other ranks within {:.1f} s, so it never came to a "
            "wait (hung or busy outside any collective)",
            kRollCallSeconds);
    return fmt::format("is hung or dead: it did not answer the other ranks within {:.1f} s (it runs on another host)",
                       kRollCallSeconds);
}

bool known_lost(const LostRank& l) { return l.state == "stopped" || l.state == "dead"; }

}  // namespace

CollectiveWatch::CollectiveWatch(int world_rank, std::string host) : world_rank_(world_rank), host_(std::move(host)) {}

CollectiveWatch::~CollectiveWatch() = default;

void CollectiveWatch::open_notice_channel(MPI_Comm world) {
    int size = 1;
    MS_MPI_CHECK(MPI_Comm_size(world, &size));
    std::vector<char> hosts(kHostChars * static_cast<size_t>(size));
    std::vector<int> pids(static_cast<size_t>(size));
    char mine[kHostChars] = {};
    host_.copy(mine, kHostChars - 1);
    const int pid = static_cast<int>(getpid());
    MS_MPI_CHECK(MPI_Allgather(mine, kHostChars, MPI_CHAR, hosts.data(), kHostChars, MPI_CHAR, world));
    MS_MPI_CHECK(MPI_Allgather(&pid, 1, MPI_INT, pids.data(), 1, MPI_INT, world));
    peers_.resize(static_cast<size_t>(size));
    for (size_t r = 0; r < peers_.size(); ++r) peers_[r] = {std::string(&hosts[r * kHostChars]), pids[r]};
    heard_at_.assign(peers_.size(), 0.0);
    reported_.assign(peers_.size(), 0);
    lost_out_.assign(peers_.size(), Message{});
    for (int kind = kTimedOut; kind < kLost; ++kind) notice_out_[kind - 1] = {kind, world_rank_, -1, 0};
    MS_MPI_CHECK(MPI_Comm_dup(world, &notice_comm_));
    MS_MPI_CHECK(MPI_Irecv(notice_in_.data(), 4, MPI_INT, MPI_ANY_SOURCE, kNoticeTag, notice_comm_, &notice_recv_));
}

void CollectiveWatch::close_notice_channel() {
    if (aborted_ || notice_comm_ == MPI_COMM_NULL) return;
    if (notice_recv_ != MPI_REQUEST_NULL) {
        MS_MPI_CHECK(MPI_Cancel(&notice_recv_));
        MS_MPI_CHECK(MPI_Wait(&notice_recv_, MPI_STATUS_IGNORE));  // a cancelled receive completes locally
    }
    // Answers to a roll call went out eagerly: they complete without the receiver.
    if (!sends_.empty()) MPI_Waitall(static_cast<int>(sends_.size()), sends_.data(), MPI_STATUSES_IGNORE);
    MS_MPI_CHECK(MPI_Comm_free(&notice_comm_));
}

void CollectiveWatch::add(const FlightRecorder* recorder) { recorders_.push_back(recorder); }

void CollectiveWatch::remove(const FlightRecorder* recorder) {
    recorders_.erase(std::remove(recorders_.begin(), recorders_.end(), recorder), recorders_.end());
}

void CollectiveWatch::drain_notices() {
    while (notice_recv_ != MPI_REQUEST_NULL) {
        int flag = 0;
        MS_MPI_CHECK(MPI_Test(&notice_recv_, &flag, MPI_STATUS_IGNORE));
        if (!flag) break;
        const auto [kind, origin, subject, state] = notice_in_;
        const auto known = [&](int r) { return r >= 0 && static_cast<size_t>(r) < peers_.size(); };
        if (known(origin)) heard_at_[origin] = now_seconds();
        if (kind == kTimedOut && timeout_origin_ < 0) timeout_origin_ = origin;
        if (kind == kRollCall) send_notice(notice_out_[kHere - 1], origin);
        if (kind == kLost && known(subject) && reported_[subject] == 0) reported_[subject] = std::clamp(state, 1, 4);
        MS_MPI_CHECK(MPI_Irecv(notice_in_.data(), 4, MPI_INT, MPI_ANY_SOURCE, kNoticeTag, notice_comm_, &notice_recv_));
    }
    // Completed sends give their requests back; the others are eager messages still on their way.
    std::erase_if(sends_, [](MPI_Request& r) {
        int done = 0;
        return MPI_Test(&r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done;
    });
}

void CollectiveWatch::send_notice(const Message& m, int to) {
    if (notice_comm_ == MPI_COMM_NULL) return;
    for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
        if (r == world_rank_ || (to >= 0 && r != to)) continue;
        MPI_Request req = MPI_REQUEST_NULL;
        if (MPI_Isend(m.data(), 4, MPI_INT, r, kNoticeTag, notice_comm_, &req) == MPI_SUCCESS) sends_.push_back(req);
    }
}

std::vector<LostRank> CollectiveWatch::roll_call(Notice kind) {
    std::vector<LostRank> lost;
    if (notice_comm_ == MPI_COMM_NULL) return lost;
    // A message received since shortly before the call counts: the notice that started this roll call, and the
    // other survivors' messages that were sent while this rank still computed.
    const double t0 = now_seconds(), since = t0 - kRollCallSeconds;
    send_notice(notice_out_[kind - 1], -1);
    const auto silent = [&](size_t r) { return static_cast<int>(r) != world_rank_ && heard_at_[r] < since; };
    // A silent rank on this host that /proc shows dead or stopped will never answer, nor will one that another rank
    // reported lost: nobody waits for them.
    double next_proc_check = t0;
    while (true) {
        drain_notices();
        const double now = now_seconds();
        if (now - t0 >= kRollCallSeconds) break;
        if (now < next_proc_check) continue;
        next_proc_check = now + kRollCallProcSeconds;
        bool unresolved = false;
        for (size_t r = 0; r < peers_.size() && !unresolved; ++r) {
            unresolved = silent(r) && reported_[r] == 0 && !known_lost(lost_rank(static_cast<int>(r)));
        }
        if (!unresolved) break;
    }
    for (size_t r = 0; r < peers_.size(); ++r) {
        if (!silent(r) && reported_[r] == 0) continue;
        LostRank l = lost_rank(static_cast<int>(r));
        // What the reporting rank saw first-hand wins over a rank that answered since (the launcher resumes a
        // stopped rank when it tears the job down).
        if (reported_[r] != 0 && (!silent(r) || !known_lost(l))) l.state = kStates[reported_[r] - 1];
        lost.push_back(std::move(l));
    }
    return lost;
}

void CollectiveWatch::report_lost(const std::vector<LostRank>& lost) {
    for (const LostRank& l : lost) {
        lost_out_[static_cast<size_t>(l.world_rank)] = {kLost, world_rank_, l.world_rank, state_number(l.state)};
        send_notice(lost_out_[static_cast<size_t>(l.world_rank)], -1);
    }
    // This rank may be gone soon: its own messages must have left. They are small and go out eagerly, given some
    // progress; a receiver is never waited for.
    const double sent_by = now_seconds() + kNoticeSendSeconds;
    while (!sends_.empty() && now_seconds() < sent_by) drain_notices();
}

LostRank CollectiveWatch::lost_rank(int world_rank) const {
    const Peer& p = peers_[static_cast<size_t>(world_rank)];
    LostRank l;
    l.world_rank = world_rank;
    l.host = p.host;
    if (options_.tp_size > 0 && options_.dp_size > 0) {
        const GridCoord c = coord_of(world_rank, options_.tp_size, options_.dp_size);
        l.tp = c.tp, l.pp = c.pp, l.dp = c.dp;
    }
    l.state = p.host == host_ ? process_state(p.pid) : "silent";
    return l;
}

std::string CollectiveWatch::name(int world_rank) const {
    const Peer& p = peers_[static_cast<size_t>(world_rank)];
    if (options_.tp_size <= 0 || options_.dp_size <= 0)
        return fmt::format("world rank {} (host {}, pid {})", world_rank, p.host, p.pid);
    const GridCoord c = coord_of(world_rank, options_.tp_size, options_.dp_size);
    return fmt::format("world rank {} (host {}, pid {}, tp {}, pp {}, dp {})", world_rank, p.host, p.pid, c.tp, c.pp,
                       c.dp);
}

std::string CollectiveWatch::blame(const std::vector<LostRank>& lost, const char* none) const {
    if (notice_comm_ == MPI_COMM_NULL)
        return "a rank of that group is hung, dead, or waiting in a different collective";
    if (lost.empty()) return none;
    std::string out;
    for (const LostRank& l : lost)
        out += fmt::format("{}{} {}", out.empty() ? "" : "; ", name(l.world_rank), state_phrase(l.state));
    return out;
}

void CollectiveWatch::wait(int n, MPI_Request* requests, FlightRecorder& recorder, uint64_t seq) {
    const std::lock_guard<std::mutex> lock(wait_mu_);
    if (aborted_) throw CollectiveTimeoutError(abort_message_);
    recorder.wait_started(seq);
    const double t0 = now_seconds();
    const double timeout = options_.collective_timeout_s;
    double next_notice_check = t0 + kNoticePollSeconds, signal_seen_at = 0;
    while (true) {
        int done = 0;
        MS_MPI_CHECK(MPI_Testall(n, requests, &done, MPI_STATUSES_IGNORE));
        if (done) {
            recorder.completed(seq);
            return;
        }
        const double now = now_seconds();
        if (now >= next_notice_check) {
            next_notice_check = now + kNoticePollSeconds;
            drain_notices();
            if (timeout_origin_ >= 0) {
                const int origin = timeout_origin_;
                const std::vector<LostRank> lost = roll_call(kHere);  // heard by the rank that timed out
                fail(fmt::format("collective timeout error: {} reported a collective timeout, so world rank {} ({}) "
                                 "stops waiting for {} after {:.1f} s: {}",
                                 name(origin), world_rank_, host_, recorder.describe(seq), now - t0,
                                 blame(lost,
                                       "every rank answered, so none is hung: the ranks wait in different "
                                       "collectives")),
                     &recorder, seq, lost);
            }
            if (options_.signal_flag && *options_.signal_flag != 0) {
                if (signal_seen_at == 0) signal_seen_at = now;
                const int sig = *options_.signal_flag;
                if (!rolled_on_signal_ && now - signal_seen_at >= kSignalRollCallSeconds) {
                    rolled_on_signal_ = true;
                    std::vector<LostRank> lost = roll_call(kRollCall);
                    std::erase_if(lost, [](const LostRank& l) { return !known_lost(l); });
                    if (!lost.empty()) {
                        fail(fmt::format("collective timeout error: world rank {} ({}) cannot complete {}: {}; "
                                         "signal {} ({}) arrived while it waited ({:.1f} s so far), the launcher "
                                         "tearing the job down",
                                         world_rank_, host_, recorder.describe(seq), blame(lost, ""), sig,
                                         strsignal(sig), now_seconds() - t0),
                             &recorder, seq, lost);
                    }
                }
                if (!dumped_on_signal_ && now - signal_seen_at >= kSignalDumpSeconds) {
                    dumped_on_signal_ = true;
                    dump(fmt::format("signal {} ({}) arrived while this rank waited for {} ({:.1f} s so far)", sig,
                                     strsignal(sig), recorder.describe(seq), now - t0));
                }
            }
        }
        if (timeout > 0 && now - t0 >= timeout) {
            const std::vector<LostRank> lost = roll_call(kTimedOut);
            fail(fmt::format("collective timeout error: world rank {} ({}) waited {:.1f} s for {}, longer than "
                             "reliability.collective_timeout_s = {}: {}",
                             world_rank_, host_, now - t0, recorder.describe(seq), timeout,
                             blame(lost,
                                   "every rank answered, so none is hung: the ranks wait in different "
                                   "collectives, or a step takes longer than the timeout")),
                 &recorder, seq, lost);
        }
    }
}

void CollectiveWatch::fail(const std::string& message, FlightRecorder* recorder, uint64_t seq,
                           const std::vector<LostRank>& lost) {
    aborted_ = true;
    report_lost(lost);
    if (recorder) recorder->timed_out(seq);
    const std::string path = dump(message);
    abort_message_ = message + (path.empty() ? std::string() : fmt::format("\n    flight recorder: {}", path)) +
                     "\n---> HINT: compare comm_traces/rank_*.json of every rank: on the group that timed out, the "
                     "rank whose last seq is lower never posted the collective the others wait in; a rank with no "
                     "trace was killed or hung outside any wait. If steps legitimately take longer, raise "
                     "reliability.collective_timeout_s (0 disables the timeout)";
    if (options_.on_fault) {
        try {
            options_.on_fault(kExitCollectiveTimeout, abort_message_, lost);
        } catch (const std::exception&) {
            // the exit record is best effort: the timeout is reported by the exception either way
        }
    }
    throw CollectiveTimeoutError(abort_message_);
}

void CollectiveWatch::add_section(std::string key, std::function<nlohmann::ordered_json()> section) {
    sections_.emplace_back(std::move(key), std::move(section));
}

std::string CollectiveWatch::dump(const std::string& reason) noexcept {
    try {
        if (options_.trace_dir.empty()) return "";
        nlohmann::ordered_json pending = nlohmann::ordered_json::array(), comms = nlohmann::ordered_json::array();
        for (const FlightRecorder* r : recorders_) {
            r->pending_json(pending);
            comms.push_back(r->to_json());
        }
        std::sort(pending.begin(), pending.end(), [](const nlohmann::ordered_json& a, const nlohmann::ordered_json& b) {
            return a["posted_at"].get<double>() < b["posted_at"].get<double>();
        });
        nlohmann::ordered_json j = {{"rank", world_rank_},
                                    {"host", host_},
                                    {"pid", static_cast<int>(getpid())},
                                    {"time", utc_iso8601(unix_seconds())},
                                    {"reason", reason},
                                    {"collective_timeout_s", options_.collective_timeout_s},
                                    {"pending", pending},
                                    {"communicators", comms}};
        for (const auto& [key, section] : sections_) j[key] = section();
        std::error_code ec;
        std::filesystem::create_directories(options_.trace_dir, ec);
        const std::string path = fmt::format("{}/rank_{:05d}.json", options_.trace_dir, world_rank_);
        const std::string tmp = path + ".tmp";
        {
            std::ofstream out(tmp, std::ios::trunc);
            out << j.dump(1) << '\n';
            if (!out.flush()) return "";
        }
        std::filesystem::rename(tmp, path, ec);
        if (ec) return "";
        std::fprintf(stderr, "[rank %d] flight recorder written to %s (%s)\n", world_rank_, path.c_str(),
                     reason.substr(0, reason.find('\n')).c_str());
        std::fflush(stderr);
        return path;
    } catch (...) {
        return "";
    }
}

}  // namespace ms
