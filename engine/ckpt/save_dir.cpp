// save_dir.cpp: see save_dir.h. POSIX calls where atomicity matters (link, rename, O_EXCL); /proc for process start
// times.
#include "engine/ckpt/save_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <system_error>

#include "comm/flight_recorder.h"
#include "engine/ckpt/atomic_dir.h"
#include "engine/core/check.h"
#include "engine/core/log.h"

namespace ms {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

[[noreturn]] void throw_unwritable(const std::string& save, const std::string& what, int err) {
    throw UserError(
        fmt::format("checkpoint.save '{}' is not writable: {}: {}; the first save would fail\n---> HINT: "
                    "point checkpoint.save at a writable directory (on a filesystem every rank can reach)",
                    save, what, std::generic_category().message(err)));
}

// Field 22 of /proc/<pid>/stat: the process's start time in clock ticks after boot; nullopt when unreadable.
std::optional<uint64_t> process_start_ticks(int64_t pid) {
    std::ifstream f(fmt::format("/proc/{}/stat", pid));
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t comm_end = stat.rfind(')');  // the command name may hold spaces and parentheses
    if (comm_end == std::string::npos) return std::nullopt;
    std::istringstream rest(stat.substr(comm_end + 1));
    std::string field;
    for (int i = 3; i <= 22 && rest >> field; ++i) {
        if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
    }
    return std::nullopt;
}

std::string read_small_file(const std::string& path, bool* exists) {
    std::ifstream f(path);
    *exists = static_cast<bool>(f);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Whether the process a lock names may still be running. Another host's processes cannot be seen from here.
bool holder_may_be_alive(const json& holder, const std::string& host) {
    const int64_t pid = holder["pid"].get<int64_t>();
    if (holder["host"].get<std::string>() != host) return true;
    if (pid == static_cast<int64_t>(::getpid())) return false;  // an earlier process that had this pid (a container)
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
    // The pid exists: the holder, unless it was reused since (0: the holder could not read its start time).
    const auto it = holder.find("proc_start");
    const uint64_t then = it != holder.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
    const auto now = process_start_ticks(pid);
    return then == 0 || !now || *now == then;
}

}  // namespace

void check_dir_writable(const std::string& save) {
    std::error_code ec;
    fs::create_directories(save, ec);
    if (ec) throw_unwritable(save, "cannot create it", ec.value());
    const std::string probe = fmt::format("{}/.write_probe.{}.{}", save, host_name(), ::getpid());
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) throw_unwritable(save, fmt::format("cannot create a file in it ('{}')", probe), errno);
    const bool written = ::write(fd, "x", 1) == 1;
    const int err = errno;
    ::close(fd);
    ::unlink(probe.c_str());
    if (!written) throw_unwritable(save, fmt::format("cannot write to '{}'", probe), err);
}

uint64_t free_bytes(const std::string& dir) {
    struct statvfs st {};
    if (::statvfs(dir.c_str(), &st) != 0) throw_unwritable(dir, "cannot read its filesystem's free space", errno);
    return static_cast<uint64_t>(st.f_bavail) * static_cast<uint64_t>(st.f_frsize);
}

SaveDirLock::SaveDirLock(const std::string& save) {
    path_ = (fs::path(save) / kLockFile).string();
    const std::string host = host_name();
    const int64_t pid = ::getpid();
    content_ = json{{"host", host},
                    {"pid", pid},
                    {"started", utc_iso8601(unix_seconds())},
                    {"proc_start", process_start_ticks(pid).value_or(0)}}
                   .dump() +
               "\n";
    const std::string mine = fmt::format("{}.{}.{}", path_, host, pid);
    write_file_atomic(mine, content_);
    // Two runs that find the same stale lock race to replace it: a bounded number of rounds, each re-reading.
    constexpr int kRounds = 3;
    for (int round = 0; round < kRounds; ++round) {
        // NFS may report a link(2) that happened as failed (a lost reply): the file's link count says.
        const bool linked = ::link(mine.c_str(), path_.c_str()) == 0;
        const int link_error = errno;
        struct stat st {};
        if (linked || (::stat(mine.c_str(), &st) == 0 && st.st_nlink == 2)) {
            ::unlink(mine.c_str());
            fsync_dir(save);
            return;
        }
        if (link_error != EEXIST) {
            ::unlink(mine.c_str());
            throw_unwritable(save, fmt::format("cannot create the lock '{}' (a hard link of '{}')", path_, mine),
                             link_error);
        }
        bool exists = false;
        const std::string text = read_small_file(path_, &exists);
        if (!exists) continue;  // released meanwhile
        const json holder = json::parse(text, nullptr, /*allow_exceptions=*/false);
        const bool valid = holder.is_object() && holder.contains("host") && holder["host"].is_string() &&
                           holder.contains("pid") && holder["pid"].is_number_integer() && holder.contains("started") &&
                           holder["started"].is_string();
        if (!valid || holder_may_be_alive(holder, host)) {
            ::unlink(mine.c_str());
            throw UserError(fmt::format(
                "checkpoint.save '{}' is in use by another run: its lock '{}' is held by {}\n---> HINT: wait for that "
                "run to end, or set checkpoint.save to another directory; if no run uses it (the holder is gone), "
                "remove '{}'",
                save, path_,
                valid ? fmt::format("pid {} on host {} (started {})", holder["pid"].get<int64_t>(),
                                    holder["host"].get<std::string>(), holder["started"].get<std::string>())
                      : fmt::format("something this program did not write ('{}')", text.substr(0, 80)),
                path_));
        }
        // A dead holder on this host: move its lock aside under this process's name, and check that what moved is
        // what was judged (another run may have taken the lock over in between; then put it back).
        const std::string aside = mine + ".stale";
        if (::rename(path_.c_str(), aside.c_str()) != 0) continue;
        bool moved = false;
        if (read_small_file(aside, &moved) != text) {
            if (::link(aside.c_str(), path_.c_str()) != 0) log_warn("checkpoint: could not restore the lock {}", path_);
            ::unlink(aside.c_str());
            continue;
        }
        ::unlink(aside.c_str());
        log_warn(
            "checkpoint: taking over the lock '{}' of pid {} on this host ({}, started {}): that process is gone (a "
            "run that crashed or was killed)",
            path_, holder["pid"].get<int64_t>(), host, holder["started"].get<std::string>());
    }
    ::unlink(mine.c_str());
    throw UserError(
        fmt::format("checkpoint.save '{}': could not take its lock '{}' in {} attempts: another run is starting with "
                    "the same directory\n---> HINT: run one job per checkpoint.save directory",
                    save, path_, kRounds));
}

SaveDirLock::~SaveDirLock() {
    bool exists = false;
    if (read_small_file(path_, &exists) == content_ && exists) ::unlink(path_.c_str());
}

}  // namespace ms
