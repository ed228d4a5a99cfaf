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

// A ping-pong between the two ranks becomes the profile's intra-node link; the inter-node one stays the link
// model's default.
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
    EXPECT_GT(prof.intra_node.alpha_s, 0);
    EXPECT_LT(prof.intra_node.alpha_s, 0.1);  // a message between two processes of one host: well under 0.1 s
    EXPECT_GT(prof.intra_node.bytes_per_s, 1e6);
    const LinkModelConfig defaults;
    EXPECT_EQ(prof.inter_node.alpha_s, defaults.inter_node_latency_us * 1e-6);
}

}  // namespace
}  // namespace ms::test
