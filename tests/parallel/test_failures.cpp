// test_failures.cpp: bad input seen by only some ranks ends every rank with exit code 2 instead of a hang.
#include <gtest/gtest.h>

#include <string>

#include "tests/e2e/run_cli.h"

namespace {

// Rank 0 finds its data, rank 1 does not (the path interpolates Open MPI's rank variable): both must stop with the
// data error before any collective that would wait for the missing rank. `timeout` turns a hang into a failure.
TEST(ParallelFailures, InputErrorOnOneRankEndsEveryRank) {
    const std::string dir = ms::test::make_temp_dir();
    const auto pre =
        ms::test::run_cli("preprocess --input " MS_SOURCE_DIR "/README.md --output-prefix " + dir + "/data_0");
    ASSERT_EQ(pre.exit_code, 0) << pre.output;
    const std::string cmd = "cd " + dir +
                            " && OMP_NUM_THREADS=1 timeout 60 mpiexec -n 2 --oversubscribe "
                            "--allow-run-as-root '" MS_BINARY_PATH "' train --config " MS_SOURCE_DIR
                            "/configs/demo.yaml --set data.source=megatron --set 'data.data_path=" +
                            dir +
                            "/data_${OMPI_COMM_WORLD_RANK}_text_document' --set model.vocab_size=257 --set "
                            "run.output_dir=" +
                            dir + "/run 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    const int status = pclose(p);
    ASSERT_TRUE(WIFEXITED(status)) << out;
    EXPECT_EQ(WEXITSTATUS(status), 2) << out;  // 124 would be the timeout: a hang
    EXPECT_NE(out.find("data_1_text_document.idx"), std::string::npos) << out;
}

}  // namespace
