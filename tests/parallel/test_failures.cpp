// test_failures.cpp: bad input seen by only some ranks ends every rank with exit code 2 instead of a hang.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "tests/common/job_run.h"
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

// Only rank 0 writes TensorBoard event files: a logging.tensorboard_dir it cannot use (here a file) ends rank 1 too,
// which says why rather than waiting in its next collective (mpiexec would kill it, srun might not).
TEST(ParallelFailures, ATensorBoardDirOnlyTheWriterFailsOnEndsEveryRank) {
    const std::string dir = ms::test::make_temp_dir();
    std::ofstream(dir + "/not_a_dir") << "x";
    const ms::test::JobRun r = ms::test::run_command(
        "OMP_NUM_THREADS=1 timeout 60 mpiexec -n 2 --oversubscribe --allow-run-as-root '" MS_BINARY_PATH
        "' train --config " MS_SOURCE_DIR
        "/configs/demo.yaml --set training.train_iters=2 --set lr_schedule.lr_warmup_iters=0 --set "
        "eval.sample_tokens=0 "
        "--set run.output_dir=" +
            dir + "/run --set logging.tensorboard_dir=" + dir + "/not_a_dir 2>&1",
        dir + "/run");
    EXPECT_EQ(r.code, 2) << r.output;  // 124 would be the timeout: rank 1 waiting for rank 0
    EXPECT_NE(r.output.find("cannot create a TensorBoard event file in logging.tensorboard_dir"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("could not open logging.tensorboard_dir"), std::string::npos) << r.output;  // rank 1
}

}  // namespace
