// test_exit_status.cpp: every failure on 2 or 4 ranks leaves exit_status.json naming the first failing rank, its
// host, the cause and the exit code, and events.jsonl ends with it (README "Exit codes", engine/train/reliability.h):
// a rank stopped inside a collective and a rank hung outside one are named by rank, host and coordinates
// (comm/mpi/collective_watch.h, the roll call); a rank killed by SIGKILL -- rank 0 or another, at the first steps or
// a later one -- is named by the survivors that the launcher tears down; a data file missing on one rank and a
// config that differs between ranks are named before anything runs. Open MPI 4.1 behaviour: tests/parallel/
// test_faults.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/job_run.h"
#include "tests/common/temp_dir.h"

namespace {

namespace fs = std::filesystem;

constexpr double kTimeoutS = 3;     // reliability.collective_timeout_s in these runs
constexpr double kExitSlackS = 30;  // "time to exit <= timeout + 30 s"

using ms::test::JobRun;
using ms::test::read_json;

// The trainer on tests/parallel/tiny.yaml under `mpiexec -n np` (one thread per rank: ranks share the cores).
std::string train_command(int np, const std::string& dir, const std::string& sets) {
    return fmt::format(
        "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive timeout 90 mpiexec -n {} --oversubscribe --allow-run-as-root '{}' "
        "train --config {}/tests/parallel/tiny.yaml --set reliability.collective_timeout_s={} --set run.output_dir={} "
        "{}",
        np, MS_BINARY_PATH, MS_SOURCE_DIR, kTimeoutS, dir, sets);
}

JobRun run_job(const ms::test::TempDir& tmp, int np, const std::string& sets, const std::string& env = "") {
    const std::string dir = tmp / "run";
    return ms::test::run_command(fmt::format("cd {} && {} {} 2>&1", tmp.path(), env, train_command(np, dir, sets)),
                                 dir);
}

std::string read_text(const std::string& path) {
    std::ifstream f(path);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

nlohmann::json rank_status(const JobRun& r, int rank) { return ms::test::rank_status(r.dir, rank); }

nlohmann::json last_event(const JobRun& r) {
    std::ifstream f(r.dir + "/events.jsonl");
    std::string line, last;
    while (std::getline(f, line)) last = line;
    return last.empty() ? nlohmann::json(nullptr) : nlohmann::json::parse(last);
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The status of the run names `rank` as the first failing one, with its host, and ends events.jsonl.
void expect_status_names(const JobRun& r, int code, int rank) {
    const nlohmann::json s = read_json(r.dir + "/exit_status.json");
    ASSERT_FALSE(s.is_null()) << "no exit_status.json\n" << r.output;
    EXPECT_EQ(s["code"], code) << s.dump(1);
    ASSERT_TRUE(s.contains("failed_rank")) << s.dump(1);
    EXPECT_EQ(s["failed_rank"]["rank"], rank) << s.dump(1) << "\n" << r.output;
    EXPECT_FALSE(s["failed_rank"]["host"].get<std::string>().empty()) << s.dump(1);
    const nlohmann::json e = last_event(r);
    ASSERT_FALSE(e.is_null()) << r.output;
    EXPECT_EQ(e["event"], "exit") << e.dump();
    EXPECT_EQ(e["code"], code) << e.dump();
    EXPECT_EQ(e["failed_rank"]["rank"], rank) << e.dump();
}

// A training run in the background: the pid of each rank, found through mpiexec's children's environment, so
// that a test can stop or kill one from outside as an operator or the OOM killer would.
class Background {
  public:
    Background(const ms::test::TempDir& tmp, int np) : tmp_(tmp) {
        dir_ = tmp / "run";
        const std::string cmd = fmt::format(
            "{} --set training.train_iters=100000 > {}/out.log 2>&1 & echo $! > {}/pid; "
            "wait $!; echo $? > {}/rc",
            train_command(np, dir_, ""), tmp.path(), tmp.path(), tmp.path());
        launcher_ = std::thread([cmd] { [[maybe_unused]] const int rc = std::system(cmd.c_str()); });
    }
    ~Background() {
        if (launcher_.joinable()) launcher_.join();
    }

    // Waits until iteration `it` is in metrics.jsonl (every rank is in the training loop), then returns the pid of
    // world rank `rank`, or 0.
    pid_t pid_of_rank(int rank, int it) {
        const std::string want = fmt::format("\"iteration\":{},", it);
        for (int i = 0; i < 600 && !has(read_text(dir_ + "/metrics.jsonl"), want); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        pid_t timeout_pid = 0;
        std::ifstream(tmp_ / "pid") >> timeout_pid;
        for (pid_t mpiexec : children(timeout_pid)) {
            for (pid_t p : children(mpiexec)) {
                std::string env = read_text(fmt::format("/proc/{}/environ", p));
                for (char& c : env) c = c == '\0' ? '\n' : c;
                if (has(env, fmt::format("\nOMPI_COMM_WORLD_RANK={}\n", rank))) return p;
            }
        }
        return 0;
    }

    // Waits for the launcher; the run as test code sees it (seconds from now).
    JobRun finish() {
        const auto t0 = std::chrono::steady_clock::now();
        launcher_.join();
        JobRun r;
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        r.dir = dir_;
        std::ifstream(tmp_ / "rc") >> r.code;
        r.output = read_text(tmp_ / "out.log");
        return r;
    }

  private:
    static std::vector<pid_t> children(pid_t parent) {
        std::vector<pid_t> out;
        std::istringstream in(read_text(fmt::format("/proc/{0}/task/{0}/children", parent)));
        for (pid_t p; in >> p;) out.push_back(p);
        return out;
    }

    const ms::test::TempDir& tmp_;
    std::string dir_;
    std::thread launcher_;
};

// ---- a hung rank is named: by every survivor's error and in the status ----

// Rank 3 of dp 4 is stopped inside its collectives (SIGSTOP): the others time out, hold the roll call, and name it,
// by host and coordinates, with the state /proc gives (stopped).
TEST(ExitStatus, RankStoppedInACollectiveIsNamedAsTheHungRank) {
    ms::test::TempDir tmp("ms_exit_status");
    Background job(tmp, 4);
    const pid_t victim = job.pid_of_rank(3, 2);
    ASSERT_GT(victim, 0) << read_text(tmp / "out.log");
    kill(victim, SIGSTOP);
    const JobRun r = job.finish();
    EXPECT_EQ(r.code, 18) << r.output;
    EXPECT_LE(r.seconds, kTimeoutS + kExitSlackS);
    std::printf("SIGSTOP of rank 3 of 4 -> exit %d after %.1f s (collective_timeout_s %.0f)\n", r.code, r.seconds,
                kTimeoutS);
    EXPECT_TRUE(has(r.output, "world rank 3 (host ")) << r.output;
    EXPECT_TRUE(has(r.output, "tp 0, pp 0, dp 3) is hung: its process is stopped (SIGSTOP)")) << r.output;
    EXPECT_FALSE(has(r.output, "a rank of that group is hung")) << r.output;
    expect_status_names(r, 18, 3);
    const nlohmann::json s = read_json(r.dir + "/exit_status.json");
    ASSERT_EQ(s["hung_ranks"].size(), 1u) << s.dump(1);
    EXPECT_EQ(s["hung_ranks"][0]["rank"], 3);
    EXPECT_EQ(s["hung_ranks"][0]["state"], "stopped");
    EXPECT_EQ(s["hung_ranks"][0]["dp"], 3);
    // Every survivor that recorded before the launcher's tear-down (on shared cores one may not) blames rank 3.
    for (int rank : {0, 1, 2}) {
        const nlohmann::json mine = rank_status(r, rank);
        if (!mine.is_null()) {
            EXPECT_EQ(mine["failed_rank"]["rank"], 3) << rank << "\n" << mine.dump(1);
        }
    }
}

// Rank 1 of pp 2 x dp 2 sleeps outside any collective (MS_INJECT hang): its process runs but never answers.
TEST(ExitStatus, RankHungOutsideACollectiveIsNamedWithItsCoordinates) {
    ms::test::TempDir tmp("ms_exit_status");
    const JobRun r = run_job(tmp, 4, "--set training.train_iters=6 --set parallel.pipeline_model_parallel_size=2",
                             "MS_INJECT=hang@step=3,rank=1");
    EXPECT_EQ(r.code, 18) << r.output;
    EXPECT_TRUE(has(r.output, "tp 0, pp 0, dp 1) is hung: its process runs but did not answer")) << r.output;
    expect_status_names(r, 18, 1);
    const nlohmann::json s = read_json(r.dir + "/exit_status.json");
    EXPECT_EQ(s["hung_ranks"][0]["state"], "alive, silent") << s.dump(1);
    EXPECT_EQ(s["failed_rank"]["pp"], 0);
    EXPECT_EQ(s["failed_rank"]["dp"], 1);
}

// ---- a status for every failure ----

// kill -9 from outside, of rank 0 (the rank that normally writes the status) and of the last rank: the survivors
// find the killed rank dead when the launcher's SIGTERM reaches them inside a collective, and one writes the status.
void check_killed_rank(int rank) {
    ms::test::TempDir tmp("ms_exit_status");
    Background job(tmp, 4);
    const pid_t victim = job.pid_of_rank(rank, 2);
    ASSERT_GT(victim, 0) << read_text(tmp / "out.log");
    kill(victim, SIGKILL);
    const JobRun r = job.finish();
    EXPECT_EQ(r.code, 128 + SIGKILL) << r.output;  // mpirun reports the killed rank
    std::printf("kill -9 of rank %d of 4 -> exit %d after %.1f s\n", rank, r.code, r.seconds);
    expect_status_names(r, 18, rank);
    const nlohmann::json s = read_json(r.dir + "/exit_status.json");
    EXPECT_EQ(s["failed_rank"]["state"], "dead") << s.dump(1);
    EXPECT_TRUE(has(s["reason"], fmt::format("world rank {} (host ", rank))) << s["reason"];
}

TEST(ExitStatus, KillNineOfRankZeroOfFourLeavesAStatusNamingIt) { check_killed_rank(0); }
TEST(ExitStatus, KillNineOfRankThreeOfFourLeavesAStatusNamingIt) { check_killed_rank(3); }

// The case: a crash at a later step (the run is 30 iterations long) of rank 1 of 2.
TEST(ExitStatus, CrashAtALaterStepLeavesAStatusNamingTheCrashedRank) {
    ms::test::TempDir tmp("ms_exit_status");
    const JobRun r = run_job(tmp, 2, "--set training.train_iters=30", "MS_INJECT=crash@step=30,rank=1");
    EXPECT_EQ(r.code, 128 + SIGKILL) << r.output;
    expect_status_names(r, 18, 1);
}

// A Megatron data file that only rank 0 has (the path interpolates Open MPI's rank variable): exit 2 on every rank,
// the line names rank 1 and its host, and so does the status rank 0 writes.
TEST(ExitStatus, DataFileMissingOnOneRankIsNamedInTheErrorAndTheStatus) {
    ms::test::TempDir tmp("ms_exit_status");
    const std::string pre = fmt::format("'{}' preprocess --input {}/README.md --output-prefix {}/data_0 2>&1",
                                        MS_BINARY_PATH, MS_SOURCE_DIR, tmp.path());
    ASSERT_EQ(std::system(pre.c_str()), 0);
    const JobRun r =
        run_job(tmp, 2,
                fmt::format("--set data.source=megatron --set 'data.data_path={}/data_${{OMPI_COMM_WORLD_RANK}}_"
                            "text_document' --set model.vocab_size=257",
                            tmp.path()));
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_TRUE(has(r.output, "data error: world rank 1 (host ")) << r.output;
    EXPECT_TRUE(has(r.output, "cannot open Megatron index")) << r.output;
    expect_status_names(r, 2, 1);
    const nlohmann::json s = read_json(r.dir + "/exit_status.json");
    EXPECT_EQ(s["rank"], 0);  // written by rank 0, which had its data: the cause is rank 1's
    EXPECT_TRUE(has(s["reason"], "cannot open Megatron index")) << s["reason"];
    EXPECT_TRUE(has(s["reason"], "data_1_text_document.idx")) << s["reason"];
}

// Rank 1 resolves another run.name (a config that differs between ranks): exit 2, the status names rank 1.
TEST(ExitStatus, ConfigHashMismatchLeavesAStatusNamingTheRankThatDiffers) {
    ms::test::TempDir tmp("ms_exit_status");
    const JobRun r = run_job(tmp, 2, "--set training.train_iters=2 --set 'run.name=r${OMPI_COMM_WORLD_RANK}'");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_TRUE(has(r.output, "config hash differs from rank 0's")) << r.output;
    expect_status_names(r, 2, 1);
    EXPECT_TRUE(has(read_json(r.dir + "/exit_status.json")["reason"], ", host ")) << r.output;
}

}  // namespace
