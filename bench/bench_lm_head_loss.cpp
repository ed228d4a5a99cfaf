// bench_lm_head_loss.cpp: the GPT-2 124M LM head (C = 768, Vp = 50304, V = 50257) and its loss, forward and backward,
// unfused (matmul_forward, cross_entropy_forward kMaxSumExp, cross_entropy_backward, matmul_backward: the whole
// (N, Vp) logits held) against the fused lm_head_loss (chunks of rows, backend.h), on the fast CPU backend in fp32,
// at N = 4*64 and N = 8*256 rows, on 1 and 2 OpenMP threads, side by side in one run.
//   build/bench_lm_head_loss [repeats] [chunk rows to sweep...]
// Each line: the median ms per call of `repeats` calls after one warm-up (the variants interleaved call by call), the
// GFLOP/s of the three GEMMs (6 N C Vp flops), and the logits memory the call holds (unfused: the (N, Vp) logits;
// fused: its scratch). The chunk rows
// given on the command line (default 128 256 512 1024) are timed too, at both thread counts, to show the backend's
// choice (lm_head_loss_chunk_rows) against its neighbours. OPENBLAS_CORETYPE as in bench_ops.cpp.
#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/core/timer.h"

namespace {

using ms::Tensor;

constexpr int64_t C = 768, Vp = 50304, V = 50257;

std::vector<float> filled(int64_t n, float lo, float hi, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = dist(rng);
    return v;
}

Tensor t(std::vector<float>& v, std::initializer_list<int64_t> dims) { return Tensor::f32(v.data(), dims); }
Tensor t(std::vector<int32_t>& v, std::initializer_list<int64_t> dims) { return Tensor::i32(v.data(), dims); }

// Medians of `repeats` timed calls of each variant after one warm-up call each, the variants interleaved call by
// call, so a change in the machine's load (other jobs on a shared machine) falls on all of them alike.
std::vector<double> interleaved_medians(int repeats, const std::vector<std::function<void()>>& variants) {
    for (const auto& fn : variants) fn();
    std::vector<std::vector<double>> times(variants.size());
    for (int r = 0; r < repeats; ++r) {
        for (size_t v = 0; v < variants.size(); ++v) {
            const double t0 = ms::now_seconds();
            variants[v]();
            times[v].push_back(ms::now_seconds() - t0);
        }
    }
    std::vector<double> medians;
    for (auto& t : times) {
        std::sort(t.begin(), t.end());
        medians.push_back(t[t.size() / 2]);
    }
    return medians;
}

void line(const std::string& what, int threads, int64_t N, double seconds, int64_t logits_bytes) {
    fmt::print("  {:<28} {:>2} thr  {:10.1f} ms  {:7.1f} GFLOP/s  logits held {:9.1f} MiB\n", what, threads,
               seconds * 1e3, 6.0 * N * C * Vp / seconds / 1e9, static_cast<double>(logits_bytes) / (1 << 20));
}

void bench_rows(ms::Backend& be, int64_t N, int repeats, const std::vector<int64_t>& sweep) {
    auto lnf = filled(N * C, -2.0f, 2.0f, 1), wte = filled(Vp * C, -0.05f, 0.05f, 2);
    auto dlnf = filled(N * C, 0.0f, 0.0f, 3), dwte = filled(Vp * C, 0.0f, 0.0f, 4);
    auto dloss = filled(N, 1.0f / N, 1.0f / N, 5), losses = filled(N, 0.0f, 0.0f, 6);
    auto row_max = losses, sum_exp = losses, target_logit = losses;
    std::vector<int32_t> targets(N);
    for (int64_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((i * 7919) % V);
    std::vector<float> logits;  // the unfused ops' (N, Vp) logits
    const auto unfused = [&] {
        be.matmul_forward({.inp = t(lnf, {N, C}), .weight = t(wte, {Vp, C}), .bias = {}, .out = t(logits, {N, Vp})});
        be.cross_entropy_forward({.logits = t(logits, {N, Vp}),
                                  .targets = t(targets, {N}),
                                  .row_max = t(row_max, {N}),
                                  .sum_exp = t(sum_exp, {N}),
                                  .target_logit = t(target_logit, {N}),
                                  .vocab_start = 0,
                                  .vocab_valid_local = V,
                                  .phase = ms::CrossEntropyPhase::kMaxSumExp});
        for (int64_t n = 0; n < N; ++n) losses[n] = std::log(sum_exp[n]) + row_max[n] - target_logit[n];
        be.cross_entropy_backward({.logits = t(logits, {N, Vp}),
                                   .targets = t(targets, {N}),
                                   .row_max = t(row_max, {N}),
                                   .sum_exp = t(sum_exp, {N}),
                                   .dloss = t(dloss, {N}),
                                   .vocab_start = 0,
                                   .vocab_valid_local = V});
        be.matmul_backward({.dout = t(logits, {N, Vp}),
                            .inp = t(lnf, {N, C}),
                            .weight = t(wte, {Vp, C}),
                            .dinp = t(dlnf, {N, C}),
                            .dweight = t(dwte, {Vp, C}),
                            .dbias = {},
                            .accumulate = ms::Accumulate::kOverwrite});
    };
    std::vector<float> scratch;
    const auto fused = [&](int64_t chunk) {
        const int64_t elems = ms::lm_head_loss_scratch_elems(ms::BackendKind::kCPU, ms::DType::kF32, N, Vp, chunk);
        return [&, chunk, elems] {
            be.lm_head_loss({.lnf = t(lnf, {N, C}),
                             .wte = t(wte, {Vp, C}),
                             .targets = t(targets, {N}),
                             .dloss = t(dloss, {N}),
                             .losses = t(losses, {N}),
                             .dlnf = t(dlnf, {N, C}),
                             .dwte = t(dwte, {Vp, C}),
                             .scratch = t(scratch, {elems}),
                             .vocab_start = 0,
                             .vocab_valid_local = V,
                             .chunk_rows = chunk});
        };
    };
    const int64_t chosen = ms::lm_head_loss_chunk_rows(ms::BackendKind::kCPU, ms::DType::kF32, N, Vp);
    std::vector<int64_t> chunks = {chosen};
    for (int64_t c : sweep) {
        if (c != chosen && c < N) chunks.push_back(c);
    }
    int64_t max_elems = 0;
    for (int64_t chunk : chunks) {
        max_elems =
            std::max(max_elems, ms::lm_head_loss_scratch_elems(ms::BackendKind::kCPU, ms::DType::kF32, N, Vp, chunk));
    }
    scratch.assign(static_cast<size_t>(max_elems), 0.0f);
    logits.assign(static_cast<size_t>(N * Vp), 0.0f);
    std::vector<std::function<void()>> variants = {unfused};
    for (int64_t chunk : chunks) variants.push_back(fused(chunk));
    fmt::print("N = {} rows (lm_head_loss_chunk_rows: {}):\n", N, chosen);
    for (const int threads : {1, 2}) {
        omp_set_num_threads(threads);
        const std::vector<double> med = interleaved_medians(repeats, variants);
        line("unfused (4 ops)", threads, N, med[0], N * Vp * 4);
        for (size_t i = 0; i < chunks.size(); ++i) {
            const int64_t chunk = chunks[i];
            const std::string what = chunk == chosen ? fmt::format("fused, chunk {} (default)", chunk)
                                                     : fmt::format("fused, chunk {}", chunk);
            line(what, threads, N, med[i + 1],
                 ms::lm_head_loss_scratch_elems(ms::BackendKind::kCPU, ms::DType::kF32, N, Vp, chunk) * 4);
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    const int repeats = argc > 1 ? std::atoi(argv[1]) : 3;
    std::vector<int64_t> sweep;
    for (int i = 2; i < argc; ++i) sweep.push_back(std::atoll(argv[i]));
    if (argc <= 2) sweep = {128, 256, 512, 1024};
    ms::BackendOptions options;
    options.mode = ms::OpMode::kFast;
    auto backend = ms::make_backend(options);
    fmt::print("bench_lm_head_loss: C {} Vp {} (V {}), fp32, OpenBLAS core {}, median of {} after a warm-up\n", C, Vp,
               V, openblas_get_corename(), repeats);
    for (const int64_t N : {int64_t{4 * 64}, int64_t{8 * 256}}) bench_rows(*backend, N, repeats, sweep);
    return 0;
}
