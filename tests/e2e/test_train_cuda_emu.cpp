// test_train_cuda_emu.cpp: `run.backend: cuda` through the real trainer, in CI, without a GPU. The binary
// mindspeed-train-cuda-emu is mindspeed-train with the emulated CUDA backend registered (tests/CMakeLists.txt): the
// CUDA kernel sources run on the CPU emulation, while the trainer takes every CUDA code path but the device memory
// -- the backend registry, the asynchronous-backend synchronization (SynchronizingCommunicator around every group,
// the model's host accesses), the device-name log and MFU peak -- against the CPU backend on the same config, the
// torchtitan way (test_equivalence.cpp): the full gradient of every parameter after step 1 (MS_DUMP_GRADS) and the
// losses of every step, in fp32 and, against the CPU backend in the same dtype, in bf16 and fp16 (mixed precision).
// tiny.yaml is cut to 2 layers of width 32 and 16 tokens, as the emulation is slow. tests/common/train_run.h runs and
// compares.
// Also: a binary built without the CUDA backend refuses run.backend: cuda with a sentence.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "tests/common/train_run.h"
#include "tests/e2e/run_cli.h"

namespace {

using ms::test::run_cli;
using ms::test::RunTolerances;
using ms::test::TrainRun;

constexpr int kSteps = 4;
const std::string kSets =
    " --set model.num_layers=2 --set model.hidden_size=32 --set model.num_attention_heads=2 "
    "--set model.seq_length=16 --set training.global_batch_size=4 --set training.train_iters=" +
    std::to_string(kSteps);

// tests/parallel/<config> cut down (kSets) plus `sets`, with `binary` on `ranks` processes.
TrainRun run_tiny(const char* binary, int ranks, const std::string& sets, const std::string& config = "tiny.yaml") {
    ms::test::TrainCommand c;
    c.binary = binary;
    c.config = MS_SOURCE_DIR "/tests/parallel/" + config;
    c.sets = kSets + " " + sets;
    c.ranks = ranks;
    c.launcher = "mpiexec --oversubscribe --allow-run-as-root";
    c.env = "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive";
    c.timeout_s = 120;
    return ms::test::run_train(c);
}

const TrainRun& cpu_baseline() {
    static const TrainRun r = run_tiny(MS_BINARY_PATH, 1, "--set run.backend=cpu");
    return r;
}

// fp32, measured by this test (it prints both worst errors) on one rank and on tp2 x pp2, and with run.seed 1 and 7
// by hand: gradients after step 1 at most 4.5e-7 of each tensor's largest entry (a LayerNorm bias or weight, a float
// sum over all rows), losses at most 6.1e-8 relative over 6 steps (the CUDA kernels sum in other orders than OpenBLAS
// and the CPU loops, as test_gpt_cuda_emu.cpp measures op by op). The bounds are ~9x and ~16x those; a missing
// synchronization, a wrong buffer or a dropped collective gives errors of order 1.
constexpr RunTolerances kFp32{4e-6, 1e-6};

void expect_matches_cpu(const TrainRun& r, const char* what) {
    ms::test::expect_run_matches(r, cpu_baseline(), kSteps, kFp32, what, "cpu");
}

TEST(TrainCudaEmulated, OneRankMatchesTheCpuBackend) {
    const TrainRun r = run_tiny(MS_CUDA_EMU_BINARY_PATH, 1, "--set run.backend=cuda");
    EXPECT_NE(r.output.find("device: the CPU emulation of the CUDA kernels | backend cuda-emulated"), std::string::npos)
        << r.output;
    expect_matches_cpu(r, "cuda-emulated, 1 rank");
}

// Four ranks exercise every synchronized collective kind: tensor-parallel all-reduces, pipeline sends and receives,
// the tied embedding's all-reduce over embd, and the gradient dump's all-gather.
TEST(TrainCudaEmulated, Tp2Pp2MatchesTheCpuBackend) {
    const TrainRun r = run_tiny(MS_CUDA_EMU_BINARY_PATH, 4,
                                "--set run.backend=cuda --set parallel.tensor_model_parallel_size=2 "
                                "--set parallel.pipeline_model_parallel_size=2");
    EXPECT_NE(r.output.find("world size 4 = tp 2 x pp 2 x dp 1"), std::string::npos) << r.output;
    expect_matches_cpu(r, "cuda-emulated, tp2 x pp2");
}

// Mixed precision: the CUDA kernels in bf16 / fp16 against the CPU backend in the same dtype (both binaries run
// mixed_precision.dtype, tests/gpu/test_gpu_train.cpp's comparison without a GPU). Both round at the same points
// (backend.h's precision contract); they differ where a differently ordered fp32 sum lands on the other side of a
// 16-bit rounding boundary: an activation gradient one 16-bit ulp apart (bf16 2^-8 = 3.9e-3, fp16 2^-11 = 4.9e-4 of
// a value), then summed over rows into a parameter's gradient. Measured here (the test prints them; and with
// run.seed 7 by hand): bf16 gradients after step 1 at most 6.8e-3 of each tensor's largest entry (a LayerNorm
// weight; 4.8e-3 with seed 7; tp2 x pp2 6.8e-3, 1 rank 5.6e-3), losses at most 3.8e-5 relative over 4 steps; fp16
// 1.0e-3 and 9.0e-6. The bounds are ~3x those; a wrong dtype, buffer or rounding point gives gradient errors of
// order 1.
const TrainRun& cpu_baseline_in(const std::string& dtype_sets) {
    static std::map<std::string, TrainRun> runs;
    auto it = runs.find(dtype_sets);
    if (it == runs.end())
        it = runs.emplace(dtype_sets, run_tiny(MS_BINARY_PATH, 1, "--set run.backend=cpu" + dtype_sets)).first;
    return it->second;
}
constexpr RunTolerances kBf16{2e-2, 1.2e-4};
constexpr RunTolerances kFp16{3e-3, 3e-5};
const std::string kBf16Sets = " --set mixed_precision.dtype=bf16";
// 2^16: step 1's gradients fit in fp16 (Megatron's default 2^32 would skip it), and the comparison is scale-free.
const std::string kFp16Sets = " --set mixed_precision.dtype=fp16 --set mixed_precision.initial_loss_scale=65536";

TEST(TrainCudaEmulated, OneRankBf16MatchesTheCpuBackendInBf16) {
    const TrainRun r = run_tiny(MS_CUDA_EMU_BINARY_PATH, 1, "--set run.backend=cuda" + kBf16Sets);
    ms::test::expect_run_matches(r, cpu_baseline_in(kBf16Sets), kSteps, kBf16, "cuda-emulated bf16, 1 rank",
                                 "cpu bf16");
    EXPECT_EQ(r.nan_iterations, 0);
}

TEST(TrainCudaEmulated, Tp2Pp2Bf16MatchesTheCpuBackendInBf16) {
    const TrainRun r = run_tiny(MS_CUDA_EMU_BINARY_PATH, 4,
                                "--set run.backend=cuda --set parallel.tensor_model_parallel_size=2 "
                                "--set parallel.pipeline_model_parallel_size=2" +
                                    kBf16Sets);
    EXPECT_NE(r.output.find("world size 4 = tp 2 x pp 2 x dp 1"), std::string::npos) << r.output;
    ms::test::expect_run_matches(r, cpu_baseline_in(kBf16Sets), kSteps, kBf16, "cuda-emulated bf16, tp2 x pp2",
                                 "cpu bf16");
}

// 16-bit gradients (mixed_precision.grad_reduce_in_fp32: false): the kernels round each call's contribution into the
// bf16 gradients as the CPU ops do, and ZeRO-1's sharded masters pass through staging memory at initialisation.
// Measured (printed): dp2 ZeRO-1 on the emulation vs one CPU rank, both with bf16 gradients: gradient 8.5e-3 (a
// LayerNorm weight), loss 1.6e-5 over 4 steps; the bf16 bounds above.
TEST(TrainCudaEmulated, Bf16GradientsMatchTheCpuBackend) {
    const std::string sets = kBf16Sets + " --set mixed_precision.grad_reduce_in_fp32=false";
    const TrainRun r =
        run_tiny(MS_CUDA_EMU_BINARY_PATH, 2, "--set run.backend=cuda --set parallel.zero_stage=1" + sets);
    EXPECT_NE(r.output.find("| bf16 gradients"), std::string::npos) << r.output;
    ms::test::expect_run_matches(r, cpu_baseline_in(sets), kSteps, kBf16, "cuda-emulated bf16 gradients, dp2 zero1",
                                 "cpu bf16 gradients, 1 rank");
    EXPECT_EQ(r.nan_iterations, 0);
}

TEST(TrainCudaEmulated, OneRankFp16MatchesTheCpuBackendInFp16) {
    const TrainRun r = run_tiny(MS_CUDA_EMU_BINARY_PATH, 1, "--set run.backend=cuda" + kFp16Sets);
    const TrainRun& base = cpu_baseline_in(kFp16Sets);
    ms::test::expect_run_matches(r, base, kSteps, kFp16, "cuda-emulated fp16, 1 rank", "cpu fp16");
    EXPECT_EQ(r.nan_iterations, 0);
    EXPECT_EQ(r.skipped_iterations, base.skipped_iterations);
}

// Llama (tests/parallel/tiny-llama.yaml cut down as above, 4 query heads of width 8 sharing 2 key/value heads): the
// RMSNorm, RoPE, grouped-query attention and SwiGLU kernels through the trainer, on tp2 (one key/value head per rank)
// in fp32 and on one rank in bf16 and fp16, against the CPU backend, with the GPT bounds above. Measured (printed):
// fp32 tp2 gradient 4.9e-7 (a k_proj weight), loss 6.0e-8 over 4 steps; bf16 one rank gradient 2.7e-7, loss 0;
// fp16 gradient 6.0e-4 (a k_proj weight), loss 2.1e-6.
const std::string kLlamaSets = " --set model.num_attention_heads=4 --set model.ffn_hidden_size=64";

TEST(TrainCudaEmulated, LlamaTp2MatchesTheCpuBackend) {
    const TrainRun base = run_tiny(MS_BINARY_PATH, 1, "--set run.backend=cpu" + kLlamaSets, "tiny-llama.yaml");
    const TrainRun r =
        run_tiny(MS_CUDA_EMU_BINARY_PATH, 2,
                 "--set run.backend=cuda --set parallel.tensor_model_parallel_size=2" + kLlamaSets, "tiny-llama.yaml");
    ms::test::expect_run_matches(r, base, kSteps, kFp32, "cuda-emulated llama, tp2", "cpu llama");
}

TEST(TrainCudaEmulated, LlamaBf16AndFp16MatchTheCpuBackendInTheirDtype) {
    for (const auto& [sets, tol] : {std::pair{kBf16Sets, kBf16}, std::pair{kFp16Sets, kFp16}}) {
        const TrainRun base =
            run_tiny(MS_BINARY_PATH, 1, "--set run.backend=cpu" + kLlamaSets + sets, "tiny-llama.yaml");
        const TrainRun r =
            run_tiny(MS_CUDA_EMU_BINARY_PATH, 1, "--set run.backend=cuda" + kLlamaSets + sets, "tiny-llama.yaml");
        ms::test::expect_run_matches(r, base, kSteps, tol, "cuda-emulated llama" + sets, "cpu");
        EXPECT_EQ(r.nan_iterations, 0) << sets;
        EXPECT_EQ(r.skipped_iterations, base.skipped_iterations) << sets;
    }
}

// Context parallelism: ring attention's block kernels, copy_columns and the fp32 output's cast through the trainer on
// cp2 (the 32 tokens of a sample cut into 4 chunks of 8), in fp32 and bf16, against one CPU rank in the same dtype,
// with the bounds above. Measured (printed): fp32 gradient 4.9e-7 (a k_proj weight), loss 0 over 4 steps; bf16
// gradient 2.7e-7, loss 1.3e-5.
TEST(TrainCudaEmulated, LlamaCp2MatchesTheCpuBackend) {
    for (const auto& [sets, tol] : {std::pair{std::string(), kFp32}, std::pair{kBf16Sets, kBf16}}) {
        const TrainRun base =
            run_tiny(MS_BINARY_PATH, 1, "--set run.backend=cpu" + kLlamaSets + sets, "tiny-llama.yaml");
        const TrainRun r = run_tiny(MS_CUDA_EMU_BINARY_PATH, 2,
                                    "--set run.backend=cuda --set parallel.context_parallel_size=2" + kLlamaSets + sets,
                                    "tiny-llama.yaml");
        EXPECT_NE(r.output.find("world size 2 = tp 1 x pp 1 x cp 2 x dp 1"), std::string::npos) << r.output;
        ms::test::expect_run_matches(r, base, kSteps, tol, "cuda-emulated llama, cp2" + sets, "cpu llama, 1 rank");
    }
}

TEST(TrainCudaEmulated, ABinaryWithoutTheCudaBackendRefusesIt) {
    if (MS_BINARY_HAS_CUDA) GTEST_SKIP() << "this build's mindspeed-train has the CUDA backend";
    const auto r = run_cli("train --config " MS_SOURCE_DIR "/configs/demo.yaml --set run.backend=cuda");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("run.backend = 'cuda' but this binary was built without the CUDA backend"),
              std::string::npos)
        << r.output;
}

}  // namespace
