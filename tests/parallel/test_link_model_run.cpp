// test_link_model_run.cpp: the link model and the communication matrix in a training run (docs/communication.md),
// tests/parallel/tiny.yaml under mpiexec with 2 ranks.
//
// The link model only delays: a dp 2 run with it (every rank its own simulated node, so dp's ring is inter-node) has
// the losses of the run without it, bit for bit. comm_matrix.json holds what the run's counters say: rank 0's dp
// bytes to rank 1 summed over the run equal metrics.jsonl's per-step dp bytes (rank 0's counter) summed over the
// steps -- a dp 2 ring all-reduce of n bytes sends n to the other rank, which is what the counter counts -- and a pp 2
// run's pp bytes are its point-to-point sends exactly.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/common/job_run.h"
#include "tests/e2e/run_cli.h"

namespace {

struct TrainedRun {
    std::vector<double> losses;
    std::vector<nlohmann::json> records;  // metrics.jsonl's step records
    nlohmann::json matrix;                // comm_matrix.json
    std::string output;
};

// MS_CHECK_ALLOCS=1 (passed on by mpiexec -x): the third step makes no heap allocation, the decorator's pooled
// operation states and the stamps included (memory/alloc_guard.h).
TrainedRun train(const std::string& sets) {
    const std::string dir = ms::test::make_temp_dir();
    const std::string cmd =
        "MS_CHECK_ALLOCS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive timeout 120 mpiexec -n 2 -x MS_CHECK_ALLOCS "
        "--oversubscribe --allow-run-as-root '" MS_BINARY_PATH "' train --config " MS_SOURCE_DIR
        "/tests/parallel/tiny.yaml --set run.output_dir=" +
        dir + " " + sets + " 2>&1";
    const ms::test::JobRun job = ms::test::run_command(cmd, dir);
    EXPECT_EQ(job.code, 0) << cmd << "\n" << job.output;
    EXPECT_EQ(job.output.find("heap allocation"), std::string::npos) << job.output;
    TrainedRun r;
    r.output = job.output;
    std::ifstream metrics(dir + "/metrics.jsonl");
    std::string line;
    while (std::getline(metrics, line)) {
        const nlohmann::json j = nlohmann::json::parse(line);
        r.losses.push_back(j["lm loss"].get<double>());
        r.records.push_back(j);
    }
    r.matrix = ms::test::read_json(dir + "/comm_matrix.json");
    EXPECT_TRUE(r.matrix.is_object()) << "no comm_matrix.json in " << dir << "\n" << job.output;
    return r;
}

// The bytes of `group` from world rank `src` to `dst` in a gathered matrix, and the pair's link class.
std::pair<int64_t, std::string> pair_bytes(const nlohmann::json& m, const std::string& group, int src, int dst) {
    for (const nlohmann::json& p : m["pairs"]) {
        if (p["group"] == group && p["src"] == src && p["dst"] == dst) {
            return {p["bytes"].get<int64_t>(), p["link"].get<std::string>()};
        }
    }
    return {0, ""};
}

int64_t summed(const std::vector<nlohmann::json>& records, const char* group) {
    int64_t s = 0;
    for (const nlohmann::json& j : records) s += j["bytes_per_step"][group].get<int64_t>();
    return s;
}

TEST(LinkModelRun, Dp2LossesUnchangedAndTheMatrixMatchesTheCounters) {
    const TrainedRun off = train("");
    const TrainedRun on = train("--set link_model.enabled=true --set run.ranks_per_node=1");
    ASSERT_EQ(off.losses.size(), 10u) << off.output;
    EXPECT_EQ(on.losses, off.losses);  // bit for bit: the model only delays
    EXPECT_NE(on.output.find("link model: every communication delayed"), std::string::npos) << on.output;
    EXPECT_NE(on.output.find("comm matrix: "), std::string::npos) << on.output;
    for (const TrainedRun* r : {&off, &on}) {
        if (!r->matrix.is_object()) continue;
        const auto [bytes, link] = pair_bytes(r->matrix, "dp", 0, 1);
        EXPECT_GT(bytes, 0);
        EXPECT_EQ(bytes, summed(r->records, "dp"));
        EXPECT_EQ(pair_bytes(r->matrix, "dp", 1, 0).first, bytes);  // the ring's other half
        EXPECT_EQ(link, r == &on ? "inter_node" : "intra_node");    // simulated nodes of one rank; one host
        EXPECT_EQ(r->matrix["world_size"], 2);
        for (const nlohmann::json& j : r->records) EXPECT_GT(j["total_comm"].get<double>(), 0) << j.dump();
    }
    if (on.matrix.is_object()) {
        EXPECT_EQ(on.matrix["link_model"]["enabled"], true);
        EXPECT_EQ(on.matrix["nodes"], nlohmann::json::array({0, 1}));
    }
}

TEST(LinkModelRun, Pp2PointToPointBytesAreExact) {
    const TrainedRun pp =
        train("--set parallel.pipeline_model_parallel_size=2 --set link_model.enabled=true --set run.ranks_per_node=1");
    ASSERT_EQ(pp.losses.size(), 10u) << pp.output;
    if (!pp.matrix.is_object()) return;
    const auto [bytes, link] = pair_bytes(pp.matrix, "pp", 0, 1);
    EXPECT_GT(bytes, 0);
    EXPECT_EQ(bytes, summed(pp.records, "pp"));  // rank 0's sends: activations forward
    EXPECT_EQ(link, "inter_node");
    EXPECT_GT(pair_bytes(pp.matrix, "pp", 1, 0).first, 0);  // gradients backward
}

// The communication engine under the link model with contention (a node per rank), its pieces of 4 kB behind the
// overlapped buckets: the same losses as the run without either, and no heap allocation in a warm step (the engine's,
// the link model's and MPI's operation states are pooled, made up front).
TEST(LinkModelRun, CommEngineUnderContentionKeepsTheLossesAndAllocatesNothing) {
    const std::string overlap = "--set parallel.overlap_grad_reduce=true --set parallel.bucket_size=5000";
    const TrainedRun plain = train(overlap);
    const TrainedRun engine = train(overlap +
                                    " --set link_model.enabled=true --set link_model.contention=true "
                                    "--set run.ranks_per_node=1 --set parallel.comm_engine=true "
                                    "--set parallel.comm_chunk_bytes=4096");
    EXPECT_NE(engine.output.find("one transfer at a time per link"), std::string::npos) << engine.output;
    EXPECT_NE(engine.output.find("comm engine: a progress thread"), std::string::npos) << engine.output;
    ASSERT_FALSE(plain.losses.empty());
    EXPECT_EQ(engine.losses, plain.losses);
}

// ZeRO-1's overlapped buckets under the link model: the reduces into the shards' owners, the tied embedding's rows
// and the parameter gather's broadcasts allocate nothing in a warm step either, and the losses are those of the same
// buckets without the link model and the gather.
TEST(LinkModelRun, Zero1OverlapsKeepTheLossesAndAllocateNothing) {
    const std::string zero1 =
        "--set parallel.zero_stage=1 --set parallel.overlap_grad_reduce=true "
        "--set parallel.bucket_size=5000";
    const TrainedRun plain = train(zero1);
    const TrainedRun overlapped = train(
        zero1 + " --set parallel.overlap_param_gather=true --set link_model.enabled=true --set run.ranks_per_node=1");
    ASSERT_FALSE(plain.losses.empty());
    EXPECT_EQ(overlapped.losses, plain.losses);
}

}  // namespace
