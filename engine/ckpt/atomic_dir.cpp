// atomic_dir.cpp: see atomic_dir.h for the protocol. POSIX calls (open/write/fsync/rename) where durability
// matters; std::filesystem for listing and removal.
#include "engine/ckpt/atomic_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>
#include <utility>
#include <vector>

#include "engine/ckpt/checksum.h"
#include "engine/core/check.h"
#include "engine/core/log.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

[[noreturn]] void throw_ckpt(const std::string& msg) { throw UserError("checkpoint error: " + msg, kExitCheckpoint); }

[[noreturn]] void throw_errno(const std::string& what, const std::string& path, int err) {
    throw_ckpt(fmt::format("{} '{}': {}", what, path, std::generic_category().message(err)));
}

[[noreturn]] void throw_ec(const std::string& what, const std::string& path, const std::error_code& ec) {
    throw_ckpt(fmt::format("{} '{}': {}", what, path, ec.message()));
}

std::string parent_dir(const std::string& path) {
    const std::string p = fs::path(path).parent_path().string();
    return p.empty() ? "." : p;
}

// The iteration in a directory name "iter_" + at least 7 digits, nothing else; nullopt for any other name.
std::optional<int64_t> parse_iter_dir_name(std::string_view name) {
    constexpr std::string_view kPrefix = "iter_";
    if (!name.starts_with(kPrefix)) return std::nullopt;
    const std::string_view digits = name.substr(kPrefix.size());
    if (digits.size() < 7 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return std::nullopt;
    int64_t it = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), it);
    if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
    return it;
}

// The tracker's iteration: the file holds decimal digits, optionally surrounded by whitespace (Megatron strips).
// nullopt with `problem` set when it exists but says something else ("release", garbage); nullopt and empty
// problem when there is no tracker.
std::optional<int64_t> read_tracker(const std::string& save, std::string* problem) {
    const std::string path = save + "/" + kTrackerFile;
    std::ifstream f(path);
    if (!f) return std::nullopt;
    std::stringstream ss;
    ss << f.rdbuf();
    std::string text = ss.str();
    const auto first = text.find_first_not_of(" \t\r\n");
    const auto last = text.find_last_not_of(" \t\r\n");
    text = first == std::string::npos ? "" : text.substr(first, last - first + 1);
    int64_t it = -1;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), it);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() || it < 0) {
        *problem = fmt::format("tracker '{}' holds '{}', not an iteration number", path, text.substr(0, 40));
        return std::nullopt;
    }
    return it;
}

// Committed checkpoints (iter_XXXXXXX/ holding a manifest.json), newest first. Existence of the manifest only:
// verification is the caller's choice.
std::vector<int64_t> list_committed(const std::string& save) {
    std::vector<int64_t> its;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(save, ec)) {
        const auto it = parse_iter_dir_name(e.path().filename().string());
        if (it && e.is_directory() && fs::is_regular_file(e.path() / kManifestFile)) its.push_back(*it);
    }
    if (ec) throw_ec("cannot list the checkpoint directory", save, ec);
    std::sort(its.rbegin(), its.rend());
    return its;
}

void remove_tree(const std::string& path) {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) throw_ec("cannot remove", path, ec);
}

struct FileDigest {
    uint64_t size;
    uint64_t xxh64;
};

// Size and XXH64 of a file written by any rank, made durable here (fsync on a read-only descriptor flushes the
// file's dirty pages on Linux no matter which descriptor wrote them).
FileDigest digest_and_sync(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw_errno("cannot open", path, errno);
    Xxh64 x;
    std::vector<unsigned char> buf(1 << 20);
    uint64_t size = 0;
    for (;;) {
        const ssize_t got = ::read(fd, buf.data(), buf.size());
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            const int e = errno;
            ::close(fd);
            throw_errno("cannot read", path, e);
        }
        if (got == 0) break;
        x.update(buf.data(), static_cast<size_t>(got));
        size += static_cast<uint64_t>(got);
    }
    if (::fsync(fd) != 0) {
        const int e = errno;
        ::close(fd);
        throw_errno("cannot fsync", path, e);
    }
    ::close(fd);
    return {size, x.digest()};
}

std::string strip_trailing_slashes(std::string s) {
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    return s;
}

}  // namespace

std::string checkpoint_dir_name(int64_t iteration) {
    MS_CHECK(iteration >= 0, "checkpoint iteration {} is negative", iteration);
    return fmt::format("iter_{:07d}", iteration);
}

std::string checkpoint_tmp_dir(const std::string& save, int64_t iteration) {
    return strip_trailing_slashes(save) + "/" + checkpoint_dir_name(iteration) + ".tmp";
}

void fsync_dir(const std::string& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) throw_errno("cannot open directory", dir, errno);
    if (::fsync(fd) != 0) {
        const int e = errno;
        ::close(fd);
        throw_errno("cannot fsync directory", dir, e);
    }
    ::close(fd);
}

// ---- AtomicFile ----

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_path_(path_ + ".tmp") {
    fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw_errno("cannot create", tmp_path_, errno);
}

AtomicFile::~AtomicFile() {
    if (fd_ >= 0) {
        ::close(fd_);
        ::unlink(tmp_path_.c_str());
    }
}

void AtomicFile::fail(const char* what, int err) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    ::unlink(tmp_path_.c_str());
    throw_errno(what, tmp_path_, err);
}

void AtomicFile::write(const void* data, size_t n) {
    MS_CHECK(fd_ >= 0, "AtomicFile '{}' written after commit", path_);
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t put = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
        if (put < 0 && errno == EINTR) continue;
        if (put < 0) fail("cannot write", errno);
        p += put;
        n -= static_cast<size_t>(put);
    }
}

void AtomicFile::commit() {
    MS_CHECK(fd_ >= 0, "AtomicFile '{}' committed twice", path_);
    if (::fsync(fd_) != 0) fail("cannot fsync", errno);
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) {  // NFS reports deferred write errors here
        const int e = errno;
        ::unlink(tmp_path_.c_str());
        throw_errno("cannot close", tmp_path_, e);
    }
    if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
        const int e = errno;
        ::unlink(tmp_path_.c_str());
        throw_errno(fmt::format("cannot rename '{}' to", tmp_path_).c_str(), path_, e);
    }
    fsync_dir(parent_dir(path_));
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
    AtomicFile f(path);
    f.write(bytes);
    f.commit();
}

// ---- CheckpointWriter ----

CheckpointWriter::CheckpointWriter(std::string save_dir, int64_t iteration)
    : save_dir_(strip_trailing_slashes(std::move(save_dir))), iteration_(iteration) {
    tmp_dir_ = checkpoint_tmp_dir(save_dir_, iteration_);
    std::error_code ec;
    fs::create_directories(save_dir_, ec);
    if (ec) throw_ec("cannot create the checkpoint directory", save_dir_, ec);
    if (fs::exists(tmp_dir_)) remove_tree(tmp_dir_);  // a crashed save of the same iteration
    fs::create_directory(tmp_dir_, ec);
    if (ec) throw_ec("cannot create", tmp_dir_, ec);
}

std::string CheckpointWriter::path(std::string_view relpath) const {
    const fs::path rel(relpath);
    MS_CHECK(!relpath.empty() && rel.is_relative() && rel.lexically_normal().string().rfind("..", 0) != 0,
             "checkpoint file '{}' must be a relative path inside the checkpoint", relpath);
    const fs::path full = fs::path(tmp_dir_) / rel;
    std::error_code ec;
    fs::create_directories(full.parent_path(), ec);
    if (ec) throw_ec("cannot create", full.parent_path().string(), ec);
    return full.string();
}

void CheckpointWriter::write_file(std::string_view relpath, std::string_view bytes) const {
    write_file_atomic(path(relpath), bytes);
}

std::string CheckpointWriter::commit(const json& manifest) {
    MS_CHECK(!committed_, "checkpoint '{}' committed twice", tmp_dir_);
    MS_CHECK(manifest.is_object(), "the checkpoint manifest must be a JSON object, got {}", manifest.type_name());

    // 1. Every file, sorted, with size and checksum; every directory fsynced.
    std::vector<std::string> files;
    std::vector<std::string> dirs = {tmp_dir_};
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(tmp_dir_, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
        const std::string rel = fs::relative(it->path(), tmp_dir_).generic_string();
        if (it->is_directory()) {
            dirs.push_back(it->path().string());
        } else if (!it->is_regular_file() || it->is_symlink()) {
            throw_ckpt(fmt::format("'{}' in '{}' is not a regular file; a checkpoint holds only files and directories",
                                   rel, tmp_dir_));
        } else if (rel.ends_with(".tmp")) {
            throw_ckpt(fmt::format("'{}' in '{}' is an unfinished write (a .tmp file); not committing", rel, tmp_dir_));
        } else if (rel == kManifestFile) {
            throw_ckpt(fmt::format("'{}' already holds a {}; only commit() writes it", tmp_dir_, kManifestFile));
        } else {
            files.push_back(rel);
        }
    }
    if (ec) throw_ec("cannot list", tmp_dir_, ec);
    std::sort(files.begin(), files.end());
    json listing = json::object();
    for (const std::string& rel : files) {
        const FileDigest d = digest_and_sync(tmp_dir_ + "/" + rel);
        listing[rel] = {{"size", d.size}, {"xxh64", xxh64_hex(d.xxh64)}};
    }
    for (const std::string& d : dirs) fsync_dir(d);

    // 2. The manifest: the commit marker inside the directory.
    if (phase_hook_) phase_hook_("manifest");
    json m = manifest;
    m["format_version"] = kManifestFormatVersion;
    m["iteration"] = iteration_;
    m["files"] = std::move(listing);
    write_file_atomic(tmp_dir_ + "/" + kManifestFile, m.dump(2) + "\n");

    // 3. The directory rename. A checkpoint of the same iteration (a rerun after a resume from an older one) is
    //    moved aside first: rename(2) does not replace a non-empty directory.
    if (phase_hook_) phase_hook_("rename");
    const std::string final_dir = save_dir_ + "/" + checkpoint_dir_name(iteration_);
    const std::string displaced = final_dir + ".old.tmp";
    const bool replacing = fs::exists(final_dir);
    if (replacing) {
        if (fs::exists(displaced)) remove_tree(displaced);
        if (::rename(final_dir.c_str(), displaced.c_str()) != 0)
            throw_errno(fmt::format("cannot move the older '{}' aside to", final_dir), displaced, errno);
    }
    if (::rename(tmp_dir_.c_str(), final_dir.c_str()) != 0)
        throw_errno(fmt::format("cannot rename '{}' to", tmp_dir_), final_dir, errno);
    fsync_dir(save_dir_);
    committed_ = true;
    if (replacing) remove_tree(displaced);

    // 4. The tracker, last (Megatron writes the bare number).
    if (phase_hook_) phase_hook_("tracker");
    write_file_atomic(save_dir_ + "/" + kTrackerFile, std::to_string(iteration_));
    return final_dir;
}

// ---- loading side ----

void verify_checkpoint(const std::string& dir_in, bool verify_checksums) {
    const std::string dir = strip_trailing_slashes(dir_in);
    const auto iteration = parse_iter_dir_name(fs::path(dir).filename().string());
    if (!iteration) throw_ckpt(fmt::format("'{}' is not named iter_XXXXXXX", dir));
    if (!fs::is_directory(dir)) throw_ckpt(fmt::format("'{}' does not exist or is not a directory", dir));
    const std::string manifest_path = dir + "/" + kManifestFile;
    std::ifstream f(manifest_path);
    if (!f) throw_ckpt(fmt::format("'{}' has no {} (an unfinished save?)", dir, kManifestFile));
    const json m = json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (m.is_discarded() || !m.is_object())
        throw_ckpt(fmt::format("'{}' is not a JSON object (corrupted manifest)", manifest_path));
    const auto it = m.find("iteration");
    if (it == m.end() || !it->is_number_integer() || it->get<int64_t>() != *iteration)
        throw_ckpt(fmt::format("'{}' says \"iteration\": {}, but the directory is iteration {}", manifest_path,
                               it == m.end() ? std::string("(missing)") : it->dump(), *iteration));
    const auto files = m.find("files");
    if (files == m.end() || !files->is_object())
        throw_ckpt(fmt::format("'{}' has no \"files\" object (corrupted manifest)", manifest_path));
    for (const auto& [rel, entry] : files->items()) {
        const fs::path relp(rel);
        const std::string norm = relp.lexically_normal().generic_string();
        if (rel.empty() || relp.is_absolute() || norm.rfind("..", 0) == 0)
            throw_ckpt(fmt::format("'{}' lists '{}', which is not a path inside the checkpoint", manifest_path, rel));
        const auto size = entry.is_object() ? entry.find("size") : entry.end();
        const auto hash = entry.is_object() ? entry.find("xxh64") : entry.end();
        if (!entry.is_object() || size == entry.end() || !size->is_number_unsigned() || hash == entry.end() ||
            !hash->is_string())
            throw_ckpt(fmt::format("'{}': the entry for '{}' needs \"size\" and \"xxh64\", got {}", manifest_path, rel,
                                   entry.dump()));
        const std::string path = dir + "/" + rel;
        std::error_code ec;
        const auto st = fs::status(path, ec);
        if (ec || !fs::is_regular_file(st)) throw_ckpt(fmt::format("'{}' is listed in the manifest but missing", path));
        const uint64_t actual = fs::file_size(path, ec);
        if (ec) throw_ec("cannot stat", path, ec);
        if (actual != size->get<uint64_t>())
            throw_ckpt(fmt::format("'{}' is {} bytes, but the manifest says {} (truncated or rewritten)", path, actual,
                                   size->get<uint64_t>()));
        if (verify_checksums) {
            const std::string got = xxh64_hex(file_xxh64(path));
            if (got != hash->get<std::string>())
                throw_ckpt(fmt::format("'{}' has XXH64 {}, but the manifest says {} (corrupted on disk)", path, got,
                                       hash->get<std::string>()));
        }
    }
}

std::optional<int64_t> find_latest_committed(const std::string& save_in, bool verify_checksums) {
    const std::string save = strip_trailing_slashes(save_in);
    if (!fs::is_directory(save)) return std::nullopt;
    std::string problem;
    const std::optional<int64_t> tracked = read_tracker(save, &problem);
    if (!problem.empty()) log_warn("checkpoint: {}; using the newest valid checkpoint", problem);
    std::vector<int64_t> candidates;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(save, ec)) {
        const auto it = parse_iter_dir_name(e.path().filename().string());
        if (it && e.is_directory()) candidates.push_back(*it);
    }
    if (ec) throw_ec("cannot list the checkpoint directory", save, ec);
    std::sort(candidates.rbegin(), candidates.rend());
    std::optional<int64_t> newest;
    for (const int64_t it : candidates) {
        try {
            verify_checkpoint(save + "/" + checkpoint_dir_name(it), verify_checksums);
            newest = it;
            break;
        } catch (const UserError& e) {
            log_warn("{}{}; skipping it", e.what(),
                     it == tracked ? fmt::format(" (named by {}/{})", save, kTrackerFile) : std::string());
        }
    }
    if (tracked && newest && *tracked < *newest) {
        log_warn(
            "checkpoint: the tracker {}/{} says {}, but {} is newer and verifies: the tracker is stale (a save that "
            "crashed between committing its directory and writing the tracker, or a tracker moved back by hand); "
            "using iteration {}\n---> HINT: to rewind a run, move the newer iter_* directories away",
            save, kTrackerFile, *tracked, checkpoint_dir_name(*newest), *newest);
    } else if (tracked && (!newest || *tracked > *newest) &&
               std::find(candidates.begin(), candidates.end(), *tracked) == candidates.end()) {
        log_warn("checkpoint: the tracker {}/{} says {}, but there is no {}; using the newest valid checkpoint", save,
                 kTrackerFile, *tracked, checkpoint_dir_name(*tracked));
    }
    return newest;
}

void keep_latest(const std::string& save_in, int k) {
    if (k < 2)
        throw UserError(
            fmt::format("config error: keeping the latest {} checkpoint(s) leaves nothing to fall back "
                        "to when the newest is corrupted; keep at least 2",
                        k));
    const std::string save = strip_trailing_slashes(save_in);
    const std::vector<int64_t> committed = list_committed(save);
    if (committed.empty()) return;
    std::string problem;
    const std::optional<int64_t> tracked = read_tracker(save, &problem);
    bool removed = false;
    for (size_t i = static_cast<size_t>(k); i < committed.size(); ++i) {
        if (committed[i] == tracked) continue;  // the user may have pointed the tracker back at an older one
        remove_tree(save + "/" + checkpoint_dir_name(committed[i]));
        removed = true;
    }
    // Crashed saves (iter_X.tmp, iter_X.old.tmp) older than the newest committed checkpoint can not be in flight:
    // a save starts only after the previous one committed.
    std::vector<std::string> stale;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(save, ec)) {
        const std::string name = e.path().filename().string();
        if (!e.is_directory() || !name.ends_with(".tmp")) continue;
        const auto it = parse_iter_dir_name(name.substr(0, name.find('.')));
        if (it && *it < committed.front()) stale.push_back(e.path().string());
    }
    if (ec) throw_ec("cannot list the checkpoint directory", save, ec);
    for (const std::string& s : stale) remove_tree(s);
    if (removed || !stale.empty()) fsync_dir(save);
}

void clean_uncommitted(const std::string& save_in) {
    const std::string save = strip_trailing_slashes(save_in);
    std::vector<fs::path> leftovers;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(save, ec)) {
        const std::string name = e.path().filename().string();
        const bool tmp_dir = e.is_directory() && name.ends_with(".tmp") &&
                             parse_iter_dir_name(name.substr(0, name.find('.'))).has_value();
        if (tmp_dir || name == std::string(kTrackerFile) + ".tmp") leftovers.push_back(e.path());
    }
    if (ec) throw_ec("cannot list the checkpoint directory", save, ec);
    std::sort(leftovers.begin(), leftovers.end());
    for (const fs::path& p : leftovers) {
        const std::string name = p.filename().string();
        const std::string committed = save + "/" + name.substr(0, name.find('.'));
        if (name.ends_with(".old.tmp") && !fs::exists(committed)) {
            if (::rename(p.c_str(), committed.c_str()) != 0)
                throw_errno(fmt::format("cannot move '{}' back to", p.string()), committed, errno);
            log_warn("checkpoint: moved {} back to {}: a save of the same iteration crashed after moving it aside",
                     p.string(), committed);
        } else {
            remove_tree(p.string());
            log_info("checkpoint: removed {}, left by an interrupted save (a crash, a kill or a full disk)",
                     p.string());
        }
    }
    if (!leftovers.empty()) fsync_dir(save);
}

}  // namespace ms
