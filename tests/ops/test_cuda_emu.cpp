// test_cuda_emu.cpp: the CUDA-on-CPU layer (engine/backends/cuda/emu/cuda_emu.h) and every CUDA kernel run on it
// against its CPU twin in OpMode::kReference.
//
// Part 1 checks the emulation itself with exact expectations: __shared__ + __syncthreads ordering, every shuffle
// against the values CUDA documents, atomics, 3-D blocks and grids, a block of 1024 threads, early return, dynamic
// shared memory and deadlock detection. Part 2 runs the kernels on shapes that are not multiples of any block
// (N = 37 or 137 rows, C = 53) into guarded buffers, and checks determinism (two runs bit-identical).
// Tolerances are scale-free errors (max |cuda - cpu| / max |cpu|) set from the values MS_OP_TEST_VERBOSE=1 prints:
// the CPU reference works in double, the kernels in float, so the floor is float rounding of the kernel's sums.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "engine/backends/cuda/kernels/adamw.cuh"
#include "engine/backends/cuda/kernels/gelu.cuh"
#include "engine/backends/cuda/kernels/layernorm.cuh"
#include "engine/backends/cuda/kernels/residual.cuh"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

// The kernels run synchronously on the emulation; any stream value will do.
const cudaStream_t kStream = nullptr;

void expect_close(const char* what, double err, double tol) {
    if (std::getenv("MS_OP_TEST_VERBOSE")) std::printf("  %-32s err %.2e (tol %.0e)\n", what, err, tol);
    EXPECT_LE(err, tol) << what;
}

// ---- part 1: the emulation layer ----

// Each thread writes its slot, then reads its neighbour's: correct only if every write precedes every read.
__global__ void shared_rotate_kernel(int* out) {
    __shared__ int slots[1024];
    const int t = threadIdx.x, n = blockDim.x;
    slots[t] = static_cast<int>(blockIdx.x) * 10000 + t;
    __syncthreads();
    const int neighbour = slots[(t + 1) % n];
    __syncthreads();  // every read is done before the second round overwrites
    slots[t] = neighbour * 2;
    __syncthreads();
    out[blockIdx.x * n + t] = slots[(t + n - 1) % n];
}

TEST(CudaEmu, SharedMemoryAndSyncthreadsWith1024ThreadsAndThreeBlocks) {
    const int n = 1024, blocks = 3;
    std::vector<int> out(n * blocks, -1);
    ms_launch(shared_rotate_kernel, blocks, n, 0, kStream, out.data());
    for (int b = 0; b < blocks; ++b) {
        // Thread t reads slot t-1, written by thread t-1 as 2 * (the value thread t wrote in the first round).
        for (int t = 0; t < n; ++t) ASSERT_EQ(out[b * n + t], 2 * (b * 10000 + t)) << "block " << b << " thread " << t;
    }
}

__global__ void indices_kernel(int* out) {
    const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const int bid = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int threads = blockDim.x * blockDim.y * blockDim.z;
    out[bid * threads + tid] = static_cast<int>(threadIdx.x + 10 * threadIdx.y + 100 * threadIdx.z + 1000 * blockIdx.x +
                                                10000 * blockIdx.y + 100000 * blockIdx.z);
}

TEST(CudaEmu, ThreeDimensionalBlocksAndGrids) {
    const dim3 grid(2, 3, 2), block(5, 4, 3);
    std::vector<int> out(2 * 3 * 2 * 5 * 4 * 3, -1);
    ms_launch(indices_kernel, grid, block, 0, kStream, out.data());
    size_t i = 0;
    for (unsigned bz = 0; bz < 2; ++bz)
        for (unsigned by = 0; by < 3; ++by)
            for (unsigned bx = 0; bx < 2; ++bx)
                for (unsigned tz = 0; tz < 3; ++tz)
                    for (unsigned ty = 0; ty < 4; ++ty)
                        for (unsigned tx = 0; tx < 5; ++tx) {
                            ASSERT_EQ(out[i++],
                                      static_cast<int>(tx + 10 * ty + 100 * tz + 1000 * bx + 10000 * by + 100000 * bz));
                        }
}

// out: 8 results per thread, the shuffles' documented values.
__global__ void shuffle_kernel(double* out) {
    const int lane = threadIdx.x % 32;
    const float v = static_cast<float>(threadIdx.x);
    double* o = out + 8 * threadIdx.x;
    o[0] = __shfl_xor_sync(0xffffffffu, v, 5);
    o[1] = __shfl_down_sync(0xffffffffu, v, 3);
    o[2] = __shfl_up_sync(0xffffffffu, v, 3);
    o[3] = __shfl_sync(0xffffffffu, v, 7);
    o[4] = __shfl_down_sync(0xffffffffu, v, 3, 8);          // within segments of 8 lanes
    o[5] = __shfl_xor_sync(0xffffffffu, 1000.0 + lane, 1);  // 8-byte values
    o[6] = warp_reduce_sum(v);
    o[7] = warp_reduce_max(v);
}

TEST(CudaEmu, ShufflesGiveTheDocumentedValues) {
    const int n = 64;  // two warps
    std::vector<double> out(8 * n);
    ms_launch(shuffle_kernel, 1, n, 0, kStream, out.data());
    for (int t = 0; t < n; ++t) {
        const int lane = t % 32, warp0 = t - lane;
        const double* o = &out[8 * t];
        EXPECT_EQ(o[0], warp0 + (lane ^ 5)) << t;
        EXPECT_EQ(o[1], lane + 3 < 32 ? t + 3 : t) << t;  // past the warp's end: your own value
        EXPECT_EQ(o[2], lane >= 3 ? t - 3 : t) << t;
        EXPECT_EQ(o[3], warp0 + 7) << t;
        EXPECT_EQ(o[4], lane % 8 + 3 < 8 ? t + 3 : t) << t;
        EXPECT_EQ(o[5], 1000.0 + (lane ^ 1)) << t;
        EXPECT_EQ(o[6], 32.0 * warp0 + 496.0) << t;  // sum of warp0 .. warp0 + 31
        EXPECT_EQ(o[7], warp0 + 31.0) << t;
    }
}

__global__ void atomics_kernel(int* count, float* sum, int* max) {
    const int gid = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(count, 1);
    atomicAdd(sum, 0.5f);
    atomicMax(max, (gid * 37) % 1001);
}

TEST(CudaEmu, AtomicsAcrossBlocks) {
    int count = 0, max = -1;
    float sum = 0.0f;
    ms_launch(atomics_kernel, 5, 96, 0, kStream, &count, &sum, &max);
    EXPECT_EQ(count, 480);
    EXPECT_EQ(sum, 240.0f);  // exact: halves up to 240 are representable
    int expected_max = -1;
    for (int g = 0; g < 480; ++g) expected_max = std::max(expected_max, (g * 37) % 1001);
    EXPECT_EQ(max, expected_max);
}

// Odd threads return at once; the even ones still pass two barriers (sm_70+ semantics), and a warp whose odd lanes
// have returned can still __syncwarp with the mask of its live lanes.
__global__ void early_return_kernel(int* out) {
    __shared__ int slots[128];
    const int t = threadIdx.x;
    if (t % 2 == 1) return;
    slots[t] = t;
    __syncthreads();
    __syncwarp(0x55555555u);
    out[t] = slots[(t + 2) % blockDim.x];
    __syncthreads();
}

TEST(CudaEmu, EarlyReturnDoesNotBlockBarriers) {
    std::vector<int> out(128, -1);
    ms_launch(early_return_kernel, 1, 128, 0, kStream, out.data());
    for (int t = 0; t < 128; ++t) EXPECT_EQ(out[t], t % 2 == 1 ? -1 : (t + 2) % 128) << t;
}

__global__ void dynamic_shared_kernel(float* out, const float* inp) {
    MS_DYNAMIC_SHARED(float, buf);
    const int t = threadIdx.x, n = blockDim.x;
    buf[t] = inp[blockIdx.x * n + t];
    __syncthreads();
    out[blockIdx.x * n + t] = buf[n - 1 - t];
}

TEST(CudaEmu, DynamicSharedMemoryReversesEachBlock) {
    const int n = 40, blocks = 3;
    auto inp = random_floats(n * blocks, 1);
    std::vector<float> out(n * blocks);
    ms_launch(dynamic_shared_kernel, blocks, n, n * sizeof(float), kStream, out.data(), inp.data());
    for (int b = 0; b < blocks; ++b) {
        for (int t = 0; t < n; ++t) EXPECT_EQ(out[b * n + t], inp[b * n + n - 1 - t]);
    }
}

// Lane 0 waits for the whole block while lanes 1..31 wait for lane 0 at the warp barrier.
__global__ void deadlock_kernel() {
    if (threadIdx.x == 0) {
        __syncthreads();
    } else {
        __syncwarp();
    }
}

TEST(CudaEmuDeathTest, DeadlockAbortsWithAMessage) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(ms_launch(deadlock_kernel, 1, 32, 0, kStream), "deadlock");
}

// ---- part 2: the kernels against their CPU twins ----

TEST(CudaEmuKernels, ResidualIsBitIdenticalToTheCpu) {
    const int64_t N = 37, M = 53, n = N * M;
    auto a = random_floats(n, 1), b = random_floats(n, 2), bias = random_floats(M, 3);
    auto cpu = make_cpu_backend(OpMode::kReference);
    for (bool with_bias : {false, true}) {
        std::vector<float> expected(n);
        cpu->residual_forward({.a = view(a, {n}),
                               .b = view(b, {n}),
                               .out = view(expected, {n}),
                               .bias = with_bias ? view(bias, {M}) : Tensor{}});
        Guarded out(n);
        cuda::residual_forward(out.data(), a.data(), b.data(), with_bias ? bias.data() : nullptr, n, M, kStream);
        EXPECT_TRUE(bit_identical(out.values(), expected)) << "bias " << with_bias;
        EXPECT_TRUE(out.guards_intact());
        // In place, out aliasing a (the trainer's residual stream).
        Guarded stream(a);
        cuda::residual_forward(stream.data(), stream.data(), b.data(), with_bias ? bias.data() : nullptr, n, M,
                               kStream);
        EXPECT_TRUE(bit_identical(stream.values(), expected)) << "in place, bias " << with_bias;
    }
}

TEST(CudaEmuKernels, GeluMatchesTheCpuReference) {
    const int64_t n = 37 * 53;
    auto inp = random_floats(n, 1, -5.0f, 5.0f);
    // The tails: the backward's e^-2u would overflow below x = -10 without its cap.
    for (float x : {-30.0f, -10.5f, -10.0f, 10.0f, 30.0f}) inp.push_back(x);
    const int64_t m = static_cast<int64_t>(inp.size());
    auto dout = random_floats(m, 2);
    auto cpu = make_cpu_backend(OpMode::kReference);
    std::vector<float> out_ref(m), dinp_ref(m);
    cpu->gelu_forward({.inp = view(inp, {m}), .out = view(out_ref, {m})});
    cpu->gelu_backward({.inp = view(inp, {m}), .dout = view(dout, {m}), .dinp = view(dinp_ref, {m})});

    Guarded out(m), dinp(m);
    cuda::gelu_forward(out.data(), inp.data(), m, kStream);
    cuda::gelu_backward(dinp.data(), inp.data(), dout.data(), m, kStream);
    EXPECT_TRUE(out.guards_intact() && dinp.guards_intact());
    // Measured 1.6e-8 / 1.1e-7: float rounding of one expf, one division and a few products.
    expect_close("gelu forward", max_rel_error(out.values(), out_ref), 2e-7);
    expect_close("gelu backward", max_rel_error(dinp.values(), dinp_ref), 1e-6);
    // dinp may alias dout.
    Guarded in_place(dout);
    cuda::gelu_backward(in_place.data(), inp.data(), in_place.data(), m, kStream);
    EXPECT_TRUE(bit_identical(in_place.values(), dinp.values()));
}

struct LayerNormCase {
    int N, C;
};

TEST(CudaEmuKernels, LayerNormMatchesTheCpuReferenceAndIsDeterministic) {
    // 37 rows: a partial block of warps; 137 rows: three chunks of the dweight/dbias partial sums, the last partial.
    for (const LayerNormCase& s : {LayerNormCase{37, 53}, LayerNormCase{137, 53}, LayerNormCase{5, 800}}) {
        const int N = s.N, C = s.C;
        SCOPED_TRACE(testing::Message() << "N " << N << " C " << C);
        auto inp = random_floats(N * C, 1, -2.0f, 2.0f), weight = random_floats(C, 2, 0.5f, 1.5f);
        auto bias = random_floats(C, 3), dout = random_floats(N * C, 4);
        const auto dinp0 = random_floats(N * C, 5), dweight0 = random_floats(C, 6), dbias0 = random_floats(C, 7);
        auto cpu = make_cpu_backend(OpMode::kReference);
        std::vector<float> out_ref(N * C), mean_ref(N), rstd_ref(N);
        cpu->layernorm_forward({.inp = view(inp, {N, C}),
                                .weight = view(weight, {C}),
                                .bias = view(bias, {C}),
                                .out = view(out_ref, {N, C}),
                                .mean = view(mean_ref, {N}),
                                .rstd = view(rstd_ref, {N}),
                                .eps = 1e-5f});

        Guarded out(N * C), mean(N), rstd(N);
        cuda::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C,
                                1e-5f, kStream);
        EXPECT_TRUE(out.guards_intact() && mean.guards_intact() && rstd.guards_intact());
        // Measured up to 1.5e-7 / 8.8e-8 / 6.8e-8: float sums of up to 25 terms per lane, then a 32-lane tree.
        expect_close("layernorm out", max_rel_error(out.values(), out_ref), 1e-6);
        expect_close("layernorm mean", max_rel_error(mean.values(), mean_ref), 1e-6);
        expect_close("layernorm rstd", max_rel_error(rstd.values(), rstd_ref), 1e-6);

        for (Accumulate acc : {Accumulate::kOverwrite, Accumulate::kAdd}) {
            const bool add = acc == Accumulate::kAdd;
            std::vector<float> dinp_ref = add ? dinp0 : std::vector<float>(N * C), dweight_ref = dweight0,
                               dbias_ref = dbias0;
            cpu->layernorm_backward({.dout = view(dout, {N, C}),
                                     .inp = view(inp, {N, C}),
                                     .weight = view(weight, {C}),
                                     .mean = view(mean_ref, {N}),
                                     .rstd = view(rstd_ref, {N}),
                                     .dinp = view(dinp_ref, {N, C}),
                                     .dweight = view(dweight_ref, {C}),
                                     .dbias = view(dbias_ref, {C}),
                                     .accumulate = acc});
            std::vector<float> first_dinp, first_dweight;
            for (int run = 0; run < 2; ++run) {
                Guarded dinp = add ? Guarded(dinp0) : Guarded(N * C, NAN);  // kOverwrite must not read dinp
                Guarded dweight(dweight0), dbias(dbias0);
                Guarded scratch(static_cast<int64_t>(cuda::layernorm_backward_scratch_floats(N, C)), NAN);
                // The CPU's mean and rstd, so that only the backward is compared.
                cuda::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), scratch.data(), dout.data(),
                                         inp.data(), weight.data(), mean_ref.data(), rstd_ref.data(), N, C,
                                         add ? cuda::DinpWrite::kAdd : cuda::DinpWrite::kOverwrite, kStream);
                EXPECT_TRUE(dinp.guards_intact() && dweight.guards_intact() && dbias.guards_intact() &&
                            scratch.guards_intact());
                // Measured up to 1.1e-7 (dinp) and 1.2e-7 (dweight, dbias: float sums over up to 137 rows).
                expect_close(add ? "layernorm dinp (+=)" : "layernorm dinp (=)", max_rel_error(dinp.values(), dinp_ref),
                             1e-6);
                expect_close("layernorm dweight", max_rel_error(dweight.values(), dweight_ref), 1e-6);
                expect_close("layernorm dbias", max_rel_error(dbias.values(), dbias_ref), 1e-6);
                if (run == 0) {
                    first_dinp = dinp.values();
                    first_dweight = dweight.values();
                } else {
                    EXPECT_TRUE(bit_identical(dinp.values(), first_dinp));
                    EXPECT_TRUE(bit_identical(dweight.values(), first_dweight));
                }
            }
        }
    }
}

TEST(CudaEmuKernels, AdamWMatchesTheCpuReference) {
    const int64_t n = 37 * 53;
    const auto param0 = random_floats(n, 1), grad = random_floats(n, 2), m0 = random_floats(n, 3, -0.1f, 0.1f);
    const auto v0 = random_floats(n, 4, 0.0f, 0.01f);
    const cuda::AdamWHyper h{
        .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_scale = 0.5f, .step = 7};
    auto param_ref = param0, m_ref = m0, v_ref = v0, g = grad;
    make_cpu_backend(OpMode::kReference)
        ->adamw({.param = view(param_ref, {n}),
                 .grad = view(g, {n}),
                 .m = view(m_ref, {n}),
                 .v = view(v_ref, {n}),
                 .lr = h.lr,
                 .beta1 = h.beta1,
                 .beta2 = h.beta2,
                 .eps = h.eps,
                 .weight_decay = h.weight_decay,
                 .grad_scale = h.grad_scale,
                 .step = h.step,
                 .param_copy = {}});
    Guarded param(param0), m(m0), v(v0);
    cuda::adamw(param.data(), m.data(), v.data(), grad.data(), n, h, kStream);
    EXPECT_TRUE(param.guards_intact() && m.guards_intact() && v.guards_intact());
    // Measured 6.0e-8 / 5.4e-8 / 8.6e-8: float instead of double for a handful of operations per element.
    expect_close("adamw param", max_rel_error(param.values(), param_ref), 1e-6);
    expect_close("adamw m", max_rel_error(m.values(), m_ref), 1e-6);
    expect_close("adamw v", max_rel_error(v.values(), v_ref), 1e-6);
}

}  // namespace
}  // namespace ms::test
