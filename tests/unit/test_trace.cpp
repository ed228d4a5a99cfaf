// test_trace.cpp: the timeline of engine/train/trace.h on one rank without MPI -- logging.trace_steps' forms, what a
// traced iteration records from its three hooks (an op, a communication counted by LinkModelCommunicator, pipeline
// actions), that nothing else is recorded, and the dropped events of a full buffer. The real runs are in
// tests/parallel/test_trace.cpp.
#include <gtest/gtest.h>

#include <array>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "comm/comm_matrix.h"
#include "comm/flight_recorder.h"
#include "comm/link_model_communicator.h"
#include "comm/nodes.h"
#include "comm/self_communicator.h"
#include "engine/config/config.h"
#include "engine/core/timer.h"
#include "engine/train/trace.h"
#include "tests/common/temp_dir.h"

namespace {

using ms::Action;

TEST(TraceSteps, ParsesAnIterationOrARange) {
    const auto one = ms::parse_trace_steps("7");
    ASSERT_TRUE(one);
    EXPECT_EQ(one->first, 7);
    EXPECT_EQ(one->last, 7);
    const auto range = ms::parse_trace_steps("3:5");
    ASSERT_TRUE(range);
    EXPECT_EQ(range->first, 3);
    EXPECT_EQ(range->last, 5);
    EXPECT_FALSE(range->contains(2));
    EXPECT_TRUE(range->contains(5));
    for (const char* bad : {"", "0", "5:3", "3:", ":4", "a", "1:2:3", "-1", "2,3", " 2"}) {
        EXPECT_FALSE(ms::parse_trace_steps(bad)) << "'" << bad << "'";
    }
}

// config.resolved.yaml quotes it: YAML 1.1 readers (PyYAML) take a plain 2:3 for the sexagesimal number 123.
TEST(TraceSteps, ResolvedConfigQuotesThemAndReadsThemBack) {
    ms::Config cfg;
    cfg.logging.trace_steps = "5:6";
    const std::string yaml = ms::config_to_yaml(cfg);
    EXPECT_NE(yaml.find("trace_steps: \"5:6\""), std::string::npos) << yaml;
    EXPECT_EQ(ms::load_config_text(yaml, "resolved", {}).logging.trace_steps, "5:6");
}

nlohmann::json read(const std::string& path) {
    std::ifstream f(path);
    return nlohmann::json::parse(f);
}

TEST(Trace, RecordsTheTracedIterationOnly) {
    const ms::test::TempDir dir("ms_trace");
    ms::CommMatrix matrix(0, ms::make_node_layout(0, {"host"}));
    ms::SelfCommunicator self("dp");
    ms::LinkModelCommunicator dp(self, {0}, matrix, nullptr);
    ms::Trace trace(dir.path(), {2, 2}, 3, {.world_rank = 0}, ms::unix_seconds(),
                    {.ops = 4, .comms = 4, .pipeline = 4});
    matrix.set_listener(&trace);
    const std::vector<Action> actions = {{Action::Kind::kForward, 0, 0, -1},
                                         {Action::Kind::kSendActivation, 0, 0, 1},
                                         {Action::Kind::kRecvGrad, 0, 0, 1}};
    std::array<float, 8> buf{};
    for (int64_t it = 1; it <= 3; ++it) {
        trace.begin_step(it);
        const double t0 = ms::now_seconds();
        trace.op({ms::OpKind::kMatmulForward, {2, 3, 4}}, t0, t0 + 1e-6);
        trace.compute(actions[0], t0, t0 + 2e-6);
        trace.p2p_batch(actions, 2, t0 + 2e-6, t0 + 3e-6);
        dp.all_reduce(std::span<float>(buf), ms::ReduceOp::kSum, ms::Priority::kLow).wait();
        trace.end_step(it);
    }
    EXPECT_EQ(trace.finish(self), dir / "trace.json");
    const nlohmann::json merged = read(dir / "trace.json");
    std::map<std::string, nlohmann::json> by_cat;
    for (const nlohmann::json& e : merged["traceEvents"]) {
        if (e["ph"] != "X") continue;
        EXPECT_EQ(e["args"]["iteration"], 2) << e.dump();
        EXPECT_FALSE(by_cat.count(e["cat"])) << "two " << e["cat"] << " events";
        by_cat[e["cat"]] = e;
    }
    EXPECT_EQ(by_cat["op"]["name"], "matmul forward N 2 K 3 M 4");
    EXPECT_EQ(by_cat["compute"]["name"], "F0");
    EXPECT_EQ(by_cat["p2p"]["name"], "send-act 0 + recv-grad 0");
    EXPECT_EQ(by_cat["p2p"]["args"]["messages"].size(), 2u);
    EXPECT_EQ(by_cat["iteration"]["name"], "iteration 2");
    const nlohmann::json& comm = by_cat["comm"];
    EXPECT_EQ(comm["name"], "dp all_reduce");
    EXPECT_EQ(comm["args"]["group"], "dp");
    EXPECT_EQ(comm["args"]["bytes"], 8 * 4);
    EXPECT_EQ(comm["args"]["priority"], "low");
    EXPECT_TRUE(by_cat.count("comm_wait"));                                          // wait() was called on it
    EXPECT_EQ(read(dir / "rank_00000.json")["traceEvents"], merged["traceEvents"]);  // one rank: the same events
    matrix.set_listener(nullptr);
}

TEST(Trace, AFullBufferDropsAndTheNextIterationHasRoom) {
    const ms::test::TempDir dir("ms_trace");
    ms::SelfCommunicator world;
    ms::Trace trace(dir.path(), {1, 2}, 2, {.world_rank = 0}, ms::unix_seconds(),
                    {.ops = 2, .comms = 1, .pipeline = 1});
    for (int64_t it = 1; it <= 2; ++it) {
        trace.begin_step(it);
        for (int i = 0; i < 5; ++i) trace.op({ms::OpKind::kGeluForward, {i + 1}}, 0.0, 0.0);
        trace.end_step(it);
    }
    trace.finish(world);
    std::map<int64_t, int> ops;
    const nlohmann::json merged = read(dir / "trace.json");
    for (const nlohmann::json& e : merged["traceEvents"]) {
        if (e["ph"] == "X" && e["cat"] == "op") ++ops[e["args"]["iteration"].get<int64_t>()];
    }
    EXPECT_EQ(ops[1], 2);  // the capacity
    EXPECT_EQ(ops[2], 5);  // grown by twice what was dropped
}

}  // namespace
