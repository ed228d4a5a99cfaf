// test_gpu_train.cpp: the trainer on the GPU (run.backend: cuda) against the CPU backend in the same dtype, through
// the binary, the torchtitan way of test_equivalence.cpp: tests/parallel/tiny.yaml, the same initial weights and
// samples, the full gradient of every parameter after step 1 (the trainer's MS_DUMP_GRADS hook) and the losses of 10
// steps (tests/common/train_run.h runs and compares).
//   fp32: OneRankOnTheGpuMatchesTheCpu, Tp2Pp2Dp2OnOneGpuMatchesTheCpu (8 processes sharing the one GPU, the MPI
//         communicator moving managed memory from the host), both against one CPU rank;
//   bf16: OneRankBf16MatchesTheCpuInBf16 (and, looser, the CPU in fp32), Tp2Pp2Dp2Bf16OnOneGpuMatchesTheCpuInBf16;
//   fp16: OneRankFp16MatchesTheCpuInFp16 (a loss scale of 2^16, which overflows nothing in step 1), and
//         Fp16LossScalingSkipsOverflowsAndTrains (Megatron's default 2^32: steps are skipped until the scale fits).
// Every comparison prints its measured worst errors ("... vs cpu ...: worst gradient error"), which gpu-check.sh
// copies into its summary. Label gpu; built only with the real CUDA backend; skipped where no CUDA device is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "tests/common/train_run.h"

namespace {

using ms::test::RunTolerances;
using ms::test::TrainRun;

bool have_gpu() {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// Several processes on device 0 need its compute mode to allow several contexts (the default does).
bool gpu_shared_by_processes() {
    int mode = -1;
    return cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, 0) == cudaSuccess && mode == cudaComputeModeDefault;
}

constexpr size_t kSteps = 10;  // tiny.yaml's train_iters
const char* const kTp2Pp2 =
    " --set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2";

// tests/parallel/<config> with `sets`, on `ranks` processes (mpiexec when more than one).
TrainRun run_tiny(int ranks, const std::string& sets, const std::string& config = "tiny.yaml") {
    ms::test::TrainCommand c;
    c.binary = MS_BINARY_PATH;
    c.config = MS_SOURCE_DIR "/tests/parallel/" + config;
    c.sets = sets;
    c.ranks = ranks;
    c.launcher = std::string(MS_MPIEXEC) + " " + MS_MPIEXEC_FLAGS;
    // Open MPI's single-copy shared-memory transports (CMA, XPMEM) pin the peer's pages with get_user_pages, which
    // CUDA managed memory does not allow in every driver; copy-in/copy-out through the shared segment works on any.
    c.env = "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive OMPI_MCA_btl_vader_single_copy_mechanism=none";
    return ms::test::run_train(c);
}

// One CPU rank in `dtype`, once per process (ctest runs each test in its own).
const TrainRun& cpu_baseline(const std::string& dtype) {
    static std::map<std::string, TrainRun> runs;
    auto it = runs.find(dtype);
    if (it == runs.end())
        it = runs.emplace(dtype, run_tiny(1, " --set run.backend=cpu --set mixed_precision.dtype=" + dtype)).first;
    return it->second;
}

// fp32, measured by this test on an H200: one rank at most 4.1e-7 per gradient tensor after step 1 (of the tensor's
// largest entry) and 3.1e-7 in the loss over 10 steps; tp2 x pp2 x dp2 at most 4.2e-7 and 4.3e-7. That is the size
// of any fp32 summation reordering (the CPU layouts of test_equivalence.cpp on this config: 4.4e-7 and 1.9e-7; the
// CUDA kernels on the emulation, test_train_cuda_emu.cpp: 4.5e-7 and 6.1e-8), from FMA contraction and cuBLAS's GEMMs
// on the device. The bounds are ~10x that; a missing synchronization or a wrong buffer gives errors of order 1 (or
// NaN). Those numbers predate cuBLASLt (cublas_gemm.h): the MLP's c_fc now computes its GELU in cuBLASLt's epilogue
// (tiny.yaml's F = 256, 128 per TP rank, are multiples of 8, so both runs here take the fused path), so this fp32
// comparison is also the check that cuBLASLt's GELU is the CPU's tanh GELU (erf's differs by up to 4.7e-4, far above
// these bounds). Unmeasured: if its fp32 tanh is an approximation coarser than 5e-6, this fails too; then
// debug.cuda_gelu_epilogue: false (gelu.cu's kernels instead of the epilogues) tells the two causes apart.
constexpr RunTolerances kFp32{5e-6, 5e-6};

// bf16 and fp16 against the CPU in the same dtype: PROVISIONAL until measured on a GPU (the test prints the measured
// values; tighten to ~5x them). Both backends round at the same points (backend.h's precision contract), so they
// differ only where a differently ordered fp32 sum (cuBLAS's, a kernel's) lands on the other side of a 16-bit rounding
// boundary (one bf16 ulp is 2^-8 = 3.9e-3 of a value, one fp16 ulp 2^-11 = 4.9e-4), after which the two runs drift
// apart step by step. Measured without a GPU, the CUDA kernels on the CPU emulation (mindspeed-train-cuda-emu) against
// the CPU backend on this very config (tiny.yaml, 10 steps): bf16 worst step-1 gradient 6.1e-3 of its tensor's scale
// (ln_f.weight), worst loss 2.0e-3 relative (step 4; the others <= 6.7e-4); on test_train_cuda_emu.cpp's smaller
// config fp16 is ~6x closer in gradients (1.0e-3) and ~4x in losses. cuBLAS reorders more than the emulation does, so
// the bounds are ~5x the emulation's. The step-1 gradients are the sharp check (a wrong dtype, buffer or rounding
// point gives errors of order 1); the losses of 16-bit runs drift as far apart as bf16 and fp32 do (below).
constexpr RunTolerances kBf16{3e-2, 1e-2};
constexpr RunTolerances kFp16{5e-3, 2e-3};
// bf16 on the GPU against fp32 on the CPU: what 8 mantissa bits allow. Measured on the CPU backend (bf16 vs fp32,
// tiny.yaml, 10 steps): worst step-1 gradient 9.4e-3 of its tensor's scale (h.0.ln_2.weight), worst loss 3.1e-3
// relative; the GPU's own drift (above) comes on top: ~5x.
constexpr RunTolerances kBf16VsFp32{5e-2, 1.5e-2};

TEST(GpuTrain, OneRankOnTheGpuMatchesTheCpu) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    const TrainRun r = run_tiny(1, " --set run.backend=cuda");
    EXPECT_NE(r.output.find("CUDA managed memory"), std::string::npos) << r.output;
    ms::test::expect_run_matches(r, cpu_baseline("fp32"), kSteps, kFp32, "cuda fp32, 1 rank", "cpu fp32");
}

TEST(GpuTrain, Tp2Pp2Dp2OnOneGpuMatchesTheCpu) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    if (!gpu_shared_by_processes())
        GTEST_SKIP() << "device 0's compute mode is not Default: 8 processes cannot share it";
    const TrainRun r = run_tiny(8, std::string(" --set run.backend=cuda") + kTp2Pp2);
    EXPECT_NE(r.output.find("world size 8 = tp 2 x pp 2 x dp 2"), std::string::npos) << r.output;
    ms::test::expect_run_matches(r, cpu_baseline("fp32"), kSteps, kFp32, "cuda fp32, tp2 x pp2 x dp2 on one GPU",
                                 "cpu fp32");
}

TEST(GpuTrain, OneRankBf16MatchesTheCpuInBf16) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    const TrainRun r = run_tiny(1, " --set run.backend=cuda --set mixed_precision.dtype=bf16");
    ms::test::expect_run_matches(r, cpu_baseline("bf16"), kSteps, kBf16, "cuda bf16, 1 rank", "cpu bf16");
    ms::test::expect_run_matches(r, cpu_baseline("fp32"), kSteps, kBf16VsFp32, "cuda bf16, 1 rank", "cpu fp32");
    EXPECT_EQ(r.skipped_iterations, 0);
    EXPECT_EQ(r.nan_iterations, 0);
}

TEST(GpuTrain, Tp2Pp2Dp2Bf16OnOneGpuMatchesTheCpuInBf16) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    if (!gpu_shared_by_processes())
        GTEST_SKIP() << "device 0's compute mode is not Default: 8 processes cannot share it";
    const TrainRun r = run_tiny(8, std::string(" --set run.backend=cuda --set mixed_precision.dtype=bf16") + kTp2Pp2);
    EXPECT_NE(r.output.find("world size 8 = tp 2 x pp 2 x dp 2"), std::string::npos) << r.output;
    ms::test::expect_run_matches(r, cpu_baseline("bf16"), kSteps, kBf16, "cuda bf16, tp2 x pp2 x dp2 on one GPU",
                                 "cpu bf16");
}

// Llama (tiny-llama.yaml: RMSNorm, RoPE, grouped-query attention with 2 key/value heads for 4 query heads, SwiGLU,
// untied head) on the GPU against the CPU: fp32 on tp2 (one key/value head per rank) and bf16 on one rank, with the
// GPT bounds above (PROVISIONAL for Llama until measured on a GPU; the emulation measured fp32 tp2 4.9e-7 / 6.0e-8
// and bf16 2.7e-7 / 0 on a smaller cut of this config, test_train_cuda_emu.cpp).
TEST(GpuTrain, LlamaTp2AndBf16MatchTheCpu) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    const TrainRun base = run_tiny(1, " --set run.backend=cpu", "tiny-llama.yaml");
    const TrainRun r =
        run_tiny(2, " --set run.backend=cuda --set parallel.tensor_model_parallel_size=2", "tiny-llama.yaml");
    ms::test::expect_run_matches(r, base, kSteps, kFp32, "cuda llama fp32, tp2", "cpu llama fp32");
    const std::string bf16 = " --set mixed_precision.dtype=bf16";
    const TrainRun base16 = run_tiny(1, " --set run.backend=cpu" + bf16, "tiny-llama.yaml");
    const TrainRun r16 = run_tiny(1, " --set run.backend=cuda" + bf16, "tiny-llama.yaml");
    ms::test::expect_run_matches(r16, base16, kSteps, kBf16, "cuda llama bf16, 1 rank", "cpu llama bf16");
}

TEST(GpuTrain, OneRankFp16MatchesTheCpuInFp16) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    // 2^16: step 1's gradients fit in fp16 on both backends, so both dump the same (scaled) gradients; the
    // comparison is scale-free.
    const std::string fp16 = " --set mixed_precision.dtype=fp16 --set mixed_precision.initial_loss_scale=65536";
    const TrainRun base = run_tiny(1, " --set run.backend=cpu" + fp16);
    const TrainRun r = run_tiny(1, " --set run.backend=cuda" + fp16);
    ms::test::expect_run_matches(r, base, kSteps, kFp16, "cuda fp16, 1 rank", "cpu fp16");
    EXPECT_EQ(r.nan_iterations, 0);
    EXPECT_EQ(r.skipped_iterations, base.skipped_iterations);
}

// Megatron's default initial scale, 2^32, overflows fp16 (max 65504) in the first backward: the dynamic scaler skips
// those steps (counted as skipped, not NaN) and halves the scale until the gradients fit, then the model trains.
TEST(GpuTrain, Fp16LossScalingSkipsOverflowsAndTrains) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    constexpr int kIters = 30;
    const TrainRun r = run_tiny(1,
                                " --set run.backend=cuda --set mixed_precision.dtype=fp16 --set "
                                "training.train_iters=" +
                                    std::to_string(kIters));
    ASSERT_EQ(r.losses.size(), static_cast<size_t>(kIters)) << r.output;
    ASSERT_EQ(r.loss_scales.size(), static_cast<size_t>(kIters)) << r.output;
    std::printf(
        "cuda fp16 loss scaling: %lld skipped and %lld NaN iterations of %d, loss scale %.0f .. %.0f, losses "
        "%.5f .. %.5f\n",
        static_cast<long long>(r.skipped_iterations), static_cast<long long>(r.nan_iterations), kIters,
        r.loss_scales.front(), r.loss_scales.back(), r.losses.front(), r.losses.back());
    EXPECT_GT(r.skipped_iterations, 0) << r.output;
    EXPECT_LT(r.skipped_iterations, kIters - 5) << "the scale never came down far enough to train\n" << r.output;
    EXPECT_EQ(r.nan_iterations, 0) << r.output;
    EXPECT_LT(r.loss_scales.back(), 4294967296.0);
    for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
    EXPECT_LT(r.losses.back(), r.losses.front() - 0.1) << "fp16 with loss scaling does not train";
}

}  // namespace
