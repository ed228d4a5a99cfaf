// clip_train.h: tests/parallel/tiny-clip.yaml trained by the real binary (train_run.h's run_train), for the CLIP
// tests that compare runs (tests/parallel/test_clip_run.cpp, test_clip_checkpoint.cpp). Needs MS_BINARY_PATH and
// MS_SOURCE_DIR (tests/CMakeLists.txt defines them for the test binaries).
#pragma once

#include <string>

#include "tests/common/train_run.h"

namespace ms::test {

// tiny-clip.yaml on `ranks` processes (mpiexec when > 1), one OpenMP thread each; `sets` are more --set options.
inline TrainRun run_tiny_clip(int ranks, const std::string& sets) {
    return run_train({.binary = MS_BINARY_PATH,
                      .config = MS_SOURCE_DIR "/tests/parallel/tiny-clip.yaml",
                      .sets = sets,
                      .ranks = ranks,
                      .launcher = "mpiexec --oversubscribe --allow-run-as-root",
                      .env = "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive",
                      .timeout_s = 120,
                      .command = "train",
                      .output_dir = {}});
}

}  // namespace ms::test
