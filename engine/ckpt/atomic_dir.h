// atomic_dir.h: the checkpoint commit protocol (docs/formats.md), Megatron names.
//
//   <save>/
//     latest_checkpointed_iteration.txt   "1000" -- the tracker, written last
//     iter_0001000/                       a committed checkpoint: manifest.json + the files it lists
//       manifest.json                     {"format_version": 1, "iteration": 1000, ..., "files": {
//                                            "model/tp00_pp000.safetensors": {"size": N, "xxh64": "<16 hex>"}}}
//     iter_0002000.tmp/                   a save in progress (or one that crashed): ignored by loaders
//
// Commit order, each step durable before the next: every file is written as name.tmp -> fsync -> rename ->
// fsync(dir); then manifest.json (sizes and XXH64 of every file, computed by commit()); then the directory
// rename iter_X.tmp -> iter_X and fsync(<save>); then the tracker, atomically. A crash at any point leaves either
// the previous committed state or the new one; the only in-between state (renamed dir, old tracker) is valid too.
//
// Invariant used by loaders: a directory named iter_XXXXXXX (no suffix) holding a manifest.json whose files all
// exist with the listed sizes (and checksums, when asked) is a complete checkpoint.
//
// All write, verify and filesystem errors throw ms::UserError with exit code kExitCheckpoint (19), naming the path
// and the errno text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace ms {

inline constexpr const char* kTrackerFile = "latest_checkpointed_iteration.txt";
inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr int kManifestFormatVersion = 1;

// "iter_0001000" (Megatron: at least 7 digits).
std::string checkpoint_dir_name(int64_t iteration);
// <save>/iter_XXXXXXX.tmp, where a save in progress writes (for ranks other than the CheckpointWriter's).
std::string checkpoint_tmp_dir(const std::string& save, int64_t iteration);

// fsync a directory, making the creation/rename/removal of its entries durable.
void fsync_dir(const std::string& dir);

// A file written under `path + ".tmp"` and renamed over `path` by commit(). Until then readers of `path` see
// the old file (or none); if the writer is destroyed without commit() (an exception), the .tmp is removed.
class AtomicFile {
  public:
    explicit AtomicFile(std::string path);
    ~AtomicFile();
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    void write(const void* data, size_t n);
    void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
    // fsync(file), close, rename(path.tmp, path), fsync(parent dir).
    void commit();

  private:
    [[noreturn]] void fail(const char* what, int err);
    std::string path_;
    std::string tmp_path_;
    int fd_ = -1;
};

// path.tmp, write, fsync(file), rename, fsync(dir).
void write_file_atomic(const std::string& path, std::string_view bytes);

// One checkpoint being written: creates <save>/iter_XXXXXXX.tmp/ (removing a stale one left by a crashed save of
// the same iteration). Construct it on ONE rank (the constructor clears the directory), barrier, let every rank
// write its files under checkpoint_tmp_dir(save, iteration) on the shared filesystem, barrier, then that rank
// calls commit().
class CheckpointWriter {
  public:
    CheckpointWriter(std::string save_dir, int64_t iteration);

    const std::string& tmp_dir() const { return tmp_dir_; }
    // tmp_dir()/relpath, with its parent directories created.
    std::string path(std::string_view relpath) const;
    // write_file_atomic(path(relpath), bytes).
    void write_file(std::string_view relpath, std::string_view bytes) const;

    // Lists every file under tmp_dir() with its size and XXH64 (re-reading each and fsyncing it and its
    // directory), writes manifest.json = `manifest` (an object: world size, config hash, ...) plus
    // "format_version", "iteration" and "files", renames the directory to <save>/iter_XXXXXXX/ (replacing one of
    // the same iteration: the trainer's startup checks let only one that failed verification get here), fsyncs
    // <save>, then writes the tracker. Returns the final directory.
    // A leftover "*.tmp" file inside (an unfinished write) or an existing manifest.json is an error.
    std::string commit(const nlohmann::json& manifest);

    // Called by commit() before each of its phases with the phase's name: "manifest" (files listed and digested,
    // no manifest yet), "rename" (manifest written, directory not renamed) and "tracker" (directory committed,
    // tracker not written). A hook that throws stops the commit there: checkpoint.h's fault injection.
    void set_phase_hook(std::function<void(std::string_view phase)> hook) { phase_hook_ = std::move(hook); }

  private:
    std::string save_dir_;
    int64_t iteration_;
    std::string tmp_dir_;
    bool committed_ = false;
    std::function<void(std::string_view)> phase_hook_;
};

// Checks that `dir` is a complete checkpoint: manifest.json parses, its "iteration" matches the directory name,
// every listed file exists with the listed size, and, with verify_checksums, the listed XXH64. Throws UserError
// (kExitCheckpoint) naming the directory, the file and the problem.
void verify_checkpoint(const std::string& dir, bool verify_checksums);

// The iteration to resume from: the newest iter_XXXXXXX/ that verifies, whatever the tracker says (warning why each
// newer one is skipped). A tracker naming an older checkpoint is stale -- a save that crashed between committing
// its directory and writing the tracker, or a tracker moved back by hand -- and is named in a warning: resuming
// from it would make the run's next saves replace the newer checkpoints. *.tmp directories and directories without
// a valid manifest are never chosen. nullopt when <save> does not exist or holds no valid checkpoint. To rewind a
// run, move the newer iter_XXXXXXX/ directories away.
std::optional<int64_t> find_latest_committed(const std::string& save, bool verify_checksums);

// Under the save directory's lock (save_dir.h) no save is in flight, so what a crashed save (a kill, a full disk) left
// is cleaned with a log line each: iter_X.tmp/ directories and the tracker's .tmp file are removed; iter_X.old.tmp/, a
// committed checkpoint that a save of the same iteration moved aside (CheckpointWriter::commit), is removed when
// iter_X/ exists and moved back when it does not (the save crashed between its two renames).
void clean_uncommitted(const std::string& save);

// Retention: deletes committed checkpoints (iter_XXXXXXX/ with a manifest.json) other than the newest k and the
// one the tracker names, and *.tmp directories older than the newest committed one (crashed saves). k >= 2, so
// a checkpoint corrupted on disk always has a fallback (torchtitan's keep_latest_k rule); k < 2 is a config error.
void keep_latest(const std::string& save, int k);

}  // namespace ms
