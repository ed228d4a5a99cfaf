#include "comm/mpi/collective_watch.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "comm/mpi/mpi_check.h"
#include "engine/core/timer.h"

namespace ms {
namespace {

constexpr int kNoticeTag = 18;               // the exit code it announces
constexpr double kNoticePollSeconds = 1e-3;  // how often a wait tests the notice receive
constexpr double kSignalDumpSeconds = 0.5;   // a wait still blocked this long after a signal dumps the recorders
constexpr double kNoticeSendSeconds = 0.5;   // how long a timed-out rank lets its notices go out

}  // namespace

CollectiveWatch::CollectiveWatch(int world_rank, std::string host) : world_rank_(world_rank), host_(std::move(host)) {}

CollectiveWatch::~CollectiveWatch() = default;

void CollectiveWatch::open_notice_channel(MPI_Comm world) {
    MS_MPI_CHECK(MPI_Comm_dup(world, &notice_comm_));
    MS_MPI_CHECK(MPI_Irecv(&notice_in_, 1, MPI_INT, MPI_ANY_SOURCE, kNoticeTag, notice_comm_, &notice_recv_));
}

void CollectiveWatch::close_notice_channel() {
    if (aborted_ || notice_comm_ == MPI_COMM_NULL) return;
    if (notice_recv_ != MPI_REQUEST_NULL) {
        MS_MPI_CHECK(MPI_Cancel(&notice_recv_));
        MS_MPI_CHECK(MPI_Wait(&notice_recv_, MPI_STATUS_IGNORE));  // a cancelled receive completes locally
    }
    MS_MPI_CHECK(MPI_Comm_free(&notice_comm_));
}

void CollectiveWatch::add(const FlightRecorder* recorder) { recorders_.push_back(recorder); }

void CollectiveWatch::remove(const FlightRecorder* recorder) {
    recorders_.erase(std::remove(recorders_.begin(), recorders_.end(), recorder), recorders_.end());
}

int CollectiveWatch::received_notice() {
    if (notice_recv_ == MPI_REQUEST_NULL) return -1;
    int flag = 0;
    MS_MPI_CHECK(MPI_Test(&notice_recv_, &flag, MPI_STATUS_IGNORE));
    return flag ? notice_in_ : -1;
}

void CollectiveWatch::wait(int n, MPI_Request* requests, FlightRecorder& recorder, uint64_t seq) {
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
            if (const int origin = received_notice(); origin >= 0) {
                fail(fmt::format("collective timeout error: world rank {} reported a collective timeout, so world "
                                 "rank {} ({}) stops waiting for {} after {:.1f} s",
                                 origin, world_rank_, host_, recorder.describe(seq), now - t0),
                     &recorder, seq);
            }
            if (options_.signal_flag && *options_.signal_flag != 0 && !dumped_on_signal_) {
                if (signal_seen_at == 0) signal_seen_at = now;
                if (now - signal_seen_at >= kSignalDumpSeconds) {
                    dumped_on_signal_ = true;
                    const int sig = *options_.signal_flag;
                    dump(fmt::format("signal {} ({}) arrived while this rank waited for {} ({:.1f} s so far)", sig,
                                     strsignal(sig), recorder.describe(seq), now - t0));
                }
            }
        }
        if (timeout > 0 && now - t0 >= timeout) {
            notify_peers();
            fail(fmt::format("collective timeout error: world rank {} ({}) waited {:.1f} s for {}, longer than "
                             "reliability.collective_timeout_s = {}: a rank of that group is hung, dead, or waiting "
                             "in a different collective",
                             world_rank_, host_, now - t0, recorder.describe(seq), timeout),
                 &recorder, seq);
        }
    }
}

void CollectiveWatch::fail(const std::string& message, FlightRecorder* recorder, uint64_t seq) {
    aborted_ = true;
    if (recorder) recorder->timed_out(seq);
    const std::string path = dump(message);
    abort_message_ = message + (path.empty() ? std::string() : fmt::format("\n    flight recorder: {}", path)) +
                     "\n---> HINT: compare comm_traces/rank_*.json of every rank: on the group that timed out, the "
                     "rank whose last seq is lower never posted the collective the others wait in; a rank with no "
                     "trace was killed or hung outside any wait. If steps legitimately take longer, raise "
                     "reliability.collective_timeout_s (0 disables the timeout)";
    if (options_.on_fault) {
        try {
            options_.on_fault(kExitCollectiveTimeout, abort_message_);
        } catch (const std::exception&) {
            // the exit record is best effort: the timeout is reported by the exception either way
        }
    }
    throw CollectiveTimeoutError(abort_message_);
}

void CollectiveWatch::notify_peers() {
    if (notice_comm_ == MPI_COMM_NULL) return;
    int size = 1;
    MPI_Comm_size(notice_comm_, &size);
    notice_out_ = world_rank_;
    std::vector<MPI_Request> sends;
    for (int r = 0; r < size; ++r) {
        if (r == world_rank_) continue;
        MPI_Request req = MPI_REQUEST_NULL;
        // Errors are ignored: a peer may be dead; the notice is best effort.
        if (MPI_Isend(&notice_out_, 1, MPI_INT, r, kNoticeTag, notice_comm_, &req) == MPI_SUCCESS) sends.push_back(req);
    }
    // Small messages go out eagerly; give them a moment of progress, but never wait for a receiver.
    const double t0 = now_seconds();
    int done = 0;
    while (!done && now_seconds() - t0 < kNoticeSendSeconds) {
        if (MPI_Testall(static_cast<int>(sends.size()), sends.data(), &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) break;
    }
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
        const nlohmann::ordered_json j = {{"rank", world_rank_},
                                          {"host", host_},
                                          {"pid", static_cast<int>(getpid())},
                                          {"time", utc_iso8601(unix_seconds())},
                                          {"reason", reason},
                                          {"collective_timeout_s", options_.collective_timeout_s},
                                          {"pending", pending},
                                          {"communicators", comms}};
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
