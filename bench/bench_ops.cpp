// bench_ops.cpp: times every fast CPU op at GPT-2 124M shapes (C=768, NH=12, Vp=50304, 12 layers; micro-batch B=4 and
// sequence T=64 unless given) and adds them up into one training step (forward, backward, AdamW, grad norm), against
// an sgemm peak probe.
//   build/bench_ops [repeats] [B] [T]   (OMP_NUM_THREADS sets the threads; matmul runs OpenBLAS single-threaded inside
//                                        them)
// OpenBLAS 0.3.21 does not recognise every new CPU and then falls back to an SSE3 kernel ("Prescott"): compare with
// OPENBLAS_CORETYPE=SkylakeX (or Haswell) on AVX-512 (AVX2) machines. The probe runs first, on OpenBLAS's own threads.
// Each line is the median of `repeats` runs after one warm-up: ms per call, then GFLOP/s (GEMMs, attention) or
// GB/s (memory-bound ops, counting each tensor read or written once).
#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/backends/cpu/probe.h"
#include "engine/backends/rope_table.h"
#include "engine/core/timer.h"

namespace {

using ms::Tensor;

constexpr int64_t C = 768, NH = 12, Vp = 50304, V = 50257, L = 12;
int64_t B = 4, T = 64, N = B * T;                                                   // main() may set B and T
constexpr int64_t kParams = Vp * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C;  // GPT-2 124M with padded wte

std::vector<float> filled(int64_t n, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = dist(rng);
    return v;
}

Tensor t(std::vector<float>& v, std::initializer_list<int64_t> dims) { return Tensor::f32(v.data(), dims); }
Tensor t(std::vector<int32_t>& v, std::initializer_list<int64_t> dims) { return Tensor::i32(v.data(), dims); }

struct Timing {
    double seconds;  // median per call
};

Timing time_op(int repeats, const std::function<void()>& fn) {
    fn();
    std::vector<double> times;
    for (int r = 0; r < repeats; ++r) {
        const double t0 = ms::now_seconds();
        fn();
        times.push_back(ms::now_seconds() - t0);
    }
    std::sort(times.begin(), times.end());
    return {times[times.size() / 2]};
}

double step_seconds = 0.0, step_gemm_seconds = 0.0;

// Prints one op and adds `calls_per_step` of it to the step total.
void report(const std::string& name, Timing tm, double flops, double bytes, int64_t calls_per_step, bool gemm) {
    const std::string rate = flops > 0 ? fmt::format("{:8.1f} GFLOP/s", flops / tm.seconds / 1e9)
                                       : fmt::format("{:8.1f} GB/s   ", bytes / tm.seconds / 1e9);
    fmt::print("  {:<30} {:9.3f} ms  {}   x{:<3} per step\n", name, tm.seconds * 1e3, rate, calls_per_step);
    step_seconds += tm.seconds * static_cast<double>(calls_per_step);
    if (gemm) step_gemm_seconds += tm.seconds * static_cast<double>(calls_per_step);
}

void bench_matmul(ms::Backend& be, int repeats, const std::string& name, int64_t K, int64_t M, bool bias,
                  int64_t calls) {
    auto inp = filled(N * K), weight = filled(M * K, -0.02f, 0.02f), b = filled(M), out = filled(N * M);
    auto dinp = filled(N * K), dweight = filled(M * K), dbias = filled(M);
    const double flops = 2.0 * N * K * M;
    report(name + " fwd",
           time_op(repeats,
                   [&] {
                       be.matmul_forward({.inp = t(inp, {N, K}),
                                          .weight = t(weight, {M, K}),
                                          .bias = bias ? t(b, {M}) : Tensor(),
                                          .out = t(out, {N, M})});
                   }),
           flops, 0, calls, true);
    report(name + " bwd",
           time_op(repeats,
                   [&] {
                       be.matmul_backward({.dout = t(out, {N, M}),
                                           .inp = t(inp, {N, K}),
                                           .weight = t(weight, {M, K}),
                                           .dinp = t(dinp, {N, K}),
                                           .dweight = t(dweight, {M, K}),
                                           .dbias = bias ? t(dbias, {M}) : Tensor(),
                                           .accumulate = ms::Accumulate::kOverwrite});
                   }),
           2 * flops, 0, calls, true);
}

}  // namespace

int main(int argc, char** argv) {
    const int repeats = argc > 1 ? std::atoi(argv[1]) : 10;
    if (argc > 2) B = std::atoi(argv[2]);
    if (argc > 3) T = std::atoi(argv[3]);
    N = B * T;
    if (repeats < 1 || B < 1 || T < 1 || T > 1024) {
        fmt::print(stderr, "bench_ops: repeats {}, B {}, T {}: each must be >= 1, and T <= 1024 (positions)\n", repeats,
                   B, T);
        return 2;
    }
    ms::BackendOptions options;
    options.mode = ms::OpMode::kFast;
    auto backend = ms::make_backend(options);
    ms::Backend& be = *backend;

    const double peak = ms::cpu::sgemm_peak_flops();
    fmt::print("bench_ops: {} OpenMP threads, OpenBLAS core {}, sgemm peak probe {:.1f} GFLOP/s; B {} T {}\n",
               omp_get_max_threads(), openblas_get_corename(), peak / 1e9, B, T);
    {
        // The model's own largest per-layer GEMM shape: (N, 768) @ (3072, 768)^T.
        auto a = filled(N * C), w = filled(4 * C * C), o = filled(N * 4 * C);
        const Timing tm = time_op(repeats, [&] {
            be.matmul_forward(
                {.inp = t(a, {N, C}), .weight = t(w, {4 * C, C}), .bias = Tensor(), .out = t(o, {N, 4 * C})});
        });
        fmt::print("  sgemm at {}x3072x768 (fc fwd shape): {:.1f} GFLOP/s\n\n", N,
                   2.0 * N * C * 4 * C / tm.seconds / 1e9);
    }

    fmt::print("GEMMs (per layer x{}, lm head once):\n", L);
    bench_matmul(be, repeats, "qkv 768->2304", C, 3 * C, true, L);
    bench_matmul(be, repeats, "attn proj 768->768", C, C, true, L);
    bench_matmul(be, repeats, "fc 768->3072", C, 4 * C, true, L);
    bench_matmul(be, repeats, "fc proj 3072->768", 4 * C, C, true, L);
    bench_matmul(be, repeats, "lm head 768->50304", C, Vp, false, 1);

    fmt::print("\nother ops:\n");
    {
        auto qkv = filled(N * 3 * C), out = filled(N * C), lse = filled(B * NH * T), dqkv = filled(N * 3 * C);
        const double flops = 4.0 * B * NH * (T * (T + 1) / 2) * (C / NH);  // causal half of QK^T and PV
        report("attention fwd",
               time_op(repeats,
                       [&] {
                           be.attention_forward({.qkv = t(qkv, {B, T, 3 * C}),
                                                 .out = t(out, {B, T, C}),
                                                 .lse = t(lse, {B, NH, T}),
                                                 .NH = NH});
                       }),
               flops, 0, L, false);
        report("attention bwd",
               time_op(repeats,
                       [&] {
                           be.attention_backward({.dout = t(out, {B, T, C}),
                                                  .qkv = t(qkv, {B, T, 3 * C}),
                                                  .out = t(out, {B, T, C}),
                                                  .lse = t(lse, {B, NH, T}),
                                                  .dqkv = t(dqkv, {B, T, 3 * C}),
                                                  .NH = NH});
                       }),
               2 * flops, 0, L, false);
    }
    {
        auto inp = filled(N * C), w = filled(C), b = filled(C), out = filled(N * C), mean = filled(N), rstd = filled(N);
        auto dinp = filled(N * C), dw = filled(C), db = filled(C);
        be.layernorm_forward({.inp = t(inp, {N, C}),
                              .weight = t(w, {C}),
                              .bias = t(b, {C}),
                              .out = t(out, {N, C}),
                              .mean = t(mean, {N}),
                              .rstd = t(rstd, {N}),
                              .eps = 1e-5f});
        report("layernorm fwd",
               time_op(repeats,
                       [&] {
                           be.layernorm_forward({.inp = t(inp, {N, C}),
                                                 .weight = t(w, {C}),
                                                 .bias = t(b, {C}),
                                                 .out = t(out, {N, C}),
                                                 .mean = t(mean, {N}),
                                                 .rstd = t(rstd, {N}),
                                                 .eps = 1e-5f});
                       }),
               0, 8.0 * N * C, 2 * L + 1, false);
        report("layernorm bwd",
               time_op(repeats,
                       [&] {
                           be.layernorm_backward({.dout = t(out, {N, C}),
                                                  .inp = t(inp, {N, C}),
                                                  .weight = t(w, {C}),
                                                  .mean = t(mean, {N}),
                                                  .rstd = t(rstd, {N}),
                                                  .dinp = t(dinp, {N, C}),
                                                  .dweight = t(dw, {C}),
                                                  .dbias = t(db, {C}),
                                                  .accumulate = ms::Accumulate::kAdd});
                       }),
               0, 16.0 * N * C, 2 * L + 1, false);
        report("residual fwd",
               time_op(repeats,
                       [&] {
                           be.residual_forward(
                               {.a = t(inp, {N * C}), .b = t(out, {N * C}), .out = t(dinp, {N * C}), .bias = {}});
                       }),
               0, 12.0 * N * C, 2 * L, false);
    }
    {
        const int64_t n = N * 4 * C;
        auto inp = filled(n, -4.0f, 4.0f), out = filled(n), dinp = filled(n);
        report("gelu fwd", time_op(repeats, [&] { be.gelu_forward({.inp = t(inp, {n}), .out = t(out, {n})}); }), 0,
               8.0 * n, L, false);
        report("gelu bwd",
               time_op(repeats,
                       [&] { be.gelu_backward({.inp = t(inp, {n}), .dout = t(out, {n}), .dinp = t(dinp, {n})}); }),
               0, 12.0 * n, L, false);
    }
    {
        std::vector<int32_t> tokens(N);
        for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 7919) % V);
        auto wte = filled(Vp * C), wpe = filled(T * C), out = filled(N * C), dwte = filled(Vp * C),
             dwpe = filled(T * C);
        report("embedding fwd",
               time_op(repeats,
                       [&] {
                           be.embedding_forward({.tokens = t(tokens, {N}),
                                                 .table = t(wte, {Vp, C}),
                                                 .pos = t(wpe, {T, C}),
                                                 .out = t(out, {N, C}),
                                                 .vocab_start = 0,
                                                 .T = T});
                       }),
               0, 12.0 * N * C, 1, false);
        report("embedding bwd",
               time_op(repeats,
                       [&] {
                           be.embedding_backward({.tokens = t(tokens, {N}),
                                                  .dout = t(out, {N, C}),
                                                  .dtable = t(dwte, {Vp, C}),
                                                  .dpos = t(wpe, {T, C}),
                                                  .vocab_start = 0,
                                                  .T = T});
                       }),
               0, 20.0 * N * C, 1, false);

        auto logits = filled(N * Vp, -5.0f, 5.0f), scratch = logits;
        auto row_max = filled(N), sum_exp = filled(N), target_logit = filled(N), dloss = filled(N, 1.0f / N, 1.0f / N);
        const auto forward = [&] {
            for (auto phase : {ms::CrossEntropyPhase::kMax, ms::CrossEntropyPhase::kSumExp}) {
                be.cross_entropy_forward({.logits = t(logits, {N, Vp}),
                                          .targets = t(tokens, {N}),
                                          .row_max = t(row_max, {N}),
                                          .sum_exp = t(sum_exp, {N}),
                                          .target_logit = t(target_logit, {N}),
                                          .vocab_start = 0,
                                          .vocab_valid_local = V,
                                          .phase = phase});
            }
        };
        report("cross_entropy fwd (2 phases)", time_op(repeats, forward), 0, 8.0 * N * Vp, 1, false);
        report("cross_entropy bwd",
               time_op(repeats,
                       [&] {
                           scratch = logits;  // the backward writes over its input; the copy is timed too
                           be.cross_entropy_backward({.logits = t(scratch, {N, Vp}),
                                                      .targets = t(tokens, {N}),
                                                      .row_max = t(row_max, {N}),
                                                      .sum_exp = t(sum_exp, {N}),
                                                      .dloss = t(dloss, {N}),
                                                      .vocab_start = 0,
                                                      .vocab_valid_local = V});
                       }),
               0, 8.0 * N * Vp, 1, false);
    }
    {
        auto param = filled(kParams), grad = filled(kParams), m = filled(kParams, 0.0f, 0.0f),
             v = filled(kParams, 0.0f, 0.0f);
        const int reps = std::max(3, repeats / 3);
        report("adamw (124M params)",
               time_op(reps,
                       [&] {
                           be.adamw({.param = t(param, {kParams}),
                                     .grad = t(grad, {kParams}),
                                     .m = t(m, {kParams}),
                                     .v = t(v, {kParams}),
                                     .lr = 1e-4f,
                                     .beta1 = 0.9f,
                                     .beta2 = 0.95f,
                                     .eps = 1e-8f,
                                     .weight_decay = 0.1f,
                                     .grad_scale = 1.0f,
                                     .step = 1,
                                     .param_copy = {}});
                       }),
               0, 28.0 * kParams, 1, false);
        report("sum_squares (124M)", time_op(reps, [&] { be.sum_squares(t(grad, {kParams})); }), 0, 4.0 * kParams, 1,
               false);
    }

    {
        // The Llama ops at the same N and C (no part of the GPT-2 step: x0): RMSNorm, RoPE with NKV = 4 of NH = 12
        // heads, SwiGLU with F = 2048.
        constexpr int64_t NKV = 4, HS = C / NH, F = 2048, row = (NH + 2 * NKV) * HS;
        auto inp = filled(N * C), w = filled(C), out = filled(N * C), rstd = filled(N), dinp = filled(N * C),
             dw = filled(C);
        const auto rmsnorm_forward = [&] {
            be.rmsnorm_forward({.inp = t(inp, {N, C}),
                                .weight = t(w, {C}),
                                .out = t(out, {N, C}),
                                .rstd = t(rstd, {N}),
                                .eps = 1e-5f});
        };
        rmsnorm_forward();
        report("rmsnorm fwd", time_op(repeats, rmsnorm_forward), 0, 8.0 * N * C, 0, false);
        report("rmsnorm bwd",
               time_op(repeats,
                       [&] {
                           be.rmsnorm_backward({.dout = t(out, {N, C}),
                                                .inp = t(inp, {N, C}),
                                                .weight = t(w, {C}),
                                                .rstd = t(rstd, {N}),
                                                .dinp = t(dinp, {N, C}),
                                                .dweight = t(dw, {C}),
                                                .accumulate = ms::Accumulate::kAdd});
                       }),
               0, 16.0 * N * C, 0, false);
        auto qkv = filled(N * row), table = ms::rope_table(T, HS, 500000.0, {});
        report("rope (NKV 4)",
               time_op(repeats,
                       [&] {
                           be.rope({.qkv = t(qkv, {N, row}),
                                    .table = t(table, {T, HS}),
                                    .positions = {},
                                    .T = T,
                                    .NH = NH,
                                    .NKV = NKV,
                                    .direction = ms::RopeDirection::kForward});
                       }),
               0, 8.0 * N * (NH + NKV) * HS, 0, false);
        auto gate_up = filled(N * 2 * F, -4.0f, 4.0f), act = filled(N * F), dgate_up = filled(N * 2 * F);
        report("swiglu fwd",
               time_op(repeats,
                       [&] {
                           be.swiglu_forward({.inp = t(gate_up, {N, 2 * F}), .out = t(act, {N, F})});
                       }),
               0, 12.0 * N * F, 0, false);
        report(
            "swiglu bwd",
            time_op(repeats,
                    [&] {
                        be.swiglu_backward(
                            {.dout = t(act, {N, F}), .inp = t(gate_up, {N, 2 * F}), .dinp = t(dgate_up, {N, 2 * F})});
                    }),
            0, 20.0 * N * F, 0, false);
    }

    const double model_flops = 6.0 * kParams * N + 12.0 * L * B * NH * (T * (T + 1) / 2) * (C / NH);
    fmt::print("\nstep estimate (sum of the ops above): {:.1f} ms, of which GEMM {:.1f} ms ({:.0f}%)\n",
               step_seconds * 1e3, step_gemm_seconds * 1e3, 100.0 * step_gemm_seconds / step_seconds);
    fmt::print("model FLOPs/step {:.1f} G -> {:.1f} GFLOP/s = {:.0f}% of the sgemm peak probe\n", model_flops / 1e9,
               model_flops / step_seconds / 1e9, 100.0 * model_flops / step_seconds / peak);
    return 0;
}
