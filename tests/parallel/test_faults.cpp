// test_faults.cpp: every injected fault ends every rank the documented way (README "Exit codes",
// engine/train/reliability.h), on one rank and under mpiexec with 2 or 4 ranks.
//
// What Open MPI 4.1 does here, measured (bench/fault_matrix.sh): when a rank dies or exits non-zero, mpirun sends
// the others SIGCONT, SIGTERM 1 s later and SIGKILL 1 s after that, and returns the first failing rank's exit code
// (128 + signal for a signal). So a rank that ends through the trainer leaves exit_status/rank_XXXXX.json (its own
// code), and a rank the launcher killed leaves none: the tests read the per-rank files, and mpiexec's status only
// for the first code. `timeout` turns a hang into exit code 124, i.e. a failure.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/job_run.h"
#include "tests/common/temp_dir.h"

namespace {

namespace fs = std::filesystem;

constexpr double kTimeoutS = 3;     // reliability.collective_timeout_s in these runs
constexpr double kExitSlackS = 30;  // "time to exit <= timeout + 30 s"

using TrainRun = ms::test::JobRun;
using ms::test::read_json;

std::string ranks_flag(int np) {
    return np == 1 ? std::string() : "mpiexec -n " + std::to_string(np) + " --oversubscribe --allow-run-as-root ";
}

// `timeout` and the one-thread environment every run gets (ranks share the two cores).
const std::string kEnv = "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive timeout 90 ";
std::string train_args() {
    return fmt::format("'{}' train --config {}/tests/parallel/tiny.yaml --set reliability.collective_timeout_s={}",
                       MS_BINARY_PATH, MS_SOURCE_DIR, kTimeoutS);
}

// Trains tests/parallel/tiny.yaml for 6 iterations with `inject` (MS_INJECT) on `np` ranks (1: no launcher).
TrainRun train(const ms::test::TempDir& tmp, int np, const std::string& inject, const std::string& sets = "") {
    const std::string dir = tmp / "run";
    return ms::test::run_command(fmt::format("cd {} && MS_INJECT='{}' {}{}{} --set training.train_iters=6 --set "
                                             "run.output_dir={} {} 2>&1",
                                             tmp.path(), inject, kEnv, ranks_flag(np), train_args(), dir, sets),
                                 dir);
}

// exit_status/rank_XXXXX.json of `rank`, or null when that rank left none (it was killed).
nlohmann::json rank_status(const TrainRun& r, int rank) { return ms::test::rank_status(r.dir, rank); }

nlohmann::json trace(const TrainRun& r, int rank) {
    char name[32];
    std::snprintf(name, sizeof(name), "rank_%05d.json", rank);
    return read_json(r.dir + "/comm_traces/" + name);
}

std::vector<nlohmann::json> events(const TrainRun& r) {
    std::vector<nlohmann::json> out;
    std::ifstream f(r.dir + "/events.jsonl");
    for (std::string line; std::getline(f, line);) out.push_back(nlohmann::json::parse(line));
    return out;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- crash: SIGKILL, no cleanup; the launcher tears the job down ----

TEST(Faults, CrashOneRankIsKilledAndLeavesNoExitStatus) {
    ms::test::TempDir tmp("ms_faults");
    const TrainRun r = train(tmp, 1, "crash@step=3");
    EXPECT_EQ(r.code, 128 + SIGKILL) << r.output;
    EXPECT_LT(r.seconds, kExitSlackS);
    EXPECT_TRUE(rank_status(r, 0).is_null());
    const auto ev = events(r);
    ASSERT_EQ(ev.size(), 2u) << r.output;  // start, the injection, and nothing after it: no chance to say more
    EXPECT_EQ(ev[0]["event"], "start");
    EXPECT_EQ(ev[1]["event"], "fault_injected");
}

TEST(Faults, CrashDp2KillsThePeerWhichDumpsItsFlightRecorderOnSigterm) {
    ms::test::TempDir tmp("ms_faults");
    const TrainRun r = train(tmp, 2, "crash@step=3,rank=1");
    EXPECT_EQ(r.code, 128 + SIGKILL) << r.output;  // mpirun reports the crashed rank's signal
    EXPECT_LT(r.seconds, kExitSlackS);
    EXPECT_TRUE(rank_status(r, 1).is_null());
    // Rank 0 was blocked in a collective when mpirun's SIGTERM came: its roll call found rank 1 dead, so it gave
    // up the wait (exit code 18 naming rank 1: tests/parallel/test_exit_status.cpp) and left its flight recorder.
    EXPECT_EQ(rank_status(r, 0)["code"], 18) << r.output;
    const nlohmann::json t = trace(r, 0);
    ASSERT_FALSE(t.is_null()) << r.output;
    EXPECT_TRUE(has(t["reason"], "signal 15")) << t["reason"];
    ASSERT_FALSE(t["pending"].empty());
    EXPECT_EQ(t["pending"][0]["state"], "timed_out");
}

// ---- hang: the peers time out after collective_timeout_s and exit 18; mpirun then kills the hung rank ----

TEST(Faults, HangDp2TimesOutWith18AndNamesThePendingCollective) {
    ms::test::TempDir tmp("ms_faults");
    const TrainRun r = train(tmp, 2, "hang@step=3,rank=1");
    EXPECT_EQ(r.code, 18) << r.output;
    EXPECT_GE(r.seconds, kTimeoutS);
    EXPECT_LE(r.seconds, kTimeoutS + kExitSlackS);
    const nlohmann::json s0 = rank_status(r, 0);
    ASSERT_FALSE(s0.is_null()) << r.output;
    EXPECT_EQ(s0["code"], 18);
    EXPECT_EQ(s0["iteration"], 3);
    EXPECT_EQ(s0["requeue"], true);
    EXPECT_TRUE(rank_status(r, 1).is_null());  // the hung rank was killed
    EXPECT_EQ(read_json(r.dir + "/exit_status.json")["code"], 18);
    // The flight recorder names the collective rank 0 waited in: the step boundary's all-reduce over world, which
    // rank 1 (asleep at the start of iteration 3) never posted.
    const nlohmann::json t = trace(r, 0);
    ASSERT_FALSE(t.is_null()) << r.output;
    ASSERT_EQ(t["pending"].size(), 1u) << t.dump(1);
    const nlohmann::json& op = t["pending"][0];
    EXPECT_EQ(op["comm"], "world");
    EXPECT_EQ(op["op"], "all_reduce");
    EXPECT_EQ(op["state"], "timed_out");
    EXPECT_GE(op["waited_s"].get<double>(), kTimeoutS);
    EXPECT_TRUE(has(r.output, "collective timeout error: world rank 0")) << r.output;
    EXPECT_TRUE(has(s0["reason"], "world all_reduce #")) << s0["reason"];
}

// Every rank of `survivors` left exit status 18 and a flight-recorder trace; the hung rank, killed, left no status.
void expect_survivors_ended_with_18(const TrainRun& r, std::initializer_list<int> survivors, int hung) {
    for (int rank : survivors) {
        const nlohmann::json s = rank_status(r, rank);
        ASSERT_FALSE(s.is_null()) << "rank " << rank << "\n" << r.output;
        EXPECT_EQ(s["code"], 18) << rank;
        EXPECT_FALSE(trace(r, rank).is_null()) << rank;
    }
    EXPECT_TRUE(rank_status(r, hung).is_null());
}

TEST(Faults, HangPp2Dp2EndsEverySurvivorWith18AndTheTracesPointAtTheHungRank) {
    ms::test::TempDir tmp("ms_faults");
    const TrainRun r = train(tmp, 4, "hang@step=3,rank=1", "--set parallel.pipeline_model_parallel_size=2");
    EXPECT_EQ(r.code, 18) << r.output;
    EXPECT_LE(r.seconds, kTimeoutS + kExitSlackS);
    expect_survivors_ended_with_18(r, {0, 2, 3}, 1);
    // Rank 3 (stage 1, same dp rank as 1) waits for rank 1's activations: its pending receive names world rank 1.
    const nlohmann::json t3 = trace(r, 3);
    ASSERT_FALSE(t3.is_null());
    ASSERT_FALSE(t3["pending"].empty()) << t3.dump(1);
    EXPECT_EQ(t3["pending"][0]["comm"], "pp");
    EXPECT_EQ(t3["pending"][0]["op"], "recv");
    EXPECT_EQ(t3["pending"][0]["peer_world_rank"], 1);
}

// With parallel.comm_engine the pp, dp and mp operations wait on the engine's thread, which waits an operation past
// the timeout through the same watch: every survivor still ends with 18, after at most two timeouts, and the trace
// of the rank waiting for the hung one's activations still shows that receive.
TEST(Faults, HangPp2Dp2WithTheCommEngineEndsEverySurvivorWith18) {
    ms::test::TempDir tmp("ms_faults");
    const TrainRun r = train(tmp, 4, "hang@step=3,rank=1",
                             "--set parallel.pipeline_model_parallel_size=2 --set parallel.comm_engine=true");
    EXPECT_EQ(r.code, 18) << r.output;
    EXPECT_TRUE(has(r.output, "comm engine: a progress thread")) << r.output;
    EXPECT_LE(r.seconds, 2 * kTimeoutS + kExitSlackS);
    expect_survivors_ended_with_18(r, {0, 2, 3}, 1);
    const nlohmann::json t3 = trace(r, 3);
    ASSERT_FALSE(t3.is_null());
    bool recv_from_1 = false;
    for (const nlohmann::json& op : t3["pending"])
        recv_from_1 = recv_from_1 || (op["comm"] == "pp" && op["peer_world_rank"] == 1);
    EXPECT_TRUE(recv_from_1) << t3.dump(1);
    // the dump shows the engine's queue beside the recorders: what it issued, and what waited to be issued
    const nlohmann::json& engine = t3["comm_engine"];
    ASSERT_TRUE(engine.is_object()) << t3.dump(1);
    EXPECT_TRUE(engine["queued"].is_array()) << engine.dump(1);
    EXPECT_GT(engine["stats"]["critical_ops"].get<int>(), 0) << engine.dump(1);
}

// ---- nan: fail -> 17 on every rank, with rank, stage and iteration; skip -> every rank skips the step ----

TEST(Faults, NanFailOneRankExits17NamingRankStageIteration) {
    ms::test::TempDir tmp("ms_faults");
    const TrainRun r = train(tmp, 1, "nan@step=3");
    EXPECT_EQ(r.code, 17) << r.output;
    EXPECT_TRUE(has(r.output, "numerical error: Rank 0, node ")) << r.output;
    EXPECT_TRUE(has(r.output, ", pipeline stage 0, iteration 3: found NaN in local grad norm")) << r.output;
    EXPECT_EQ(rank_status(r, 0)["code"], 17);
    EXPECT_EQ(rank_status(r, 0)["iteration"], 3);
}

TEST(Faults, NanFailPp2Exits17OnEveryRankAndNamesTheRankThatFoundIt) {
    ms::test::TempDir tmp("ms_faults");
    const TrainRun r = train(tmp, 2, "nan@step=3,rank=1", "--set parallel.pipeline_model_parallel_size=2");
    EXPECT_EQ(r.code, 17) << r.output;
    EXPECT_LT(r.seconds, kExitSlackS);
    const nlohmann::json s0 = rank_status(r, 0), s1 = rank_status(r, 1);
    ASSERT_FALSE(s0.is_null() || s1.is_null()) << r.output;
    EXPECT_EQ(s0["code"], 17);
    EXPECT_EQ(s1["code"], 17);
    EXPECT_TRUE(has(s1["reason"], "Rank 1, node ")) << s1["reason"];
    EXPECT_TRUE(has(s1["reason"], "pipeline stage 1, iteration 3: found NaN in local grad norm")) << s1["reason"];
    EXPECT_TRUE(has(s0["reason"], "pipeline stage 0, iteration 3: rank 1 (pipeline stage 1) found NaN"))
        << s0["reason"];
}

// The iteration-4..6 losses of `r`'s metrics.jsonl.
std::vector<double> later_losses(const TrainRun& r) {
    std::vector<double> out;
    std::ifstream f(r.dir + "/metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
        const auto j = nlohmann::json::parse(line);
        if (j.contains("lm loss") && j["iteration"].get<int>() >= 4) out.push_back(j["lm loss"].get<double>());
    }
    return out;
}

TEST(Faults, NanSkipDp2SkipsTheStepOnEveryRankLikeOneRankDoes) {
    ms::test::TempDir a("ms_faults"), b("ms_faults");
    const TrainRun one = train(a, 1, "nan@step=3", "--set reliability.nan_policy=skip");
    const TrainRun two = train(b, 2, "nan@step=3,rank=1", "--set reliability.nan_policy=skip");
    for (const TrainRun* r : {&one, &two}) {
        ASSERT_EQ(r->code, 0) << r->output;
        EXPECT_TRUE(has(r->output, "number of skipped iterations:   1 | number of nan iterations:   1")) << r->output;
        EXPECT_EQ(rank_status(*r, 0)["code"], 0);
    }
    EXPECT_EQ(rank_status(two, 1)["code"], 0);
    EXPECT_TRUE(has(two.output,
                    "iteration 3: skipped the optimizer step on every rank: rank 1 (pipeline stage 0) "
                    "found NaN in local grad norm"))
        << two.output;
    // Both layouts see the same global batch per step (tiny.yaml), so if every rank skipped step 3 the later
    // losses agree to 2e-6 relative, the bound tests/parallel/test_equivalence.cpp measured for dp 1 vs dp 2. Had
    // only one dp rank stepped, the replicas would differ and so would the losses. Taking step 3 moves them by far
    // more than that bound (checked against a run without the fault), so the comparison can fail.
    ms::test::TempDir c("ms_faults");
    const TrainRun clean = train(c, 1, "");
    ASSERT_EQ(clean.code, 0) << clean.output;
    const auto l1 = later_losses(one), l2 = later_losses(two), l0 = later_losses(clean);
    ASSERT_EQ(l1.size(), 3u);
    ASSERT_EQ(l2.size(), 3u);
    ASSERT_EQ(l0.size(), 3u);
    for (size_t i = 0; i < l1.size(); ++i) {
        EXPECT_NEAR(l1[i], l2[i], 2e-6 * l1[i]) << "iteration " << i + 4;
        EXPECT_GT(std::abs(l1[i] - l0[i]), 100 * 2e-6 * l1[i]) << "iteration " << i + 4;
    }
    const auto ev = events(two);
    ASSERT_GE(ev.size(), 2u);
    EXPECT_EQ(ev[1]["event"], "nan_skip");
    EXPECT_EQ(ev[1]["found_by"], 1);
}

// ---- sigterm: every rank finishes the iteration, saves, exits 3 ----

TEST(Faults, SigtermOneRankSavesAndExits3) {
    ms::test::TempDir tmp("ms_faults");
    const TrainRun r = train(tmp, 1, "sigterm@step=3", "--set checkpoint.save=" + tmp / "ckpt");
    EXPECT_EQ(r.code, 3) << r.output;
    EXPECT_TRUE(fs::exists(tmp / "ckpt/iter_0000003")) << r.output;
    const nlohmann::json s = rank_status(r, 0);
    EXPECT_EQ(s["code"], 3);
    EXPECT_EQ(s["iteration"], 3);
    EXPECT_TRUE(has(s["reason"], "SIGTERM received (rank 0 first): stopped after iteration 3; checkpoint saved to"))
        << s["reason"];
}

TEST(Faults, SigtermOnOneRankOfPp2StopsEveryRankWith3) {
    ms::test::TempDir tmp("ms_faults");
    const TrainRun r = train(tmp, 2, "sigterm@step=3,rank=1",
                             "--set parallel.pipeline_model_parallel_size=2 --set checkpoint.save=" + tmp / "ckpt");
    EXPECT_EQ(r.code, 3) << r.output;
    for (int rank : {0, 1}) {
        const nlohmann::json s = rank_status(r, rank);
        ASSERT_FALSE(s.is_null()) << rank << "\n" << r.output;
        EXPECT_EQ(s["code"], 3);
        EXPECT_EQ(s["iteration"], 3);
    }
    EXPECT_TRUE(fs::exists(tmp / "ckpt/iter_0000003/manifest.json")) << r.output;
    bool signal_event = false;
    for (const auto& e : events(r)) signal_event |= e["event"] == "signal" && e["first_rank"] == 1;
    EXPECT_TRUE(signal_event);
}

// SIGUSR1 sent to mpirun from outside (what a scheduler does) is forwarded to every rank: all stop with 3.
TEST(Faults, SigusrToMpirunStopsEveryRankWith3) {
    ms::test::TempDir tmp("ms_faults");
    const std::string dir = tmp / "run";
    // sh runs `timeout` in the background and records its pid; mpiexec is timeout's child.
    const std::string cmd = fmt::format(
        "{}{}{} --set training.train_iters=100000 --set run.output_dir={} > {}/out.log 2>&1 & echo $! > {}/pid; "
        "wait $!; echo $? > {}/rc",
        kEnv, ranks_flag(2), train_args(), dir, tmp.path(), tmp.path(), tmp.path());
    std::thread launcher([&] { [[maybe_unused]] const int rc = std::system(cmd.c_str()); });
    // Once iteration 2 is in metrics.jsonl, every rank is in the loop with its handlers installed.
    bool running = false;
    for (int i = 0; i < 600 && !running; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        std::ifstream m(dir + "/metrics.jsonl");
        const std::string all((std::istreambuf_iterator<char>(m)), std::istreambuf_iterator<char>());
        running = has(all, "\"iteration\":2,");
    }
    pid_t timeout_pid = 0;
    std::ifstream(tmp / "pid") >> timeout_pid;
    int mpirun = 0;
    if (FILE* p = popen(("pgrep -P " + std::to_string(timeout_pid)).c_str(), "r")) {
        if (fscanf(p, "%d", &mpirun) != 1) mpirun = 0;
        pclose(p);
    }
    const bool found = running && timeout_pid > 0 && mpirun > 0;
    kill(found ? mpirun : timeout_pid, found ? SIGUSR1 : SIGTERM);  // timeout passes a SIGTERM on to mpiexec
    launcher.join();
    ASSERT_TRUE(found) << "running " << running << ", timeout pid " << timeout_pid << ", mpirun pid " << mpirun;
    int rc = -1;
    std::ifstream(tmp / "rc") >> rc;
    std::ifstream log(tmp / "out.log");
    const std::string out((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    EXPECT_EQ(rc, 3) << out;
    TrainRun r;
    r.dir = dir;
    for (int rank : {0, 1}) EXPECT_EQ(rank_status(r, rank)["code"], 3) << rank << "\n" << out;
    EXPECT_TRUE(has(rank_status(r, 0)["reason"], "SIGUSR1 received")) << out;
}

// ---- after a fault: auto-resume continues as if nothing had happened ----

// iteration -> lm loss from metrics.jsonl. A resumed run first drops what the interrupted one logged past the
// checkpoint (engine/train/metrics_log.h), so every iteration has exactly one line.
std::map<int, double> losses(const std::string& run_dir) {
    std::map<int, double> out;
    std::ifstream f(run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
        const auto j = nlohmann::json::parse(line);
        if (!j.contains("lm loss") || !j["lm loss"].is_number()) continue;
        const int it = j["iteration"].get<int>();
        EXPECT_EQ(out.count(it), 0u) << "iteration " << it << " logged twice in " << run_dir << "/metrics.jsonl";
        out[it] = j["lm loss"];
    }
    return out;
}

// A crash (dp 2, at iteration 6: iteration 5 is already logged) and a hang (pp 2, at iteration 5), with a
// checkpoint every 2 iterations; then the same command without the fault auto-resumes from iteration 4 and
// finishes: every loss from 5 on equals an undisturbed run's bit for bit (same layout: exact resume), no uncommitted
// checkpoint is ever loaded, and metrics.jsonl holds each iteration once (`dropped_lines`: what the resume trimmed).
void check_resume_after(const std::string& fault, int np, const std::string& layout, int dropped_lines) {
    const std::string ckpt_sets = layout +
                                  " --set checkpoint.save_interval=2 --set checkpoint.save={0}/ckpt "
                                  "--set checkpoint.load={0}/ckpt";
    ms::test::TempDir clean("ms_faults_clean"), faulty("ms_faults_resume");
    const TrainRun undisturbed = train(clean, np, "", fmt::format(fmt::runtime(ckpt_sets), clean.path()));
    ASSERT_EQ(undisturbed.code, 0) << undisturbed.output;
    const TrainRun failed = train(faulty, np, fault, fmt::format(fmt::runtime(ckpt_sets), faulty.path()));
    ASSERT_NE(failed.code, 0) << failed.output;
    EXPECT_LT(failed.seconds, kTimeoutS + kExitSlackS);
    for (const auto& e : fs::directory_iterator(faulty / "ckpt")) {  // nothing half-written looks committed
        const std::string name = e.path().filename().string();
        if (name.rfind("iter_", 0) == 0 && name.find(".tmp") == std::string::npos) {
            EXPECT_TRUE(fs::exists(e.path() / "manifest.json")) << name;
        }
    }
    const TrainRun resumed = train(faulty, np, "", fmt::format(fmt::runtime(ckpt_sets), faulty.path()));
    ASSERT_EQ(resumed.code, 0) << resumed.output;
    EXPECT_TRUE(has(resumed.output, "iter_0000004")) << resumed.output;  // resumed from the last checkpoint
    EXPECT_EQ(has(resumed.output, fmt::format("metrics: dropped {} line(s)", dropped_lines)), dropped_lines > 0)
        << resumed.output;
    const auto want = losses(undisturbed.dir), got = losses(resumed.dir);
    ASSERT_EQ(want.size(), 6u) << undisturbed.output;
    for (int it = 5; it <= 6; ++it) {
        ASSERT_TRUE(got.count(it)) << it << "\n" << resumed.output;
        EXPECT_EQ(got.at(it), want.at(it)) << "iteration " << it;
    }
}

TEST(Faults, AutoResumeAfterACrashOnDp2ContinuesLikeAnUndisturbedRun) {
    check_resume_after("crash@step=6,rank=1", 2, "", 1);
}

TEST(Faults, AutoResumeAfterAHangOnPp2ContinuesLikeAnUndisturbedRun) {
    check_resume_after("hang@step=5,rank=1", 2, "--set parallel.pipeline_model_parallel_size=2", 0);
}

}  // namespace
