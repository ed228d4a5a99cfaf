// test_cuda_backend.cpp: every op through the Backend interface of CudaBackend (engine/backends/cuda/cuda_backend.h,
// here the "cuda-emulated" build: the kernel sources run on the CPU through fibers) against the CPU backend in
// OpMode::kReference, on shapes that are not multiples of any block, with guarded outputs. The kernels themselves
// are tested through their raw launchers in test_cuda_emu*.cpp; this file checks the backend's plumbing: which
// tensor goes to which launcher argument, the Accumulate and optional-tensor handling, the scratch it owns, the
// shape checks. Tolerances are the launcher tests' (measured there with MS_OP_TEST_VERBOSE=1); with it set, this
// file prints errors of the same order, all <= 3.6e-7 (1.3e-13 for sum_squares). A coverage test fails when an
// OpKind has no test in this file. The same file, linked with ms_cuda_backend instead, is test_cuda_device
// (tests/CMakeLists.txt), the check on a real GPU: there every operator new returns managed memory (below), so
// the std::vector buffers are readable by both the kernels and the CPU reference.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <vector>

#include "engine/backends/cuda/cuda_backend.h"
#include "engine/backends/rope_table.h"
#include "tests/ops/attention_block_check.h"
#include "tests/ops/op_test_util.h"

#if defined(MS_TEST_CUDA_DEVICE)
#include <cuda_runtime.h>

#include <new>

// Every allocation of test_cuda_device is CUDA managed memory, with a 16-byte header that remembers it.
void* operator new(size_t bytes) {
    void* p = nullptr;
    if (cudaMallocManaged(&p, bytes + 16) != cudaSuccess) throw std::bad_alloc();
    return static_cast<char*>(p) + 16;
}
void operator delete(void* p) noexcept {
    if (p) cudaFree(static_cast<char*>(p) - 16);  // fails harmlessly once the runtime is unloading at exit
}
void operator delete(void* p, size_t) noexcept { operator delete(p); }
void* operator new[](size_t bytes) { return operator new(bytes); }
void operator delete[](void* p) noexcept { operator delete(p); }
void operator delete[](void* p, size_t) noexcept { operator delete(p); }
// The nothrow forms too (std::stable_sort's buffer, for one): else the linker takes them from the engine's
// allocation counter (memory/alloc_guard.cpp), whose plain forms then clash with these.
void* operator new(size_t bytes, const std::nothrow_t&) noexcept {
    try {
        return operator new(bytes);
    } catch (const std::bad_alloc&) {
        return nullptr;
    }
}
void* operator new[](size_t bytes, const std::nothrow_t& tag) noexcept { return operator new(bytes, tag); }
void operator delete(void* p, const std::nothrow_t&) noexcept { operator delete(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { operator delete(p); }
#endif

namespace ms::test {
namespace {

// ---- coverage: the OpKinds this file runs through CudaBackend, registered at static-initialisation time ----

std::set<OpKind>& cuda_backend_ops() {
    static std::set<OpKind> ops;
    return ops;
}
bool covers(std::initializer_list<OpKind> ops) {
    cuda_backend_ops().insert(ops.begin(), ops.end());
    return true;
}
#define MS_CUDA_BACKEND_TEST(name, ...)                                        \
    static const bool CudaBackend_##name##_registered = covers({__VA_ARGS__}); \
    TEST(CudaBackend, name)

std::unique_ptr<Backend> make_cuda() {
    BackendOptions o;
    o.kind = BackendKind::kCUDA;
    return make_backend_with_cuda(o);
}

void expect_close(const char* what, double err, double tol) {
    if (std::getenv("MS_OP_TEST_VERBOSE")) std::printf("  %-32s err %.2e (tol %.0e)\n", what, err, tol);
    EXPECT_LE(err, tol) << what;
}

TEST(CudaBackend, NameAndDtypes) {
    auto cuda = make_cuda();
    EXPECT_EQ(cuda->name(), CudaBackend::emulated() ? "cuda-emulated" : "cuda");
    // Every op on the three activation dtypes of the precision contract (test_cuda_emu_mixed.cpp tests bf16, fp16).
    for (int op = 0; op < static_cast<int>(OpKind::kCount); ++op) {
        for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
            EXPECT_TRUE(cuda->supports(static_cast<OpKind>(op), d)) << "OpKind " << op << " " << dtype_name(d);
        }
        EXPECT_FALSE(cuda->supports(static_cast<OpKind>(op), DType::kI32)) << "OpKind " << op;
    }
    // make_backend_with_cuda forwards the other kinds; make_backend itself still builds only the CPU backend.
    BackendOptions cpu;
    cpu.mode = OpMode::kReference;
    EXPECT_EQ(make_backend_with_cuda(cpu)->name(), "cpu-reference");
}

// The checks are host code, the same in both builds: test_cuda_device skips this (its forked child would need the
// parent's CUDA context, and a re-executed one dies in its managed allocations before printing).
#if !defined(MS_TEST_CUDA_DEVICE)
TEST(CudaBackendDeathTest, ShapeErrorsAreSentences) {
    auto cuda = make_cuda();
    std::vector<float> inp(6 * 5), weight(4 * 3), out(6 * 4);
    EXPECT_DEATH(cuda->matmul_forward(
                     {.inp = view(inp, {6, 5}), .weight = view(weight, {4, 3}), .bias = {}, .out = view(out, {6, 4})}),
                 "matmul: weight is \\(.., 3\\) but inp is \\(.., 5\\)");
    std::vector<float> qkv(2 * 3 * 3 * 130), o(2 * 3 * 130), lse(2 * 3);
    EXPECT_DEATH(
        cuda->attention_forward(
            {.qkv = view(qkv, {2, 3, 390}), .out = view(o, {2, 3, 130}), .lse = view(lse, {2, 1, 3}), .NH = 1}),
        "head size 130 exceeds");
}
#endif

// ---- residual, gelu ----

MS_CUDA_BACKEND_TEST(ResidualMatchesTheCpuBitForBit, OpKind::kResidualForward) {
    const int64_t n = 1001 * 3, M = 1001;
    auto a = random_floats(n, 1), b = random_floats(n, 2), bias = random_floats(M, 3);
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    for (bool with_bias : {false, true}) {
        std::vector<float> ref(n);
        cpu->residual_forward({.a = view(a, {n}),
                               .b = view(b, {n}),
                               .out = view(ref, {n}),
                               .bias = with_bias ? view(bias, {M}) : Tensor{}});
        Guarded out(n, NAN);
        cuda->residual_forward({.a = view(a, {n}),
                                .b = view(b, {n}),
                                .out = out.tensor({n}),
                                .bias = with_bias ? view(bias, {M}) : Tensor{}});
        EXPECT_TRUE(bit_identical(out.values(), ref)) << "bias " << with_bias;
        EXPECT_TRUE(out.guards_intact());
        auto aliased = a;  // out may alias a
        cuda->residual_forward({.a = view(aliased, {n}),
                                .b = view(b, {n}),
                                .out = view(aliased, {n}),
                                .bias = with_bias ? view(bias, {M}) : Tensor{}});
        EXPECT_TRUE(bit_identical(aliased, ref));
    }
}

MS_CUDA_BACKEND_TEST(GeluMatchesTheCpuReference, OpKind::kGeluForward, OpKind::kGeluBackward) {
    const int64_t n = 3001;
    auto inp = random_floats(n, 1, -5.0f, 5.0f), dout = random_floats(n, 2);
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    std::vector<float> out_ref(n), dinp_ref(n);
    cpu->gelu_forward({.inp = view(inp, {n}), .out = view(out_ref, {n})});
    cpu->gelu_backward({.inp = view(inp, {n}), .dout = view(dout, {n}), .dinp = view(dinp_ref, {n})});
    Guarded out(n, NAN), dinp(n, NAN);
    cuda->gelu_forward({.inp = view(inp, {n}), .out = out.tensor({n})});
    cuda->gelu_backward({.inp = view(inp, {n}), .dout = view(dout, {n}), .dinp = dinp.tensor({n})});
    // test_cuda_emu.cpp: measured 1.6e-8 / 1.1e-7.
    expect_close("gelu forward", max_rel_error(out.values(), out_ref), 2e-7);
    expect_close("gelu backward", max_rel_error(dinp.values(), dinp_ref), 1e-6);
    EXPECT_TRUE(out.guards_intact() && dinp.guards_intact());
    auto aliased = dout;  // dinp may alias dout
    cuda->gelu_backward({.inp = view(inp, {n}), .dout = view(aliased, {n}), .dinp = view(aliased, {n})});
    EXPECT_TRUE(bit_identical(aliased, dinp.values()));
}

// ---- layernorm ----

// The residual add fused in front of the LayerNorm (backend.h): residual_out as the residual op's, bit for bit (the
// same fp32 additions), the LayerNorm's outputs within the layernorm test's tolerances; in place (residual_out
// aliasing residual_a) and out-of-place, with and without the residual bias.
MS_CUDA_BACKEND_TEST(LayerNormResidualMatchesTheCpuReference, OpKind::kLayerNormResidualForward) {
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    for (const std::pair<int64_t, int64_t>& shape : {std::pair<int64_t, int64_t>{7, 37}, {137, 200}}) {
        const int64_t N = shape.first, C = shape.second;
        auto a = random_floats(N * C, 1, -3.0f, 3.0f), b = random_floats(N * C, 2), res_bias = random_floats(C, 3);
        auto weight = random_floats(C, 4), bias = random_floats(C, 5);
        for (bool with_bias : {false, true}) {
            SCOPED_TRACE(testing::Message() << "N " << N << " C " << C << " bias " << with_bias);
            const Tensor rb = with_bias ? view(res_bias, {C}) : Tensor{};
            std::vector<float> res_ref(N * C), out_ref(N * C), mean_ref(N), rstd_ref(N);
            cpu->layernorm_forward({.inp = {},
                                    .weight = view(weight, {C}),
                                    .bias = view(bias, {C}),
                                    .out = view(out_ref, {N, C}),
                                    .mean = view(mean_ref, {N}),
                                    .rstd = view(rstd_ref, {N}),
                                    .eps = 1e-5f,
                                    .residual_a = view(a, {N, C}),
                                    .residual_b = view(b, {N, C}),
                                    .residual_bias = rb,
                                    .residual_out = view(res_ref, {N, C})});
            for (bool in_place : {false, true}) {
                auto stream = a;
                Guarded res(N * C, NAN), out(N * C, NAN), mean(N, NAN), rstd(N, NAN);
                cuda->layernorm_forward({.inp = {},
                                         .weight = view(weight, {C}),
                                         .bias = view(bias, {C}),
                                         .out = out.tensor({N, C}),
                                         .mean = mean.tensor({N}),
                                         .rstd = rstd.tensor({N}),
                                         .eps = 1e-5f,
                                         .residual_a = view(stream, {N, C}),
                                         .residual_b = view(b, {N, C}),
                                         .residual_bias = rb,
                                         .residual_out = in_place ? view(stream, {N, C}) : res.tensor({N, C})});
                cuda->synchronize();
                EXPECT_TRUE(bit_identical(in_place ? stream : res.values(), res_ref)) << "in place " << in_place;
                // the layernorm test's tolerances (test_cuda_emu.cpp: measured up to 1.5e-7 / 8.8e-8 / 6.8e-8)
                expect_close("layernorm + residual out", max_rel_error(out.values(), out_ref), 1e-6);
                expect_close("layernorm + residual mean", max_rel_error(mean.values(), mean_ref), 1e-6);
                expect_close("layernorm + residual rstd", max_rel_error(rstd.values(), rstd_ref), 1e-6);
                EXPECT_TRUE(res.guards_intact() && out.guards_intact() && mean.guards_intact() && rstd.guards_intact());
            }
        }
    }
}

MS_CUDA_BACKEND_TEST(LayerNormMatchesTheCpuReference, OpKind::kLayerNormForward, OpKind::kLayerNormBackward) {
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();  // one backend for both shapes: the second, larger one grows its scratch
    for (auto [N, C] : {std::pair<int64_t, int64_t>{7, 37}, std::pair<int64_t, int64_t>{137, 200}}) {
        SCOPED_TRACE(testing::Message() << "N " << N << " C " << C);
        auto inp = random_floats(N * C, 1, -3.0f, 3.0f), weight = random_floats(C, 2), bias = random_floats(C, 3);
        auto dout = random_floats(N * C, 4);
        const auto dinp0 = random_floats(N * C, 5), dweight0 = random_floats(C, 6), dbias0 = random_floats(C, 7);
        std::vector<float> out_ref(N * C), mean_ref(N), rstd_ref(N);
        cpu->layernorm_forward({.inp = view(inp, {N, C}),
                                .weight = view(weight, {C}),
                                .bias = view(bias, {C}),
                                .out = view(out_ref, {N, C}),
                                .mean = view(mean_ref, {N}),
                                .rstd = view(rstd_ref, {N}),
                                .eps = 1e-5f});
        Guarded out(N * C, NAN), mean(N, NAN), rstd(N, NAN);
        cuda->layernorm_forward({.inp = view(inp, {N, C}),
                                 .weight = view(weight, {C}),
                                 .bias = view(bias, {C}),
                                 .out = out.tensor({N, C}),
                                 .mean = mean.tensor({N}),
                                 .rstd = rstd.tensor({N}),
                                 .eps = 1e-5f});
        // test_cuda_emu.cpp: measured up to 1.5e-7 / 8.8e-8 / 6.8e-8.
        expect_close("layernorm out", max_rel_error(out.values(), out_ref), 1e-6);
        expect_close("layernorm mean", max_rel_error(mean.values(), mean_ref), 1e-6);
        expect_close("layernorm rstd", max_rel_error(rstd.values(), rstd_ref), 1e-6);
        EXPECT_TRUE(out.guards_intact() && mean.guards_intact() && rstd.guards_intact());
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
            Guarded dinp = add ? Guarded(dinp0) : Guarded(N * C, NAN), dweight(dweight0), dbias(dbias0);
            cuda->layernorm_backward({.dout = view(dout, {N, C}),
                                      .inp = view(inp, {N, C}),
                                      .weight = view(weight, {C}),
                                      .mean = view(mean_ref, {N}),
                                      .rstd = view(rstd_ref, {N}),
                                      .dinp = dinp.tensor({N, C}),
                                      .dweight = dweight.tensor({C}),
                                      .dbias = dbias.tensor({C}),
                                      .accumulate = acc});
            // test_cuda_emu.cpp: measured up to 1.1e-7 (dinp) and 1.2e-7 (dweight, dbias).
            expect_close(add ? "layernorm dinp (+=)" : "layernorm dinp (=)", max_rel_error(dinp.values(), dinp_ref),
                         1e-6);
            expect_close("layernorm dweight", max_rel_error(dweight.values(), dweight_ref), 1e-6);
            expect_close("layernorm dbias", max_rel_error(dbias.values(), dbias_ref), 1e-6);
            EXPECT_TRUE(dinp.guards_intact() && dweight.guards_intact() && dbias.guards_intact());
        }
    }
}

// ---- matmul ----

MS_CUDA_BACKEND_TEST(MatmulMatchesTheCpuReference, OpKind::kMatmulForward, OpKind::kMatmulBackward) {
    const int64_t N = 37, K = 53, M = 29;
    auto inp = random_floats(N * K, 1), weight = random_floats(M * K, 2), bias = random_floats(M, 3);
    auto dout = random_floats(N * M, 4);
    const auto dinp0 = random_floats(N * K, 5), dweight0 = random_floats(M * K, 6), dbias0 = random_floats(M, 7);
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    for (bool with_bias : {false, true}) {
        std::vector<float> out_ref(N * M);
        cpu->matmul_forward({.inp = view(inp, {N, K}),
                             .weight = view(weight, {M, K}),
                             .bias = with_bias ? view(bias, {M}) : Tensor{},
                             .out = view(out_ref, {N, M})});
        Guarded out(N * M, NAN);
        cuda->matmul_forward({.inp = view(inp, {N, K}),
                              .weight = view(weight, {M, K}),
                              .bias = with_bias ? view(bias, {M}) : Tensor{},
                              .out = out.tensor({N, M})});
        // test_cuda_emu_ops.cpp: measured up to 3.3e-7.
        expect_close("matmul out", max_rel_error(out.values(), out_ref), 1e-6);
        EXPECT_TRUE(out.guards_intact());
    }
    for (Accumulate acc : {Accumulate::kOverwrite, Accumulate::kAdd}) {
        const bool add = acc == Accumulate::kAdd;
        std::vector<float> dinp_ref = add ? dinp0 : std::vector<float>(N * K), dweight_ref = dweight0,
                           dbias_ref = dbias0;
        cpu->matmul_backward({.dout = view(dout, {N, M}),
                              .inp = view(inp, {N, K}),
                              .weight = view(weight, {M, K}),
                              .dinp = view(dinp_ref, {N, K}),
                              .dweight = view(dweight_ref, {M, K}),
                              .dbias = view(dbias_ref, {M}),
                              .accumulate = acc});
        Guarded dinp = add ? Guarded(dinp0) : Guarded(N * K, NAN), dweight(dweight0), dbias(dbias0);
        cuda->matmul_backward({.dout = view(dout, {N, M}),
                               .inp = view(inp, {N, K}),
                               .weight = view(weight, {M, K}),
                               .dinp = dinp.tensor({N, K}),
                               .dweight = dweight.tensor({M, K}),
                               .dbias = dbias.tensor({M}),
                               .accumulate = acc});
        // test_cuda_emu_ops.cpp: measured up to 2.2e-7.
        expect_close(add ? "matmul dinp (+=)" : "matmul dinp (=)", max_rel_error(dinp.values(), dinp_ref), 1e-6);
        expect_close("matmul dweight", max_rel_error(dweight.values(), dweight_ref), 1e-6);
        expect_close("matmul dbias", max_rel_error(dbias.values(), dbias_ref), 1e-6);
        EXPECT_TRUE(dinp.guards_intact() && dweight.guards_intact() && dbias.guards_intact());
    }
    // Without dinp and dbias (both optional): dweight only.
    std::vector<float> dweight_ref = dweight0;
    cpu->matmul_backward({.dout = view(dout, {N, M}),
                          .inp = view(inp, {N, K}),
                          .weight = view(weight, {M, K}),
                          .dinp = {},
                          .dweight = view(dweight_ref, {M, K}),
                          .dbias = {},
                          .accumulate = Accumulate::kOverwrite});
    Guarded dweight(dweight0);
    cuda->matmul_backward({.dout = view(dout, {N, M}),
                           .inp = view(inp, {N, K}),
                           .weight = view(weight, {M, K}),
                           .dinp = {},
                           .dweight = dweight.tensor({M, K}),
                           .dbias = {},
                           .accumulate = Accumulate::kOverwrite});
    expect_close("matmul dweight only", max_rel_error(dweight.values(), dweight_ref), 1e-6);
    EXPECT_TRUE(dweight.guards_intact());
}

// The MLP's GELU fusion (backend.h: gelu_out, gelu_inp) against the CPU reference's matmul then gelu. M = 40 and
// K = 48 are multiples of 8, so on a GPU the products take cuBLASLt's GELU_AUX_BIAS and DGELU epilogues; M = 29 /
// K = 45 give an aux leading dimension cuBLASLt refuses, so there they take the fallback (cuBLASLt or cuBLAS, then
// gelu.cu's kernels). The emulation runs its matmul then its gelu kernel: the launcher tests' 1e-6 (measured <=
// 2.3e-7). On a GPU, gelu_out and dinp in fp32: unmeasured (no GPU when this was written); 3e-5 is below the 7e-5
// that erf's GELU would be off from the tanh GELU on these values (4.7e-4 at x = -2.7, over max |gelu| ~ 7), so the
// test also tells which GELU cuBLASLt computes. The pre-activation (the aux output), dweight and dbias are plain
// fp32 sums: 1e-6, as in MatmulMatchesTheCpuReference.
MS_CUDA_BACKEND_TEST(MatmulGeluFusionMatchesTheCpuReference, OpKind::kMatmulForward, OpKind::kMatmulBackward) {
#if defined(MS_TEST_CUDA_DEVICE)
    const double tol = 3e-5;
#else
    const double tol = 1e-6;
#endif
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    for (const int64_t align8 : {1, 0}) {
        const int64_t N = 37, K = align8 ? 48 : 45, M = align8 ? 40 : 29;
        SCOPED_TRACE(testing::Message() << "N " << N << " K " << K << " M " << M);
        auto inp = random_floats(N * K, 1), weight = random_floats(M * K, 2), bias = random_floats(M, 3);
        auto dout = random_floats(N * M, 4), gelu_inp = random_floats(N * K, 5, -3.0f, 3.0f);
        const auto dweight0 = random_floats(M * K, 6), dbias0 = random_floats(M, 7);
        for (bool with_bias : {false, true}) {
            std::vector<float> out_ref(N * M), act_ref(N * M);
            cpu->matmul_forward({.inp = view(inp, {N, K}),
                                 .weight = view(weight, {M, K}),
                                 .bias = with_bias ? view(bias, {M}) : Tensor{},
                                 .out = view(out_ref, {N, M})});
            cpu->gelu_forward({.inp = view(out_ref, {N * M}), .out = view(act_ref, {N * M})});
            Guarded out(N * M, NAN), act(N * M, NAN);
            cuda->matmul_forward({.inp = view(inp, {N, K}),
                                  .weight = view(weight, {M, K}),
                                  .bias = with_bias ? view(bias, {M}) : Tensor{},
                                  .out = out.tensor({N, M}),
                                  .gelu_out = act.tensor({N, M})});
            cuda->synchronize();
            expect_close("fused matmul out (pre-activation)", max_rel_error(out.values(), out_ref), 1e-6);
            expect_close("fused matmul gelu_out", max_rel_error(act.values(), act_ref), tol);
            EXPECT_TRUE(out.guards_intact() && act.guards_intact());
        }
        std::vector<float> dinp_ref(N * K), dweight_ref = dweight0, dbias_ref = dbias0;
        cpu->matmul_backward({.dout = view(dout, {N, M}),
                              .inp = view(inp, {N, K}),
                              .weight = view(weight, {M, K}),
                              .dinp = view(dinp_ref, {N, K}),
                              .dweight = view(dweight_ref, {M, K}),
                              .dbias = view(dbias_ref, {M}),
                              .accumulate = Accumulate::kOverwrite});
        cpu->gelu_backward(
            {.inp = view(gelu_inp, {N * K}), .dout = view(dinp_ref, {N * K}), .dinp = view(dinp_ref, {N * K})});
        Guarded dinp(N * K, NAN), dweight(dweight0), dbias(dbias0);
        cuda->matmul_backward({.dout = view(dout, {N, M}),
                               .inp = view(inp, {N, K}),
                               .weight = view(weight, {M, K}),
                               .dinp = dinp.tensor({N, K}),
                               .dweight = dweight.tensor({M, K}),
                               .dbias = dbias.tensor({M}),
                               .accumulate = Accumulate::kOverwrite,
                               .gelu_inp = view(gelu_inp, {N, K})});
        cuda->synchronize();
        expect_close("fused matmul dinp (through gelu)", max_rel_error(dinp.values(), dinp_ref), tol);
        expect_close("fused matmul dweight", max_rel_error(dweight.values(), dweight_ref), 1e-6);
        expect_close("fused matmul dbias", max_rel_error(dbias.values(), dbias_ref), 1e-6);
        EXPECT_TRUE(dinp.guards_intact() && dweight.guards_intact() && dbias.guards_intact());
    }
}

// ---- attention ----

MS_CUDA_BACKEND_TEST(AttentionMatchesTheCpuReference, OpKind::kAttentionForward, OpKind::kAttentionBackward) {
    const int64_t B = 2, T = 21, NH = 3, HS = 12, C = NH * HS;
    auto qkv = random_floats(B * T * 3 * C, 1, -2.0f, 2.0f), dout = random_floats(B * T * C, 2);
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    std::vector<float> out_ref(B * T * C), lse_ref(B * NH * T), dqkv_ref(B * T * 3 * C);
    cpu->attention_forward(
        {.qkv = view(qkv, {B, T, 3 * C}), .out = view(out_ref, {B, T, C}), .lse = view(lse_ref, {B, NH, T}), .NH = NH});
    cpu->attention_backward({.dout = view(dout, {B, T, C}),
                             .qkv = view(qkv, {B, T, 3 * C}),
                             .out = view(out_ref, {B, T, C}),
                             .lse = view(lse_ref, {B, NH, T}),
                             .dqkv = view(dqkv_ref, {B, T, 3 * C}),
                             .NH = NH});
    Guarded out(B * T * C, NAN), lse(B * NH * T, NAN), dqkv(B * T * 3 * C, NAN);
    cuda->attention_forward(
        {.qkv = view(qkv, {B, T, 3 * C}), .out = out.tensor({B, T, C}), .lse = lse.tensor({B, NH, T}), .NH = NH});
    cuda->attention_backward({.dout = view(dout, {B, T, C}),
                              .qkv = view(qkv, {B, T, 3 * C}),
                              .out = view(out_ref, {B, T, C}),
                              .lse = view(lse_ref, {B, NH, T}),
                              .dqkv = dqkv.tensor({B, T, 3 * C}),
                              .NH = NH});
    // test_cuda_emu_ops.cpp: measured up to 4.2e-7 (out), 1.4e-7 (lse), 3.5e-7 (dqkv).
    expect_close("attention out", max_rel_error(out.values(), out_ref), 2e-6);
    expect_close("attention lse", max_rel_error(lse.values(), lse_ref), 2e-6);
    expect_close("attention dqkv", max_rel_error(dqkv.values(), dqkv_ref), 2e-6);
    EXPECT_TRUE(out.guards_intact() && lse.guards_intact() && dqkv.guards_intact());
}

// ---- embedding ----

MS_CUDA_BACKEND_TEST(EmbeddingMatchesTheCpuBitForBit, OpKind::kEmbeddingForward, OpKind::kEmbeddingBackward) {
    const int64_t B = 3, T = 7, N = B * T, C = 53, V = 40, vocab_start = 30;
    auto tokens = random_ints(N, 1, 0, static_cast<int32_t>(vocab_start + V + 20));  // some on other shards
    auto table = random_floats(V * C, 2), pos = random_floats(T * C, 3), dout = random_floats(N * C, 4);
    const auto dtable0 = random_floats(V * C, 5), dpos0 = random_floats(T * C, 6);
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    for (bool with_pos : {false, true}) {
        std::vector<float> out_ref(N * C);
        cpu->embedding_forward({.tokens = view(tokens, {N}),
                                .table = view(table, {V, C}),
                                .pos = with_pos ? view(pos, {T, C}) : Tensor{},
                                .out = view(out_ref, {N, C}),
                                .vocab_start = vocab_start,
                                .T = T});
        Guarded out(N * C, NAN);
        cuda->embedding_forward({.tokens = view(tokens, {N}),
                                 .table = view(table, {V, C}),
                                 .pos = with_pos ? view(pos, {T, C}) : Tensor{},
                                 .out = out.tensor({N, C}),
                                 .vocab_start = vocab_start,
                                 .T = T});
        EXPECT_TRUE(bit_identical(out.values(), out_ref)) << "pos " << with_pos;
        auto dtable_ref = dtable0, dpos_ref = dpos0;
        cpu->embedding_backward({.tokens = view(tokens, {N}),
                                 .dout = view(dout, {N, C}),
                                 .dtable = view(dtable_ref, {V, C}),
                                 .dpos = with_pos ? view(dpos_ref, {T, C}) : Tensor{},
                                 .vocab_start = vocab_start,
                                 .T = T});
        Guarded dtable(dtable0), dpos(dpos0);
        cuda->embedding_backward({.tokens = view(tokens, {N}),
                                  .dout = view(dout, {N, C}),
                                  .dtable = dtable.tensor({V, C}),
                                  .dpos = with_pos ? dpos.tensor({T, C}) : Tensor{},
                                  .vocab_start = vocab_start,
                                  .T = T});
        // The kernels sum every element in the CPU's order (test_cuda_emu_ops.cpp).
        EXPECT_TRUE(bit_identical(dtable.values(), dtable_ref)) << "pos " << with_pos;
        EXPECT_TRUE(bit_identical(dpos.values(), dpos_ref)) << "pos " << with_pos;
        EXPECT_TRUE(out.guards_intact() && dtable.guards_intact() && dpos.guards_intact());
    }
}

// ---- cross-entropy ----

MS_CUDA_BACKEND_TEST(CrossEntropyMatchesTheCpuReference, OpKind::kCrossEntropyForward, OpKind::kCrossEntropyBackward) {
    const int64_t N = 37, Vp = 300, valid = 290, vocab_start = 0;
    auto logits = random_floats(N * Vp, 1, -8.0f, 8.0f);
    auto targets = random_ints(N, 2, 0, static_cast<int32_t>(vocab_start + Vp + 50));
    auto dloss = random_floats(N, 3, 0.01f, 0.1f);
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    auto forward = [&](Backend& be, Tensor row_max, Tensor sum_exp, Tensor target_logit) {
        CrossEntropyForwardArgs fa{.logits = view(logits, {N, Vp}),
                                   .targets = view(targets, {N}),
                                   .row_max = row_max,
                                   .sum_exp = sum_exp,
                                   .target_logit = target_logit,
                                   .vocab_start = vocab_start,
                                   .vocab_valid_local = valid,
                                   .phase = CrossEntropyPhase::kMax};
        be.cross_entropy_forward(fa);
        fa.phase = CrossEntropyPhase::kSumExp;
        be.cross_entropy_forward(fa);
    };
    std::vector<float> max_ref(N), sum_ref(N), target_ref(N);
    forward(*cpu, view(max_ref, {N}), view(sum_ref, {N}), view(target_ref, {N}));
    Guarded row_max(N, NAN), sum_exp(N, NAN), target_logit(N, NAN);
    forward(*cuda, row_max.tensor({N}), sum_exp.tensor({N}), target_logit.tensor({N}));
    EXPECT_TRUE(bit_identical(row_max.values(), max_ref));
    EXPECT_TRUE(bit_identical(target_logit.values(), target_ref));
    // test_cuda_emu_ops.cpp: measured 7.2e-8 (sum_exp), 4.8e-9 (dlogits).
    expect_close("cross_entropy sum_exp", max_rel_error(sum_exp.values(), sum_ref), 1e-6);
    auto dlogits_ref = logits;
    const CrossEntropyBackwardArgs ba{.logits = view(dlogits_ref, {N, Vp}),
                                      .targets = view(targets, {N}),
                                      .row_max = view(max_ref, {N}),
                                      .sum_exp = view(sum_ref, {N}),
                                      .dloss = view(dloss, {N}),
                                      .vocab_start = vocab_start,
                                      .vocab_valid_local = valid};
    cpu->cross_entropy_backward(ba);
    Guarded dlogits(logits);
    CrossEntropyBackwardArgs cba = ba;
    cba.logits = dlogits.tensor({N, Vp});
    cuda->cross_entropy_backward(cba);
    expect_close("cross_entropy dlogits", max_rel_error(dlogits.values(), dlogits_ref), 1e-6);
    EXPECT_TRUE(row_max.guards_intact() && sum_exp.guards_intact() && target_logit.guards_intact() &&
                dlogits.guards_intact());
}

// ---- lm head + loss ----

// The fused op in chunks of 8 rows (several chunks and a ragged last one) against the CPU reference's fused op and
// against this backend's own unfused ops on the whole logits. Measured (emulation, MS_OP_TEST_VERBOSE=1): against
// the CPU reference losses 9.3e-8, dlnf 3.7e-7, dwte 2.0e-7; against its own unfused ops 0 for the losses and dlnf
// (the same kernels on each row) and 2.0e-7 for dwte (summed chunk by chunk). On a GPU cuBLAS may pick another
// algorithm per chunk shape, so the bit-identity is checked on the emulation only.
MS_CUDA_BACKEND_TEST(LmHeadLossMatchesTheCpuReferenceAndItsUnfusedOps, OpKind::kLmHeadLoss) {
    const int64_t N = 37, C = 53, Vp = 67, valid = 61, R = 8;
    auto lnf = random_floats(N * C, 1, -2.0f, 2.0f), wte = random_floats(Vp * C, 2, -0.5f, 0.5f);
    auto targets = random_ints(N, 3, 0, static_cast<int32_t>(valid - 1));
    auto dloss = random_floats(N, 4, 0.01f, 0.05f);
    const auto dwte0 = random_floats(Vp * C, 5, -0.1f, 0.1f);
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    struct Out {
        std::vector<float> losses, dlnf, dwte;
    };
    const auto fused = [&](Backend& be, BackendKind kind) {
        Out o{std::vector<float>(N, NAN), std::vector<float>(N * C, NAN), dwte0};
        const int64_t elems = lm_head_loss_scratch_elems(kind, DType::kF32, N, Vp, R);
        Guarded scratch(elems, NAN);
        be.lm_head_loss({.lnf = view(lnf, {N, C}),
                         .wte = view(wte, {Vp, C}),
                         .targets = view(targets, {N}),
                         .dloss = view(dloss, {N}),
                         .losses = view(o.losses, {N}),
                         .dlnf = view(o.dlnf, {N, C}),
                         .dwte = view(o.dwte, {Vp, C}),
                         .scratch = scratch.tensor({elems}),
                         .vocab_start = 0,
                         .vocab_valid_local = valid,
                         .chunk_rows = R});
        be.synchronize();
        EXPECT_TRUE(scratch.guards_intact());
        return o;
    };
    const Out want = fused(*cpu, BackendKind::kCPU);
    const Out got = fused(*cuda, BackendKind::kCUDA);
    expect_close("lm_head_loss losses", max_rel_error(got.losses, want.losses), 1e-6);
    expect_close("lm_head_loss dlnf", max_rel_error(got.dlnf, want.dlnf), 1e-6);
    expect_close("lm_head_loss dwte", max_rel_error(got.dwte, want.dwte), 1e-6);
    // the unfused ops on this backend
    Out un{std::vector<float>(N), std::vector<float>(N * C, NAN), dwte0};
    std::vector<float> logits(N * Vp), row_max(N), sum_exp(N), target_logit(N);
    cuda->matmul_forward(
        {.inp = view(lnf, {N, C}), .weight = view(wte, {Vp, C}), .bias = {}, .out = view(logits, {N, Vp})});
    cuda->cross_entropy_forward({.logits = view(logits, {N, Vp}),
                                 .targets = view(targets, {N}),
                                 .row_max = view(row_max, {N}),
                                 .sum_exp = view(sum_exp, {N}),
                                 .target_logit = view(target_logit, {N}),
                                 .vocab_start = 0,
                                 .vocab_valid_local = valid,
                                 .phase = CrossEntropyPhase::kMaxSumExp});
    cuda->synchronize();
    for (int64_t n = 0; n < N; ++n) un.losses[n] = std::log(sum_exp[n]) + row_max[n] - target_logit[n];
    cuda->cross_entropy_backward({.logits = view(logits, {N, Vp}),
                                  .targets = view(targets, {N}),
                                  .row_max = view(row_max, {N}),
                                  .sum_exp = view(sum_exp, {N}),
                                  .dloss = view(dloss, {N}),
                                  .vocab_start = 0,
                                  .vocab_valid_local = valid});
    cuda->matmul_backward({.dout = view(logits, {N, Vp}),
                           .inp = view(lnf, {N, C}),
                           .weight = view(wte, {Vp, C}),
                           .dinp = view(un.dlnf, {N, C}),
                           .dweight = view(un.dwte, {Vp, C}),
                           .dbias = {},
                           .accumulate = Accumulate::kOverwrite});
    cuda->synchronize();
    expect_close("lm_head_loss fused vs unfused dwte", max_rel_error(got.dwte, un.dwte), 1e-6);
    if (CudaBackend::emulated()) {
        EXPECT_TRUE(bit_identical(got.losses, un.losses));
        EXPECT_TRUE(bit_identical(got.dlnf, un.dlnf));
    } else {
        expect_close("lm_head_loss fused vs unfused losses", max_rel_error(got.losses, un.losses), 1e-6);
        expect_close("lm_head_loss fused vs unfused dlnf", max_rel_error(got.dlnf, un.dlnf), 1e-6);
    }
}

// ---- adamw, sum_squares, zero ----

MS_CUDA_BACKEND_TEST(AdamWMatchesTheCpuReference, OpKind::kAdamW) {
    const int64_t n = 2049;
    const auto param0 = random_floats(n, 1), m0 = random_floats(n, 2, -0.1f, 0.1f), v0 = random_floats(n, 3, 0, 0.01f);
    auto grad = random_floats(n, 4);
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    auto param_ref = param0, m_ref = m0, v_ref = v0;
    const AdamWArgs args{.param = view(param_ref, {n}),
                         .grad = view(grad, {n}),
                         .m = view(m_ref, {n}),
                         .v = view(v_ref, {n}),
                         .lr = 1e-3f,
                         .beta1 = 0.9f,
                         .beta2 = 0.95f,
                         .eps = 1e-8f,
                         .weight_decay = 0.1f,
                         .grad_scale = 0.5f,
                         .step = 3,
                         .param_copy = {}};
    cpu->adamw(args);
    Guarded param(param0), m(m0), v(v0);
    AdamWArgs cargs = args;
    cargs.param = param.tensor({n});
    cargs.m = m.tensor({n});
    cargs.v = v.tensor({n});
    cuda->adamw(cargs);
    // test_cuda_emu.cpp: measured 6.0e-8 / 5.4e-8 / 8.6e-8.
    expect_close("adamw param", max_rel_error(param.values(), param_ref), 1e-6);
    expect_close("adamw m", max_rel_error(m.values(), m_ref), 1e-6);
    expect_close("adamw v", max_rel_error(v.values(), v_ref), 1e-6);
    EXPECT_TRUE(param.guards_intact() && m.guards_intact() && v.guards_intact());
}

MS_CUDA_BACKEND_TEST(SumSquaresAndZero, OpKind::kSumSquares) {
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    // Growing sizes through one backend: its scratch grows; 0 elements sum to exactly 0.
    for (int64_t n : {int64_t{0}, int64_t{1001}, int64_t{163840}}) {
        SCOPED_TRACE(testing::Message() << "n " << n);
        auto x = random_floats(static_cast<size_t>(n), 1, -3.0f, 3.0f);
        const double expected = cpu->sum_squares(Tensor::f32(x.data(), {n}));
        const double got = cuda->sum_squares(Tensor::f32(x.data(), {n}));
        // test_cuda_emu_ops.cpp: measured 1.3e-13 against the CPU reference.
        expect_close("sum_squares", std::fabs(got - expected) / std::max(expected, 1e-300), 1e-12);
        EXPECT_EQ(cuda->sum_squares(Tensor::f32(x.data(), {n})), got);  // deterministic
    }
    Guarded z(random_floats(777, 2));
    cuda->zero(z.tensor({777}));
    cuda->synchronize();
    EXPECT_EQ(z.values(), std::vector<float>(777, 0.0f));
    EXPECT_TRUE(z.guards_intact());
}

// ---- cast ----

MS_CUDA_BACKEND_TEST(CastMatchesTheCpuBitForBit, OpKind::kCast) {
    const int64_t n = 1001;
    auto x = random_floats(static_cast<size_t>(n), 1, -70000.0f, 70000.0f);
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    // fp32 -> 16 bits -> fp32 for both 16-bit types; the 16-bit buffers are raw uint16_t storage (std::vector, so
    // managed memory in test_cuda_device).
    for (DType d : {DType::kBF16, DType::kF16}) {
        SCOPED_TRACE(dtype_name(d));
        std::vector<uint16_t> half(static_cast<size_t>(n)), half_ref(static_cast<size_t>(n));
        std::vector<float> back(static_cast<size_t>(n)), back_ref(static_cast<size_t>(n));
        cuda->cast({.src = view(x, {n}), .dst = Tensor(half.data(), d, {n})});
        cuda->cast({.src = Tensor(half.data(), d, {n}), .dst = view(back, {n})});
        cuda->synchronize();
        cpu->cast({.src = view(x, {n}), .dst = Tensor(half_ref.data(), d, {n})});
        cpu->cast({.src = Tensor(half_ref.data(), d, {n}), .dst = view(back_ref, {n})});
        EXPECT_EQ(half, half_ref);
        EXPECT_TRUE(bit_identical(back, back_ref));
    }
}

// ---- the Llama ops (fp32; bf16 / fp16 and the launchers' contracts: test_cuda_emu_llama_ops.cpp) ----

MS_CUDA_BACKEND_TEST(LlamaOpsMatchTheCpuReference, OpKind::kRmsNormForward, OpKind::kRmsNormBackward, OpKind::kRope,
                     OpKind::kSwiGluForward, OpKind::kSwiGluBackward) {
    const int64_t N = 37, C = 131, F = 67, NH = 4, NKV = 2, HS = 10, T = 13, row = (NH + 2 * NKV) * HS;
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    // RMSNorm: dinp += onto random values, dweight += onto random values.
    auto inp = random_floats(N * C, 1, -2.0f, 2.0f), weight = random_floats(C, 2), dout = random_floats(N * C, 3);
    const auto dinp0 = random_floats(N * C, 4), dweight0 = random_floats(C, 5);
    std::vector<float> out_ref(N * C), rstd_ref(N), dinp_ref = dinp0, dweight_ref = dweight0;
    Guarded out(N * C, NAN), rstd(N, NAN), dinp(dinp0), dweight(dweight0);
    for (Backend* b : {cpu.get(), cuda.get()}) {
        const bool on_cuda = b == cuda.get();
        b->rmsnorm_forward({.inp = view(inp, {N, C}),
                            .weight = view(weight, {C}),
                            .out = on_cuda ? out.tensor({N, C}) : view(out_ref, {N, C}),
                            .rstd = on_cuda ? rstd.tensor({N}) : view(rstd_ref, {N}),
                            .eps = 1e-5f});
        b->rmsnorm_backward({.dout = view(dout, {N, C}),
                             .inp = view(inp, {N, C}),
                             .weight = view(weight, {C}),
                             .rstd = on_cuda ? rstd.tensor({N}) : view(rstd_ref, {N}),
                             .dinp = on_cuda ? dinp.tensor({N, C}) : view(dinp_ref, {N, C}),
                             .dweight = on_cuda ? dweight.tensor({C}) : view(dweight_ref, {C}),
                             .accumulate = Accumulate::kAdd});
    }
    cuda->synchronize();
    expect_close("rmsnorm out", max_rel_error(out.values(), out_ref), 1e-6);
    expect_close("rmsnorm rstd", max_rel_error(rstd.values(), rstd_ref), 1e-6);
    expect_close("rmsnorm dinp", max_rel_error(dinp.values(), dinp_ref), 1e-6);
    expect_close("rmsnorm dweight", max_rel_error(dweight.values(), dweight_ref), 1e-6);
    EXPECT_TRUE(out.guards_intact() && rstd.guards_intact() && dinp.guards_intact() && dweight.guards_intact());
    // RoPE, forward and inverse, with and without positions (B = 3 sequences of T).
    const int64_t Nr = 3 * T;
    auto table = rope_table(2 * T, HS, 10000.0, {.factor = 8.0, .original_max_position_embeddings = 16.0});
    auto positions = random_ints(Nr, 6, 0, static_cast<int32_t>(2 * T - 1));
    const auto qkv0 = random_floats(Nr * row, 7, -2.0f, 2.0f);
    for (RopeDirection dir : {RopeDirection::kForward, RopeDirection::kInverse}) {
        for (bool with_positions : {false, true}) {
            std::vector<float> ref = qkv0;
            Guarded qkv(qkv0);
            for (Backend* b : {cpu.get(), cuda.get()}) {
                b->rope({.qkv = b == cuda.get() ? qkv.tensor({Nr, row}) : view(ref, {Nr, row}),
                         .table = view(table, {2 * T, HS}),
                         .positions = with_positions ? view(positions, {Nr}) : Tensor{},
                         .T = T,
                         .NH = NH,
                         .NKV = NKV,
                         .direction = dir});
            }
            cuda->synchronize();
            expect_close("rope", max_rel_error(qkv.values(), ref), 1e-6);
            EXPECT_TRUE(qkv.guards_intact());
        }
    }
    // SwiGLU
    auto sw_inp = random_floats(N * 2 * F, 8, -8.0f, 8.0f), sw_dout = random_floats(N * F, 9);
    std::vector<float> sw_out_ref(N * F), sw_dinp_ref(N * 2 * F);
    Guarded sw_out(N * F, NAN), sw_dinp(N * 2 * F, NAN);
    cpu->swiglu_forward({.inp = view(sw_inp, {N, 2 * F}), .out = view(sw_out_ref, {N, F})});
    cpu->swiglu_backward(
        {.dout = view(sw_dout, {N, F}), .inp = view(sw_inp, {N, 2 * F}), .dinp = view(sw_dinp_ref, {N, 2 * F})});
    cuda->swiglu_forward({.inp = view(sw_inp, {N, 2 * F}), .out = sw_out.tensor({N, F})});
    cuda->swiglu_backward(
        {.dout = view(sw_dout, {N, F}), .inp = view(sw_inp, {N, 2 * F}), .dinp = sw_dinp.tensor({N, 2 * F})});
    cuda->synchronize();
    expect_close("swiglu out", max_rel_error(sw_out.values(), sw_out_ref), 1e-6);
    expect_close("swiglu dinp", max_rel_error(sw_dinp.values(), sw_dinp_ref), 1e-6);
    EXPECT_TRUE(sw_out.guards_intact() && sw_dinp.guards_intact());
}

// Ring attention's ops (the kernels' own tests: test_cuda_emu_attention_block.cpp): a remote block (packed kv, its
// keys at a column offset) over some rows merged onto a previous result, then its backward onto nonzero dq and dkv;
// the rank's own causal block (kv = qkv); copy_columns packing the keys and values.
MS_CUDA_BACKEND_TEST(AttentionBlockMatchesTheCpuReference, OpKind::kAttentionBlockForward,
                     OpKind::kAttentionBlockBackward, OpKind::kCopyColumns) {
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    const int NH = 4, NKV = 2, HS = 10, W = (NH + 2 * NKV) * HS, KV = 2 * NKV * HS;
    for (const BlockShape& s : {BlockShape{2, 13, 11, KV + 3, NH, NKV, HS, 3, 2, 9, 10, false, true},
                                BlockShape{2, 13, 13, W, NH, NKV, HS, NH * HS, 0, 13, 13, true, false}}) {
        const size_t N = size_t{1} * s.B * s.T;
        BlockInputs in;
        in.kv_is_qkv = s.causal;
        in.qkv = random_floats(N * s.W(), 1, -2.0f, 2.0f);
        if (!s.causal) in.kv = random_floats(size_t{1} * s.B * s.Tk * s.Wkv, 2, -2.0f, 2.0f);
        in.acc = random_floats(N * s.C(), 3);
        in.lse = random_floats(size_t{1} * s.B * s.NH * s.T, 4, 0.5f, 2.5f);
        in.dout = random_floats(N * s.C(), 5);
        in.dq = random_floats(N * s.C(), 6);
        in.dkv = random_floats(size_t{1} * s.B * s.Tk * s.Wd(), 7);
        const BlockForwardResult want = run_block_forward(*cpu, DType::kF32, s, in);
        const BlockForwardResult got = run_block_forward(*cuda, DType::kF32, s, in);
        expect_close("attention_block acc", max_rel_error(got.acc, want.acc), 1e-6);
        expect_close("attention_block lse", max_rel_error(got.lse, want.lse), 1e-6);
        in.out = want.acc;
        in.final_lse = want.lse;
        const BlockBackwardResult bwant = run_block_backward(*cpu, DType::kF32, s, in);
        const BlockBackwardResult bgot = run_block_backward(*cuda, DType::kF32, s, in);
        expect_close("attention_block dq", max_rel_error(bgot.dq, bwant.dq), 1e-6);
        expect_close("attention_block dkv", max_rel_error(bgot.dkv, bwant.dkv), 1e-6);
    }
    std::vector<float> qkv = random_floats(26 * W, 8), kv_ref(26 * KV);
    Guarded kv(26 * KV, NAN);
    cpu->copy_columns({.src = view(qkv, {26, W}), .dst = view(kv_ref, {26, KV}), .src_column = NH * HS, .cols = KV});
    cuda->copy_columns({.src = view(qkv, {26, W}), .dst = kv.tensor({26, KV}), .src_column = NH * HS, .cols = KV});
    cuda->synchronize();
    EXPECT_TRUE(bit_identical(kv.values(), kv_ref));
    EXPECT_TRUE(kv.guards_intact());
}

// Registered at static-initialisation time, so this holds when ctest runs each test in its own process.
TEST(CudaBackend, EveryOpKindHasATestHere) {
    for (int op = 0; op < static_cast<int>(OpKind::kCount); ++op) {
        EXPECT_TRUE(cuda_backend_ops().count(static_cast<OpKind>(op)))
            << "OpKind " << op << " (backend.h order) is not run through CudaBackend in test_cuda_backend.cpp";
    }
}

}  // namespace
}  // namespace ms::test
