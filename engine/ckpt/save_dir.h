// save_dir.h: a checkpoint save directory at a run's start (checkpoint.h open_save_dir): can it be written, how much
// room is left, and the lock that keeps a second run from saving into it. What crashed saves left is cleaned by
// atomic_dir.h clean_uncommitted, under this lock.
//
//   <save>/mindspeed-train.lock   {"host": "node7", "pid": 4242, "started": "2026-12-01T11:06:32.120Z",
//                                  "proc_start": 123456}   -- present while a run holds the directory
#pragma once

#include <cstdint>
#include <string>

namespace ms {

inline constexpr const char* kLockFile = "mindspeed-train.lock";

// Creates `save` (and its parents) and a file in it, then removes the file: a read-only, unwritable or impossible
// directory is found before training instead of at the first save. UserError (kExitConfigError) naming the directory
// and the errno text otherwise.
void check_dir_writable(const std::string& save);

// Bytes an unprivileged writer may still use on the filesystem holding `dir` (statvfs: f_bavail * f_frsize).
uint64_t free_bytes(const std::string& dir);

// One run's hold on a save directory: <save>/mindspeed-train.lock holds {"host", "pid", "started" (UTC),
// "proc_start" (the holder's start time in clock ticks after boot, from /proc/<pid>/stat)} from construction to
// destruction. The lock is written whole into a file of this process's own name and then hard-linked to the lock's
// name, which fails when the name exists: creation is atomic (also on NFS) and a reader never sees a partial lock.
// A lock of a live process, of another host (whose processes this host cannot see), or one this program did not
// write refuses the run: UserError (kExitConfigError) naming the holder and what to do. A lock of a process of this
// host that is gone (no such pid, or the pid now belongs to a process that started at another time: a crashed or
// killed run) is taken over with a warning naming it. Only the rank that commits takes it (checkpoint.h).
class SaveDirLock {
  public:
    explicit SaveDirLock(const std::string& save);
    ~SaveDirLock();  // removes the lock file if it still is this process's
    SaveDirLock(const SaveDirLock&) = delete;
    SaveDirLock& operator=(const SaveDirLock&) = delete;

    const std::string& path() const { return path_; }

  private:
    std::string path_;
    std::string content_;  // what this process wrote: the lock is removed only while it holds exactly this
};

}  // namespace ms
