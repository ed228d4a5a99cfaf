// test_lm_head_loss.cpp: the fused LM head + cross-entropy (backend.h, LmHeadLossArgs; cpu/ops/lm_head_loss.cpp)
// against the unfused ops it replaces: matmul_forward, cross_entropy_forward (kMaxSumExp), the loss as the model
// forms it, cross_entropy_backward and matmul_backward, on fp32, bf16 and fp16.
//   - exact: the reference mode is bit-identical to the unfused reference ops (same loops, same roundings); in fp32
//     the fast mode in one chunk is bit-identical to the unfused fast ops (the same sgemm calls and loops); a row of
//     zero activations has the loss log(valid);
//   - tolerances where the summation order differs: chunks (sgemm's bits depend on the row count of its call, and
//     dwte is summed chunk by chunk), fast vs reference;
//   - contract: dwte +=, dlnf overwritten, the padded vocabulary's rows of dwte untouched, forward only touches only
//     the losses, nothing written outside the tensors, the results independent of the thread count;
//   - gradient: dlnf and dwte against central differences of sum_n dloss[n] * loss[n].
// Tolerances: MS_OP_TEST_VERBOSE=1 ./test_ops --gtest_filter='LmHeadLoss*' prints every measured error; each
// tolerance below says what was measured.
#include <omp.h>

#include <cstring>
#include <limits>
#include <string>
#include <tuple>

#include "engine/backends/cuda/cuda_backend.h"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// A tensor of run-time dtype built from float values (rounded on store), with guard bytes on each side.
class Buf {
  public:
    static constexpr size_t kGuard = 64;
    static constexpr unsigned char kSentinel = 0x5A;

    Buf(DType dtype, const std::vector<float>& values)
        : dtype_(dtype), n_(values.size()), bytes_(n_ * dtype_size(dtype) + 2 * kGuard, kSentinel) {
        for (size_t i = 0; i < n_; ++i) set(i, values[i]);
    }
    Buf(DType dtype, int64_t n, float fill) : Buf(dtype, std::vector<float>(static_cast<size_t>(n), fill)) {}

    Tensor tensor(std::initializer_list<int64_t> dims) { return Tensor(data(), dtype_, dims); }
    std::vector<float> values() const {
        std::vector<float> v(n_);
        for (size_t i = 0; i < n_; ++i) v[i] = get(i);
        return v;
    }
    bool guards_intact() const {
        for (size_t i = 0; i < kGuard; ++i) {
            if (bytes_[i] != kSentinel || bytes_[bytes_.size() - 1 - i] != kSentinel) return false;
        }
        return true;
    }

  private:
    void* data() { return bytes_.data() + kGuard; }
    const void* data() const { return bytes_.data() + kGuard; }
    void set(size_t i, float x) {
        visit_float(dtype_, [&](auto z) { static_cast<decltype(z)*>(data())[i] = from_float<decltype(z)>(x); });
    }
    float get(size_t i) const {
        return visit_float(dtype_, [&](auto z) { return to_float(static_cast<const decltype(z)*>(data())[i]); });
    }

    DType dtype_;
    size_t n_;
    std::vector<unsigned char> bytes_;
};

struct Shape {
    int64_t N, C, Vp, valid;
};

// The inputs, as float values already rounded through the dtype they are stored in.
struct Inputs {
    Shape s;
    DType d;
    std::vector<float> lnf, wte, dloss, dwte0;
    std::vector<int32_t> targets;
};

Inputs make_inputs(const Shape& s, DType d, uint32_t seed = 1) {
    Inputs in{s, d, {}, {}, {}, {}, {}};
    in.lnf = rounded(d, random_floats(s.N * s.C, seed, -2.0f, 2.0f));
    in.wte = rounded(d, random_floats(s.Vp * s.C, seed + 1, -0.5f, 0.5f));
    in.dloss = random_floats(s.N, seed + 2, 0.5f / s.N, 2.0f / s.N);
    in.dwte0 = random_floats(s.Vp * s.C, seed + 3, -0.1f, 0.1f);
    in.targets = random_ints(s.N, seed + 4, 0, static_cast<int32_t>(s.valid - 1));
    return in;
}

struct Result {
    std::vector<float> losses, dlnf, dwte;
    bool guards_intact = true;
};

// The fused op on `be` (a backend of `kind`), chunks of chunk_rows (0: the backend's choice); forward only when
// `backward` is false (then dlnf and dwte are passed but must stay untouched).
Result run_fused(Backend& be, BackendKind kind, const Inputs& in, int64_t chunk_rows, bool backward = true) {
    const Shape& s = in.s;
    Buf lnf(in.d, in.lnf), wte(in.d, in.wte), dlnf(in.d, s.N * s.C, kNaN), dwte(DType::kF32, in.dwte0);
    Buf losses(DType::kF32, s.N, kNaN), dloss(DType::kF32, in.dloss);
    Buf scratch(DType::kF32, lm_head_loss_scratch_elems(kind, in.d, s.N, s.Vp, chunk_rows), kNaN);
    auto targets = in.targets;
    be.lm_head_loss({.lnf = lnf.tensor({s.N, s.C}),
                     .wte = wte.tensor({s.Vp, s.C}),
                     .targets = view(targets, {s.N}),
                     .dloss = backward ? dloss.tensor({s.N}) : Tensor(),
                     .losses = losses.tensor({s.N}),
                     .dlnf = dlnf.tensor({s.N, s.C}),
                     .dwte = dwte.tensor({s.Vp, s.C}),
                     .scratch = scratch.tensor({lm_head_loss_scratch_elems(kind, in.d, s.N, s.Vp, chunk_rows)}),
                     .vocab_start = 0,
                     .vocab_valid_local = s.valid,
                     .chunk_rows = chunk_rows});
    be.synchronize();
    return {losses.values(), dlnf.values(), dwte.values(),
            lnf.guards_intact() && wte.guards_intact() && dlnf.guards_intact() && dwte.guards_intact() &&
                losses.guards_intact() && scratch.guards_intact()};
}

// The unfused sequence the op replaces, as the model runs it for a tensor-parallel group of one.
Result run_unfused(Backend& be, const Inputs& in) {
    const Shape& s = in.s;
    Buf lnf(in.d, in.lnf), wte(in.d, in.wte), dlnf(in.d, s.N * s.C, kNaN), dwte(DType::kF32, in.dwte0);
    Buf logits(in.d, s.N * s.Vp, kNaN), dloss(DType::kF32, in.dloss);
    std::vector<float> row_max(s.N), sum_exp(s.N), target_logit(s.N), losses(s.N);
    auto targets = in.targets;
    be.matmul_forward({.inp = lnf.tensor({s.N, s.C}),
                       .weight = wte.tensor({s.Vp, s.C}),
                       .bias = {},
                       .out = logits.tensor({s.N, s.Vp})});
    be.cross_entropy_forward({.logits = logits.tensor({s.N, s.Vp}),
                              .targets = view(targets, {s.N}),
                              .row_max = view(row_max, {s.N}),
                              .sum_exp = view(sum_exp, {s.N}),
                              .target_logit = view(target_logit, {s.N}),
                              .vocab_start = 0,
                              .vocab_valid_local = s.valid,
                              .phase = CrossEntropyPhase::kMaxSumExp});
    be.synchronize();
    for (int64_t n = 0; n < s.N; ++n) losses[n] = std::log(sum_exp[n]) + row_max[n] - target_logit[n];
    be.cross_entropy_backward({.logits = logits.tensor({s.N, s.Vp}),
                               .targets = view(targets, {s.N}),
                               .row_max = view(row_max, {s.N}),
                               .sum_exp = view(sum_exp, {s.N}),
                               .dloss = dloss.tensor({s.N}),
                               .vocab_start = 0,
                               .vocab_valid_local = s.valid});
    be.matmul_backward({.dout = logits.tensor({s.N, s.Vp}),
                        .inp = lnf.tensor({s.N, s.C}),
                        .weight = wte.tensor({s.Vp, s.C}),
                        .dinp = dlnf.tensor({s.N, s.C}),
                        .dweight = dwte.tensor({s.Vp, s.C}),
                        .dbias = {},
                        .accumulate = Accumulate::kOverwrite});
    be.synchronize();
    return {losses, dlnf.values(), dwte.values(), true};
}

// The padded vocabulary's rows of dwte, and the real rows, as separate vectors.
std::vector<float> rows(const std::vector<float>& m, int64_t C, int64_t begin, int64_t end) {
    return {m.begin() + begin * C, m.begin() + end * C};
}

std::string label(DType d, const char* what) { return std::string(dtype_name(d)) + " " + what; }

// Not multiples of any block: chunks of 8 rows leave a last one of 5; C = 53, Vp = 67 with 61 real columns.
constexpr Shape kSmall{37, 53, 67, 61};
// Several of the fast path's tiles (output_tiles(70, 1000): 4 of 80 x 256) and chunks.
constexpr Shape kWide{70, 96, 1000, 990};

MS_OP_TEST(LmHeadLoss, ReferenceIsTheUnfusedReferenceOpsBitForBit, kExact, OpKind::kLmHeadLoss) {
    auto ref = make_cpu_backend(OpMode::kReference);
    for (DType d : kDtypes) {
        const Inputs in = make_inputs(kSmall, d);
        const Result fused = run_fused(*ref, BackendKind::kCPU, in, 8);
        const Result unfused = run_unfused(*ref, in);
        EXPECT_TRUE(bit_identical(fused.losses, unfused.losses)) << dtype_name(d);
        EXPECT_TRUE(bit_identical(fused.dlnf, unfused.dlnf)) << dtype_name(d);
        EXPECT_TRUE(bit_identical(fused.dwte, unfused.dwte)) << dtype_name(d);
        EXPECT_TRUE(fused.guards_intact);
    }
}

// With one chunk holding every row, the fast op makes the unfused fast ops' sgemm calls (the same column blocks, the
// same shapes) and runs their cross-entropy loops: in fp32 every output is bit-identical. (In bf16 / fp16 the
// cross-entropy ops' loops load D, and the compiler vectorises their exp-sum with another lane order than the fused
// op's fp32 loop: a tolerance, below.)
MS_OP_TEST(LmHeadLoss, FastFp32InOneChunkIsTheUnfusedFastOpsBitForBit, kExact, OpKind::kLmHeadLoss) {
    auto fast = make_cpu_backend(OpMode::kFast);
    for (DType d : {DType::kF32}) {
        for (const Shape& s : {kSmall, kWide}) {
            const Inputs in = make_inputs(s, d);
            const Result unfused = run_unfused(*fast, in);
            const Result fused = run_fused(*fast, BackendKind::kCPU, in, s.N);
            EXPECT_TRUE(bit_identical(fused.losses, unfused.losses)) << dtype_name(d) << " Vp " << s.Vp;
            EXPECT_TRUE(bit_identical(fused.dlnf, unfused.dlnf)) << dtype_name(d) << " Vp " << s.Vp;
            EXPECT_TRUE(bit_identical(fused.dwte, unfused.dwte)) << dtype_name(d) << " Vp " << s.Vp;
        }
    }
}

// Tolerance of the fused fast op against the unfused fast ops when the rows are cut into chunks, as max |a - b| /
// max |b|: OpenBLAS's sgemm gives a row's logits and dlnf bits that depend on the row count of the call (its
// micro-tiles), so a logit moves by an fp32 ulp or so (and may then round to the other side of a D boundary), the
// exp-sum's lane order differs in bf16 / fp16 (above), and dwte is summed chunk by chunk. FastMatchesTheUnfusedFastOps
// says what was measured.
double fused_vs_unfused_tolerance(DType d, const std::string& what) {
    if (what == "losses") return d == DType::kF32 ? 1e-6 : 3e-6;
    if (what == "dlnf") return d == DType::kF32 ? 5e-6 : 2e-3;
    return d == DType::kF32 ? 3e-6 : 4e-5;  // dwte
}

// The fused fast op against the unfused fast ops, every dtype, chunks of 1, 8 and the default rows, on the two shapes
// (so several chunks with a ragged last one, and one). Measured with MS_OP_TEST_VERBOSE=1 (this machine's OpenBLAS
// kernel), the largest over the chunk sizes and shapes: fp32 losses 2.1e-7, dlnf 1.0e-6, dwte 6.0e-7; bf16 losses
// 8.7e-8, dlnf 0, dwte 6.0e-7; fp16 losses 5.1e-7, dlnf 3.2e-4 (a dlogit one fp16 rounding apart), dwte 7.6e-6. The
// tolerances (fused_vs_unfused_tolerance) are about 5x those.
MS_OP_TEST(LmHeadLoss, FastMatchesTheUnfusedFastOps, kFastVsReference, OpKind::kLmHeadLoss) {
    auto fast = make_cpu_backend(OpMode::kFast);
    for (DType d : kDtypes) {
        for (const Shape& s : {kSmall, kWide}) {
            const Inputs in = make_inputs(s, d);
            const Result unfused = run_unfused(*fast, in);
            for (int64_t chunk : {int64_t{1}, int64_t{8}, int64_t{0}}) {
                const Result fused = run_fused(*fast, BackendKind::kCPU, in, chunk);
                const std::string at = " Vp " + std::to_string(s.Vp) + " chunk " + std::to_string(chunk);
                expect_within(label(d, "losses") + at, OpMode::kFast, max_rel_error(fused.losses, unfused.losses),
                              fused_vs_unfused_tolerance(d, "losses"));
                expect_within(label(d, "dlnf") + at, OpMode::kFast, max_rel_error(fused.dlnf, unfused.dlnf),
                              fused_vs_unfused_tolerance(d, "dlnf"));
                expect_within(label(d, "dwte") + at, OpMode::kFast, max_rel_error(fused.dwte, unfused.dwte),
                              fused_vs_unfused_tolerance(d, "dwte"));
                EXPECT_TRUE(fused.guards_intact);
            }
        }
    }
}

// Fast vs reference, both fused, chunks of 8 rows. Measured (MS_OP_TEST_VERBOSE=1): fp32 losses 1.7e-7, dlnf 3.1e-7,
// dwte 1.2e-7 (exp_approx against exp, sgemm's order against double); bf16 losses 8.7e-8, dlnf 0, dwte 1.2e-7; fp16
// losses 8.7e-8, dlnf 2.6e-5, dwte 7.6e-6 (a dlogit rounded to the other side of an fp16 boundary). The tolerances
// are those of fused_vs_unfused_tolerance, which the same mechanisms explain.
MS_OP_TEST(LmHeadLoss, FastMatchesTheReference, kFastVsReference, OpKind::kLmHeadLoss) {
    auto fast = make_cpu_backend(OpMode::kFast);
    auto ref = make_cpu_backend(OpMode::kReference);
    for (DType d : kDtypes) {
        const Inputs in = make_inputs(kSmall, d);
        const Result got = run_fused(*fast, BackendKind::kCPU, in, 8);
        const Result want = run_fused(*ref, BackendKind::kCPU, in, 8);
        expect_within(label(d, "fast vs reference losses"), OpMode::kFast, max_rel_error(got.losses, want.losses),
                      fused_vs_unfused_tolerance(d, "losses"));
        expect_within(label(d, "fast vs reference dlnf"), OpMode::kFast, max_rel_error(got.dlnf, want.dlnf),
                      fused_vs_unfused_tolerance(d, "dlnf"));
        expect_within(label(d, "fast vs reference dwte"), OpMode::kFast, max_rel_error(got.dwte, want.dwte),
                      fused_vs_unfused_tolerance(d, "dwte"));
    }
}

MS_OP_TEST(LmHeadLoss, AccumulatesDwteOverwritesDlnfAndMasksThePadding, kContract, OpKind::kLmHeadLoss) {
    for (OpMode mode : {OpMode::kFast, OpMode::kReference}) {
        auto be = make_cpu_backend(mode);
        for (DType d : kDtypes) {
            const Shape& s = kSmall;
            const Inputs in = make_inputs(s, d);
            const Result r = run_fused(*be, BackendKind::kCPU, in, 8);
            EXPECT_TRUE(r.guards_intact) << mode_name(mode);
            // the padded rows of dwte keep their initial values exactly; dlnf has no NaN left (overwritten)
            EXPECT_TRUE(bit_identical(rows(r.dwte, s.C, s.valid, s.Vp), rows(in.dwte0, s.C, s.valid, s.Vp)));
            for (float x : r.dlnf) ASSERT_FALSE(std::isnan(x)) << mode_name(mode) << " " << dtype_name(d);
            // +=: a second run from the first one's dwte adds the same product again (fp32, so compare with tolerance)
            Inputs again = in;
            again.dwte0 = r.dwte;
            const Result r2 = run_fused(*be, BackendKind::kCPU, again, 8);
            std::vector<float> twice(r.dwte.size());
            for (size_t i = 0; i < twice.size(); ++i) twice[i] = r.dwte[i] + (r.dwte[i] - in.dwte0[i]);
            expect_within(label(d, "dwte accumulates"), mode, max_rel_error(r2.dwte, twice), 1e-6);
            EXPECT_TRUE(bit_identical(r2.losses, r.losses));
            // forward only: the same losses, dlnf and dwte untouched
            const Result f = run_fused(*be, BackendKind::kCPU, in, 8, /*backward=*/false);
            EXPECT_TRUE(bit_identical(f.losses, r.losses));
            EXPECT_TRUE(bit_identical(f.dwte, in.dwte0));
            for (float x : f.dlnf) ASSERT_TRUE(std::isnan(x));
        }
    }
}

// A target in the padded tail cannot happen (targets are real ids); a row whose logits are all equal has the
// closed-form loss log(valid): lnf = 0 makes every logit 0.
MS_OP_TEST(LmHeadLoss, ZeroActivationsGiveLogOfTheVocabulary, kExact, OpKind::kLmHeadLoss) {
    for (OpMode mode : {OpMode::kFast, OpMode::kReference}) {
        auto be = make_cpu_backend(mode);
        Inputs in = make_inputs(kSmall, DType::kF32);
        std::fill(in.lnf.begin(), in.lnf.end(), 0.0f);
        const Result r = run_fused(*be, BackendKind::kCPU, in, 8);
        for (int64_t n = 0; n < kSmall.N; ++n) {
            EXPECT_NEAR(r.losses[n], std::log(static_cast<double>(kSmall.valid)), 2e-6) << mode_name(mode);
        }
    }
}

MS_OP_TEST(LmHeadLoss, DeterministicAnyThreadCount, kDeterminism, OpKind::kLmHeadLoss) {
    auto fast = make_cpu_backend(OpMode::kFast);
    const int saved_threads = omp_get_max_threads();
    for (DType d : kDtypes) {
        const Inputs in = make_inputs(kWide, d);
        omp_set_num_threads(1);
        const Result one = run_fused(*fast, BackendKind::kCPU, in, 16);
        for (int threads : {2, 3}) {
            omp_set_num_threads(threads);
            for (int rep = 0; rep < 2; ++rep) {
                const Result many = run_fused(*fast, BackendKind::kCPU, in, 16);
                EXPECT_TRUE(bit_identical(many.losses, one.losses)) << dtype_name(d) << " " << threads << " threads";
                EXPECT_TRUE(bit_identical(many.dlnf, one.dlnf)) << dtype_name(d) << " " << threads << " threads";
                EXPECT_TRUE(bit_identical(many.dwte, one.dwte)) << dtype_name(d) << " " << threads << " threads";
            }
        }
    }
    omp_set_num_threads(saved_threads);
}

// dlnf and dwte against central differences of L = sum_n dloss[n] * loss[n] (reference, fp32, double sum), on a
// small shape, step 1e-2. Measured max relative error 2.7e-5 (dlnf), 1.5e-5 (dwte): the step's second-order term
// and the float loss's rounding over the step; tolerance 2e-4.
MS_OP_TEST(LmHeadLoss, GradientMatchesFiniteDifferences, kGradient, OpKind::kLmHeadLoss) {
    auto ref = make_cpu_backend(OpMode::kReference);
    const Shape s{5, 6, 11, 9};
    Inputs in = make_inputs(s, DType::kF32);
    std::fill(in.dwte0.begin(), in.dwte0.end(), 0.0f);
    const Result r = run_fused(*ref, BackendKind::kCPU, in, 2);
    const auto loss = [&] {
        const Result f = run_fused(*ref, BackendKind::kCPU, in, 2, /*backward=*/false);
        return dot_loss(f.losses, in.dloss);
    };
    const std::vector<double> g_lnf = numeric_grad(in.lnf, loss, 1e-2f);
    const std::vector<double> g_wte = numeric_grad(in.wte, loss, 1e-2f);
    expect_within("lm_head_loss dlnf vs finite differences", OpMode::kReference, max_rel_error(r.dlnf, g_lnf), 2e-4);
    expect_within("lm_head_loss dwte vs finite differences", OpMode::kReference, max_rel_error(r.dwte, g_wte), 2e-4);
}

// The CUDA kernels on the CPU emulation (the twin check of kernels/lm_head_loss.cu; test_cuda_backend.cpp runs fp32
// through the same backend), every dtype, chunks of 8 rows: against the CPU reference's fused op and against the
// emulated backend's own unfused ops. Measured (MS_OP_TEST_VERBOSE=1), max |a - b| / max |b|: against the CPU
// reference, fp32 losses 1.7e-7, dlnf 4.1e-7, dwte 2.4e-7, bf16 / fp16 losses 4.4e-8, dlnf 0, dwte 1.2e-7; against
// its own unfused ops the losses and dlnf are bit-identical (the same kernels on each row) and dwte within 1.8e-7
// (summed chunk by chunk). Tolerances: fused_vs_unfused_tolerance, the same mechanisms.
TEST(LmHeadLoss, CudaEmulationMatchesTheCpuAndItsUnfusedOps) {
    BackendOptions o;
    o.kind = BackendKind::kCUDA;
    auto cuda = make_backend_with_cuda(o);
    auto ref = make_cpu_backend(OpMode::kReference);
    for (DType d : kDtypes) {
        const Inputs in = make_inputs(kSmall, d);
        const Result got = run_fused(*cuda, BackendKind::kCUDA, in, 8);
        const Result want = run_fused(*ref, BackendKind::kCPU, in, 8);
        const Result unfused = run_unfused(*cuda, in);
        EXPECT_TRUE(got.guards_intact);
        for (const auto& [what, a, b] :
             {std::tuple{"losses", &got.losses, &want.losses}, std::tuple{"dlnf", &got.dlnf, &want.dlnf},
              std::tuple{"dwte", &got.dwte, &want.dwte}}) {
            expect_within(label(d, "cuda-emulated vs cpu reference ") + what, OpMode::kFast, max_rel_error(*a, *b),
                          fused_vs_unfused_tolerance(d, what));
        }
        EXPECT_TRUE(bit_identical(got.losses, unfused.losses)) << dtype_name(d);
        EXPECT_TRUE(bit_identical(got.dlnf, unfused.dlnf)) << dtype_name(d);
        expect_within(label(d, "cuda-emulated fused vs unfused dwte"), OpMode::kFast,
                      max_rel_error(got.dwte, unfused.dwte), fused_vs_unfused_tolerance(d, "dwte"));
    }
}

}  // namespace
}  // namespace ms::test
