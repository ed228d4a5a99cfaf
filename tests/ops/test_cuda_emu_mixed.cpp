// test_cuda_emu_mixed.cpp: every CUDA kernel on bf16 and fp16 activations (mixed precision, the precision contract in
// engine/backends/backend.h), run through CudaBackend on the CPU emulation.
//
// What each op is compared with, for D = bf16 and fp16:
//   - the CPU backend in OpMode::kReference computing in fp32 on the same D-rounded inputs, its D outputs rounded
//     through D afterwards (round_to<D>): what the contract says a D op computes, up to summation order;
//   - the CPU backend on the D tensors themselves, whenever cpu->supports(op, D) says it has them (the CPU bf16 /
//     fp16 ops), with the same tolerances;
//   - itself: two runs bit-identical; guard bytes on both sides of every buffer intact.
// Parameter gradients (dweight, dbias, dtable, dpos) and statistics (mean, rstd, lse, row_max, ...) are fp32 by the
// contract and are compared unrounded. Shapes are not multiples of any block or tile. Tolerances are scale-free
// errors (max |cuda - ref| / max |ref|). A D output may differ from the rounded reference by one unit in the last
// place of D where the two fp32 results (summation order, expf vs tanh) straddle a rounding boundary: at most 2^-7 =
// 7.8e-3 of the value for bf16 and 2^-10 = 9.8e-4 for fp16, the tolerances 8e-3 and 1e-3. MS_OP_TEST_VERBOSE=1
// prints the measured errors: most D outputs 0, the largest 3.3e-3 (bf16) and 4.1e-4 (fp16), both attention's
// dqkv; fp32 gradients and statistics <= 2.0e-7 (tolerance 1e-6); ops whose fp32 arithmetic is the reference's own
// order (residual, embedding, row_max, target_logit) are compared with 0.
// The cast kernel is compared with the CPU cast bit for bit, special values included.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "engine/backends/cuda/cuda_backend.h"
#include "engine/core/half.h"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

constexpr DType kHalfTypes[] = {DType::kBF16, DType::kF16};

std::unique_ptr<Backend> make_cuda() {
    BackendOptions o;
    o.kind = BackendKind::kCUDA;
    return make_backend_with_cuda(o);
}

// n values of dtype fp32, bf16 or fp16, with kGuardBytes sentinel bytes on each side to catch stray writes.
class Buf {
  public:
    static constexpr size_t kGuardBytes = 128;
    static constexpr unsigned char kSentinel = 0xA5;

    Buf(DType dtype, const std::vector<float>& init)
        : dtype_(dtype), n_(init.size()), bytes_(2 * kGuardBytes + init.size() * dtype_size(dtype), kSentinel) {
        for (size_t i = 0; i < n_; ++i) store(i, init[i]);
    }
    void* data() { return bytes_.data() + kGuardBytes; }
    Tensor tensor(std::initializer_list<int64_t> dims) { return Tensor(data(), dtype_, dims); }
    std::vector<float> values() const {
        std::vector<float> v(n_);
        const unsigned char* p = bytes_.data() + kGuardBytes;
        for (size_t i = 0; i < n_; ++i) {
            if (dtype_ == DType::kF32) {
                std::memcpy(&v[i], p + 4 * i, 4);
            } else if (dtype_ == DType::kBF16) {
                bf16 h;
                std::memcpy(&h, p + 2 * i, 2);
                v[i] = to_float(h);
            } else {
                fp16 h;
                std::memcpy(&h, p + 2 * i, 2);
                v[i] = to_float(h);
            }
        }
        return v;
    }
    bool guards_intact() const {
        const size_t tail = kGuardBytes + n_ * dtype_size(dtype_);
        for (size_t i = 0; i < kGuardBytes; ++i) {
            if (bytes_[i] != kSentinel || bytes_[tail + i] != kSentinel) return false;
        }
        return true;
    }

  private:
    void store(size_t i, float x) {
        unsigned char* p = bytes_.data() + kGuardBytes + i * dtype_size(dtype_);
        if (dtype_ == DType::kF32) {
            std::memcpy(p, &x, 4);
        } else if (dtype_ == DType::kBF16) {
            const bf16 h = from_float<bf16>(x);
            std::memcpy(p, &h, 2);
        } else {
            const fp16 h = from_float<fp16>(x);
            std::memcpy(p, &h, 2);
        }
    }

    DType dtype_;
    size_t n_;
    std::vector<unsigned char> bytes_;
};

// ---- the harness: one op, run on the reference (fp32 on D-rounded inputs), on CUDA twice, on the CPU in D ----

struct Out {
    std::string name;
    std::vector<float> values;
    bool activation;  // stored in D (the fp32 reference's value is rounded through D), else fp32 by the contract
};
using Outs = std::vector<Out>;

// An op's run on `be` with activations stored as `storage` (D, or fp32 for the reference); inputs are D-rounded.
using OpRun = std::function<Outs(Backend& be, DType storage)>;

struct Collect {
    const char* name;
    const Buf* buf;
    bool activation;
};
Outs collect(std::initializer_list<Collect> bufs) {
    Outs outs;
    for (const Collect& c : bufs) {
        EXPECT_TRUE(c.buf->guards_intact()) << c.name << ": a write outside the buffer";
        outs.push_back({c.name, c.buf->values(), c.activation});
    }
    return outs;
}

// Tolerance of one output per D.
struct Tol {
    const char* name;
    double bf16, fp16;
};

void expect_close(const std::string& what, double err, double tol) {
    if (std::getenv("MS_OP_TEST_VERBOSE")) std::printf("  %-44s err %.2e (tol %.0e)\n", what.c_str(), err, tol);
    EXPECT_LE(err, tol) << what;
}

void check_op(const char* op, OpKind kind, DType D, const OpRun& run, std::initializer_list<Tol> tols) {
    SCOPED_TRACE(testing::Message() << op << " in " << dtype_name(D));
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    Outs ref = run(*cpu, DType::kF32);
    for (Out& o : ref) {
        if (o.activation) o.values = rounded(D, o.values);
    }
    const Outs got = run(*cuda, D);
    const Outs again = run(*cuda, D);
    Outs cpu_d;
    if (cpu->supports(kind, D)) cpu_d = run(*cpu, D);
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < got.size(); ++i) {
        const Out& o = got[i];
        double tol = -1;
        for (const Tol& t : tols) {
            if (o.name == t.name) tol = D == DType::kBF16 ? t.bf16 : t.fp16;
        }
        ASSERT_GE(tol, 0) << "no tolerance for " << o.name;
        const std::string what = std::string(op) + " " + o.name + " " + std::string(dtype_name(D));
        EXPECT_TRUE(bit_identical(o.values, again[i].values)) << what << ": two runs differ";
        expect_close(what, max_rel_error(o.values, ref[i].values), tol);
        if (!cpu_d.empty())
            expect_close(what + " vs cpu-" + std::string(dtype_name(D)), max_rel_error(o.values, cpu_d[i].values), tol);
    }
}

std::vector<float> nans(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }

// ---- elementwise: residual, gelu ----

TEST(CudaEmuMixed, ResidualIsTheRoundedFp32SumBitForBit) {
    const int64_t M = 337, n = 3 * M;
    for (DType D : kHalfTypes) {
        const auto a = rounded(D, random_floats(n, 1)), b = rounded(D, random_floats(n, 2)),
                   bias = rounded(D, random_floats(M, 3));
        const OpRun run = [&](Backend& be, DType s) {
            Buf ba(s, a), bb(s, b), bbias(s, bias), out(s, nans(n)), stream(s, a);
            be.residual_forward(
                {.a = ba.tensor({n}), .b = bb.tensor({n}), .out = out.tensor({n}), .bias = bbias.tensor({M})});
            // out aliasing a, without a bias: the residual stream's in-place add
            be.residual_forward({.a = stream.tensor({n}), .b = bb.tensor({n}), .out = stream.tensor({n}), .bias = {}});
            be.synchronize();
            return collect({{"out", &out, true}, {"in-place", &stream, true}});
        };
        // The same fp32 additions in the same order, rounded once: identical.
        check_op("residual", OpKind::kResidualForward, D, run, {{"out", 0, 0}, {"in-place", 0, 0}});
    }
}

TEST(CudaEmuMixed, GeluForwardAndBackward) {
    const int64_t n = 1001;
    for (DType D : kHalfTypes) {
        const auto inp = rounded(D, random_floats(n, 1, -6.0f, 6.0f)), dout = rounded(D, random_floats(n, 2));
        const OpRun run = [&](Backend& be, DType s) {
            Buf x(s, inp), out(s, nans(n)), dy(s, dout), dx(s, nans(n));
            be.gelu_forward({.inp = x.tensor({n}), .out = out.tensor({n})});
            be.gelu_backward({.inp = x.tensor({n}), .dout = dy.tensor({n}), .dinp = dx.tensor({n})});
            be.synchronize();
            return collect({{"out", &out, true}, {"dinp", &dx, true}});
        };
        check_op("gelu", OpKind::kGeluForward, D, run, {{"out", 8e-3, 1e-3}, {"dinp", 8e-3, 1e-3}});
    }
}

// ---- layernorm ----

TEST(CudaEmuMixed, LayerNormForwardAndBackward) {
    const int64_t N = 37, C = 67;
    for (DType D : kHalfTypes) {
        const auto inp = rounded(D, random_floats(N * C, 1, -2.0f, 3.0f)),
                   w = rounded(D, random_floats(C, 2, 0.5f, 1.5f)), bias = rounded(D, random_floats(C, 3)),
                   dout = rounded(D, random_floats(N * C, 4)), dinp0 = rounded(D, random_floats(N * C, 5));
        const auto dw0 = random_floats(C, 6), db0 = random_floats(C, 7);
        const OpRun run = [&](Backend& be, DType s) {
            Buf x(s, inp), weight(s, w), b(s, bias), out(s, nans(N * C)), mean(DType::kF32, nans(N)),
                rstd(DType::kF32, nans(N)), dy(s, dout), dx_add(s, dinp0), dx(s, nans(N * C)), dw(DType::kF32, dw0),
                db(DType::kF32, db0);
            be.layernorm_forward({.inp = x.tensor({N, C}),
                                  .weight = weight.tensor({C}),
                                  .bias = b.tensor({C}),
                                  .out = out.tensor({N, C}),
                                  .mean = mean.tensor({N}),
                                  .rstd = rstd.tensor({N}),
                                  .eps = 1e-5f});
            LayerNormBackwardArgs args{.dout = dy.tensor({N, C}),
                                       .inp = x.tensor({N, C}),
                                       .weight = weight.tensor({C}),
                                       .mean = mean.tensor({N}),
                                       .rstd = rstd.tensor({N}),
                                       .dinp = dx_add.tensor({N, C}),
                                       .dweight = dw.tensor({C}),
                                       .dbias = db.tensor({C}),
                                       .accumulate = Accumulate::kAdd};
            be.layernorm_backward(args);
            args.dinp = dx.tensor({N, C});
            args.accumulate = Accumulate::kOverwrite;
            be.layernorm_backward(args);  // dweight and dbias accumulate twice
            be.synchronize();
            return collect({{"out", &out, true},
                            {"mean", &mean, false},
                            {"rstd", &rstd, false},
                            {"dinp +=", &dx_add, true},
                            {"dinp =", &dx, true},
                            {"dweight", &dw, false},
                            {"dbias", &db, false}});
        };
        check_op("layernorm", OpKind::kLayerNormForward, D, run,
                 {{"out", 8e-3, 1e-3},
                  {"mean", 1e-6, 1e-6},
                  {"rstd", 1e-6, 1e-6},
                  {"dinp +=", 8e-3, 1e-3},
                  {"dinp =", 8e-3, 1e-3},
                  {"dweight", 1e-6, 1e-6},
                  {"dbias", 1e-6, 1e-6}});
    }
}

// The residual add fused into layernorm_forward (backend.h): residual_out and the LayerNorm's outputs, with and
// without the residual bias, with residual_out aliasing residual_a and with out aliasing residual_b (the trainer's
// in-place stream and sequence-parallel buffer). `fused` false runs residual_forward and then layernorm_forward.
enum class LnAlias : uint8_t { kNone, kResidualOutIsA, kOutIsB };
struct LnResidualCase {
    int64_t N, C;
    bool with_bias;
    LnAlias alias;
};
// Inputs rounded through D, stored as s (D, or fp32 for check_op's reference).
Outs run_layernorm_residual(Backend& be, DType s, DType D, const LnResidualCase& c, bool fused) {
    const int64_t N = c.N, C = c.C;
    Buf a(s, rounded(D, random_floats(N * C, 1, -2.0f, 3.0f))), b(s, rounded(D, random_floats(N * C, 2))),
        rb(s, rounded(D, random_floats(C, 3))), weight(s, rounded(D, random_floats(C, 4, 0.5f, 1.5f))),
        bias(s, rounded(D, random_floats(C, 5))), res(s, nans(N * C)), out(s, nans(N * C)), mean(DType::kF32, nans(N)),
        rstd(DType::kF32, nans(N));
    Buf& res_out = c.alias == LnAlias::kResidualOutIsA ? a : res;
    Buf& ln_out = c.alias == LnAlias::kOutIsB ? b : out;
    LayerNormForwardArgs args{.inp = {},
                              .weight = weight.tensor({C}),
                              .bias = bias.tensor({C}),
                              .out = ln_out.tensor({N, C}),
                              .mean = mean.tensor({N}),
                              .rstd = rstd.tensor({N}),
                              .eps = 1e-5f};
    const Tensor res_bias = c.with_bias ? rb.tensor({C}) : Tensor();
    if (fused) {
        args.residual_a = a.tensor({N, C});
        args.residual_b = b.tensor({N, C});
        args.residual_bias = res_bias;
        args.residual_out = res_out.tensor({N, C});
    } else {
        be.residual_forward(
            {.a = a.tensor({N * C}), .b = b.tensor({N * C}), .out = res_out.tensor({N * C}), .bias = res_bias});
        args.inp = res_out.tensor({N, C});
    }
    be.layernorm_forward(args);
    be.synchronize();
    return collect(
        {{"residual_out", &res_out, true}, {"out", &ln_out, true}, {"mean", &mean, false}, {"rstd", &rstd, false}});
}

// C = 67: the scalar path of the 16-bit kernel; 256: packed, every value in registers; 1160: packed, and past the
// columns a lane keeps in registers (768, kCached / kCachedPacks in layernorm.cu), so the rest is re-read from
// residual_out.
TEST(CudaEmuMixed, LayerNormResidualFusionIsTheTwoKernelsBitForBit) {
    auto cuda = make_cuda();
    for (DType D : {DType::kF32, DType::kBF16, DType::kF16}) {
        for (const int64_t C : {67, 256, 1160}) {
            const int64_t N = C > 256 ? 11 : 37;
            for (bool with_bias : {true, false}) {
                for (LnAlias alias : {LnAlias::kNone, LnAlias::kResidualOutIsA, LnAlias::kOutIsB}) {
                    const LnResidualCase c{N, C, with_bias, alias};
                    SCOPED_TRACE(testing::Message() << dtype_name(D) << " C " << C << (with_bias ? " bias" : "")
                                                    << " alias " << static_cast<int>(alias));
                    const Outs fused = run_layernorm_residual(*cuda, D, D, c, true);
                    const Outs two = run_layernorm_residual(*cuda, D, D, c, false);
                    ASSERT_EQ(fused.size(), two.size());
                    for (size_t i = 0; i < fused.size(); ++i) {
                        EXPECT_TRUE(bit_identical(fused[i].values, two[i].values)) << fused[i].name;
                    }
                }
            }
        }
    }
}

// Against the CPU's fused op on the same D tensors (check_op's fp32 reference does not round the residual sum to D
// before the LayerNorm, as the contract asks): the residual sum exactly (the same fp32 additions, rounded once), the
// LayerNorm within the layernorm test's tolerances.
TEST(CudaEmuMixed, LayerNormResidualFusionMatchesTheCpu) {
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    for (DType D : kHalfTypes) {
        for (const int64_t C : {67, 256}) {
            const LnResidualCase c{37, C, true, LnAlias::kResidualOutIsA};
            const Outs got = run_layernorm_residual(*cuda, D, D, c, true);
            const Outs ref = run_layernorm_residual(*cpu, D, D, c, true);
            ASSERT_EQ(got.size(), 4u);
            const bool bf = D == DType::kBF16;
            const double tols[] = {0.0, bf ? 8e-3 : 1e-3, 1e-6, 1e-6};  // residual_out, out, mean, rstd
            for (size_t i = 0; i < got.size(); ++i) {
                expect_close("layernorm + residual " + got[i].name + " " + std::string(dtype_name(D)) + " C " +
                                 std::to_string(C),
                             max_rel_error(got[i].values, ref[i].values), tols[i]);
            }
        }
    }
}

// ---- matmul ----

TEST(CudaEmuMixed, MatmulForwardAndBackward) {
    const int64_t N = 37, K = 45, M = 29;
    for (DType D : kHalfTypes) {
        const auto inp = rounded(D, random_floats(N * K, 1)), w = rounded(D, random_floats(M * K, 2)),
                   bias = rounded(D, random_floats(M, 3)), dout = rounded(D, random_floats(N * M, 4)),
                   dinp0 = rounded(D, random_floats(N * K, 5));
        const auto dw0 = random_floats(M * K, 6), db0 = random_floats(M, 7);
        const OpRun run = [&](Backend& be, DType s) {
            Buf x(s, inp), weight(s, w), b(s, bias), out(s, nans(N * M)), out_nobias(s, nans(N * M)), dy(s, dout),
                dx_add(s, dinp0), dx(s, nans(N * K)), dw(DType::kF32, dw0), db(DType::kF32, db0);
            be.matmul_forward({.inp = x.tensor({N, K}),
                               .weight = weight.tensor({M, K}),
                               .bias = b.tensor({M}),
                               .out = out.tensor({N, M})});
            be.matmul_forward({.inp = x.tensor({N, K}),
                               .weight = weight.tensor({M, K}),
                               .bias = {},
                               .out = out_nobias.tensor({N, M})});
            MatmulBackwardArgs args{.dout = dy.tensor({N, M}),
                                    .inp = x.tensor({N, K}),
                                    .weight = weight.tensor({M, K}),
                                    .dinp = dx_add.tensor({N, K}),
                                    .dweight = dw.tensor({M, K}),
                                    .dbias = db.tensor({M}),
                                    .accumulate = Accumulate::kAdd};
            be.matmul_backward(args);
            args.dinp = dx.tensor({N, K});
            args.dbias = {};
            args.accumulate = Accumulate::kOverwrite;
            be.matmul_backward(args);  // dweight accumulates twice, dbias once
            be.synchronize();
            return collect({{"out", &out, true},
                            {"out (no bias)", &out_nobias, true},
                            {"dinp +=", &dx_add, true},
                            {"dinp =", &dx, true},
                            {"dweight", &dw, false},
                            {"dbias", &db, false}});
        };
        check_op("matmul", OpKind::kMatmulForward, D, run,
                 {{"out", 8e-3, 1e-3},
                  {"out (no bias)", 8e-3, 1e-3},
                  {"dinp +=", 8e-3, 1e-3},
                  {"dinp =", 8e-3, 1e-3},
                  {"dweight", 1e-6, 1e-6},
                  {"dbias", 1e-6, 1e-6}});
    }
}

// The MLP's GELU fusion (backend.h): the emulation runs its matmul, then its gelu kernel, on the D-rounded
// pre-activation (product); the fp32 reference computes gelu_out (dinp) from the unrounded one, rounded once. Two
// roundings against one, the first scaled by |gelu'| <= 1.13: at most (0.5 * 1.13 + 0.5) = 1.07 units in the last
// place, 8.3e-3 of the value for bf16 and 1.0e-3 for fp16, so the tolerances of those two outputs are 1.2e-2 and
// 1.5e-3; measured (MS_OP_TEST_VERBOSE=1) gelu_out 3.6e-3 / 2.2e-4, dinp 6.8e-3 / 8.5e-4.
TEST(CudaEmuMixed, MatmulGeluFusion) {
    const int64_t N = 37, K = 48, M = 40;
    for (DType D : kHalfTypes) {
        const auto inp = rounded(D, random_floats(N * K, 1)), w = rounded(D, random_floats(M * K, 2)),
                   bias = rounded(D, random_floats(M, 3)), dout = rounded(D, random_floats(N * M, 4)),
                   gelu_in = rounded(D, random_floats(N * K, 5, -3.0f, 3.0f));
        const auto dw0 = random_floats(M * K, 6), db0 = random_floats(M, 7);
        const OpRun run = [&](Backend& be, DType s) {
            Buf x(s, inp), weight(s, w), b(s, bias), out(s, nans(N * M)), act(s, nans(N * M)), dy(s, dout),
                g(s, gelu_in), dx(s, nans(N * K)), dw(DType::kF32, dw0), db(DType::kF32, db0);
            be.matmul_forward({.inp = x.tensor({N, K}),
                               .weight = weight.tensor({M, K}),
                               .bias = b.tensor({M}),
                               .out = out.tensor({N, M}),
                               .gelu_out = act.tensor({N, M})});
            be.matmul_backward({.dout = dy.tensor({N, M}),
                                .inp = x.tensor({N, K}),
                                .weight = weight.tensor({M, K}),
                                .dinp = dx.tensor({N, K}),
                                .dweight = dw.tensor({M, K}),
                                .dbias = db.tensor({M}),
                                .accumulate = Accumulate::kOverwrite,
                                .gelu_inp = g.tensor({N, K})});
            be.synchronize();
            return collect({{"out", &out, true},
                            {"gelu_out", &act, true},
                            {"dinp (through gelu)", &dx, true},
                            {"dweight", &dw, false},
                            {"dbias", &db, false}});
        };
        check_op("matmul + gelu", OpKind::kMatmulForward, D, run,
                 {{"out", 8e-3, 1e-3},
                  {"gelu_out", 1.2e-2, 1.5e-3},
                  {"dinp (through gelu)", 1.2e-2, 1.5e-3},
                  {"dweight", 1e-6, 1e-6},
                  {"dbias", 1e-6, 1e-6}});
    }
}

// ---- attention ----

TEST(CudaEmuMixed, AttentionForwardAndBackward) {
    const int64_t B = 2, T = 37, NH = 3, HS = 24, C = NH * HS;
    for (DType D : kHalfTypes) {
        const auto qkv = rounded(D, random_floats(B * T * 3 * C, 1, -2.0f, 2.0f)),
                   dout = rounded(D, random_floats(B * T * C, 2));
        const OpRun run = [&](Backend& be, DType s) {
            Buf x(s, qkv), out(s, nans(B * T * C)), lse(DType::kF32, nans(B * NH * T)), dy(s, dout),
                dx(s, nans(B * T * 3 * C));
            be.attention_forward({.qkv = x.tensor({B, T, 3 * C}),
                                  .out = out.tensor({B, T, C}),
                                  .lse = lse.tensor({B, NH, T}),
                                  .NH = NH});
            be.synchronize();
            // The backward reads the forward's output as stored in D: the fp32 reference gets it rounded too.
            Buf out_d(s, rounded(D, out.values()));
            be.attention_backward({.dout = dy.tensor({B, T, C}),
                                   .qkv = x.tensor({B, T, 3 * C}),
                                   .out = out_d.tensor({B, T, C}),
                                   .lse = lse.tensor({B, NH, T}),
                                   .dqkv = dx.tensor({B, T, 3 * C}),
                                   .NH = NH});
            be.synchronize();
            return collect({{"out", &out, true}, {"lse", &lse, false}, {"dqkv", &dx, true}});
        };
        check_op("attention", OpKind::kAttentionForward, D, run,
                 {{"out", 8e-3, 1e-3}, {"lse", 1e-6, 1e-6}, {"dqkv", 8e-3, 1e-3}});
    }
}

// ---- embedding ----

TEST(CudaEmuMixed, EmbeddingForwardAndBackward) {
    const int64_t B = 2, T = 19, N = B * T, C = 67, V = 50, vocab_start = 10;
    // Tokens below, inside and above this shard's rows [10, 60).
    auto tokens = random_ints(N, 1, 0, 70);
    for (DType D : kHalfTypes) {
        const auto table = rounded(D, random_floats(V * C, 2)), pos = rounded(D, random_floats(T * C, 3)),
                   dout = rounded(D, random_floats(N * C, 4));
        const auto dtable0 = random_floats(V * C, 5), dpos0 = random_floats(T * C, 6);
        const OpRun run = [&](Backend& be, DType s) {
            Buf tab(s, table), ps(s, pos), out(s, nans(N * C)), dy(s, dout), dtab(DType::kF32, dtable0),
                dps(DType::kF32, dpos0);
            be.embedding_forward({.tokens = view(tokens, {N}),
                                  .table = tab.tensor({V, C}),
                                  .pos = ps.tensor({T, C}),
                                  .out = out.tensor({N, C}),
                                  .vocab_start = vocab_start,
                                  .T = T});
            be.embedding_backward({.tokens = view(tokens, {N}),
                                   .dout = dy.tensor({N, C}),
                                   .dtable = dtab.tensor({V, C}),
                                   .dpos = dps.tensor({T, C}),
                                   .vocab_start = vocab_start,
                                   .T = T});
            be.synchronize();
            return collect({{"out", &out, true}, {"dtable", &dtab, false}, {"dpos", &dps, false}});
        };
        // One fp32 add rounded once, and fp32 sums in token order: the CPU's arithmetic exactly.
        check_op("embedding", OpKind::kEmbeddingForward, D, run, {{"out", 0, 0}, {"dtable", 0, 0}, {"dpos", 0, 0}});
    }
}

// ---- cross-entropy ----

TEST(CudaEmuMixed, CrossEntropyForwardAndBackward) {
    const int64_t N = 37, Vp = 300, valid = 290, vocab_start = 0;
    auto targets = random_ints(N, 1, 0, 350);  // inside the shard, in its padded tail, on other shards
    auto dloss = random_floats(N, 2, 0.01f, 0.1f);
    for (DType D : kHalfTypes) {
        const auto logits = rounded(D, random_floats(N * Vp, 3, -8.0f, 8.0f));
        const OpRun run = [&](Backend& be, DType s) {
            Buf l(s, logits), row_max(DType::kF32, nans(N)), sum_exp(DType::kF32, nans(N)),
                target_logit(DType::kF32, nans(N));
            CrossEntropyForwardArgs fa{.logits = l.tensor({N, Vp}),
                                       .targets = view(targets, {N}),
                                       .row_max = row_max.tensor({N}),
                                       .sum_exp = sum_exp.tensor({N}),
                                       .target_logit = target_logit.tensor({N}),
                                       .vocab_start = vocab_start,
                                       .vocab_valid_local = valid,
                                       .phase = CrossEntropyPhase::kMax};
            be.cross_entropy_forward(fa);
            fa.phase = CrossEntropyPhase::kSumExp;
            be.cross_entropy_forward(fa);
            be.cross_entropy_backward({.logits = l.tensor({N, Vp}),
                                       .targets = view(targets, {N}),
                                       .row_max = row_max.tensor({N}),
                                       .sum_exp = sum_exp.tensor({N}),
                                       .dloss = view(dloss, {N}),
                                       .vocab_start = vocab_start,
                                       .vocab_valid_local = valid});
            be.synchronize();
            return collect({{"row_max", &row_max, false},
                            {"sum_exp", &sum_exp, false},
                            {"target_logit", &target_logit, false},
                            {"dlogits", &l, true}});
        };
        // row_max and target_logit are values of the logits themselves: exact.
        check_op("cross_entropy", OpKind::kCrossEntropyForward, D, run,
                 {{"row_max", 0, 0}, {"sum_exp", 1e-6, 1e-6}, {"target_logit", 0, 0}, {"dlogits", 8e-3, 1e-3}});
    }
}

// ---- adamw: the fused cast of the updated master weights ----

TEST(CudaEmuMixed, AdamWWritesTheRoundedParamCopyAndLeavesFp32Unchanged) {
    const int64_t n = 2049;
    const auto param0 = random_floats(n, 1), m0 = random_floats(n, 2, -0.1f, 0.1f), v0 = random_floats(n, 3, 0, 0.01f);
    auto grad = random_floats(n, 4);
    auto cuda = make_cuda();
    const auto step = [&](Buf& param, Buf& m, Buf& v, Buf* copy) {
        cuda->adamw({.param = param.tensor({n}),
                     .grad = view(grad, {n}),
                     .m = m.tensor({n}),
                     .v = v.tensor({n}),
                     .lr = 1e-3f,
                     .beta1 = 0.9f,
                     .beta2 = 0.95f,
                     .eps = 1e-8f,
                     .weight_decay = 0.1f,
                     .grad_scale = 0.5f,
                     .step = 3,
                     .param_copy = copy ? copy->tensor({n}) : Tensor{}});
        cuda->synchronize();
    };
    Buf p_plain(DType::kF32, param0), m_plain(DType::kF32, m0), v_plain(DType::kF32, v0);
    step(p_plain, m_plain, v_plain, nullptr);
    for (DType D : kHalfTypes) {
        SCOPED_TRACE(dtype_name(D));
        Buf p(DType::kF32, param0), m(DType::kF32, m0), v(DType::kF32, v0), copy(D, nans(n));
        step(p, m, v, &copy);
        // fp32 state as without the copy, and the copy is exactly the updated param rounded to D.
        EXPECT_TRUE(bit_identical(p.values(), p_plain.values()));
        EXPECT_TRUE(bit_identical(m.values(), m_plain.values()));
        EXPECT_TRUE(bit_identical(v.values(), v_plain.values()));
        EXPECT_TRUE(bit_identical(copy.values(), rounded(D, p.values())));
        EXPECT_TRUE(p.guards_intact() && m.guards_intact() && v.guards_intact() && copy.guards_intact());
        auto cpu = make_cpu_backend(OpMode::kReference);
        if (cpu->supports(OpKind::kAdamW, D)) {
            auto p_ref = param0, m_ref = m0, v_ref = v0;
            Buf copy_ref(D, nans(n));
            cpu->adamw({.param = view(p_ref, {n}),
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
                        .param_copy = copy_ref.tensor({n})});
            // the fp32 update differs from the CPU's by summation order only (test_cuda_emu.cpp: 6.0e-8), so the
            // copies differ by at most one D ulp where that straddles a rounding boundary
            expect_close(std::string("adamw param_copy vs cpu-") + std::string(dtype_name(D)),
                         max_rel_error(copy.values(), copy_ref.values()), D == DType::kBF16 ? 8e-3 : 1e-3);
        }
    }
}

// ---- sum_squares on D ----

TEST(CudaEmuMixed, SumSquaresOfHalfValues) {
    const int64_t n = 70001;  // two chunks, the second partial
    auto cuda = make_cuda();
    for (DType D : kHalfTypes) {
        SCOPED_TRACE(dtype_name(D));
        const auto x = rounded(D, random_floats(n, 1, -3.0f, 3.0f));
        double expected = 0.0;
        for (float xi : x) expected += static_cast<double>(xi) * xi;
        Buf b(D, x);
        const double got = cuda->sum_squares(b.tensor({n}));
        expect_close(std::string("sum_squares ") + std::string(dtype_name(D)), std::fabs(got - expected) / expected,
                     1e-12);
        EXPECT_EQ(cuda->sum_squares(b.tensor({n})), got);
    }
}

// ---- cast: the CPU's bits exactly ----

TEST(CudaEmuMixed, CastMatchesTheCpuBitForBit) {
    // Random values over a wide range, plus the edge cases: signed zeros, infinities, NaN, fp16's overflow threshold
    // and subnormals, bf16 and fp16 halfway cases (ties to even).
    auto values = random_floats(1000, 1, -70000.0f, 70000.0f);
    const auto small = random_floats(1000, 2, -1e-4f, 1e-4f);
    values.insert(values.end(), small.begin(), small.end());
    const float inf = std::numeric_limits<float>::infinity();
    for (float x : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 65504.0f, 65519.0f, 65520.0f,
                    -65520.0f, 5.96e-8f, 2.98e-8f, 3e-8f, 6.1e-5f, 1.00390625f, 1.01171875f, 1.0f + 1.0f / 2048,
                    1.0f + 3.0f / 2048, 3.4e38f}) {
        values.push_back(x);
    }
    const int64_t n = static_cast<int64_t>(values.size());
    auto cpu = make_cpu_backend(OpMode::kReference);
    auto cuda = make_cuda();
    for (DType s : {DType::kF32, DType::kBF16, DType::kF16}) {
        for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
            if (s == d) continue;
            SCOPED_TRACE(testing::Message() << dtype_name(s) << " -> " << dtype_name(d));
            Buf src(s, values), got(d, nans(n)), want(d, nans(n));
            cuda->cast({.src = src.tensor({n}), .dst = got.tensor({n})});
            cuda->synchronize();
            cpu->cast({.src = src.tensor({n}), .dst = want.tensor({n})});
            EXPECT_EQ(std::memcmp(got.data(), want.data(), static_cast<size_t>(n) * dtype_size(d)), 0);
            EXPECT_TRUE(got.guards_intact());
        }
    }
}

// ---- the contract's dtype checks are sentences ----

TEST(CudaEmuMixedDeathTest, ContractViolationsAreSentences) {
    auto cuda = make_cuda();
    const int64_t N = 4, K = 3, M = 2;
    Buf inp(DType::kBF16, std::vector<float>(N * K)), w(DType::kBF16, std::vector<float>(M * K)),
        w16(DType::kF16, std::vector<float>(M * K)), out(DType::kBF16, std::vector<float>(N * M)),
        dout(DType::kBF16, std::vector<float>(N * M)), dw_f16(DType::kF16, std::vector<float>(M * K));
    EXPECT_DEATH(cuda->matmul_backward({.dout = dout.tensor({N, M}),
                                        .inp = inp.tensor({N, K}),
                                        .weight = w.tensor({M, K}),
                                        .dinp = {},
                                        .dweight = dw_f16.tensor({M, K}),
                                        .dbias = {},
                                        .accumulate = Accumulate::kOverwrite}),
                 "matmul: dweight is fp16, but a parameter gradient is fp32 or the op's activation dtype bf16");
    EXPECT_DEATH(cuda->matmul_forward(
                     {.inp = inp.tensor({N, K}), .weight = w16.tensor({M, K}), .bias = {}, .out = out.tensor({N, M})}),
                 "matmul: weight is fp16 but the op's activation dtype is bf16");
    Buf x(DType::kF16, std::vector<float>(N * K)), y(DType::kF16, std::vector<float>(N * K)),
        lnw(DType::kF16, std::vector<float>(K)), mean16(DType::kF16, std::vector<float>(N)),
        rstd(DType::kF32, std::vector<float>(N));
    EXPECT_DEATH(cuda->layernorm_forward({.inp = x.tensor({N, K}),
                                          .weight = lnw.tensor({K}),
                                          .bias = lnw.tensor({K}),
                                          .out = y.tensor({N, K}),
                                          .mean = mean16.tensor({N}),
                                          .rstd = rstd.tensor({N}),
                                          .eps = 1e-5f}),
                 "layernorm: mean is fp16, but a statistic is fp32");
}

}  // namespace
}  // namespace ms::test
