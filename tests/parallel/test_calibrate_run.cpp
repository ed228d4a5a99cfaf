// test_calibrate_run.cpp: `mindspeed-train calibrate` under mpiexec with 2 ranks measures the link between them.
// The one-process calibrate (no MPI) is tested in tests/unit/test_profile.cpp; this one starts MPI, so it runs with
// the other multi-rank jobs.
#include <gtest/gtest.h>

#include <string>

#include "engine/config/config.h"
#include "engine/sim/profile.h"
#include "tests/common/job_run.h"
#include "tests/common/temp_dir.h"

namespace ms::test {
namespace {

// A ping-pong between the two ranks becomes the profile's intra-node link, and all-reduces over both its reduction
// rate; the inter-node link stays the link model's default. Both ranks time the ops at once; rank 0 alone prints
// them and writes the profile.
TEST(CalibrateRun, UnderMpirunMeasuresTheIntraNodeLink) {
    TempDir dir("ms_calibrate");
    const std::string out = dir / "cpu.json";
    const std::string cmd = "OMP_WAIT_POLICY=passive timeout 300 mpiexec --oversubscribe --allow-run-as-root -np 2 " +
                            std::string(MS_BINARY_PATH) + " calibrate --quick --threads 1 --output " + out + " 2>&1";
    const JobRun run = run_command(cmd, "");
    ASSERT_EQ(run.code, 0) << run.output;
    EXPECT_NE(run.output.find("calibrate: intra-node link (MPI between ranks 0 and 1)"), std::string::npos)
        << run.output;
    const sim::Profile prof = sim::load_profile(out);
    EXPECT_NE(prof.links_source.find("intra_node measured: MPI ping-pong"), std::string::npos) << prof.links_source;
    EXPECT_NE(prof.links_source.find("fp32 all-reduces over the 2 ranks 65536 B"), std::string::npos)
        << prof.links_source;
    EXPECT_GE(prof.intra_node.reduce_bytes_per_s, 0);  // 0: the all-reduces took no longer than their transfers
    EXPECT_NE(prof.source.find("2 ranks timing every op at once"), std::string::npos) << prof.source;
    EXPECT_NE(run.output.find("1 thread a rank, 2 ranks at once"), std::string::npos) << run.output;
    size_t tables = 0;
    for (size_t at = run.output.find("matmul_fwd      overhead"); at != std::string::npos;
         at = run.output.find("matmul_fwd      overhead", at + 1))
        ++tables;
    EXPECT_EQ(tables, 1u) << run.output;
    EXPECT_GT(prof.intra_node.alpha_s, 0);
    EXPECT_LT(prof.intra_node.alpha_s, 0.1);  // a message between two processes of one host: well under 0.1 s
    EXPECT_GT(prof.intra_node.bytes_per_s, 1e6);
    const LinkModelConfig defaults;
    EXPECT_EQ(prof.inter_node.alpha_s, defaults.inter_node_latency_us * 1e-6);
}

}  // namespace
}  // namespace ms::test
