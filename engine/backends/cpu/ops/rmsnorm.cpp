// rmsnorm.cpp: RMSNorm (Llama) over the last dim, forward and backward.
//
// Layouts: inp/out/dout/dinp (N, C), weight (C), dweight (C) fp32 or D, rstd (N) fp32.
// Forward:  rstd = 1 / sqrt(mean(x^2) + eps), out = x * rstd * weight; rstd is saved for the backward.
// Backward: norm = x * rstd, g = dout * weight; dinp = (g - norm * mean(g * norm)) * rstd  (= or += per `accumulate`);
//           dweight += sum_n dout * norm.
// The fast backward does the rows in parallel for dinp (each thread's row of fp32 terms in its scratch), then blocks of
// 16 columns in parallel for dweight, each block summing its columns over all rows in order: every value is summed in
// the same order whatever the thread count. Precision: inp, weight, out, dout and dinp are D; rstd is fp32; dweight is
// fp32 or D (backend.h): a D dweight gets from_float<D>(old + the fp32 column sum), once per call.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "engine/backends/cpu/ops.h"
#include "engine/backends/cpu/ops/precision.h"

namespace ms::cpu {
namespace {

constexpr int64_t kColumnBlock = 16;  // floats of one cache line

template <class D>
void forward_reference(const RmsNormForwardArgs& a, int64_t N, int64_t C) {
    const D* inp = a.inp.as<D>();
    const D* weight = a.weight.as<D>();
    D* out = a.out.as<D>();
    for (int64_t n = 0; n < N; ++n) {
        const D* x = inp + n * C;
        double sq = 0.0;
        for (int64_t c = 0; c < C; ++c) sq += static_cast<double>(to_float(x[c])) * to_float(x[c]);
        const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(C) + a.eps);
        for (int64_t c = 0; c < C; ++c) {
            out[n * C + c] = from_float<D>(static_cast<float>(to_float(x[c]) * rstd * to_float(weight[c])));
        }
        a.rstd.f32()[n] = static_cast<float>(rstd);
    }
}

template <class D>
void forward_fast(const RmsNormForwardArgs& a, int64_t N, int64_t C) {
    const D* inp = a.inp.as<D>();
    const D* weight = a.weight.as<D>();
    D* out = a.out.as<D>();
    float* rstd_out = a.rstd.f32();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        const D* x = inp + n * C;
        float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
        for (int64_t c = 0; c < C; ++c) sq += to_float(x[c]) * to_float(x[c]);
        const float rstd = 1.0f / std::sqrt(sq / static_cast<float>(C) + a.eps);
        D* o = out + n * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) o[c] = from_float<D>(to_float(x[c]) * rstd * to_float(weight[c]));
        rstd_out[n] = rstd;
    }
}

template <class D, class G>
void backward_reference(const RmsNormBackwardArgs& a, int64_t N, int64_t C) {
    const D* dout = a.dout.as<D>();
    const D* inp = a.inp.as<D>();
    const D* weight = a.weight.as<D>();
    const float* rstd = a.rstd.f32();
    D* dinp = a.dinp.as<D>();
    G* dweight = a.dweight.as<G>();
    for (int64_t n = 0; n < N; ++n) {
        const D* x = inp + n * C;
        const D* d = dout + n * C;
        double g_norm_mean = 0.0;
        for (int64_t c = 0; c < C; ++c) {
            g_norm_mean += static_cast<double>(to_float(d[c])) * to_float(weight[c]) * to_float(x[c]) * rstd[n];
        }
        g_norm_mean /= static_cast<double>(C);
        for (int64_t c = 0; c < C; ++c) {
            const double g = static_cast<double>(to_float(d[c])) * to_float(weight[c]);
            const double norm = static_cast<double>(to_float(x[c])) * rstd[n];
            const float di = static_cast<float>((g - norm * g_norm_mean) * rstd[n]);
            dinp[n * C + c] = from_float<D>(a.accumulate == Accumulate::kAdd ? to_float(dinp[n * C + c]) + di : di);
        }
    }
    for (int64_t c = 0; c < C; ++c) {
        double dw = 0.0;
        for (int64_t n = 0; n < N; ++n) {
            dw += static_cast<double>(to_float(dout[n * C + c])) * to_float(inp[n * C + c]) * rstd[n];
        }
        dweight[c] = add_rounded(dweight[c], static_cast<float>(dw));
    }
}

template <class D, class G>
void backward_fast(const RmsNormBackwardArgs& a, int64_t N, int64_t C) {
    const D* dout = a.dout.as<D>();
    const D* inp = a.inp.as<D>();
    const D* weight = a.weight.as<D>();
    const float* rstd = a.rstd.f32();
    D* dinp = a.dinp.as<D>();
    G* dweight = a.dweight.as<G>();
    const bool add = a.accumulate == Accumulate::kAdd;
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n) {
            const D* x = inp + n * C;
            const D* d = dout + n * C;
            const float rs = rstd[n];
            float g_norm_sum = 0.0f;
#pragma omp simd reduction(+ : g_norm_sum)
            for (int64_t c = 0; c < C; ++c) g_norm_sum += to_float(d[c]) * to_float(weight[c]) * to_float(x[c]) * rs;
            const float g_norm_mean = g_norm_sum / static_cast<float>(C);
            // The row's fp32 terms first, then the store: kAdd rounds old + term, the term exactly kOverwrite's (a
            // compiler cannot fuse the add into the term's last multiply across the scratch row).
            float* term = scratch_f32(Scratch::kA, static_cast<size_t>(C));
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) {
                term[c] = (to_float(d[c]) * to_float(weight[c]) - to_float(x[c]) * rs * g_norm_mean) * rs;
            }
            D* di = dinp + n * C;
            if (add) {
#pragma omp simd
                for (int64_t c = 0; c < C; ++c) di[c] = from_float<D>(to_float(di[c]) + term[c]);
            } else {
#pragma omp simd
                for (int64_t c = 0; c < C; ++c) di[c] = from_float<D>(term[c]);
            }
        }
        const int64_t num_blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < num_blocks; ++blk) {
            const int64_t c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
            float dw[kColumnBlock] = {};
            for (int64_t n = 0; n < N; ++n) {
                const D* x = inp + n * C;
                const D* d = dout + n * C;
                const float rs = rstd[n];
#pragma omp simd
                for (int64_t c = c0; c < c1; ++c) dw[c - c0] += to_float(d[c]) * to_float(x[c]) * rs;
            }
            for (int64_t c = c0; c < c1; ++c) dweight[c] = add_rounded(dweight[c], dw[c - c0]);
        }
    }
}

}  // namespace

void rmsnorm_forward(const RmsNormForwardArgs& a, OpMode mode) {
    const int64_t C = a.inp.dim(-1);
    MS_CHECK(C > 0, "rmsnorm: inp has no columns");
    const int64_t N = a.inp.numel() / C;
    MS_CHECK(a.out.numel() == N * C, "rmsnorm: out has {} elements, expected N({}) * C({})", a.out.numel(), N, C);
    MS_CHECK(a.weight.numel() == C, "rmsnorm: weight has {} elements, expected C = {}", a.weight.numel(), C);
    MS_CHECK(a.rstd.numel() == N, "rmsnorm: rstd has {} elements, expected N = {}", a.rstd.numel(), N);
    const DType D = activation_dtype(a.inp, "rmsnorm_forward", "inp");
    expect_d(a.weight, D, "rmsnorm_forward", "weight", "inp");
    expect_d(a.out, D, "rmsnorm_forward", "out", "inp");
    expect_f32(a.rstd, "rmsnorm_forward", "rstd", "statistics");
    dispatch_float(D, [&](auto tag) {
        using T = decltype(tag);
        if (mode == OpMode::kReference) {
            forward_reference<T>(a, N, C);
        } else {
            forward_fast<T>(a, N, C);
        }
    });
}

void rmsnorm_backward(const RmsNormBackwardArgs& a, OpMode mode) {
    const int64_t C = a.inp.dim(-1);
    MS_CHECK(C > 0, "rmsnorm: inp has no columns");
    const int64_t N = a.inp.numel() / C;
    MS_CHECK(a.dout.numel() == N * C && a.dinp.numel() == N * C,
             "rmsnorm: dout/dinp have {}/{} elements, expected N({}) * C({})", a.dout.numel(), a.dinp.numel(), N, C);
    MS_CHECK(a.weight.numel() == C && a.dweight.numel() == C,
             "rmsnorm: weight/dweight have {}/{} elements, expected C = {}", a.weight.numel(), a.dweight.numel(), C);
    MS_CHECK(a.rstd.numel() == N, "rmsnorm: rstd has {} elements, expected N = {}", a.rstd.numel(), N);
    const DType D = activation_dtype(a.inp, "rmsnorm_backward", "inp");
    expect_d(a.dout, D, "rmsnorm_backward", "dout", "inp");
    expect_d(a.weight, D, "rmsnorm_backward", "weight", "inp");
    expect_d(a.dinp, D, "rmsnorm_backward", "dinp", "inp");
    expect_f32(a.rstd, "rmsnorm_backward", "rstd", "statistics");
    expect_grad(a.dweight, D, "rmsnorm_backward", "dweight", "inp");
    dispatch_float(D, [&](auto tag) {
        using T = decltype(tag);
        dispatch_grad<T>(a.dweight.dtype, [&](auto grad_tag) {
            using GT = decltype(grad_tag);
            if (mode == OpMode::kReference) {
                backward_reference<T, GT>(a, N, C);
            } else {
                backward_fast<T, GT>(a, N, C);
            }
        });
    });
}

}  // namespace ms::cpu
