// run_end.cpp: see run_end.h.
#include "engine/train/run_end.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "comm/flight_recorder.h"
#include "comm/process_groups.h"
#include "engine/core/check.h"
#include "engine/core/log.h"

namespace ms {
namespace {

namespace fs = std::filesystem;

// ---- signals: the first only sets the flag; everything else happens where the ranks agree ----

volatile std::sig_atomic_t g_stop_signal = 0;

// Who writes the exit record: record_exit() or a second signal's handler, whichever claims it first; the code it
// claimed with, for a handler that comes later and must exit with it.
std::atomic<int> g_exit_claimed{0};
std::atomic<int> g_exit_code{0};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free,
              "the signal handler reads these");

bool claim_exit_record(int code) {
    int expected = 0;
    if (!g_exit_claimed.compare_exchange_strong(expected, 1)) return false;
    g_exit_code.store(code);
    return true;
}

// What a second signal's handler writes, prepared when the exit record is armed: the handler may only call
// async-signal-safe functions (open, write, rename, link, clock_gettime), so it formats nothing it could not
// format into a fixed buffer. The same fields as record_exit()'s, without the peers' coordinates.
constexpr size_t kPathMax = 1024;
struct SignalExitFiles {
    std::atomic<bool> ready{false};
    std::atomic<int64_t> iteration{0};
    int rank = 0;
    char output_dir[kPathMax], status_dir[kPathMax], events_dir[kPathMax];
    char rank_file[kPathMax], rank_tmp[kPathMax], top_file[kPathMax], top_tmp[kPathMax], events_file[kPathMax];
    char host_json[256];  // the host as a JSON string, quotes included
};
SignalExitFiles g_signal_files;

// A fixed buffer that async-signal-safe code appends to; what does not fit is cut off.
struct SafeText {
    char text[4096];
    size_t size = 0;
    SafeText& add(const char* s) {
        while (*s && size + 1 < sizeof(text)) text[size++] = *s++;
        text[size] = '\0';
        return *this;
    }
    SafeText& add_int(int64_t v, int width = 0) {
        char digits[24];
        int n = 0;
        const bool negative = v < 0;
        uint64_t u = negative ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
        do {
            digits[n++] = static_cast<char>('0' + u % 10);
            u /= 10;
        } while (u != 0);
        while (n < width) digits[n++] = '0';
        if (negative) add("-");
        while (n > 0) {
            const char c[2] = {digits[--n], '\0'};
            add(c);
        }
        return *this;
    }
    // "2026-11-29T23:10:00.123Z", as utc_iso8601(); the civil date from days since 1970 (H. Hinnant's algorithm).
    SafeText& add_utc_now() {
        timespec ts{};
        clock_gettime(CLOCK_REALTIME, &ts);
        const int64_t secs = ts.tv_sec, days = secs / 86400, sod = secs % 86400;
        const int64_t z = days + 719468, era = z / 146097, doe = z - era * 146097;
        const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
        const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
        const int64_t day = doy - (153 * mp + 2) / 5 + 1, month = mp < 10 ? mp + 3 : mp - 9;
        const int64_t year = yoe + era * 400 + (month <= 2);
        add("\"").add_int(year, 4).add("-").add_int(month, 2).add("-").add_int(day, 2).add("T");
        add_int(sod / 3600, 2).add(":").add_int(sod / 60 % 60, 2).add(":").add_int(sod % 60, 2).add(".");
        return add_int(ts.tv_nsec / 1000000, 3).add("Z\"");
    }
};

bool write_all(const char* path, const SafeText& t) {
    const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    size_t done = 0;
    while (done < t.size) {
        const ssize_t n = ::write(fd, t.text + done, t.size - done);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
    }
    return ::close(fd) == 0 && done == t.size;
}

// The exit record of a second signal: exit_status/rank_XXXXX.json, exit_status.json (rank 0 always, another rank
// only when none exists) and the exit event. Async-signal-safe.
void write_signal_exit_record(int sig, int first_sig) {
    SignalExitFiles& f = g_signal_files;
    if (!f.ready.load()) return;
    SafeText reason;
    reason.add("second stop signal (").add(signal_name(sig)).add(", the first was ").add(signal_name(first_sig));
    reason.add("): exited at once, nothing saved; a requeue resumes from the last committed checkpoint");
    const int64_t it = f.iteration.load();
    SafeText status;
    status.add("{\n \"code\": ").add_int(128 + sig).add(",\n \"reason\": \"").add(reason.text);
    status.add("\",\n \"iteration\": ").add_int(it).add(",\n \"rank\": ").add_int(f.rank);
    status.add(",\n \"host\": ").add(f.host_json).add(",\n \"time\": ").add_utc_now();
    status.add(",\n \"requeue\": true,\n \"failed_rank\": {\"rank\": ").add_int(f.rank).add(", \"host\": ");
    status.add(f.host_json).add("}\n}\n");
    ::mkdir(f.output_dir, 0755);
    ::mkdir(f.status_dir, 0755);
    if (write_all(f.rank_tmp, status)) ::rename(f.rank_tmp, f.rank_file);
    if (write_all(f.top_tmp, status)) {
        if (f.rank == 0) {
            ::rename(f.top_tmp, f.top_file);
        } else {
            [[maybe_unused]] const int linked = ::link(f.top_tmp, f.top_file);  // only when none exists
            ::unlink(f.top_tmp);
        }
    }
    SafeText line;
    line.add("{\"time\":").add_utc_now().add(",\"event\":\"exit\",\"rank\":").add_int(f.rank);
    line.add(",\"code\":").add_int(128 + sig).add(",\"reason\":\"").add(reason.text);
    line.add("\",\"iteration\":").add_int(it).add("}\n");
    if (f.rank != 0) ::mkdir(f.events_dir, 0755);
    const int fd = ::open(f.events_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
        [[maybe_unused]] const ssize_t n = ::write(fd, line.text, line.size);
        ::close(fd);
    }
}

extern "C" void on_stop_signal(int sig) {
    const int first = g_stop_signal;
    if (first == 0) {
        g_stop_signal = sig;
        return;
    }
    SafeText msg;
    msg.add("mindspeed-train: second stop signal (").add(signal_name(sig)).add("): exiting now, nothing saved\n");
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, msg.text, msg.size);
    if (claim_exit_record(128 + sig)) {
        write_signal_exit_record(sig, first);
        std::signal(sig, SIG_DFL);
        raise(sig);  // delivered when this handler returns: killed by the signal, as the record says
        return;
    }
    _exit(g_exit_code.load());  // the run recorded how it ends (it is finishing): exit with that code at once
}

// ---- the exit record: process state, since apps/main.cpp records after the run's objects are gone ----

struct ExitRecord {
    bool armed = false, written = false;
    std::string output_dir, host;
    int rank = 0;
    int64_t iteration = 0;
    std::vector<std::string> hosts;  // by world rank; empty: only this rank's is known
    int tp_size = 0, dp_size = 0;    // the layout once a Reliability exists; 0: not yet
};

ExitRecord& exit_record() {
    static ExitRecord r;
    return r;
}

// One line, one write(2), O_APPEND: lines from one process never interleave, and each is on disk when it returns.
void append_line(const fs::path& path, const std::string& line) {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    const std::string text = line + "\n";
    [[maybe_unused]] const ssize_t n = ::write(fd, text.data(), text.size());
    ::close(fd);
}

// Whole file or nothing: a reader never sees half a JSON object. exclusive: only if `path` does not exist yet.
bool write_file_atomic(const fs::path& path, const std::string& text, bool exclusive = false) {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    const fs::path tmp = path.string() + fmt::format(".tmp.{}", getpid());
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) return false;
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !ok) return false;
    if (exclusive) {
        const bool linked = ::link(tmp.c_str(), path.c_str()) == 0;
        ::unlink(tmp.c_str());
        return linked;
    }
    return ::rename(tmp.c_str(), path.c_str()) == 0;
}

std::string rank_file(int rank, const char* ext) { return fmt::format("rank_{:05d}.{}", rank, ext); }

void copy_path(char (&out)[kPathMax], const fs::path& path) {
    const std::string& p = path.native();
    const size_t n = std::min(p.size(), kPathMax - 1);
    p.copy(out, n);
    out[n] = '\0';
}

// Fills g_signal_files from the armed record (its directory, rank and host); no second signal writes while it
// is being filled.
void prepare_signal_exit_record(const ExitRecord& r) {
    SignalExitFiles& f = g_signal_files;
    f.ready.store(false);
    const fs::path dir(r.output_dir);
    const std::string host = nlohmann::json(r.host).dump();
    if (dir.native().size() + 64 >= kPathMax || host.size() >= sizeof(f.host_json)) return;
    const std::string tmp = fmt::format(".tmp.{}.signal", getpid());
    f.rank = r.rank;
    copy_path(f.output_dir, dir);
    copy_path(f.status_dir, dir / "exit_status");
    copy_path(f.events_dir, dir / "events");
    copy_path(f.rank_file, dir / "exit_status" / rank_file(r.rank, "json"));
    copy_path(f.rank_tmp, dir / "exit_status" / (rank_file(r.rank, "json") + tmp));
    copy_path(f.top_file, dir / "exit_status.json");
    copy_path(f.top_tmp, dir / ("exit_status.json" + tmp));
    copy_path(f.events_file, r.rank == 0 ? dir / "events.jsonl" : dir / "events" / rank_file(r.rank, "jsonl"));
    host.copy(f.host_json, host.size());
    f.host_json[host.size()] = '\0';
    f.ready.store(true);
}

void write_event(const ExitRecord& r, const std::string& type, nlohmann::json fields, bool local) {
    if (!r.armed || (r.rank != 0 && !local)) return;
    nlohmann::ordered_json j = {{"time", utc_iso8601(unix_seconds())}, {"event", type}, {"rank", r.rank}};
    for (const auto& [key, value] : fields.items()) j[key] = value;
    const fs::path dir(r.output_dir);
    append_line(r.rank == 0 ? dir / "events.jsonl" : dir / "events" / rank_file(r.rank, "jsonl"), j.dump());
}

bool requeue(int code) { return code == kExitSignal || code == kExitCollectiveTimeout; }

// {rank, host, [tp, pp, dp]}: a world rank as the status names it.
nlohmann::ordered_json rank_json(const ExitRecord& r, int rank) {
    nlohmann::ordered_json j = {{"rank", rank}};
    j["host"] = rank == r.rank                               ? r.host
                : static_cast<size_t>(rank) < r.hosts.size() ? r.hosts[static_cast<size_t>(rank)]
                                                             : std::string("?");
    if (r.tp_size > 0 && r.dp_size > 0) {
        const GridCoord c = coord_of(rank, r.tp_size, r.dp_size);
        j["tp"] = c.tp;
        j["pp"] = c.pp;
        j["dp"] = c.dp;
    }
    return j;
}

nlohmann::ordered_json lost_json(const ExitRecord& r, const LostRank& l) {
    nlohmann::ordered_json j = rank_json(r, l.world_rank);
    j["state"] = l.state;
    return j;
}

}  // namespace

// ---- signals ----

void install_signal_handlers() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // file writes and sleeps in progress carry on
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGUSR1, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
}

int stop_signal() { return g_stop_signal; }
const volatile std::sig_atomic_t* stop_signal_flag() { return &g_stop_signal; }

const char* signal_name(int sig) {
    switch (sig) {
        case SIGTERM:
            return "SIGTERM";
        case SIGUSR1:
            return "SIGUSR1";
        case SIGUSR2:
            return "SIGUSR2";
        case SIGINT:
            return "SIGINT";
        case SIGKILL:
            return "SIGKILL";
        default:
            return "signal";
    }
}

// ---- exit record ----

void arm_exit_record(std::string output_dir, int rank, std::vector<std::string> hosts) {
    ExitRecord& r = exit_record();
    r = ExitRecord{};
    r.armed = true;
    r.output_dir = std::move(output_dir);
    r.rank = rank;
    r.host = static_cast<size_t>(rank) < hosts.size() ? hosts[static_cast<size_t>(rank)] : std::string("?");
    r.hosts = std::move(hosts);
    g_exit_claimed.store(0);  // a new run's record, not yet written (r.written is reset above)
    prepare_signal_exit_record(r);
}

std::string describe_rank(int world_rank) {
    const nlohmann::ordered_json j = rank_json(exit_record(), world_rank);
    if (!j.contains("tp")) return fmt::format("world rank {} (host {})", world_rank, j["host"].get<std::string>());
    return fmt::format("world rank {} (host {}, tp {}, pp {}, dp {})", world_rank, j["host"].get<std::string>(),
                       j["tp"].get<int>(), j["pp"].get<int>(), j["dp"].get<int>());
}

void record_exit(int code, const std::string& reason, int failed_rank, const std::vector<LostRank>& lost) {
    ExitRecord& r = exit_record();
    if (!r.armed || r.written || !claim_exit_record(code)) return;  // a second signal may have written it
    r.written = true;
    const nlohmann::ordered_json failed = !lost.empty()      ? lost_json(r, lost.front())
                                          : failed_rank >= 0 ? rank_json(r, failed_rank)
                                                             : rank_json(r, r.rank);
    nlohmann::ordered_json status = {{"code", code},
                                     {"reason", reason},
                                     {"iteration", r.iteration},
                                     {"rank", r.rank},
                                     {"host", r.host},
                                     {"time", utc_iso8601(unix_seconds())},
                                     {"requeue", requeue(code)},
                                     {"failed_rank", failed}};
    nlohmann::ordered_json hung = nlohmann::ordered_json::array();
    for (const LostRank& l : lost) hung.push_back(lost_json(r, l));
    if (!lost.empty()) status["hung_ranks"] = hung;
    const std::string text = status.dump(1) + "\n";
    const fs::path dir(r.output_dir);
    write_file_atomic(dir / "exit_status" / rank_file(r.rank, "json"), text);
    bool wrote_status = false;
    if (r.rank == 0)
        wrote_status = write_file_atomic(dir / "exit_status.json", text);
    else if (code != kExitOk)
        wrote_status = write_file_atomic(dir / "exit_status.json", text, /*exclusive=*/true);
    nlohmann::json fields = {{"code", code}, {"reason", reason}, {"iteration", r.iteration}, {"failed_rank", failed}};
    if (!lost.empty()) fields["hung_ranks"] = hung;
    write_event(r, "exit", fields, code != kExitOk);
    // Rank 0 ends events.jsonl with its exit. When ranks were lost, the launcher may kill rank 0 before it gets to
    // that (or rank 0 is the one lost): the rank that wrote the status ends it too.
    if (r.rank != 0 && wrote_status && !lost.empty()) {
        nlohmann::ordered_json j = {{"time", utc_iso8601(unix_seconds())}, {"event", "exit"}, {"rank", r.rank}};
        for (const auto& [key, value] : fields.items()) j[key] = value;
        append_line(dir / "events.jsonl", j.dump());
    }
}

void set_exit_layout(const std::string& output_dir, int rank, std::string host, int tp_size, int dp_size) {
    // A new run's record, with the hosts the trainer armed it with for this run's directory.
    ExitRecord& r = exit_record();
    const bool same_run = r.armed && !r.written && r.rank == rank && r.output_dir == output_dir;
    arm_exit_record(output_dir, rank, same_run ? std::move(r.hosts) : std::vector<std::string>{});
    r.host = std::move(host);
    r.tp_size = tp_size;
    r.dp_size = dp_size;
    prepare_signal_exit_record(r);
}

void set_exit_iteration(int64_t it) {
    exit_record().iteration = it;
    g_signal_files.iteration.store(it);
}

int64_t exit_iteration() { return exit_record().iteration; }

void record_event(const std::string& type, nlohmann::json fields, bool local) {
    write_event(exit_record(), type, std::move(fields), local);
}

nlohmann::json lost_ranks_json(const std::vector<LostRank>& lost) {
    nlohmann::json hung = nlohmann::json::array();
    for (const LostRank& l : lost) hung.push_back(nlohmann::json(lost_json(exit_record(), l)));
    return hung;
}

std::optional<int> recorded_exit_code() {
    if (g_exit_claimed.load() == 0) return std::nullopt;
    return g_exit_code.load();
}

}  // namespace ms
