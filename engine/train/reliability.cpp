#include "engine/train/reliability.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <limits>
#include <mutex>
#include <thread>

#include "comm/flight_recorder.h"
#include "comm/process_groups.h"
#include "engine/backends/backend.h"
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

constexpr int kLossBad = 1, kGradBad = 2, kNaN = 4, kBitsPerRank = 8;

}  // namespace

// ---- fault injection ----

FaultInjection parse_fault_injection(std::string_view spec, std::string_view source, int world_size,
                                     int64_t train_iters) {
    FaultInjection f;
    f.spec = std::string(spec);
    f.source = std::string(source);
    if (spec.empty()) return f;
    const auto bad = [&](const std::string& what) {
        return UserError(fmt::format(
            "config error: {} = '{}': {}\n---> HINT: write <kind>@step=<S>[,rank=<R>] with kind crash, hang, nan or "
            "sigterm, S an iteration in [1, training.train_iters({})] and R a world rank in [0, {}) (0 when "
            "omitted), e.g. crash@step=5,rank=1",
            source, spec, what, train_iters, world_size));
    };
    const size_t at = spec.find('@');
    if (at == std::string_view::npos) throw bad("there is no '@' after the fault kind");
    const std::string_view kind = spec.substr(0, at);
    if (kind == "crash")
        f.kind = FaultKind::kCrash;
    else if (kind == "hang")
        f.kind = FaultKind::kHang;
    else if (kind == "nan")
        f.kind = FaultKind::kNan;
    else if (kind == "sigterm")
        f.kind = FaultKind::kSigterm;
    else
        throw bad(fmt::format("unknown fault kind '{}'", kind));
    bool has_step = false, has_rank = false;
    std::string_view rest = spec.substr(at + 1);
    while (!rest.empty()) {
        const size_t comma = rest.find(',');
        const std::string_view item = rest.substr(0, comma);
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
        const size_t eq = item.find('=');
        const std::string_view key = item.substr(0, eq);
        const std::string_view value = eq == std::string_view::npos ? std::string_view() : item.substr(eq + 1);
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
        if (eq == std::string_view::npos || value.empty() || ec != std::errc() || end != value.data() + value.size()) {
            throw bad(fmt::format("'{}' is not key=<integer>", item));
        }
        if (key == "step" && !has_step) {
            has_step = true;
            f.step = v;
        } else if (key == "rank" && !has_rank) {
            has_rank = true;
            f.rank = static_cast<int>(v);
            if (v < 0 || v >= world_size) throw bad(fmt::format("rank {} is not in [0, {})", v, world_size));
        } else {
            throw bad(fmt::format("'{}' is {}", key, key == "step" || key == "rank" ? "given twice" : "not a key"));
        }
    }
    if (!has_step) throw bad("step=<S> is missing");
    if (f.step < 1 || f.step > train_iters) {
        throw bad(fmt::format("step {} is outside [1, {}]: the fault would never fire", f.step, train_iters));
    }
    return f;
}

FaultInjection resolve_fault_injection(const ReliabilityConfig& cfg, int world_size, int64_t train_iters) {
    const char* env = std::getenv("MS_INJECT");
    if (env && *env) return parse_fault_injection(env, "MS_INJECT", world_size, train_iters);
    return parse_fault_injection(cfg.inject, "reliability.inject", world_size, train_iters);
}

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

// ---- Reliability ----

Reliability::Reliability(const Config& cfg, const ProcessGroups& groups, std::string host)
    : cfg_(cfg),
      rank_(groups.world->rank()),
      world_size_(groups.world->size()),
      tp_(groups.tp_size),
      dp_(groups.dp_size),
      pp_stage_(groups.pp_rank),
      last_stage_(groups.is_last_stage()),
      host_(std::move(host)),
      inject_(resolve_fault_injection(cfg.reliability, world_size_, cfg.training.train_iters)) {
    // A new run's record, with the hosts the trainer armed it with for this run's directory.
    ExitRecord& r = exit_record();
    const bool same_run = r.armed && !r.written && r.rank == rank_ && r.output_dir == cfg.run.output_dir;
    arm_exit_record(cfg.run.output_dir, rank_, same_run ? std::move(r.hosts) : std::vector<std::string>{});
    r.host = host_;
    r.tp_size = tp_;
    r.dp_size = dp_;
    prepare_signal_exit_record(r);
}

CollectiveWatchOptions Reliability::watch_options() const {
    CollectiveWatchOptions o;
    o.collective_timeout_s = cfg_.reliability.collective_timeout_s;
    o.trace_dir = (fs::path(cfg_.run.output_dir) / "comm_traces").string();
    o.signal_flag = stop_signal_flag();
    o.tp_size = tp_;
    o.dp_size = dp_;
    o.on_fault = [](int code, const std::string& message, const std::vector<LostRank>& lost) {
        const ExitRecord& r = exit_record();
        nlohmann::json hung = nlohmann::json::array();
        for (const LostRank& l : lost) hung.push_back(nlohmann::json(lost_json(r, l)));
        write_event(r, "collective_timeout", {{"message", message}, {"hung_ranks", hung}}, /*local=*/true);
        record_exit(code, message, -1, lost);
    };
    return o;
}

void Reliability::start(Communicator& world, uint64_t config_hash) {
    const fs::path dir(cfg_.run.output_dir);
    if (rank_ == 0) {
        std::error_code ec;
        fs::create_directories(dir, ec);
        fs::remove(dir / "exit_status.json", ec);
        fs::remove_all(dir / "exit_status", ec);
        if (fs::exists(dir / "comm_traces", ec)) {
            fs::remove_all(dir / "comm_traces.prev", ec);
            fs::rename(dir / "comm_traces", dir / "comm_traces.prev", ec);
        }
    }
    world.barrier();  // nobody writes this run's files before they are cleared
    nlohmann::json fields = {{"config_hash", fmt::format("{:016x}", config_hash)},
                             {"world_size", world_size_},
                             {"tp", tp_},
                             {"pp", world_size_ / (tp_ * dp_)},
                             {"dp", dp_},
                             {"nan_policy", cfg_.reliability.nan_policy},
                             {"collective_timeout_s", cfg_.reliability.collective_timeout_s},
                             {"host", host_},
                             {"pid", static_cast<int>(getpid())}};
    if (inject_.kind != FaultKind::kNone) {
        fields["inject"] = {{"spec", inject_.spec}, {"source", inject_.source}};
        log_info("fault injection armed: {} (from {})", inject_.spec, inject_.source);
    }
    event("start", fields);
}

void Reliability::event(const std::string& type, nlohmann::json fields, bool local) const {
    write_event(exit_record(), type, std::move(fields), local);
}

void Reliability::begin_step(int64_t it) {
    exit_record().iteration = it;
    g_signal_files.iteration.store(it);
    if (inject_.kind == FaultKind::kNone || inject_.step != it || inject_.rank != rank_) return;
    const char* what = inject_.kind == FaultKind::kCrash     ? "crash: SIGKILL to itself"
                       : inject_.kind == FaultKind::kHang    ? "hang: sleeping forever"
                       : inject_.kind == FaultKind::kSigterm ? "sigterm: SIGTERM to itself"
                                                             : nullptr;
    if (!what) return;  // nan fires in step_boundary
    event("fault_injected", {{"iteration", it}, {"kind", inject_.spec}}, /*local=*/true);
    std::fprintf(stderr, "[rank %d] fault injection (%s) at iteration %lld: %s\n", rank_, inject_.source.c_str(),
                 static_cast<long long>(it), what);
    std::fflush(stderr);
    std::fflush(stdout);
    switch (inject_.kind) {
        case FaultKind::kCrash:
            raise(SIGKILL);
            break;
        case FaultKind::kHang:
            while (true) pause();  // a signal handler returns here; only SIGKILL or a second SIGTERM ends it
        case FaultKind::kSigterm:
            raise(SIGTERM);
            break;
        default:
            break;
    }
}

StepVerdict Reliability::step_boundary(Communicator& world, int64_t it, float loss, std::span<float> grads,
                                       Backend& backend, bool check_grads) {
    if (inject_.kind == FaultKind::kNan && inject_.step == it && inject_.rank == rank_ && !grads.empty()) {
        backend.synchronize();  // the host writes the gradients
        grads[0] = std::numeric_limits<float>::quiet_NaN();
        nan_injected_ = true;  // its event is written outside the allocation guard
    }
    const double grad_sq =
        check_grads ? backend.sum_squares(Tensor::f32(grads.data(), {static_cast<int64_t>(grads.size())})) : 0.0;
    int bits = 0;
    if (last_stage_ && !std::isfinite(loss)) bits |= kLossBad | (std::isnan(loss) ? kNaN : 0);
    if (!std::isfinite(grad_sq)) bits |= kGradBad | (std::isnan(grad_sq) ? kNaN : 0);
    local_bits_ = bits;
    // MAX over ranks of: the stop signal; (world - rank) of the lowest rank that has one; (world - rank) of the
    // lowest rank that found a NaN/Inf, with what it found in the low bits.
    const int sig = stop_signal();
    std::array<int32_t, 3> flags = {sig, sig ? world_size_ - rank_ : 0,
                                    bits ? (world_size_ - rank_) * kBitsPerRank + bits : 0};
    world.all_reduce(std::span<int32_t>(flags), ReduceOp::kMax).wait();
    if (nan_injected_ && flags[2] != 0 && cfg_.reliability.nan_policy != "skip") log_injected_nan(it);
    StepVerdict v;
    if (flags[0] != 0) {
        v.stop = true;
        signal_ = flags[0];
        signal_rank_ = world_size_ - flags[1];
    }
    skipped_ = false;
    if (flags[2] == 0) return v;
    bad_rank_ = world_size_ - flags[2] / kBitsPerRank;
    bad_bits_ = flags[2] % kBitsPerRank;
    if (cfg_.reliability.nan_policy == "skip") {
        v.skip_step = true;
        skipped_ = true;
        return v;
    }
    const int bad_stage = bad_rank_ / (tp_ * dp_);  // rank = tp_rank + tp * (dp_rank + dp * pp_rank)
    const std::string head = fmt::format("numerical error: Rank {}, node {}, pipeline stage {}, iteration {}: ", rank_,
                                         host_, pp_stage_, it);
    const std::string found =
        local_bits_ ? fmt::format("found {} before the data-parallel reduction", describe_bad(local_bits_))
                    : fmt::format(
                          "rank {} (pipeline stage {}) found {} before the data-parallel reduction (its "
                          "message names it); this rank's loss and gradients are finite",
                          bad_rank_, bad_stage, describe_bad(bad_bits_));
    const std::string message = head + found +
                                ". reliability.nan_policy = fail stops every rank before the optimizer update "
                                "(exit code 17)\n---> HINT: the run resumes from its last checkpoint; if the loss "
                                "diverged, lower optimizer.lr or lengthen lr_schedule.lr_warmup_iters; "
                                "reliability.nan_policy: skip drops such iterations instead";
    event("nan_fail", {{"iteration", it}, {"found_by", bad_rank_}, {"what", describe_bad(bad_bits_)}},
          /*local=*/local_bits_ != 0);
    record_exit(kExitNumerical, message);
    throw NumericalError(message);
}

void Reliability::log_injected_nan(int64_t it) {
    nan_injected_ = false;
    event("fault_injected", {{"iteration", it}, {"kind", inject_.spec}}, /*local=*/true);
}

void Reliability::after_step(int64_t it) {
    if (nan_injected_) log_injected_nan(it);
    if (skipped_) {
        const int bad_stage = bad_rank_ / (tp_ * dp_);
        if (local_bits_) {
            log_warn(
                "Rank {}, node {}, pipeline stage {}, iteration {}: found {}; reliability.nan_policy = skip: no "
                "rank takes this optimizer step",
                rank_, host_, pp_stage_, it, describe_bad(local_bits_));
        }
        log_info(
            "iteration {}: skipped the optimizer step on every rank: rank {} (pipeline stage {}) found {} "
            "(reliability.nan_policy = skip)",
            it, bad_rank_, bad_stage, describe_bad(bad_bits_));
        event("nan_skip", {{"iteration", it}, {"found_by", bad_rank_}, {"what", describe_bad(bad_bits_)}},
              /*local=*/local_bits_ != 0);
        skipped_ = false;
    }
    if (signal_ != 0) log_signal(it, "train");
}

void Reliability::log_signal(int64_t it, std::string_view phase) {
    if (signal_logged_) return;
    signal_logged_ = true;
    event("signal",
          {{"iteration", it}, {"signal", signal_name(signal_)}, {"first_rank", signal_rank_}, {"phase", phase}});
}

bool Reliability::poll_stop(Communicator& world) {
    const int sig = stop_signal();
    std::array<int32_t, 2> flags = {sig, sig ? world_size_ - rank_ : 0};
    world.all_reduce(std::span<int32_t>(flags), ReduceOp::kMax).wait();
    if (flags[0] == 0) return false;
    signal_ = flags[0];
    signal_rank_ = world_size_ - flags[1];
    return true;
}

void Reliability::stop_point(Communicator& world) {
    if (!poll_stop(world)) return;
    const int64_t it = exit_record().iteration;
    log_signal(it, "setup");
    const std::string reason =
        fmt::format("{} received (rank {} first) during setup: stopped before the first training step; nothing to save",
                    signal_name(signal_), signal_rank_);
    log_info("exit: {} (exit code 3: requeue to resume)", reason);
    record_exit(kExitSignal, reason);
    throw SignalStop(reason);
}

int Reliability::exit_on_signal(int64_t it, const std::string& checkpoint_dir, std::string_view phase) {
    log_signal(it, phase.empty() ? "train" : phase);
    const std::string saved = checkpoint_dir.empty() ? "checkpoint.save is not set, so nothing was saved"
                                                     : fmt::format("checkpoint saved to {}", checkpoint_dir);
    const std::string reason =
        phase.empty() ? fmt::format("{} received (rank {} first): stopped after iteration {}; {}", signal_name(signal_),
                                    signal_rank_, it, saved)
                      : fmt::format("{} received (rank {} first) during {}: stopped after iteration {}; {}",
                                    signal_name(signal_), signal_rank_, phase, it, saved);
    log_info("exit: {} (exit code 3: requeue to resume)", reason);
    record_exit(kExitSignal, reason);
    return kExitSignal;
}

int Reliability::finish(int64_t iterations) {
    exit_record().iteration = iterations;
    record_exit(kExitOk, fmt::format("done: trained to iteration {}", iterations));
    return kExitOk;
}

std::string Reliability::describe_bad(int bits) const {
    const char* kind = bits & kNaN ? "NaN" : "Inf";
    if ((bits & kLossBad) && (bits & kGradBad)) return fmt::format("{} in local loss and local grad norm", kind);
    return fmt::format("{} in local {}", kind, bits & kLossBad ? "loss" : "grad norm");
}

// ---- the setup watch ----

struct SetupStopWatch::State {
    std::mutex mutex;
    std::condition_variable wake;
    bool done = false;
    std::thread thread;
};

SetupStopWatch::SetupStopWatch() : state_(std::make_unique<State>()) {
    state_->thread = std::thread([s = state_.get()] {
        constexpr auto kPoll = std::chrono::milliseconds(20);
        std::chrono::steady_clock::time_point seen{};
        std::unique_lock<std::mutex> lock(s->mutex);
        while (!s->wake.wait_for(lock, kPoll, [s] { return s->done; })) {
            const int sig = stop_signal();
            if (sig == 0) continue;
            const auto now = std::chrono::steady_clock::now();
            if (seen == std::chrono::steady_clock::time_point{}) seen = now;
            if (std::chrono::duration<double>(now - seen).count() < kSetupStopGraceS) continue;
            const std::string reason = fmt::format(
                "{} received during setup: setup was still running {:.1f} s later, so this process exited "
                "without waiting for it or for other ranks; nothing to save (no step has run)",
                signal_name(sig), kSetupStopGraceS);
            if (g_exit_claimed.load() != 0) return;  // the main thread is already ending the run
            write_event(exit_record(), "signal", {{"signal", signal_name(sig)}, {"phase", "setup"}}, /*local=*/false);
            log_info("exit: {} (exit code 3: requeue to resume)", reason);
            record_exit(kExitSignal, reason);
            std::fflush(stdout);
            std::fflush(stderr);
            // 3, or the code of an end the main thread recorded first
            _exit(g_exit_claimed.load() != 0 ? g_exit_code.load() : kExitSignal);
        }
    });
}

SetupStopWatch::~SetupStopWatch() {
    {
        std::lock_guard<std::mutex> lock(state_->mutex);
        state_->done = true;
    }
    state_->wake.notify_one();
    state_->thread.join();
}

}  // namespace ms
