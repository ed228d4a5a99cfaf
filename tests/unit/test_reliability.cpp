// test_reliability.cpp: the parts of engine/train/reliability.h and comm/flight_recorder.h that need no MPI job --
// the fault-injection grammar and its errors, the reliability.* config keys, the signal handlers (in forked
// children: the stop flag is process state), the NaN verdicts of step_boundary on one rank, the run files, and the
// flight recorder's ring. tests/parallel/test_faults.cpp runs the faults end to end under mpiexec.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "comm/flight_recorder.h"
#include "comm/process_groups.h"
#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/config/config.h"
#include "engine/train/reliability.h"
#include "tests/common/temp_dir.h"

namespace {

using ms::FaultKind;

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const ms::UserError& e) {
        EXPECT_EQ(e.exit_code(), ms::kExitConfigError);
        return e.what();
    }
    ADD_FAILURE() << "no UserError";
    return "";
}

nlohmann::json read_json(const std::string& path) {
    std::ifstream f(path);
    EXPECT_TRUE(f.good()) << path;
    return nlohmann::json::parse(f);
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
    std::ifstream f(path);
    std::vector<nlohmann::json> lines;
    for (std::string line; std::getline(f, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
}

TEST(FaultInjection, ParsesEveryKind) {
    const auto f = ms::parse_fault_injection("crash@step=5,rank=3", "MS_INJECT", 4, 10);
    EXPECT_EQ(f.kind, FaultKind::kCrash);
    EXPECT_EQ(f.step, 5);
    EXPECT_EQ(f.rank, 3);
    EXPECT_EQ(ms::parse_fault_injection("hang@rank=1,step=2", "x", 2, 10).kind, FaultKind::kHang);
    EXPECT_EQ(ms::parse_fault_injection("nan@step=10", "x", 1, 10).kind, FaultKind::kNan);
    const auto s = ms::parse_fault_injection("sigterm@step=1", "x", 8, 10);
    EXPECT_EQ(s.kind, FaultKind::kSigterm);
    EXPECT_EQ(s.rank, 0);  // rank 0 when omitted
    EXPECT_EQ(ms::parse_fault_injection("", "x", 1, 10).kind, FaultKind::kNone);
}

TEST(FaultInjection, BadSpecsSayWhatIsWrong) {
    const auto err = [](const char* spec) {
        return error_of([&] { ms::parse_fault_injection(spec, "reliability.inject", 2, 10); });
    };
    const std::string unknown = err("boom@step=1");
    EXPECT_NE(unknown.find("reliability.inject = 'boom@step=1'"), std::string::npos) << unknown;
    EXPECT_NE(unknown.find("unknown fault kind 'boom'"), std::string::npos) << unknown;
    EXPECT_NE(unknown.find("crash, hang, nan or sigterm"), std::string::npos) << unknown;
    EXPECT_NE(err("crash").find("no '@'"), std::string::npos);
    EXPECT_NE(err("crash@rank=1").find("step=<S> is missing"), std::string::npos);
    EXPECT_NE(err("crash@step=1,rank=2").find("rank 2 is not in [0, 2)"), std::string::npos);
    EXPECT_NE(err("crash@step=11").find("step 11 is outside [1, 10]: the fault would never fire"), std::string::npos);
    EXPECT_NE(err("crash@step=x").find("'step=x' is not key=<integer>"), std::string::npos);
    EXPECT_NE(err("crash@step=1,step=2").find("'step' is given twice"), std::string::npos);
    EXPECT_NE(err("crash@step=1,node=2").find("'node' is not a key"), std::string::npos);
}

TEST(FaultInjection, EnvironmentWinsOverConfig) {
    ms::ReliabilityConfig cfg;
    cfg.inject = "nan@step=2";
    EXPECT_EQ(ms::resolve_fault_injection(cfg, 2, 10).source, "reliability.inject");
    const auto f = ms::resolve_fault_injection(cfg, 2, 10, "hang@step=3,rank=1");  // MS_INJECT's value
    const auto g = ms::resolve_fault_injection(cfg, 2, 10, "");  // set but empty: the config applies again
    EXPECT_EQ(f.kind, FaultKind::kHang);
    EXPECT_EQ(f.source, "MS_INJECT");
    EXPECT_EQ(g.kind, FaultKind::kNan);
}

TEST(ReliabilityConfig, KeysAreValidated) {
    const std::string policy = error_of([] { ms::load_config("", {"reliability.nan_policy=ignore"}); });
    EXPECT_NE(policy.find("reliability.nan_policy = 'ignore' must be one of: fail, skip"), std::string::npos) << policy;
    const std::string timeout = error_of([] { ms::load_config("", {"reliability.collective_timeout_s=-1"}); });
    EXPECT_NE(timeout.find("reliability.collective_timeout_s = -1.0 must be >= 0"), std::string::npos) << timeout;
    ms::Config cfg = ms::load_config("", {"reliability.inject=crash@step=2,rank=4", "model.vocab_size=64",
                                          "model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4"});
    const std::string inject = error_of([&] { ms::validate_config(cfg, 4); });
    EXPECT_NE(inject.find("rank 4 is not in [0, 4)"), std::string::npos) << inject;
    const ms::Config defaults =
        ms::load_config("", {"model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4"});
    EXPECT_EQ(defaults.reliability.nan_policy, "fail");
    EXPECT_EQ(defaults.reliability.collective_timeout_s, 600.0);
    EXPECT_EQ(defaults.reliability.inject, "");
}

// Runs `body` in a forked child and returns its wait status (the stop flag and handlers are process state).
int in_child(const std::function<int()>& body) {
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) _exit(body());
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

// SIGTERM, SIGUSR1 and SIGINT: the first only sets the flag; a second one, of any of them, ends the process by that
// signal (no exit record is armed here, so none is written: tests/parallel/test_signals.cpp checks the one written).
TEST(Signals, FirstSignalOnlySetsTheFlagASecondKills) {
    for (const int second : {SIGTERM, SIGUSR1, SIGINT}) {
        const int status = in_child([second] {
            ms::install_signal_handlers();
            if (ms::stop_signal() != 0) return 10;
            raise(SIGUSR1);
            if (ms::stop_signal() != SIGUSR1) return 11;
            raise(second);
            return 12;
        });
        ASSERT_TRUE(WIFSIGNALED(status)) << "exit code " << WEXITSTATUS(status);
        EXPECT_EQ(WTERMSIG(status), second);
    }
}

TEST(Signals, SigintIsAStopSignal) {
    const int status = in_child([] {
        ms::install_signal_handlers();
        raise(SIGINT);
        return ms::stop_signal() == SIGINT ? 0 : 1;
    });
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
}

// One rank, no MPI: ProcessGroups over SelfCommunicators, the reference CPU backend.
struct OneRank {
    ms::test::TempDir dir{"ms_reliability"};
    ms::Config cfg;
    ms::SelfCommunicator world{"world"};
    ms::ProcessGroups groups;
    std::unique_ptr<ms::Backend> backend = ms::make_backend({});
    std::vector<float> grads = std::vector<float>(100, 0.5f);

    explicit OneRank(const std::string& policy, const std::string& inject = "") {
        cfg = ms::load_config("", {"run.output_dir=" + dir.path(), "reliability.nan_policy=" + policy,
                                   "reliability.inject=" + inject, "training.train_iters=10", "model.num_layers=2",
                                   "model.hidden_size=64", "model.num_attention_heads=4"});
        groups = ms::make_process_groups(world, ms::Topology{});
    }
    // The trainer's step boundary on these gradients: the injection, their sum of squares, the verdict.
    ms::StepVerdict boundary(ms::Reliability& rel, int64_t it, float loss) {
        const ms::Tensor g = ms::Tensor::f32(grads.data(), {static_cast<int64_t>(grads.size())});
        rel.inject_nan(it, g, *backend);
        const double squares = backend->sum_squares(g);
        return rel.step_boundary(world, it, loss, squares, /*check_grads=*/true);
    }
};

TEST(StepBoundary, FailNamesRankStageAndIterationAndRecordsExit17) {
    OneRank r("fail", "nan@step=4");
    ms::Reliability rel(r.cfg, r.groups, "host-a");
    rel.start(r.world, 0x1234);
    for (int64_t it = 1; it <= 3; ++it) {
        rel.begin_step(it);
        const ms::StepVerdict v = r.boundary(rel, it, 2.5f);
        EXPECT_FALSE(v.skip_step || v.stop) << it;
        rel.after_step(it);
    }
    rel.begin_step(4);
    std::string msg;
    try {
        r.boundary(rel, 4, 2.5f);
    } catch (const ms::NumericalError& e) {
        msg = e.what();
        EXPECT_EQ(e.exit_code(), ms::kExitNumerical);
    }
    EXPECT_NE(msg.find("Rank 0, node host-a, pipeline stage 0, iteration 4: found NaN in local grad norm"),
              std::string::npos)
        << msg;
    EXPECT_TRUE(std::isnan(r.grads[0]));  // the injection poisons the first gradient element
    const nlohmann::json status = read_json(r.dir / "exit_status.json");
    EXPECT_EQ(status["code"], 17);
    EXPECT_EQ(status["iteration"], 4);
    EXPECT_EQ(status["rank"], 0);
    EXPECT_EQ(status["host"], "host-a");
    EXPECT_EQ(status["requeue"], false);
    EXPECT_EQ(read_json(r.dir / "exit_status/rank_00000.json"), status);
    const auto events = read_jsonl(r.dir / "events.jsonl");
    ASSERT_EQ(events.size(), 4u);
    EXPECT_EQ(events[0]["event"], "start");
    EXPECT_EQ(events[0]["config_hash"], "0000000000001234");
    EXPECT_EQ(events[0]["inject"]["spec"], "nan@step=4");
    EXPECT_EQ(events[1]["event"], "fault_injected");
    EXPECT_EQ(events[1]["iteration"], 4);
    EXPECT_EQ(events[2]["event"], "nan_fail");
    EXPECT_EQ(events[3]["event"], "exit");
    EXPECT_EQ(events[3]["code"], 17);
    ms::record_exit(0, "again");  // once per process: the first record stands
    EXPECT_EQ(read_json(r.dir / "exit_status.json")["code"], 17);
}

TEST(StepBoundary, InfInTheLossOfTheLastStageIsFoundAsInf) {
    OneRank r("fail");
    ms::Reliability rel(r.cfg, r.groups, "h");
    std::string msg;
    try {
        r.boundary(rel, 1, std::numeric_limits<float>::infinity());
    } catch (const ms::NumericalError& e) {
        msg = e.what();
    }
    EXPECT_NE(msg.find("iteration 1: found Inf in local loss before the data-parallel reduction"), std::string::npos)
        << msg;
}

TEST(StepBoundary, SkipAgreesToSkipAndLogsTheEvent) {
    OneRank r("skip", "nan@step=2");
    ms::Reliability rel(r.cfg, r.groups, "h");
    rel.start(r.world, 1);
    rel.begin_step(1);
    EXPECT_FALSE(r.boundary(rel, 1, 1.0f).skip_step);
    rel.begin_step(2);
    EXPECT_TRUE(r.boundary(rel, 2, 1.0f).skip_step);
    rel.after_step(2);
    r.grads[0] = 0.5f;  // the next backward overwrites the gradients
    rel.begin_step(3);
    EXPECT_FALSE(r.boundary(rel, 3, 1.0f).skip_step);
    EXPECT_EQ(rel.finish(10), ms::kExitOk);
    const auto events = read_jsonl(r.dir / "events.jsonl");
    ASSERT_EQ(events.size(), 4u);  // start, fault_injected, nan_skip, exit
    EXPECT_EQ(events[1]["event"], "fault_injected");
    EXPECT_EQ(events[2]["event"], "nan_skip");
    EXPECT_EQ(events[2]["iteration"], 2);
    EXPECT_EQ(events[2]["found_by"], 0);
    EXPECT_EQ(read_json(r.dir / "exit_status.json")["code"], 0);
}

TEST(StepBoundary, StartClearsThePreviousRunsExitFilesAndKeepsItsTraces) {
    OneRank r("fail");
    std::filesystem::create_directories(r.dir / "exit_status");
    std::filesystem::create_directories(r.dir / "comm_traces");
    std::ofstream(r.dir / "exit_status.json") << "{}";
    std::ofstream(r.dir / "comm_traces/rank_00000.json") << "{}";
    ms::Reliability rel(r.cfg, r.groups, "h");
    rel.start(r.world, 1);
    EXPECT_FALSE(std::filesystem::exists(r.dir / "exit_status.json"));
    EXPECT_FALSE(std::filesystem::exists(r.dir / "exit_status"));
    EXPECT_TRUE(std::filesystem::exists(r.dir / "comm_traces.prev/rank_00000.json"));
    EXPECT_EQ(rel.exit_on_signal(7, "/ckpt/iter_0000007"), ms::kExitSignal);
    const nlohmann::json status = read_json(r.dir / "exit_status.json");
    EXPECT_EQ(status["code"], 3);
    EXPECT_EQ(status["requeue"], true);
    EXPECT_NE(status["reason"].get<std::string>().find("checkpoint saved to /ckpt/iter_0000007"), std::string::npos);
}

TEST(FlightRecorder, RingKeepsTheLastOperationsWithoutGrowing) {
    ms::FlightRecorder rec("pp", 1, 2);
    rec.set_world_ranks({3, 5});
    const size_t n = ms::FlightRecorder::kCapacity + 10;
    for (size_t i = 1; i <= n; ++i) {
        const uint64_t seq = rec.posted(ms::CommOp::kAllReduce, i, ms::DType::kF32);
        EXPECT_EQ(seq, i);
        if (i != n) rec.completed(seq);
    }
    EXPECT_EQ(rec.find(10), nullptr);  // overwritten
    ASSERT_NE(rec.find(11), nullptr);
    EXPECT_EQ(rec.last_seq(), n);
    const auto j = rec.to_json();
    EXPECT_EQ(j["entries"].size(), ms::FlightRecorder::kCapacity);
    EXPECT_EQ(j["entries"][0]["seq"], 11);
    EXPECT_EQ(j["world_ranks"], nlohmann::ordered_json({3, 5}));  // to_json() is ordered; Clang rejects the mix
    nlohmann::ordered_json pending = nlohmann::ordered_json::array();
    rec.pending_json(pending);
    ASSERT_EQ(pending.size(), 1u);
    EXPECT_EQ(pending[0]["seq"], n);
    EXPECT_EQ(pending[0]["state"], "posted");

    const uint64_t recv = rec.posted(ms::CommOp::kRecv, 4096, ms::DType::kF32, /*peer=*/0, /*tag=*/7, 1);
    rec.wait_started(recv);
    rec.timed_out(recv);
    EXPECT_EQ(rec.describe(recv),
              "pp recv #75 from rank 0 (world rank 3) tag 7 (4096 x fp32, group of 2, this rank 1)");
    EXPECT_EQ(rec.record_json(*rec.find(recv))["state"], "timed_out");
}

}  // namespace
