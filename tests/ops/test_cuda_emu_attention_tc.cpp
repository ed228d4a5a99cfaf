// test_cuda_emu_attention_tc.cpp: the tensor-core attention kernels (kernels/attention_tc.cu, PTX mma.sync m16n8k16
// through cuda/mma.cuh) on the CPU emulation against the CPU backend in OpMode::kReference on the same bf16 / fp16
// tensors.
//
// Per dtype (bf16, fp16) and head size (16, 64; and 32 in bf16), for T = 1, 9, 17, 70, 130 (one row; fewer rows than
// one mma tile; one partial tile; one partial 128-row forward / dQ tile over two key tiles, two 64-row dK/dV tiles; two
// 128-row tiles, the second of 2 rows, walking up to three double-buffered key tiles) with B = 2, NH = 2: forward
// out and lse, and backward dQ, dK, dV (each third of dqkv on its own scale) with the CPU's out and lse as the
// backward's inputs, so the two are checked separately; both backwards, split (dQ kernel, dK/dV kernel) and fused
// (one kernel, dQ added across key tiles in a fixed order through scratch). The fused dK and dV must equal the split
// ones bit for bit (same operations, same order); the fused dQ sums the same products in another order, so it must
// be within one unit in the last place of S of the split dQ (measured: 0 up to T = 70, at most 4.4e-4 of dQ's scale
// in bf16 and 7.7e-5 in fp16 at T = 130). Outputs start as NaN (every element must be written), the fused kernel's
// scratch as NaN / -1 (its accumulator written before it is read, its semaphores zeroed by the launch), guard
// elements around them must stay intact, and a second run must give the same bits (at T = 130; at T = 70 the
// dispatch check below repeats the kernels too: the emulation is slow, and the whole file stays under 30 s). One
// case also checks that attention_forward / attention_backward dispatch to these kernels (the fused backward when
// given scratch, the split one without), and to the scalar ones under AttentionKernels::kScalar; another that
// CudaBackend runs the fused backward on the scratch it owns, twice, and the split one under
// debug.cuda_attention_bwd: split (BackendOptions::cuda). A death test checks that the emulation catches a
// fused backward whose blocks wait on blocks that have not run. The Hopper forward (wgmma, HS 64) must give the
// mma.sync forward's bits, multi-head and grouped-query.
//
// Tolerances are scale-free errors (max |tc - ref| / max |ref|), about 3x the largest MS_OP_TEST_VERBOSE=1 measured
// over all T and HS (values below, mma.sync kernels). The reference computes in double and rounds once; the kernels
// round P (forward) and dS (backward) to the storage type before their mma, so the error is a few units in the last
// place of the storage type: bf16 has 8 bits of mantissa, fp16 11, hence the ~8x between the two.
// lse is fp32 from fp32 sums of exact bf16/fp16 products: float rounding only.
//   measured, bf16: out 4.0e-3, lse 1.2e-7, dQ 5.0e-3, dK 6.9e-3, dV 4.6e-3 (split and fused alike)
//   measured, fp16: out 5.0e-4, lse 2.5e-7, dQ 7.7e-4, dK 7.3e-4, dV 5.1e-4 (6.7e-4 at HS 32, which runs in bf16 only
//   now, to keep the file under 30 s)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/backends/cuda/cuda_backend.h"
#include "engine/backends/cuda/kernels/attention.cuh"
#include "engine/backends/cuda/kernels/attention_tc.cuh"
#include "engine/core/half.h"
#include "tests/ops/attention_tc_check.h"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

const cudaStream_t kStream = nullptr;  // the emulation runs launches synchronously

template <class S>
constexpr DType dtype_of() {
    return std::is_same_v<S, bf16> ? DType::kBF16 : DType::kF16;
}

// n values of S with kGuard sentinel elements on each side; 16-byte aligned (operator new aligns to 16, the guard
// is 128 bytes), as the tensor-core path needs.
template <class S>
class HalfBuf {
  public:
    static constexpr size_t kGuard = 64;
    static constexpr uint16_t kSentinel = 0x5a5a;
    static constexpr uint16_t kNaN = 0x7fff;  // a NaN in both bf16 and fp16

    explicit HalfBuf(size_t n) : bits_(n + 2 * kGuard, kSentinel), n_(n) {
        for (size_t i = 0; i < n; ++i) bits_[kGuard + i] = kNaN;
    }
    explicit HalfBuf(const std::vector<float>& init) : HalfBuf(init.size()) {
        for (size_t i = 0; i < n_; ++i) bits_[kGuard + i] = from_float<S>(init[i]).bits;
    }
    S* data() { return reinterpret_cast<S*>(bits_.data() + kGuard); }
    Tensor tensor(std::initializer_list<int64_t> dims) { return Tensor(data(), dtype_of<S>(), dims); }
    std::vector<float> values() const {
        std::vector<float> v(n_);
        for (size_t i = 0; i < n_; ++i) v[i] = to_float(S{bits_[kGuard + i]});
        return v;
    }
    bool guards_intact() const {
        for (size_t i = 0; i < kGuard; ++i) {
            if (bits_[i] != kSentinel || bits_[kGuard + n_ + i] != kSentinel) return false;
        }
        return true;
    }

  private:
    std::vector<uint16_t> bits_;
    size_t n_;
};

// Scratch for the fused backward, 16-byte aligned, filled with 0xff bytes (NaN floats, -1 semaphores), so the kernel
// must write its dQ accumulator before reading it and zero its semaphores itself; kGuard bytes past its end must stay
// 0xff.
class Scratch {
  public:
    static constexpr size_t kGuard = 64;
    explicit Scratch(size_t bytes) : words_((bytes + kGuard + 15) / 16), bytes_(bytes) {
        std::memset(words_.data(), 0xff, words_.size() * 16);
    }
    void* data() { return words_.data(); }
    bool guard_intact() const {
        const auto* p = reinterpret_cast<const unsigned char*>(words_.data());
        return std::all_of(p + bytes_, p + bytes_ + kGuard, [](unsigned char c) { return c == 0xff; });
    }

  private:
    struct alignas(16) Word {
        unsigned char bytes[16];
    };
    std::vector<Word> words_;
    size_t bytes_;
};

template <class S>
void check_attention_tc(int HS, const Tolerances& tol) {
    const int B = 2, NH = 2, C = NH * HS;
    for (int T : {1, 9, 17, 70, 130}) {
        const std::string tag =
            std::string(dtype_name(dtype_of<S>())) + " HS " + std::to_string(HS) + " T " + std::to_string(T) + ": ";
        SCOPED_TRACE(tag);
        HalfBuf<S> qkv(random_floats(size_t{1} * B * T * 3 * C, 11 + T, -2.0f, 2.0f)),
            dout(random_floats(size_t{1} * B * T * C, 12 + T));
        auto cpu = make_cpu_backend(OpMode::kReference);
        HalfBuf<S> out_ref(size_t{1} * B * T * C), dqkv_ref(size_t{1} * B * T * 3 * C);
        Guarded lse_ref(int64_t{B} * NH * T, NAN);
        cpu->attention_forward({.qkv = qkv.tensor({B, T, 3 * C}),
                                .out = out_ref.tensor({B, T, C}),
                                .lse = lse_ref.tensor({B, NH, T}),
                                .NH = NH});
        cpu->attention_backward({.dout = dout.tensor({B, T, C}),
                                 .qkv = qkv.tensor({B, T, 3 * C}),
                                 .out = out_ref.tensor({B, T, C}),
                                 .lse = lse_ref.tensor({B, NH, T}),
                                 .dqkv = dqkv_ref.tensor({B, T, 3 * C}),
                                 .NH = NH});
        const std::vector<float> dqkv_want = dqkv_ref.values();
        ASSERT_TRUE(cuda::attention_tc_eligible(HS, {qkv.data(), dout.data(), out_ref.data()}));

        std::vector<float> first_out, first_lse, first_dqkv, first_fused;
        const int runs = T == 130 ? 2 : 1;  // the emulation is slow: one repeat (and the dispatch check at T 70)
        for (int run = 0; run < runs; ++run) {
            HalfBuf<S> out(size_t{1} * B * T * C), dqkv(size_t{1} * B * T * 3 * C), fused(size_t{1} * B * T * 3 * C);
            Guarded lse(int64_t{B} * NH * T, NAN);
            Scratch scratch(cuda::attention_tc_backward_scratch_bytes(B, T, NH, HS));
            cuda::attention_tc_forward(out.data(), lse.data(), qkv.data(), B, T, NH, HS, kStream);
            cuda::attention_tc_backward(dqkv.data(), dout.data(), qkv.data(), out_ref.data(), lse_ref.data(), nullptr,
                                        B, T, NH, HS, cuda::AttentionTcBackward::kSplit, kStream);
            cuda::attention_tc_backward(fused.data(), dout.data(), qkv.data(), out_ref.data(), lse_ref.data(),
                                        scratch.data(), B, T, NH, HS, cuda::AttentionTcBackward::kFused, kStream);
            EXPECT_TRUE(out.guards_intact() && lse.guards_intact() && dqkv.guards_intact() && fused.guards_intact() &&
                        scratch.guard_intact())
                << "a write outside";
            const std::vector<float> got = dqkv.values(), got_fused = fused.values();
            if (run == 0) {
                expect_close(tag + "out", max_rel_error(out.values(), out_ref.values()), tol.out);
                expect_close(tag + "lse", max_rel_error(lse.values(), lse_ref.values()), tol.lse);
                // With one key (T = 1) P = 1 and dS = dP - D = 0: dQ and dK are rounding noise around 0, measured
                // on dV's scale.
                const auto scale_of = [&](int part) { return third(dqkv_want, C, T == 1 ? 2 : part); };
                for (const auto& [name, v] : {std::pair{"split ", &got}, std::pair{"fused ", &got_fused}}) {
                    const std::string what = tag + name;
                    expect_close(what + "dQ", error_on_scale(third(*v, C, 0), third(dqkv_want, C, 0), scale_of(0)),
                                 tol.dq);
                    expect_close(what + "dK", error_on_scale(third(*v, C, 1), third(dqkv_want, C, 1), scale_of(1)),
                                 tol.dk);
                    expect_close(what + "dV", error_on_scale(third(*v, C, 2), third(dqkv_want, C, 2), scale_of(2)),
                                 tol.dv);
                }
                // the fused kernel computes dK and dV with the split dK/dV kernel's operations in its order; its dQ
                // sums the same products in another order (per key tile, then over key tiles), so only close
                EXPECT_TRUE(bit_identical(third(got_fused, C, 1), third(got, C, 1))) << "fused dK differs from split";
                EXPECT_TRUE(bit_identical(third(got_fused, C, 2), third(got, C, 2))) << "fused dV differs from split";
                // dQ rounded from two fp32 sums that differ in their last bits: at most one unit in the last place
                // of S apart, 2^-7 (bf16) or 2^-10 (fp16) of the element, so of dQ's largest
                const std::vector<float> dq_split = third(got, C, 0);
                expect_close(tag + "fused dQ vs split", error_on_scale(third(got_fused, C, 0), dq_split, scale_of(0)),
                             std::is_same_v<S, bf16> ? 0x1p-7 : 0x1p-10);
                first_out = out.values();
                first_lse = lse.values();
                first_dqkv = got;
                first_fused = got_fused;
            } else {
                EXPECT_TRUE(bit_identical(out.values(), first_out)) << "forward out: two runs differ";
                EXPECT_TRUE(bit_identical(lse.values(), first_lse)) << "forward lse: two runs differ";
                EXPECT_TRUE(bit_identical(got, first_dqkv)) << "split backward dqkv: two runs differ";
                EXPECT_TRUE(bit_identical(got_fused, first_fused)) << "fused backward dqkv: two runs differ";
            }
        }

        if (T == 70) {  // the generic launchers take this path for bf16 / fp16 with HS a multiple of 16
            HalfBuf<S> out(size_t{1} * B * T * C), dqkv(size_t{1} * B * T * 3 * C), dqkv_f(size_t{1} * B * T * 3 * C);
            Guarded lse(int64_t{B} * NH * T, NAN);
            const size_t bytes = cuda::attention_backward_scratch_bytes<S>(B, T, NH, HS);
            EXPECT_EQ(bytes, cuda::attention_tc_backward_scratch_bytes(B, T, NH, HS)) << "fused is the default";
            Scratch scratch(bytes);
            cuda::attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, HS, kStream);
            cuda::attention_backward(dqkv.data(), dout.data(), qkv.data(), out_ref.data(), lse_ref.data(), B, T, NH, HS,
                                     kStream);
            cuda::attention_backward(dqkv_f.data(), dout.data(), qkv.data(), out_ref.data(), lse_ref.data(),
                                     scratch.data(), B, T, NH, HS, kStream);
            EXPECT_TRUE(bit_identical(out.values(), first_out)) << "attention_forward did not dispatch to tensor cores";
            EXPECT_TRUE(bit_identical(dqkv.values(), first_dqkv))
                << "attention_backward without scratch did not run the split tensor-core backward";
            EXPECT_TRUE(bit_identical(dqkv_f.values(), first_fused))
                << "attention_backward with scratch did not run the fused tensor-core backward";

            // AttentionKernels::kScalar (debug.cuda_attention: scalar): the same launchers run the scalar kernels
            // (fp32 P and dS, other bits), which still match the reference within the same tolerances
            const auto scalar = cuda::AttentionKernels::kScalar;
            HalfBuf<S> out_s(size_t{1} * B * T * C), dqkv_s(size_t{1} * B * T * 3 * C);
            cuda::attention_forward(out_s.data(), lse.data(), qkv.data(), B, T, NH, HS, kStream, scalar);
            cuda::attention_backward(dqkv_s.data(), dout.data(), qkv.data(), out_ref.data(), lse_ref.data(), B, T, NH,
                                     HS, kStream, scalar);
            EXPECT_EQ(cuda::attention_backward_scratch_bytes<S>(B, T, NH, HS, scalar), 0u);
            EXPECT_FALSE(bit_identical(out_s.values(), first_out)) << "AttentionKernels::kScalar kept tensor cores";
            EXPECT_FALSE(bit_identical(dqkv_s.values(), first_dqkv)) << "AttentionKernels::kScalar kept tensor cores";
            expect_close(tag + "scalar out", max_rel_error(out_s.values(), out_ref.values()), tol.out);
            const std::vector<float> got_s = dqkv_s.values();
            for (int part = 0; part < 3; ++part) {
                expect_close(
                    tag + "scalar d" + "QKV"[part],
                    error_on_scale(third(got_s, C, part), third(dqkv_want, C, part), third(dqkv_want, C, part)),
                    part == 0   ? tol.dq
                    : part == 1 ? tol.dk
                                : tol.dv);
            }
        }
    }
}

constexpr const Tolerances& kBf16Tol = kAttentionTcBf16Tol;  // attention_tc_check.h
constexpr const Tolerances& kFp16Tol = kAttentionTcFp16Tol;

TEST(CudaEmuAttentionTc, Bf16HeadSize16) { check_attention_tc<bf16>(16, kBf16Tol); }
TEST(CudaEmuAttentionTc, Bf16HeadSize32) { check_attention_tc<bf16>(32, kBf16Tol); }
TEST(CudaEmuAttentionTc, Bf16HeadSize64) { check_attention_tc<bf16>(64, kBf16Tol); }
TEST(CudaEmuAttentionTc, Fp16HeadSize16) { check_attention_tc<fp16>(16, kFp16Tol); }
TEST(CudaEmuAttentionTc, Fp16HeadSize64) { check_attention_tc<fp16>(64, kFp16Tol); }

// Through CudaBackend, which owns the fused backward's scratch: a bf16 attention_backward at a tensor-core head size
// runs the fused kernel (the default), bit for bit as the launcher on fresh scratch, and again on the scratch the first
// call left behind (semaphores at their final counts, accumulator full): each launch resets what it relies on. With
// BackendOptions::cuda.attention_backward = kSplit (debug.cuda_attention_bwd: split) it runs the split one.
TEST(CudaEmuAttentionTc, BackendRunsTheFusedBackwardOnItsOwnScratch) {
    // T = 130, HS = 32 in bf16: a shape where the fused and split dQ differ in a few bits (so the check below tells
    // them apart)
    const int B = 2, T = 130, NH = 2, HS = 32, C = NH * HS;
    HalfBuf<bf16> qkv(random_floats(size_t{1} * B * T * 3 * C, 11 + T, -2.0f, 2.0f)),
        dout(random_floats(size_t{1} * B * T * C, 12 + T)), out(size_t{1} * B * T * C), want(size_t{1} * B * T * 3 * C),
        split(size_t{1} * B * T * 3 * C);
    Guarded lse(int64_t{B} * NH * T, NAN);
    make_cpu_backend(OpMode::kReference)
        ->attention_forward(
            {.qkv = qkv.tensor({B, T, 3 * C}), .out = out.tensor({B, T, C}), .lse = lse.tensor({B, NH, T}), .NH = NH});
    const size_t bytes = cuda::attention_backward_scratch_bytes<bf16>(B, T, NH, HS);
    Scratch scratch(cuda::attention_tc_backward_scratch_bytes(B, T, NH, HS));
    cuda::attention_tc_backward(want.data(), dout.data(), qkv.data(), out.data(), lse.data(), scratch.data(), B, T, NH,
                                HS, bytes > 0 ? cuda::AttentionTcBackward::kFused : cuda::AttentionTcBackward::kSplit,
                                kStream);
    cuda::attention_tc_backward(split.data(), dout.data(), qkv.data(), out.data(), lse.data(), nullptr, B, T, NH, HS,
                                cuda::AttentionTcBackward::kSplit, kStream);
    if (bytes > 0) {
        ASSERT_FALSE(bit_identical(split.values(), want.values())) << "the shape tells fused from split";
    }
    BackendOptions o;
    o.kind = BackendKind::kCUDA;
    auto be = make_backend_with_cuda(o);
    for (int call = 0; call < 2; ++call) {
        HalfBuf<bf16> dqkv(size_t{1} * B * T * 3 * C);
        be->attention_backward({.dout = dout.tensor({B, T, C}),
                                .qkv = qkv.tensor({B, T, 3 * C}),
                                .out = out.tensor({B, T, C}),
                                .lse = lse.tensor({B, NH, T}),
                                .dqkv = dqkv.tensor({B, T, 3 * C}),
                                .NH = NH});
        be->synchronize();
        EXPECT_TRUE(bit_identical(dqkv.values(), want.values())) << "call " << call;
        EXPECT_TRUE(dqkv.guards_intact()) << "call " << call;
    }
    o.cuda.attention_backward = CudaAttentionBackward::kSplit;
    auto be_split = make_backend_with_cuda(o);
    HalfBuf<bf16> dqkv(size_t{1} * B * T * 3 * C);
    be_split->attention_backward({.dout = dout.tensor({B, T, C}),
                                  .qkv = qkv.tensor({B, T, 3 * C}),
                                  .out = out.tensor({B, T, C}),
                                  .lse = lse.tensor({B, NH, T}),
                                  .dqkv = dqkv.tensor({B, T, 3 * C}),
                                  .NH = NH});
    be_split->synchronize();
    EXPECT_TRUE(bit_identical(dqkv.values(), split.values())) << "debug.cuda_attention_bwd: split ran another backward";
}

// The fused backward's blocks wait on one another in ticket order; taken in the reverse order, the first block
// (key tile 0) waits for key tile 1's dQ share on query tile 1, which no block has added: the emulation must abort
// (on a GPU such a kernel would hang or depend on the order blocks start in).
TEST(CudaEmuAttentionTcDeathTest, MisorderedFusedBackwardAborts) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    const int B = 1, T = 130, NH = 1, HS = 16, C = NH * HS;
    HalfBuf<bf16> qkv(random_floats(size_t{1} * B * T * 3 * C, 1, -2.0f, 2.0f)),
        dout(random_floats(size_t{1} * B * T * C, 2)), out(random_floats(size_t{1} * B * T * C, 3)),
        dqkv(size_t{1} * B * T * 3 * C);
    std::vector<float> lse(size_t{1} * B * NH * T, 1.0f);
    Scratch scratch(cuda::attention_tc_backward_scratch_bytes(B, T, NH, HS));
    EXPECT_DEATH(
        cuda::attention_tc_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), scratch.data(), B, T,
                                    NH, HS, cuda::AttentionTcBackward::kFusedMisorderedForTest, kStream),
        "waits for a flag to become 1, but it is 0");
}

// The Hopper forward (attention_tc_forward_wgmma: wgmma m64n64k16, the emulation's twin of the sm_90a kernel), in
// both schedules (serial; the softmax overlapping the previous tile's P V), sums each product's 16 k in one
// instruction and the k-slices in order, as the mma.sync forward does, and shares its softmax: on the emulation its
// out and lse must be the mma.sync kernel's bits (which the test above holds to the
// reference). Shapes: one row; a partial 128-row block; T = 130 (two blocks, the second of 2 rows, three key tiles);
// T = 200 with grouped-query heads (NH 4, NKV 2: two query heads per key/value head). Outputs start as NaN.
template <class S>
void check_wgmma_forward() {
    const int HS = 64;
    struct Shape {
        int B, T, NH, NKV;
    };
    for (const Shape& sh : {Shape{2, 1, 2, 2}, Shape{2, 17, 2, 2}, Shape{1, 130, 2, 2}, Shape{1, 200, 4, 2}}) {
        SCOPED_TRACE(std::string(dtype_name(dtype_of<S>())) + " T " + std::to_string(sh.T) + " NH " +
                     std::to_string(sh.NH) + " NKV " + std::to_string(sh.NKV));
        const int64_t rows = int64_t{sh.B} * sh.T, C = int64_t{sh.NH} * HS, W = int64_t{sh.NH + 2 * sh.NKV} * HS;
        HalfBuf<S> qkv(random_floats(static_cast<size_t>(rows * W), 21 + sh.T, -2.0f, 2.0f));
        HalfBuf<S> out_mma(static_cast<size_t>(rows * C));
        Guarded lse_mma(int64_t{sh.B} * sh.NH * sh.T, NAN);
        cuda::attention_tc_forward(out_mma.data(), lse_mma.data(), qkv.data(), sh.B, sh.T, sh.NH, sh.NKV, HS, kStream);
        for (const auto schedule : {cuda::WgmmaSchedule::kSerial, cuda::WgmmaSchedule::kOverlapped}) {
            const char* name = schedule == cuda::WgmmaSchedule::kSerial ? "serial" : "overlapped";
            HalfBuf<S> out_wg(static_cast<size_t>(rows * C));
            Guarded lse_wg(int64_t{sh.B} * sh.NH * sh.T, NAN);
            cuda::attention_tc_forward_wgmma(out_wg.data(), lse_wg.data(), qkv.data(), sh.B, sh.T, sh.NH, sh.NKV, HS,
                                             schedule, kStream);
            EXPECT_TRUE(out_wg.guards_intact() && lse_wg.guards_intact()) << name << ": a write outside";
            EXPECT_TRUE(bit_identical(out_wg.values(), out_mma.values()))
                << name << ": out differs from the mma.sync forward";
            EXPECT_TRUE(bit_identical(lse_wg.values(), lse_mma.values()))
                << name << ": lse differs from the mma.sync forward";
        }
    }
}

TEST(CudaEmuAttentionTc, WgmmaForwardIsTheMmaForwardBitForBitBf16) { check_wgmma_forward<bf16>(); }
TEST(CudaEmuAttentionTc, WgmmaForwardIsTheMmaForwardBitForBitFp16) { check_wgmma_forward<fp16>(); }

TEST(CudaEmuAttentionTc, EligibilityFollowsHeadSizeAndAlignment) {
    alignas(16) static unsigned char buf[64];
    EXPECT_TRUE(cuda::attention_tc_eligible(16, {buf}));
    EXPECT_TRUE(cuda::attention_tc_eligible(48, {buf}));
    EXPECT_TRUE(cuda::attention_tc_eligible(64, {buf, buf + 32}));
    EXPECT_FALSE(cuda::attention_tc_eligible(24, {buf}));  // not a multiple of the mma tile
    EXPECT_FALSE(cuda::attention_tc_eligible(8, {buf}));
    EXPECT_FALSE(cuda::attention_tc_eligible(80, {buf}));           // wider than the kernels are instantiated for
    EXPECT_FALSE(cuda::attention_tc_eligible(64, {buf, buf + 2}));  // a misaligned tensor
}

}  // namespace
}  // namespace ms::test
