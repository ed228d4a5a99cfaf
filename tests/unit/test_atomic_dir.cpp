// test_atomic_dir.cpp: engine/ckpt/atomic_dir and checksum -- XXH64 against published vectors, the commit protocol
// (final directory, manifest, tracker), and the loader's fallbacks: uncommitted .tmp directories, a byte flipped
// on disk, a tracker naming a missing directory, an older checkpoint (stale) or garbage; retention; atomic single
// files; the save directory's lock and the cleaning of crashed saves' leftovers.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/ckpt/atomic_dir.h"
#include "engine/ckpt/checksum.h"
#include "engine/ckpt/save_dir.h"
#include "engine/core/check.h"
#include "tests/common/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A fresh directory per test, removed at the end.
class TempDir : public ms::test::TempDir {
  public:
    TempDir() : ms::test::TempDir("ms_ckpt_test") {}
};

std::string read_all(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// A committed checkpoint with two files whose contents depend on the iteration.
void save(const std::string& dir, int64_t iteration) {
    ms::CheckpointWriter w(dir, iteration);
    w.write_file("model/tp00_pp000.safetensors", std::string(1000, static_cast<char>('a' + iteration % 26)));
    w.write_file("train_state.json", json{{"iteration", iteration}}.dump());
    w.commit(json{{"world_size", 1}});
}

std::vector<std::string> listing(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

TEST(AtomicDirTest, Xxh64MatchesPublishedVectorsAndStreams) {
    // Vectors from the xxHash reference (xxhsum -H64) and the Python `xxhash` package's README.
    EXPECT_EQ(ms::xxh64("", 0), 0xEF46DB3751D8E999ULL);
    EXPECT_EQ(ms::xxh64("abc", 3), 0x44BC2CF5AD770999ULL);
    EXPECT_EQ(ms::xxh64("xxhash", 6), 0x32DD38952C4BC720ULL);
    EXPECT_EQ(ms::xxh64("xxhash", 6, 20141025), 0xB559B98D844E0635ULL);
    const std::string nobody = "Nobody inspects the spammish repetition";  // 39 bytes: one full 32-byte stripe
    EXPECT_EQ(ms::xxh64(nobody.data(), nobody.size()), 0xFBCEA83C8A378BF1ULL);
    EXPECT_EQ(ms::xxh64_hex(0xFBCEA83C8A378BF1ULL), "fbcea83c8a378bf1");

    // Any split of the input into update() calls gives the one-shot digest.
    std::mt19937 rng(7);
    std::string data(1000, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    const uint64_t whole = ms::xxh64(data.data(), data.size());
    for (int trial = 0; trial < 50; ++trial) {
        ms::Xxh64 x;
        for (size_t at = 0; at < data.size();) {
            const size_t n = std::min<size_t>(rng() % 70, data.size() - at);
            x.update(data.data() + at, n);
            at += n;
        }
        EXPECT_EQ(x.digest(), whole);
    }
    TempDir dir;
    std::ofstream(dir / "f", std::ios::binary) << data;
    EXPECT_EQ(ms::file_xxh64(dir / "f"), whole);
}

TEST(AtomicDirTest, CommitCreatesFinalDirManifestAndTracker) {
    TempDir dir;
    const std::string save_dir = dir / "save";  // created by the writer
    ms::CheckpointWriter w(save_dir, 1000);
    EXPECT_EQ(w.tmp_dir(), save_dir + "/iter_0001000.tmp");
    EXPECT_EQ(ms::checkpoint_tmp_dir(save_dir + "/", 1000), w.tmp_dir());
    EXPECT_TRUE(fs::is_directory(w.tmp_dir()));
    w.write_file("model/tp00_pp000.safetensors", "weights");
    std::ofstream(w.path("rng/rank00000.json")) << "{}";  // a file written by other means, without fsync
    const std::string final_dir = w.commit(json{{"world_size", 8}, {"tp", 2}});

    EXPECT_EQ(final_dir, save_dir + "/iter_0001000");
    EXPECT_EQ(listing(save_dir), (std::vector<std::string>{"iter_0001000", "latest_checkpointed_iteration.txt"}));
    EXPECT_EQ(read_all(save_dir + "/latest_checkpointed_iteration.txt"), "1000");
    const json m = json::parse(read_all(final_dir + "/manifest.json"));
    EXPECT_EQ(m["world_size"], 8);
    EXPECT_EQ(m["tp"], 2);
    EXPECT_EQ(m["iteration"], 1000);
    EXPECT_EQ(m["format_version"], ms::kManifestFormatVersion);
    ASSERT_EQ(m["files"].size(), 2u);
    EXPECT_EQ(m["files"]["model/tp00_pp000.safetensors"]["size"], 7);
    EXPECT_EQ(m["files"]["model/tp00_pp000.safetensors"]["xxh64"], ms::xxh64_hex(ms::xxh64("weights", 7)));
    EXPECT_EQ(m["files"]["rng/rank00000.json"]["size"], 2);
    EXPECT_NO_THROW(ms::verify_checkpoint(final_dir, true));
    EXPECT_EQ(ms::find_latest_committed(save_dir, true), 1000);
    EXPECT_EQ(ms::find_latest_committed(save_dir + "/", false), 1000);
}

TEST(AtomicDirTest, NothingCommittedGivesNullopt) {
    TempDir dir;
    EXPECT_EQ(ms::find_latest_committed(dir / "does-not-exist", true), std::nullopt);
    EXPECT_EQ(ms::find_latest_committed(dir.path(), true), std::nullopt);
}

TEST(AtomicDirTest, UncommittedTmpDirAndDirsWithoutManifestAreIgnored) {
    TempDir dir;
    save(dir.path(), 1000);
    {
        ms::CheckpointWriter w(dir.path(), 2000);  // a save that crashes before commit
        w.write_file("model/tp00_pp000.safetensors", "partial");
    }
    fs::create_directory(dir / "iter_0003000");  // renamed by hand, or another tool's directory
    std::ofstream(dir / "iter_0003000/model.bin") << "x";
    fs::create_directory(dir / "iter_0004000");  // a manifest that is not one
    std::ofstream(dir / "iter_0004000/manifest.json") << "{\"files\": ";
    std::ofstream(dir / "latest_checkpointed_iteration.txt") << "4000";
    EXPECT_TRUE(fs::is_directory(dir / "iter_0002000.tmp"));
    EXPECT_EQ(ms::find_latest_committed(dir.path(), true), 1000);

    // A later save of the same iteration starts from a clean .tmp directory.
    ms::CheckpointWriter again(dir.path(), 2000);
    EXPECT_TRUE(fs::is_empty(again.tmp_dir()));
}

TEST(AtomicDirTest, FlippedByteFailsChecksumAndFallsBackToThePreviousIteration) {
    TempDir dir;
    save(dir.path(), 1000);
    save(dir.path(), 2000);
    EXPECT_EQ(ms::find_latest_committed(dir.path(), true), 2000);
    const std::string victim = dir / "iter_0002000/model/tp00_pp000.safetensors";
    {
        std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(500);
        f.put('Z');  // same size: only the checksum sees it
    }
    EXPECT_EQ(ms::find_latest_committed(dir.path(), /*verify_checksums=*/false), 2000);
    EXPECT_EQ(ms::find_latest_committed(dir.path(), /*verify_checksums=*/true), 1000);
    try {
        ms::verify_checkpoint(dir / "iter_0002000", true);
        ADD_FAILURE() << "a flipped byte passed verification";
    } catch (const ms::UserError& e) {
        EXPECT_NE(std::string(e.what()).find(victim), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("XXH64"), std::string::npos) << e.what();
        EXPECT_EQ(e.exit_code(), ms::kExitCheckpoint);
    }
    // A truncated file is caught by the size check alone.
    fs::resize_file(victim, 999);
    EXPECT_EQ(ms::find_latest_committed(dir.path(), false), 1000);
}

TEST(AtomicDirTest, TrackerNamingAMissingDirOrGarbageFallsBackToTheNewestValid) {
    TempDir dir;
    save(dir.path(), 1000);
    save(dir.path(), 2000);
    save(dir.path(), 3000);
    fs::remove_all(dir / "iter_0003000");
    EXPECT_EQ(ms::find_latest_committed(dir.path(), true), 2000);
    std::ofstream(dir / "latest_checkpointed_iteration.txt") << "release";
    EXPECT_EQ(ms::find_latest_committed(dir.path(), true), 2000);
    fs::remove(dir / "latest_checkpointed_iteration.txt");  // crash between the directory rename and the tracker
    EXPECT_EQ(ms::find_latest_committed(dir.path(), true), 2000);
    // A tracker naming an older valid checkpoint is stale (a crash between the rename and the tracker, or a tracker
    // moved back by hand): the newest valid one wins, so that the run's next saves cannot replace it.
    std::ofstream(dir / "latest_checkpointed_iteration.txt") << " 1000\n";
    EXPECT_EQ(ms::find_latest_committed(dir.path(), true), 2000);
}

TEST(AtomicDirTest, RecommittingAnIterationReplacesIt) {
    TempDir dir;
    save(dir.path(), 1000);
    ms::CheckpointWriter w(dir.path(), 1000);
    w.write_file("only.txt", "new");
    w.commit(json::object());
    EXPECT_EQ(listing(dir / "iter_0001000"), (std::vector<std::string>{"manifest.json", "only.txt"}));
    EXPECT_EQ(listing(dir.path()), (std::vector<std::string>{"iter_0001000", "latest_checkpointed_iteration.txt"}));
    EXPECT_EQ(ms::find_latest_committed(dir.path(), true), 1000);
}

TEST(AtomicDirTest, CommitRefusesAnUnfinishedWrite) {
    TempDir dir;
    ms::CheckpointWriter w(dir.path(), 5);
    std::ofstream(w.path("model/x.safetensors.tmp")) << "half";
    try {
        w.commit(json::object());
        ADD_FAILURE() << "committed a directory holding a .tmp file";
    } catch (const ms::UserError& e) {
        EXPECT_NE(std::string(e.what()).find("model/x.safetensors.tmp"), std::string::npos) << e.what();
        EXPECT_EQ(e.exit_code(), ms::kExitCheckpoint);
    }
    EXPECT_EQ(ms::find_latest_committed(dir.path(), true), std::nullopt);
    EXPECT_FALSE(fs::exists(dir / "latest_checkpointed_iteration.txt"));
}

TEST(AtomicDirTest, KeepLatestDeletesTheOlderCommittedAndStaleTmpDirs) {
    TempDir dir;
    for (int64_t it = 1000; it <= 5000; it += 1000) save(dir.path(), it);
    fs::create_directory(dir / "iter_0000500.tmp");  // crashed long ago
    fs::create_directory(dir / "iter_0006000.tmp");  // newer than every committed one: maybe in flight
    fs::create_directory(dir / "iter_0000100");      // no manifest: not ours to delete
    fs::create_directory(dir / "unrelated");
    ms::keep_latest(dir.path(), 2);
    EXPECT_EQ(listing(dir.path()),
              (std::vector<std::string>{"iter_0000100", "iter_0004000", "iter_0005000", "iter_0006000.tmp",
                                        "latest_checkpointed_iteration.txt", "unrelated"}));
    EXPECT_EQ(ms::find_latest_committed(dir.path(), true), 5000);

    // The checkpoint the tracker names survives even when it is not among the newest k.
    save(dir.path(), 7000);
    std::ofstream(dir / "latest_checkpointed_iteration.txt") << "4000";
    ms::keep_latest(dir.path(), 2);
    EXPECT_TRUE(fs::exists(dir / "iter_0004000"));
    EXPECT_TRUE(fs::exists(dir / "iter_0005000"));
    EXPECT_TRUE(fs::exists(dir / "iter_0007000"));
    EXPECT_FALSE(fs::exists(dir / "iter_0006000.tmp"));            // now older than the newest committed one: stale
    EXPECT_EQ(ms::find_latest_committed(dir.path(), true), 7000);  // the stale tracker does not win

    try {
        ms::keep_latest(dir.path(), 1);
        ADD_FAILURE() << "keep_latest(1) accepted";
    } catch (const ms::UserError& e) {
        EXPECT_NE(std::string(e.what()).find("at least 2"), std::string::npos) << e.what();
    }
}

// What crashed saves leave is cleaned at the next start (under the save directory's lock): unfinished directories of
// any iteration, the tracker's .tmp file, and a checkpoint moved aside for a same-iteration save -- removed when the
// replacement committed, moved back when it did not.
TEST(AtomicDirTest, CleanUncommittedRemovesLeftoversAndRestoresAMovedAsideCheckpoint) {
    TempDir dir;
    save(dir.path(), 1000);
    save(dir.path(), 2000);
    fs::create_directories(dir / "iter_0003000.tmp/model");  // a full disk during the save of 3000
    std::ofstream(dir / "iter_0003000.tmp/model/tp00_pp000.safetensors") << "half";
    fs::rename(dir / "iter_0002000", dir / "iter_0002000.old.tmp");  // crashed between its two renames
    save(dir.path(), 1000);
    fs::create_directory(dir / "iter_0001000.old.tmp");  // the replacement of 1000 committed
    std::ofstream(dir / "latest_checkpointed_iteration.txt.tmp") << "3";
    fs::create_directory(dir / "unrelated.tmp");
    ms::clean_uncommitted(dir.path());
    EXPECT_EQ(listing(dir.path()), (std::vector<std::string>{"iter_0001000", "iter_0002000",
                                                             "latest_checkpointed_iteration.txt", "unrelated.tmp"}));
    EXPECT_EQ(ms::find_latest_committed(dir.path(), true), 2000);
}

// The save directory's lock: a live holder (this test's parent process) or one on another host refuses a second
// writer with a sentence naming it; a dead holder of this host is taken over; the lock goes with its holder.
TEST(AtomicDirTest, SaveDirLockRefusesALiveHolderAndTakesOverADeadOne) {
    TempDir dir;
    const std::string host = ms::host_name(), lock = dir / ms::kLockFile;
    const auto expect_refused = [&](const std::string& holder, const std::string& named) {
        std::ofstream(lock) << holder;
        try {
            ms::SaveDirLock l(dir.path());
            ADD_FAILURE() << "took the lock held by " << holder;
        } catch (const ms::UserError& e) {
            EXPECT_NE(std::string(e.what()).find("is in use by another run"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
            EXPECT_EQ(e.exit_code(), ms::kExitConfigError);
        }
        EXPECT_EQ(read_all(lock), holder);  // untouched
    };
    expect_refused(json{{"host", host}, {"pid", ::getppid()}, {"started", "then"}}.dump(),
                   "pid " + std::to_string(::getppid()) + " on host " + host + " (started then)");
    expect_refused(json{{"host", "elsewhere"}, {"pid", 1}, {"started", "then"}}.dump(), "pid 1 on host elsewhere");
    expect_refused("garbage", "something this program did not write ('garbage')");

    const pid_t child = ::fork();  // a pid that is surely gone: a child that exited and was reaped
    if (child == 0) ::_exit(0);
    ASSERT_GT(child, 0);
    ::waitpid(child, nullptr, 0);
    for (const json& dead : {json{{"host", host}, {"pid", child}, {"started", "then"}},
                             // the parent's pid, but recorded with another start time: the pid was reused since
                             json{{"host", host}, {"pid", ::getppid()}, {"started", "then"}, {"proc_start", 1}}}) {
        std::ofstream(lock) << dead.dump();
        {
            const ms::SaveDirLock l(dir.path());
            const json mine = json::parse(read_all(lock));
            EXPECT_EQ(mine["pid"], ::getpid());
            EXPECT_EQ(mine["host"], host);
            EXPECT_EQ(listing(dir.path()), std::vector<std::string>{ms::kLockFile});
        }
        EXPECT_FALSE(fs::exists(lock));
    }
}

TEST(AtomicDirTest, WriteFileAtomicLeavesNoTmpBehind) {
    TempDir dir;
    const std::string path = dir / "state.json";
    ms::write_file_atomic(path, "first");
    ms::write_file_atomic(path, "second, longer");
    ms::write_file_atomic(path, "3");  // shorter: nothing of the old contents may remain
    EXPECT_EQ(read_all(path), "3");
    EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"state.json"});
    {
        ms::AtomicFile f(path);  // abandoned: an exception between open and commit
        f.write("never");
    }
    EXPECT_EQ(read_all(path), "3");
    EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"state.json"});
    ms::write_file_atomic(dir / "empty", "");
    EXPECT_EQ(fs::file_size(dir / "empty"), 0u);
}

TEST(AtomicDirTest, WriteErrorsNameThePathAndTheErrnoText) {
    TempDir dir;
    try {
        ms::write_file_atomic(dir / "no/such/dir/file", "x");
        ADD_FAILURE() << "wrote into a missing directory";
    } catch (const ms::UserError& e) {
        EXPECT_NE(std::string(e.what()).find(dir / "no/such/dir/file.tmp"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
        EXPECT_EQ(e.exit_code(), ms::kExitCheckpoint);
    }
    std::ofstream(dir / "plain") << "x";  // a file where the save directory should be
    EXPECT_THROW(ms::CheckpointWriter(dir / "plain", 1), ms::UserError);
    EXPECT_THROW(ms::fsync_dir(dir / "missing"), ms::UserError);
    if (::geteuid() != 0) {  // root ignores permissions
        fs::create_directory(dir / "ro");
        fs::permissions(dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
        EXPECT_THROW(ms::write_file_atomic(dir / "ro/f", "x"), ms::UserError);
        fs::permissions(dir / "ro", fs::perms::owner_all);
    }
}

}  // namespace
