// layernorm.cpp: LayerNorm over the last dim, forward and backward.
//
// Layouts: inp/out/dout/dinp (N, C), weight/bias/dweight/dbias (C), mean/rstd (N) fp32.
// Forward:  norm = (x - mean) * rstd with rstd = 1 / sqrt(var + eps) (biased variance, two passes over the row),
//           out = norm * weight + bias; mean and rstd are saved for the backward.
// Backward: g = dout * weight; dinp = (g - mean(g) - norm * mean(g * norm)) * rstd   (= or += per `accumulate`)
//           dweight += sum_n dout * norm;  dbias += sum_n dout.
// The fast backward does the rows in parallel for dinp, then the columns in parallel for dweight/dbias (each
// thread sums its columns over all rows in order): deterministic, no per-thread partial buffers.
// Precision: inp, weight, bias, out, dout and dinp are D; mean and rstd are fp32; dweight and dbias are fp32 or D.
// Values are loaded with to_float and every D output element is rounded once on store (kAdd: the fp32 sum of the
// old value and the new term); each dweight / dbias element gets its column's whole fp32 sum added in one step, so a
// D one is rounded once per call.
// Residual fusion (residual_out defined, backend.h): residual.cpp's op writes residual_out, then the forward above
// normalises it, in the same mode; so the fused op is the two ops in sequence, bit for bit, by construction.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "engine/backends/cpu/ops.h"
#include "engine/backends/cpu/ops/precision.h"

namespace ms::cpu {
namespace {

void check_row_vector(const Tensor& t, int64_t C, const char* what) {
    MS_CHECK(t.numel() == C, "layernorm: {} has {} elements, expected C = {}", what, t.numel(), C);
}

template <class D>
void forward_reference(const LayerNormForwardArgs& a, int64_t N, int64_t C) {
    const D* inp = a.inp.as<D>();
    const D* weight = a.weight.as<D>();
    const D* bias = a.bias.as<D>();
    D* out = a.out.as<D>();
    for (int64_t n = 0; n < N; ++n) {
        const D* x = inp + n * C;
        double mean = 0.0;
        for (int64_t c = 0; c < C; ++c) mean += to_float(x[c]);
        mean /= static_cast<double>(C);
        double var = 0.0;
        for (int64_t c = 0; c < C; ++c) var += (to_float(x[c]) - mean) * (to_float(x[c]) - mean);
        var /= static_cast<double>(C);
        const double rstd = 1.0 / std::sqrt(var + a.eps);
        for (int64_t c = 0; c < C; ++c) {
            out[n * C + c] = from_float<D>(
                static_cast<float>((to_float(x[c]) - mean) * rstd * to_float(weight[c]) + to_float(bias[c])));
        }
        a.mean.f32()[n] = static_cast<float>(mean);
        a.rstd.f32()[n] = static_cast<float>(rstd);
    }
}

template <class D>
void forward_fast(const LayerNormForwardArgs& a, int64_t N, int64_t C) {
    const D* inp = a.inp.as<D>();
    const D* weight = a.weight.as<D>();
    const D* bias = a.bias.as<D>();
    D* out = a.out.as<D>();
    float* mean_out = a.mean.f32();
    float* rstd_out = a.rstd.f32();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        const D* x = inp + n * C;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < C; ++c) sum += to_float(x[c]);
        const float mean = sum / static_cast<float>(C);
        float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
        for (int64_t c = 0; c < C; ++c) sq += (to_float(x[c]) - mean) * (to_float(x[c]) - mean);
        const float rstd = 1.0f / std::sqrt(sq / static_cast<float>(C) + a.eps);
        D* o = out + n * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
            o[c] = from_float<D>((to_float(x[c]) - mean) * rstd * to_float(weight[c]) + to_float(bias[c]));
        }
        mean_out[n] = mean;
        rstd_out[n] = rstd;
    }
}

template <class D>
void backward_reference(const LayerNormBackwardArgs& a, int64_t N, int64_t C) {
    const D* dout = a.dout.as<D>();
    const D* inp = a.inp.as<D>();
    const D* weight = a.weight.as<D>();
    const float* mean = a.mean.f32();
    const float* rstd = a.rstd.f32();
    D* dinp = a.dinp.as<D>();
    const ParamGrad<D> dweight = ParamGrad<D>::of(a.dweight);
    const ParamGrad<D> dbias = ParamGrad<D>::of(a.dbias);
    for (int64_t n = 0; n < N; ++n) {
        const D* x = inp + n * C;
        const D* d = dout + n * C;
        double g_mean = 0.0, g_norm_mean = 0.0;
        for (int64_t c = 0; c < C; ++c) {
            const double norm = (to_float(x[c]) - static_cast<double>(mean[n])) * rstd[n];
            g_mean += static_cast<double>(to_float(d[c])) * to_float(weight[c]);
            g_norm_mean += static_cast<double>(to_float(d[c])) * to_float(weight[c]) * norm;
        }
        g_mean /= static_cast<double>(C);
        g_norm_mean /= static_cast<double>(C);
        for (int64_t c = 0; c < C; ++c) {
            const double norm = (to_float(x[c]) - static_cast<double>(mean[n])) * rstd[n];
            const double g = static_cast<double>(to_float(d[c])) * to_float(weight[c]);
            const float di = static_cast<float>((g - g_mean - norm * g_norm_mean) * rstd[n]);
            dinp[n * C + c] = from_float<D>(a.accumulate == Accumulate::kAdd ? to_float(dinp[n * C + c]) + di : di);
        }
    }
    for (int64_t c = 0; c < C; ++c) {
        double dw = 0.0, db = 0.0;
        for (int64_t n = 0; n < N; ++n) {
            const double norm = (to_float(inp[n * C + c]) - static_cast<double>(mean[n])) * rstd[n];
            dw += to_float(dout[n * C + c]) * norm;
            db += to_float(dout[n * C + c]);
        }
        dweight.add(c, static_cast<float>(dw));
        dbias.add(c, static_cast<float>(db));
    }
}

template <class D>
void backward_fast(const LayerNormBackwardArgs& a, int64_t N, int64_t C) {
    const D* dout = a.dout.as<D>();
    const D* inp = a.inp.as<D>();
    const D* weight = a.weight.as<D>();
    const float* mean = a.mean.f32();
    const float* rstd = a.rstd.f32();
    D* dinp = a.dinp.as<D>();
    const ParamGrad<D> dweight = ParamGrad<D>::of(a.dweight);
    const ParamGrad<D> dbias = ParamGrad<D>::of(a.dbias);
    const bool add = a.accumulate == Accumulate::kAdd;
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n) {
            const D* x = inp + n * C;
            const D* d = dout + n * C;
            const float mu = mean[n], rs = rstd[n];
            float g_sum = 0.0f, g_norm_sum = 0.0f;
#pragma omp simd reduction(+ : g_sum, g_norm_sum)
            for (int64_t c = 0; c < C; ++c) {
                const float g = to_float(d[c]) * to_float(weight[c]);
                g_sum += g;
                g_norm_sum += g * (to_float(x[c]) - mu) * rs;
            }
            const float g_mean = g_sum / static_cast<float>(C);
            const float g_norm_mean = g_norm_sum / static_cast<float>(C);
            D* di = dinp + n * C;
            if (add) {
#pragma omp simd
                for (int64_t c = 0; c < C; ++c) {
                    di[c] = from_float<D>(to_float(di[c]) + (to_float(d[c]) * to_float(weight[c]) - g_mean -
                                                             (to_float(x[c]) - mu) * rs * g_norm_mean) *
                                                                rs);
                }
            } else {
#pragma omp simd
                for (int64_t c = 0; c < C; ++c) {
                    di[c] = from_float<D>(
                        (to_float(d[c]) * to_float(weight[c]) - g_mean - (to_float(x[c]) - mu) * rs * g_norm_mean) *
                        rs);
                }
            }
        }
        // Columns in blocks of 16 floats (one cache line), each block summed over all rows in order.
        const int64_t num_blocks = (C + 15) / 16;
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < num_blocks; ++blk) {
            const int64_t c0 = blk * 16, c1 = std::min(C, c0 + 16);
            float dw[16] = {}, db[16] = {};
            for (int64_t n = 0; n < N; ++n) {
                const D* x = inp + n * C;
                const D* d = dout + n * C;
                const float mu = mean[n], rs = rstd[n];
#pragma omp simd
                for (int64_t c = c0; c < c1; ++c) {
                    dw[c - c0] += to_float(d[c]) * (to_float(x[c]) - mu) * rs;
                    db[c - c0] += to_float(d[c]);
                }
            }
            for (int64_t c = c0; c < c1; ++c) {
                dweight.add(c, dw[c - c0]);
                dbias.add(c, db[c - c0]);
            }
        }
    }
}

}  // namespace

void layernorm_forward(const LayerNormForwardArgs& a, OpMode mode) {
    if (a.residual_out.defined()) {
        MS_CHECK(!a.inp.defined(),
                 "layernorm: inp must be undefined when residual_out is defined (its sum is the input)");
        MS_CHECK(!a.residual_bias.defined() || a.residual_bias.numel() == a.out.dim(-1),
                 "layernorm: residual_bias has {} elements, expected C = {}", a.residual_bias.numel(), a.out.dim(-1));
        residual_forward({.a = a.residual_a, .b = a.residual_b, .out = a.residual_out, .bias = a.residual_bias}, mode);
        LayerNormForwardArgs ln{.inp = a.residual_out,
                                .weight = a.weight,
                                .bias = a.bias,
                                .out = a.out,
                                .mean = a.mean,
                                .rstd = a.rstd,
                                .eps = a.eps};
        layernorm_forward(ln, mode);
        return;
    }
    const int64_t C = a.inp.dim(-1);
    const int64_t N = a.inp.numel() / C;
    MS_CHECK(a.out.numel() == N * C, "layernorm: out has {} elements, expected N({}) * C({})", a.out.numel(), N, C);
    check_row_vector(a.weight, C, "weight");
    check_row_vector(a.bias, C, "bias");
    MS_CHECK(a.mean.numel() == N && a.rstd.numel() == N, "layernorm: mean/rstd have {}/{} elements, expected N = {}",
             a.mean.numel(), a.rstd.numel(), N);
    const DType D = activation_dtype(a.inp, "layernorm_forward", "inp");
    expect_d(a.weight, D, "layernorm_forward", "weight", "inp");
    expect_d(a.bias, D, "layernorm_forward", "bias", "inp");
    expect_d(a.out, D, "layernorm_forward", "out", "inp");
    expect_f32(a.mean, "layernorm_forward", "mean", "statistics");
    expect_f32(a.rstd, "layernorm_forward", "rstd", "statistics");
    dispatch_float(D, [&](auto tag) {
        using T = decltype(tag);
        if (mode == OpMode::kReference) {
            forward_reference<T>(a, N, C);
        } else {
            forward_fast<T>(a, N, C);
        }
    });
}

void layernorm_backward(const LayerNormBackwardArgs& a, OpMode mode) {
    const int64_t C = a.inp.dim(-1);
    const int64_t N = a.inp.numel() / C;
    MS_CHECK(a.dout.numel() == N * C && a.dinp.numel() == N * C,
             "layernorm: dout/dinp have {}/{} elements, expected N({}) * C({})", a.dout.numel(), a.dinp.numel(), N, C);
    check_row_vector(a.weight, C, "weight");
    check_row_vector(a.dweight, C, "dweight");
    check_row_vector(a.dbias, C, "dbias");
    MS_CHECK(a.mean.numel() == N && a.rstd.numel() == N, "layernorm: mean/rstd have {}/{} elements, expected N = {}",
             a.mean.numel(), a.rstd.numel(), N);
    const DType D = activation_dtype(a.inp, "layernorm_backward", "inp");
    expect_d(a.dout, D, "layernorm_backward", "dout", "inp");
    expect_d(a.weight, D, "layernorm_backward", "weight", "inp");
    expect_d(a.dinp, D, "layernorm_backward", "dinp", "inp");
    expect_f32(a.mean, "layernorm_backward", "mean", "statistics");
    expect_f32(a.rstd, "layernorm_backward", "rstd", "statistics");
    expect_grad(a.dweight, D, "layernorm_backward", "dweight", "inp");
    expect_grad(a.dbias, D, "layernorm_backward", "dbias", "inp");
    dispatch_float(D, [&](auto tag) {
        using T = decltype(tag);
        if (mode == OpMode::kReference) {
            backward_reference<T>(a, N, C);
        } else {
            backward_fast<T>(a, N, C);
        }
    });
}

}  // namespace ms::cpu
