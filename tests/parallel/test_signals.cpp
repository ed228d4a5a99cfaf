// test_signals.cpp: a stop signal ends every phase of a run fast, the documented way (engine/train/reliability.h
// "Signals", README "Stopping a run"): setup, training, validation, the end-of-run sample, the `eval` and `generate`
// commands; SIGTERM, SIGUSR1 and SIGINT alike; a second signal at once, with a status; under mpiexec, SIGUSR1 to the
// launcher gives the launcher's exit code 3, SIGTERM does not, and the README's script turns one into the other.
//
// Each test starts the binary, waits for a line of its output that says the phase has begun, sends the signal and
// measures the seconds to exit. The phases are made long through the config (many layers, a long validation, many
// sampled tokens), so that a run that does not act on the signal goes on well past kStopBoundS. The bound: several
// times the seconds-to-exit bench/fault_matrix.sh measures for every phase, for a loaded two-core machine.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/job_run.h"
#include "tests/common/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr double kStopBoundS = 5;       // signal -> exit, every phase
constexpr double kWaitForPhaseS = 120;  // start -> the line that says the phase has begun
constexpr double kKillAfterS = 60;      // signal -> SIGKILL of a run that does not stop (a failure)

struct SignalRun {
    int code = -1;         // exit code, or 128 + signal
    double seconds = -1;   // from the first signal to the exit
    bool reached = false;  // the line appeared and the signals were sent
    std::string output;
};

std::string slurp(const std::string& path) {
    std::ifstream f(path);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Runs `command` (its output to <tmp>/out.log; the process is the command itself, not a shell), waits until `line`
// appears in its output, sends `signals` 50 ms apart and waits for the exit.
SignalRun run_and_signal(const ms::test::TempDir& tmp, const std::string& command, const std::string& line,
                         const std::vector<int>& signals) {
    const std::string log = tmp / "out.log";
    const std::string sh = fmt::format("cd '{}' && OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive exec {} > '{}' 2>&1",
                                       tmp.path(), command, log);
    SignalRun r;
    const pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", sh.c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    int status = 0;
    bool exited = false;
    const auto poll_exit = [&] {
        if (!exited && waitpid(pid, &status, WNOHANG) == pid) exited = true;
        return exited;
    };
    const auto t_start = Clock::now();
    while (!poll_exit() && std::chrono::duration<double>(Clock::now() - t_start).count() < kWaitForPhaseS) {
        if (has(slurp(log), line)) {
            r.reached = true;
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const auto t_signal = Clock::now();
    if (r.reached) {
        for (size_t i = 0; i < signals.size(); ++i) {
            if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
            kill(pid, signals[i]);
        }
    }
    while (!poll_exit()) {
        if (std::chrono::duration<double>(Clock::now() - t_signal).count() > kKillAfterS) kill(pid, SIGKILL);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    r.seconds = std::chrono::duration<double>(Clock::now() - t_signal).count();
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.output = slurp(log);
    return r;
}

std::string trainer() { return fmt::format("'{}'", MS_BINARY_PATH); }
std::string mpiexec(int np) { return fmt::format("mpiexec -n {} --oversubscribe --allow-run-as-root ", np); }

// tests/parallel/tiny.yaml with its output in <tmp>/run and `sets`.
std::string train(const ms::test::TempDir& tmp, const std::string& sets) {
    return fmt::format("{} train --config {}/tests/parallel/tiny.yaml --set run.output_dir={} {}", trainer(),
                       MS_SOURCE_DIR, tmp / "run", sets);
}

// A validation of 2000 iterations (8000 micro-batches) every 2 iterations: the synthetic data is
// large enough, and split evenly, that the validation split holds them all.
const std::string kLongValidation =
    "--set data.synthetic.num_tokens=2000000 --set data.split=50,50,0 --set eval.eval_interval=2 "
    "--set eval.eval_iters=2000";

// 2000 thin layers: setup (plan, build, initialisation) is long, and so is each step.
const std::string kLongSetup = "--set model.num_layers=2000 --set model.hidden_size=32";

nlohmann::json status_of(const ms::test::TempDir& tmp, const std::string& file) {
    return ms::test::read_json(tmp / ("run/" + file));
}
nlohmann::json rank_status(const ms::test::TempDir& tmp, int rank) { return ms::test::rank_status(tmp / "run", rank); }

void expect_stopped_fast(const SignalRun& r, int code) {
    ASSERT_TRUE(r.reached) << r.output;
    EXPECT_EQ(r.code, code) << r.output;
    EXPECT_LT(r.seconds, kStopBoundS) << r.output;
}

// ---- setup: nothing to save; the setup watch ends a long phase ----

TEST(Signals, SigtermDuringSetupExits3WithinSeconds) {
    ms::test::TempDir tmp("ms_signals");
    const SignalRun r = run_and_signal(tmp, train(tmp, kLongSetup + " --set training.train_iters=4"),
                                       "derived: global batch", {SIGTERM});
    expect_stopped_fast(r, 3);
    const nlohmann::json s = status_of(tmp, "exit_status.json");
    ASSERT_FALSE(s.is_null()) << r.output;
    EXPECT_EQ(s["code"], 3);
    EXPECT_TRUE(has(s["reason"], "SIGTERM received")) << s["reason"];
    EXPECT_TRUE(has(s["reason"], "during setup")) << s["reason"];
    EXPECT_FALSE(has(r.output, "iteration        1/")) << r.output;  // no step ran
}

// Both ranks get the launcher's SIGUSR1 in their setup; mpiexec returns their 3.
TEST(Signals, SigusrToMpiexecDuringSetupStopsEveryRankWith3) {
    ms::test::TempDir tmp("ms_signals");
    const SignalRun r = run_and_signal(tmp, mpiexec(2) + train(tmp, kLongSetup + " --set training.train_iters=4"),
                                       "derived: global batch", {SIGUSR1});
    expect_stopped_fast(r, 3);
    for (int rank : {0, 1}) {
        const nlohmann::json s = rank_status(tmp, rank);
        ASSERT_FALSE(s.is_null()) << rank << "\n" << r.output;
        EXPECT_EQ(s["code"], 3) << rank;
        EXPECT_TRUE(has(s["reason"], "SIGUSR1 received")) << s["reason"];
        EXPECT_TRUE(has(s["reason"], "during setup")) << s["reason"];
    }
}

// ---- validation: the iteration before it is saved; the partial validation is dropped ----

TEST(Signals, SigtermDuringValidationSavesThatIterationAndExits3) {
    ms::test::TempDir tmp("ms_signals");
    const SignalRun r = run_and_signal(
        tmp, train(tmp, kLongValidation + " --set training.train_iters=6 --set checkpoint.save=" + tmp / "ckpt"),
        "iteration        2/", {SIGTERM});
    expect_stopped_fast(r, 3);
    EXPECT_TRUE(fs::exists(tmp / "ckpt/iter_0000002/manifest.json")) << r.output;
    EXPECT_FALSE(fs::exists(tmp / "ckpt/iter_0000003")) << r.output;  // no further step
    EXPECT_FALSE(has(r.output, "validation loss at iteration 2")) << r.output;
    const nlohmann::json s = status_of(tmp, "exit_status.json");
    ASSERT_FALSE(s.is_null()) << r.output;
    EXPECT_EQ(s["code"], 3);
    EXPECT_TRUE(has(s["reason"],
                    "SIGTERM received (rank 0 first) during validation: stopped after iteration 2; "
                    "checkpoint saved to"))
        << s["reason"];
}

// Section "Launchers": SIGUSR1 to mpiexec is forwarded to every rank; all agree mid-validation, and mpiexec's own
// exit code is the ranks' 3.
TEST(Signals, SigusrToMpiexecDuringValidationStopsEveryRankWith3) {
    ms::test::TempDir tmp("ms_signals");
    const SignalRun r = run_and_signal(
        tmp,
        mpiexec(2) +
            train(tmp, kLongValidation + " --set training.train_iters=6 --set checkpoint.save=" + tmp / "ckpt"),
        "iteration        2/", {SIGUSR1});
    expect_stopped_fast(r, 3);
    for (int rank : {0, 1}) {
        const nlohmann::json s = rank_status(tmp, rank);
        ASSERT_FALSE(s.is_null()) << rank << "\n" << r.output;
        EXPECT_EQ(s["code"], 3) << rank;
        EXPECT_EQ(s["iteration"], 2) << rank;
        EXPECT_TRUE(has(s["reason"], "during validation")) << s["reason"];
    }
    EXPECT_TRUE(fs::exists(tmp / "ckpt/iter_0000002/manifest.json")) << r.output;
}

// Open MPI 4's mpirun turns a SIGTERM into a job kill and exits 1, whatever the ranks record (README "Stopping a
// run"): this test pins that down, so that a launcher that changes it shows here.
TEST(Signals, SigtermToMpiexecIsAJobKillThatExits1) {
    ms::test::TempDir tmp("ms_signals");
    const SignalRun r = run_and_signal(tmp, mpiexec(2) + train(tmp, "--set training.train_iters=100000"),
                                       "iteration        2/", {SIGTERM});
    expect_stopped_fast(r, 1);
}

// The README's launcher script: a SIGTERM to it reaches mpirun as SIGUSR1, and the script returns the ranks' 3.
TEST(Signals, SigtermToTheReadmeMpirunScriptGives3) {
    ms::test::TempDir tmp("ms_signals");
    {
        std::ofstream script(tmp / "run.sh");
        script << mpiexec(2) << train(tmp, "--set training.train_iters=100000") << " & pid=$!\n"
               << "trap 'kill -USR1 $pid 2>/dev/null' TERM INT USR1\n"
               << "while kill -0 $pid 2>/dev/null; do wait $pid; done\n"
               << "wait $pid\n";
    }
    const SignalRun r = run_and_signal(tmp, "bash " + tmp / "run.sh", "iteration        2/", {SIGTERM});
    expect_stopped_fast(r, 3);
    for (int rank : {0, 1}) {
        const nlohmann::json s = rank_status(tmp, rank);
        ASSERT_FALSE(s.is_null()) << rank << "\n" << r.output;
        EXPECT_EQ(s["code"], 3) << rank;
        EXPECT_TRUE(has(s["reason"], "SIGUSR1 received")) << s["reason"];
    }
}

// ---- training: SIGINT is a stop signal like SIGTERM ----

TEST(Signals, SigintDuringTrainingSavesAndExits3) {
    ms::test::TempDir tmp("ms_signals");
    const SignalRun r =
        run_and_signal(tmp, train(tmp, "--set training.train_iters=100000 --set checkpoint.save=" + tmp / "ckpt"),
                       "iteration        2/", {SIGINT});
    expect_stopped_fast(r, 3);
    const nlohmann::json s = status_of(tmp, "exit_status.json");
    ASSERT_FALSE(s.is_null()) << r.output;
    EXPECT_EQ(s["code"], 3);
    EXPECT_TRUE(has(s["reason"], "SIGINT received (rank 0 first): stopped after iteration")) << s["reason"];
    std::ifstream tracker(tmp / "ckpt/latest_checkpointed_iteration.txt");
    int64_t saved = 0;
    tracker >> saved;
    EXPECT_EQ(saved, s["iteration"].get<int64_t>()) << r.output;
}

// ---- a second signal: at once, and with a status ----

// The first SIGTERM waits for the step boundary of a 500-layer step; the second, 50 ms later, ends the process.
TEST(Signals, SecondSignalExitsAtOnceAndWritesTheStatus) {
    ms::test::TempDir tmp("ms_signals");
    const SignalRun r = run_and_signal(
        tmp, train(tmp, "--set model.num_layers=500 --set model.hidden_size=32 --set training.train_iters=100"),
        "iteration        1/", {SIGTERM, SIGTERM});
    expect_stopped_fast(r, 128 + SIGTERM);
    EXPECT_LT(r.seconds, 1.0) << r.output;  // "at once": the 50 ms between the signals and the exit itself
    const nlohmann::json s = status_of(tmp, "exit_status.json");
    ASSERT_FALSE(s.is_null()) << r.output;
    EXPECT_EQ(s["code"], 128 + SIGTERM);
    EXPECT_EQ(s["requeue"], true);
    EXPECT_EQ(s["iteration"], 2);  // the step it was in
    EXPECT_TRUE(has(s["reason"], "second stop signal (SIGTERM, the first was SIGTERM)")) << s["reason"];
    EXPECT_EQ(rank_status(tmp, 0), s);
    std::ifstream events(tmp / "run/events.jsonl");
    std::string last;
    for (std::string line; std::getline(events, line);) last = line;
    EXPECT_TRUE(has(last, "\"event\":\"exit\"") && has(last, "\"code\":143")) << last;
}

// ---- the end-of-run sample ----

// 4096 tokens (16 windows of 256, the most eval.sample_tokens allows), each a forward pass over up to 256 tokens.

TEST(Signals, SigtermDuringTheEndOfRunSampleExits3) {
    ms::test::TempDir tmp("ms_signals");
    const SignalRun r = run_and_signal(
        tmp,
        train(tmp,
              "--set training.train_iters=3 --set model.seq_length=256 --set eval.sample_tokens=4096 --set "
              "checkpoint.save=" +
                  tmp / "ckpt"),
        "checkpoint: saved iteration 3", {SIGTERM});
    expect_stopped_fast(r, 3);
    const nlohmann::json s = status_of(tmp, "exit_status.json");
    ASSERT_FALSE(s.is_null()) << r.output;
    EXPECT_EQ(s["code"], 3);
    EXPECT_TRUE(has(s["reason"], "during the end-of-run sample: stopped after iteration 3")) << s["reason"];
}

// ---- the eval and generate commands ----

// A checkpoint of tiny.yaml's model with a 256-token vocabulary (the byte-level tokenizer's), in <tmp>/ckpt.
void save_checkpoint(const ms::test::TempDir& tmp, const std::string& sets) {
    const std::string cmd = fmt::format(
        "OMP_NUM_THREADS=1 timeout 120 {} --set training.train_iters=2 --set lr_schedule.lr_warmup_iters=1 --set "
        "checkpoint.save={} {} > {} 2>&1",
        train(tmp, ""), tmp / "ckpt", sets, tmp / "train.log");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(tmp / "train.log");
}

TEST(Signals, EvalCommandStopsOnSigtermWith3) {
    ms::test::TempDir tmp("ms_signals");
    const std::string data = "--set data.synthetic.num_tokens=2000000 --set data.split=50,50,0";
    save_checkpoint(tmp, data);
    const SignalRun r =
        run_and_signal(tmp,
                       fmt::format("{} eval --config {}/tests/parallel/tiny.yaml {} --load {} --iters 2000", trainer(),
                                   MS_SOURCE_DIR, data, tmp / "ckpt"),
                       "eval: ", {SIGTERM});
    expect_stopped_fast(r, 3);
    EXPECT_TRUE(has(r.output, "eval: SIGTERM received")) << r.output;
    EXPECT_FALSE(has(r.output, "eval loss:")) << r.output;
}

TEST(Signals, GenerateCommandStopsOnSigtermWith3) {
    ms::test::TempDir tmp("ms_signals");
    save_checkpoint(tmp, "--set model.vocab_size=256");
    const SignalRun r =
        run_and_signal(tmp, fmt::format("{} generate --load {} --prompt 'ab' --tokens 200000", trainer(), tmp / "ckpt"),
                       "generate: ", {SIGTERM});
    expect_stopped_fast(r, 3);
    EXPECT_TRUE(has(r.output, "generate: SIGTERM received")) << r.output;
}

}  // namespace
