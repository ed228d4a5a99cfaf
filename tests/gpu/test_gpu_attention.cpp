// test_gpu_attention.cpp: the tensor-core attention kernels (engine/backends/cuda/kernels/attention_tc.cu, PTX
// mma.sync m16n8k16) on a real GPU against the CPU backend in OpMode::kReference: the GPU twin of
// tests/ops/test_cuda_emu_attention_tc.cpp, which runs the same source on the CPU emulation at small T only.
//
// Per dtype (bf16, fp16) and (B, T, NH, HS) in (2, 9, 3, 16), (2, 70, 2, 32), (2, 130, 2, 64), (1, 1024, 2, 64),
// (4, 512, 12, 64), and grouped-query attention (NKV key/value heads < NH; the kGrouped kernels) in (2, 70, 4, 32)
// with NKV 2, (2, 130, 8, 64) with NKV 2, (1, 1024, 8, 64) with NKV 1 and (4, 512, 12, 64) with NKV 4:
// forward out and lse, backward dQ, dK, dV (each on its own scale) with the CPU's out and lse as inputs, as scale-free
// errors, for the split backward (two kernels) and the fused one (one kernel, dQ added across key tiles in a fixed
// order through scratch), which may differ by one unit in the last place of dQ, dK or dV (the emulation test checks
// dK and dV bit for bit, and dQ to one unit); outputs and scratch start as NaN (every element must be written, no
// accumulator read before its first write); a second run gives the same bits (no order-dependent atomics).
// Tolerances are the emulation test's (about 3x its measured errors), which a GPU should meet: a tensor core's
// summation order and ex2.approx differ from the emulation's only in the last bits of fp32 values, far below the
// rounding of P, dS and the outputs to 16 bits. Written without a GPU to run it on: MS_OP_TEST_VERBOSE=1 prints the
// errors to re-measure them.
// Ring attention (kernels/attention_block.cu, the GPU twin of tests/ops/test_cuda_emu_attention_block.cpp): the block
// forward and backward in fp32, bf16 and fp16 (NH 8, NKV 2 and 8, HS 64 and 32, T 300: rows and keys in many 32-row
// chunks) against the CPU reference, fp32 outputs within the emulation test's tolerances, two runs bit-identical;
// copy_columns bit-identical to the CPU backend's. The Hopper wgmma forward at the HS 64 shapes, where the GPU has it.
// Skips without a CUDA device (ctest -L gpu).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/backends/cuda/kernels/attention_block.cuh"
#include "engine/backends/cuda/kernels/attention_tc.cuh"
#include "engine/core/half.h"
#include "tests/ops/attention_block_check.h"
#include "tests/ops/attention_gqa_check.h"
#include "tests/ops/attention_tc_check.h"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

bool have_gpu() {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define MS_TEST_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

template <class S>
constexpr DType dtype_of() {
    return std::is_same_v<S, bf16> ? DType::kBF16 : DType::kF16;
}

// n elements of T in device memory (cudaMalloc: 256-byte aligned, as the tensor-core path needs 16).
template <class T>
class DeviceBuf {
  public:
    explicit DeviceBuf(size_t n) : n_(n) {
        if (cudaMalloc(&p_, n * sizeof(T)) != cudaSuccess) p_ = nullptr;
    }
    ~DeviceBuf() { cudaFree(p_); }
    DeviceBuf(const DeviceBuf&) = delete;
    DeviceBuf& operator=(const DeviceBuf&) = delete;
    T* get() { return p_; }
    cudaError_t upload(const std::vector<T>& v) {
        return cudaMemcpy(p_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
    }
    cudaError_t fill_nan() { return cudaMemset(p_, 0xff, n_ * sizeof(T)); }  // 0xffff: NaN in bf16 and fp16
    std::vector<T> download() const {
        std::vector<T> v(n_);
        if (cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) v.clear();
        return v;
    }

  private:
    T* p_ = nullptr;
    size_t n_;
};

template <class S>
std::vector<S> to_s(const std::vector<float>& v) {
    std::vector<S> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = from_float<S>(v[i]);
    return out;
}
template <class S>
std::vector<float> to_f(const std::vector<S>& v) {
    std::vector<float> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = to_float(v[i]);
    return out;
}

constexpr const Tolerances& kBf16Tol = kAttentionTcBf16Tol;  // attention_tc_check.h: the emulation's
constexpr const Tolerances& kFp16Tol = kAttentionTcFp16Tol;

struct Shape {
    int B, T, NH, HS;
    int NKV = 0;  // key/value heads; 0: NH (multi-head)
};

template <class S>
void check_attention_on_gpu(const Shape& s, const Tolerances& tol) {
    const int B = s.B, T = s.T, NH = s.NH, HS = s.HS, C = NH * HS, NKV = s.NKV > 0 ? s.NKV : NH;
    const int KV = NKV * HS, W = C + 2 * KV;  // a key/value block's width, qkv's row width
    const std::string tag = std::string(dtype_name(dtype_of<S>())) + " B " + std::to_string(B) + " T " +
                            std::to_string(T) + " NH " + std::to_string(NH) + " NKV " + std::to_string(NKV) + " HS " +
                            std::to_string(HS) + ": ";
    SCOPED_TRACE(tag);
    const size_t n_qkv = size_t{1} * B * T * W, n_out = size_t{1} * B * T * C, n_lse = size_t{1} * B * NH * T;
    // inputs rounded to S first, so the CPU reference sees exactly what the GPU does
    std::vector<S> qkv = to_s<S>(random_floats(n_qkv, 11 + T, -2.0f, 2.0f)),
                   dout = to_s<S>(random_floats(n_out, 12 + T));
    std::vector<S> out_ref(n_out), dqkv_ref(n_qkv);
    std::vector<float> lse_ref(n_lse);
    auto cpu = make_cpu_backend(OpMode::kReference);
    const DType d = dtype_of<S>();
    cpu->attention_forward({.qkv = Tensor(qkv.data(), d, {B, T, W}),
                            .out = Tensor(out_ref.data(), d, {B, T, C}),
                            .lse = Tensor::f32(lse_ref.data(), {B, NH, T}),
                            .NH = NH,
                            .NKV = NKV});
    cpu->attention_backward({.dout = Tensor(dout.data(), d, {B, T, C}),
                             .qkv = Tensor(qkv.data(), d, {B, T, W}),
                             .out = Tensor(out_ref.data(), d, {B, T, C}),
                             .lse = Tensor::f32(lse_ref.data(), {B, NH, T}),
                             .dqkv = Tensor(dqkv_ref.data(), d, {B, T, W}),
                             .NH = NH,
                             .NKV = NKV});
    const std::vector<float> out_want = to_f(out_ref), dqkv_want = to_f(dqkv_ref);

    DeviceBuf<S> d_qkv(n_qkv), d_dout(n_out), d_out_ref(n_out), d_out(n_out), d_dqkv(n_qkv), d_fused(n_qkv);
    DeviceBuf<float> d_lse_ref(n_lse), d_lse(n_lse);
    DeviceBuf<unsigned char> d_scratch(cuda::attention_tc_backward_scratch_bytes(B, T, NH, HS));
    ASSERT_TRUE(d_qkv.get() && d_dout.get() && d_out_ref.get() && d_out.get() && d_dqkv.get() && d_fused.get() &&
                d_lse_ref.get() && d_lse.get() && d_scratch.get());
    MS_TEST_CUDA(d_qkv.upload(qkv));
    MS_TEST_CUDA(d_dout.upload(dout));
    MS_TEST_CUDA(d_out_ref.upload(out_ref));
    MS_TEST_CUDA(d_lse_ref.upload(lse_ref));
    ASSERT_TRUE(cuda::attention_tc_eligible(HS, {d_qkv.get(), d_dout.get(), d_out.get(), d_dqkv.get()}));

    std::vector<S> first_out, first_dqkv, first_fused;
    std::vector<float> first_lse;
    for (int run = 0; run < 2; ++run) {
        MS_TEST_CUDA(d_out.fill_nan());
        MS_TEST_CUDA(d_dqkv.fill_nan());
        MS_TEST_CUDA(d_fused.fill_nan());
        MS_TEST_CUDA(d_lse.fill_nan());
        MS_TEST_CUDA(d_scratch.fill_nan());
        cuda::attention_tc_forward(d_out.get(), d_lse.get(), d_qkv.get(), B, T, NH, NKV, HS, nullptr);
        cuda::attention_tc_backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out_ref.get(), d_lse_ref.get(), nullptr,
                                    B, T, NH, NKV, HS, cuda::AttentionTcBackward::kSplit, nullptr);
        cuda::attention_tc_backward(d_fused.get(), d_dout.get(), d_qkv.get(), d_out_ref.get(), d_lse_ref.get(),
                                    d_scratch.get(), B, T, NH, NKV, HS, cuda::AttentionTcBackward::kFused, nullptr);
        MS_TEST_CUDA(cudaDeviceSynchronize());
        MS_TEST_CUDA(cudaGetLastError());
        const std::vector<S> out = d_out.download(), dqkv = d_dqkv.download(), fused = d_fused.download();
        const std::vector<float> lse = d_lse.download();
        ASSERT_EQ(out.size(), n_out);
        ASSERT_EQ(dqkv.size(), n_qkv);
        ASSERT_EQ(fused.size(), n_qkv);
        ASSERT_EQ(lse.size(), n_lse);
        if (run == 0) {
            const std::vector<float> got = to_f(dqkv), got_fused = to_f(fused);
            expect_close(tag + "out", error_on_scale(to_f(out), out_want, out_want), tol.out);
            expect_close(tag + "lse", max_rel_error(lse, lse_ref), tol.lse);
            for (int part = 0; part < 3; ++part) {  // dQ, dK, dV, each on its own scale
                const int from = part == 0 ? 0 : part == 1 ? C : C + KV, width = part == 0 ? C : KV;
                const std::vector<float> want = columns(dqkv_want, W, from, width),
                                         split = columns(got, W, from, width),
                                         fused_part = columns(got_fused, W, from, width);
                const double part_tol = part == 0 ? tol.dq : part == 1 ? tol.dk : tol.dv;
                const std::string name = std::string("d") + "QKV"[part];
                expect_close(tag + "split " + name, error_on_scale(split, want, want), part_tol);
                expect_close(tag + "fused " + name, error_on_scale(fused_part, want, want), part_tol);
                // one unit in the last place of S of the element, so of the largest (0 where bit-identical)
                expect_close(tag + "fused " + name + " vs split", error_on_scale(fused_part, split, split),
                             std::is_same_v<S, bf16> ? 0x1p-7 : 0x1p-10);
            }
            first_out = out;
            first_dqkv = dqkv;
            first_fused = fused;
            first_lse = lse;
        } else {
            EXPECT_TRUE(std::memcmp(out.data(), first_out.data(), n_out * sizeof(S)) == 0) << "out: two runs differ";
            EXPECT_TRUE(std::memcmp(dqkv.data(), first_dqkv.data(), n_qkv * sizeof(S)) == 0) << "dqkv: runs differ";
            EXPECT_TRUE(std::memcmp(fused.data(), first_fused.data(), n_qkv * sizeof(S)) == 0)
                << "fused dqkv: runs differ";
            EXPECT_TRUE(bit_identical(lse, first_lse)) << "lse: two runs differ";
        }
    }
}

// the last: 384 fused blocks at once, enough to fill a GPU, so blocks wait on one another while they run
constexpr Shape kShapes[] = {{2, 9, 3, 16},      {2, 70, 2, 32},      {2, 130, 2, 64},
                             {1, 1024, 2, 64},   {4, 512, 12, 64},    {2, 70, 4, 32, 2},
                             {2, 130, 8, 64, 2}, {1, 1024, 8, 64, 1}, {4, 512, 12, 64, 4}};

TEST(GpuAttentionTc, Bf16MatchesTheCpuReference) {
    if (!have_gpu()) GTEST_SKIP() << "SKIPPED: no CUDA device";
    for (const Shape& s : kShapes) check_attention_on_gpu<bf16>(s, kBf16Tol);
}

TEST(GpuAttentionTc, Fp16MatchesTheCpuReference) {
    if (!have_gpu()) GTEST_SKIP() << "SKIPPED: no CUDA device";
    for (const Shape& s : kShapes) check_attention_on_gpu<fp16>(s, kFp16Tol);
}

// The Hopper forward (attention_tc_forward_wgmma, sm_90a, both schedules) at the HS 64 shapes above, out and lse
// against the CPU reference within the same tolerances, and against the mma.sync forward within one unit in the last
// place of S (on the emulation the two are bit-identical; a tensor core's accumulation order may move the fp32 sums'
// last bits); outputs start as NaN; two runs give the same bits. Skips on a GPU or build without wgmma (compute
// capability 9.0 and CMAKE_CUDA_ARCHITECTURES=90a: scripts/gpu-check.sh builds so on an H100 / H200).
template <class S>
void check_wgmma_forward_on_gpu(const Shape& s, const Tolerances& tol) {
    const int B = s.B, T = s.T, NH = s.NH, HS = s.HS, C = NH * HS, NKV = s.NKV > 0 ? s.NKV : NH;
    const int W = C + 2 * NKV * HS;
    const size_t n_qkv = size_t{1} * B * T * W, n_out = size_t{1} * B * T * C, n_lse = size_t{1} * B * NH * T;
    std::vector<S> qkv = to_s<S>(random_floats(n_qkv, 11 + T, -2.0f, 2.0f)), out_ref(n_out);
    std::vector<float> lse_ref(n_lse);
    const DType d = dtype_of<S>();
    make_cpu_backend(OpMode::kReference)
        ->attention_forward({.qkv = Tensor(qkv.data(), d, {B, T, W}),
                             .out = Tensor(out_ref.data(), d, {B, T, C}),
                             .lse = Tensor::f32(lse_ref.data(), {B, NH, T}),
                             .NH = NH,
                             .NKV = NKV});
    const std::vector<float> out_want = to_f(out_ref);
    DeviceBuf<S> d_qkv(n_qkv), d_out(n_out), d_mma(n_out);
    DeviceBuf<float> d_lse(n_lse), d_lse_mma(n_lse);
    ASSERT_TRUE(d_qkv.get() && d_out.get() && d_mma.get() && d_lse.get() && d_lse_mma.get());
    MS_TEST_CUDA(d_qkv.upload(qkv));
    cuda::attention_tc_forward(d_mma.get(), d_lse_mma.get(), d_qkv.get(), B, T, NH, NKV, HS, nullptr);
    MS_TEST_CUDA(cudaDeviceSynchronize());
    const std::vector<float> mma = to_f(d_mma.download());
    for (const auto schedule : {cuda::WgmmaSchedule::kSerial, cuda::WgmmaSchedule::kOverlapped}) {
        const std::string tag = std::string(dtype_name(d)) + " B " + std::to_string(B) + " T " + std::to_string(T) +
                                " NH " + std::to_string(NH) + " NKV " + std::to_string(NKV) +
                                (schedule == cuda::WgmmaSchedule::kSerial ? " wgmma serial " : " wgmma overlapped ");
        SCOPED_TRACE(tag);
        std::vector<S> first_out;
        std::vector<float> first_lse;
        for (int run = 0; run < 2; ++run) {
            MS_TEST_CUDA(d_out.fill_nan());
            MS_TEST_CUDA(d_lse.fill_nan());
            cuda::attention_tc_forward_wgmma(d_out.get(), d_lse.get(), d_qkv.get(), B, T, NH, NKV, HS, schedule,
                                             nullptr);
            MS_TEST_CUDA(cudaDeviceSynchronize());
            MS_TEST_CUDA(cudaGetLastError());
            const std::vector<S> out = d_out.download();
            const std::vector<float> lse = d_lse.download();
            ASSERT_EQ(out.size(), n_out);
            ASSERT_EQ(lse.size(), n_lse);
            if (run == 0) {
                expect_close(tag + "out", error_on_scale(to_f(out), out_want, out_want), tol.out);
                expect_close(tag + "lse", max_rel_error(lse, lse_ref), tol.lse);
                expect_close(tag + "out vs mma.sync", error_on_scale(to_f(out), mma, mma),
                             std::is_same_v<S, bf16> ? 0x1p-7 : 0x1p-10);
                first_out = out;
                first_lse = lse;
            } else {
                EXPECT_TRUE(std::memcmp(out.data(), first_out.data(), n_out * sizeof(S)) == 0) << "out: runs differ";
                EXPECT_TRUE(bit_identical(lse, first_lse)) << "lse: two runs differ";
            }
        }
    }
}

TEST(GpuAttentionTc, WgmmaForwardMatchesTheCpuReference) {
    if (!have_gpu()) GTEST_SKIP() << "SKIPPED: no CUDA device";
    if (!cuda::attention_wgmma_supported()) {
        GTEST_SKIP() << "SKIPPED: no wgmma here (needs compute capability 9.0 and a build for sm_90a)";
    }
    for (const Shape& s : kShapes) {
        if (s.HS != cuda::kAttentionWgmmaHS) continue;
        check_wgmma_forward_on_gpu<bf16>(s, kBf16Tol);
        check_wgmma_forward_on_gpu<fp16>(s, kFp16Tol);
    }
}

// ---- ring attention (kernels/attention_block.cu): the scalar block kernels against the CPU reference ----

// One block's forward (onto a random previous acc and lse) and backward (onto random dq and dkv) on the GPU, through
// the launchers, against the CPU backend's kReference on the same S inputs; every output is fp32, so the errors are
// the fp32 summation's and the tolerances the emulation test's (test_cuda_emu_attention_block.cpp). A second run
// gives the same bits.
template <class S>
void check_block_on_gpu(const BlockShape& s) {
    const DType d = ms::dtype_of<S>();
    const std::string tag = std::string(dtype_name(d)) + " B " + std::to_string(s.B) + " NH " + std::to_string(s.NH) +
                            " HS " + std::to_string(s.HS) + " " + s.tag() + ": ";
    SCOPED_TRACE(tag);
    const size_t N = size_t{1} * s.B * s.T, n_kv = size_t{1} * s.B * s.Tk * s.Wkv, n_lse = size_t{1} * s.B * s.NH * s.T;
    const size_t n_dkv = size_t{1} * s.B * s.Tk * s.Wd();
    BlockInputs in;
    in.qkv = rounded(d, random_floats(N * s.W(), 21 + s.T, -2.0f, 2.0f));
    in.kv = rounded(d, random_floats(n_kv, 22 + s.T, -2.0f, 2.0f));
    in.acc = random_floats(N * s.C(), 23);
    in.lse = random_floats(n_lse, 24, 0.5f, 2.5f);
    in.dout = rounded(d, random_floats(N * s.C(), 25));
    in.dq = random_floats(N * s.C(), 26);
    in.dkv = random_floats(n_dkv, 27);
    auto cpu = make_cpu_backend(OpMode::kReference);
    const BlockForwardResult want = run_block_forward(*cpu, d, s, in);
    in.out = rounded(d, want.acc);
    in.final_lse = want.lse;
    const BlockBackwardResult bwant = run_block_backward(*cpu, d, s, in);

    DeviceBuf<S> d_qkv(N * s.W()), d_kv(n_kv), d_dout(N * s.C()), d_out(N * s.C());
    DeviceBuf<float> d_acc(N * s.C()), d_lse(n_lse), d_dq(N * s.C()), d_dkv(n_dkv);
    ASSERT_TRUE(d_qkv.get() && d_kv.get() && d_dout.get() && d_out.get() && d_acc.get() && d_lse.get() && d_dq.get() &&
                d_dkv.get());
    MS_TEST_CUDA(d_qkv.upload(to_s<S>(in.qkv)));
    MS_TEST_CUDA(d_kv.upload(to_s<S>(in.kv)));
    MS_TEST_CUDA(d_dout.upload(to_s<S>(in.dout)));
    MS_TEST_CUDA(d_out.upload(to_s<S>(in.out)));
    const cuda::AttentionBlockShape shape{.B = s.B,
                                          .T = s.T,
                                          .Tk = s.Tk,
                                          .Wkv = s.Wkv,
                                          .kv_column = s.kv_column,
                                          .q_begin = s.q_begin,
                                          .q_rows = s.q_rows,
                                          .kv_rows = s.kv_rows,
                                          .NH = s.NH,
                                          .NKV = s.NKV,
                                          .HS = s.HS,
                                          .causal = s.causal};
    std::vector<float> first_acc, first_lse, first_dq, first_dkv;
    for (int run = 0; run < 2; ++run) {
        MS_TEST_CUDA(d_acc.upload(in.acc));
        MS_TEST_CUDA(d_lse.upload(in.lse));
        MS_TEST_CUDA(d_dq.upload(in.dq));
        MS_TEST_CUDA(d_dkv.upload(in.dkv));
        cuda::attention_block_forward(d_acc.get(), d_lse.get(), d_qkv.get(), d_kv.get(), shape, s.merge, nullptr);
        MS_TEST_CUDA(d_lse.upload(want.lse));  // the backward's final lse: the reference's
        cuda::attention_block_backward(d_dq.get(), d_dkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(),
                                       d_kv.get(), shape, nullptr);
        MS_TEST_CUDA(cudaDeviceSynchronize());
        MS_TEST_CUDA(cudaGetLastError());
        const std::vector<float> acc = d_acc.download(), dq = d_dq.download(), dkv = d_dkv.download();
        ASSERT_EQ(acc.size(), N * s.C());
        ASSERT_EQ(dkv.size(), n_dkv);
        if (run == 0) {
            expect_close(tag + "acc", gqa_error(acc, want.acc), 3e-6);
            expect_close(tag + "dq", gqa_error(dq, bwant.dq), 3e-6);
            expect_close(tag + "dkv", gqa_error(dkv, bwant.dkv), 3e-6);
            first_acc = acc;
            first_dq = dq;
            first_dkv = dkv;
        } else {
            EXPECT_TRUE(bit_identical(acc, first_acc) && bit_identical(dq, first_dq) && bit_identical(dkv, first_dkv))
                << "two runs differ";
        }
    }
    // lse: the forward alone (the loop's second upload replaced it with the reference's).
    MS_TEST_CUDA(d_acc.upload(in.acc));
    MS_TEST_CUDA(d_lse.upload(in.lse));
    cuda::attention_block_forward(d_acc.get(), d_lse.get(), d_qkv.get(), d_kv.get(), shape, s.merge, nullptr);
    MS_TEST_CUDA(cudaDeviceSynchronize());
    expect_close(tag + "lse", gqa_error(d_lse.download(), want.lse), 5e-7);
}

// Per key/value heads NKV of NH = 8, HS 64 and 32: the rank's own causal block (kv = qkv), a remote block merged
// onto acc (kv packed, its keys at a column offset), and rows [q_begin, q_begin + q_rows) against kv_rows < Tk keys.
std::vector<BlockShape> gpu_block_shapes() {
    std::vector<BlockShape> shapes;
    for (int HS : {64, 32}) {
        for (int NKV : {2, 8}) {
            const int NH = 8, W = (NH + 2 * NKV) * HS, KV = 2 * NKV * HS;
            shapes.push_back({2, 300, 300, W, NH, NKV, HS, NH * HS, 0, 300, 300, true, false});
            shapes.push_back({2, 300, 257, KV + 8, NH, NKV, HS, 8, 0, 300, 257, false, true});
            shapes.push_back({2, 300, 280, KV, NH, NKV, HS, 0, 37, 200, 251, false, false});
        }
    }
    return shapes;
}

TEST(GpuAttentionBlock, MatchesTheCpuReference) {
    if (!have_gpu()) GTEST_SKIP() << "SKIPPED: no CUDA device";
    for (const BlockShape& s : gpu_block_shapes()) {
        check_block_on_gpu<float>(s);
        check_block_on_gpu<bf16>(s);
        check_block_on_gpu<fp16>(s);
    }
}

// copy_columns between every pair of float, bf16 and fp16: the CPU backend's bits.
template <class S, class D>
void check_copy_columns_on_gpu() {
    SCOPED_TRACE(std::string(dtype_name(ms::dtype_of<S>())) + " -> " + std::string(dtype_name(ms::dtype_of<D>())));
    constexpr int64_t kRows = 1000, kWs = 96, kWd = 80, kSrcColumn = 32, kDstColumn = 8, kCols = 64;
    const std::vector<S> src = to_s<S>(random_floats(kRows * kWs, 31, -3.0f, 3.0f));
    const std::vector<D> init = to_s<D>(random_floats(kRows * kWd, 32));
    std::vector<S> src_cpu = src;
    std::vector<D> want = init;
    auto cpu = make_cpu_backend(OpMode::kReference);
    cpu->copy_columns({.src = Tensor(src_cpu.data(), ms::dtype_of<S>(), {kRows, kWs}),
                       .dst = Tensor(want.data(), ms::dtype_of<D>(), {kRows, kWd}),
                       .src_column = kSrcColumn,
                       .dst_column = kDstColumn,
                       .cols = kCols});
    DeviceBuf<S> d_src(src.size());
    DeviceBuf<D> d_dst(init.size());
    ASSERT_TRUE(d_src.get() && d_dst.get());
    MS_TEST_CUDA(d_src.upload(src));
    MS_TEST_CUDA(d_dst.upload(init));
    cuda::copy_columns(d_dst.get(), d_src.get(), kRows, kWs, kWd, kSrcColumn, kDstColumn, kCols, nullptr);
    MS_TEST_CUDA(cudaDeviceSynchronize());
    MS_TEST_CUDA(cudaGetLastError());
    const std::vector<D> got = d_dst.download();
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(D)), 0);
}

TEST(GpuAttentionBlock, CopyColumnsIsTheCpuCopy) {
    if (!have_gpu()) GTEST_SKIP() << "SKIPPED: no CUDA device";
    check_copy_columns_on_gpu<float, bf16>();
    check_copy_columns_on_gpu<float, fp16>();
    check_copy_columns_on_gpu<float, float>();
    check_copy_columns_on_gpu<bf16, float>();
    check_copy_columns_on_gpu<fp16, float>();
    check_copy_columns_on_gpu<bf16, fp16>();
}

}  // namespace
}  // namespace ms::test
