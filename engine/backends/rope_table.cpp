// rope_table.cpp: rope_inv_freq and rope_table (rope_table.h).
#include "engine/backends/rope_table.h"

#include <cmath>
#include <numbers>

#include "engine/core/check.h"

namespace ms {

std::vector<double> rope_inv_freq(int64_t HS, double theta, const RopeScaling& s) {
    MS_CHECK(HS > 0 && HS % 2 == 0,
             "rope: head size HS = {} is odd or not positive; rotary embeddings rotate pairs (i, i + HS/2), so HS must "
             "be even",
             HS);
    MS_CHECK(theta > 1.0, "rope: theta = {} must be > 1 (Llama: 10000 or 500000)", theta);
    std::vector<double> f(static_cast<size_t>(HS / 2));
    for (int64_t i = 0; i < HS / 2; ++i) {
        f[static_cast<size_t>(i)] = std::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(HS));
    }
    if (s.factor == 0.0 || s.factor == 1.0) return f;
    MS_CHECK(s.factor > 0.0, "rope: scaling factor = {} must be positive (0 or 1 turns scaling off)", s.factor);
    MS_CHECK(s.low_freq_factor > 0.0 && s.high_freq_factor > s.low_freq_factor,
             "rope: llama3 scaling needs high_freq_factor({}) > low_freq_factor({}) > 0", s.high_freq_factor,
             s.low_freq_factor);
    const double low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
    const double high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
    for (double& fi : f) {
        const double wavelen = 2.0 * std::numbers::pi / fi;
        if (wavelen < high_wavelen) continue;
        if (wavelen > low_wavelen) {
            fi /= s.factor;
            continue;
        }
        const double smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        fi = (1.0 - smooth) * fi / s.factor + smooth * fi;
    }
    return f;
}

std::vector<float> rope_table(int64_t positions, int64_t HS, double theta, const RopeScaling& scaling) {
    MS_CHECK(positions >= 0, "rope: positions = {} is negative", positions);
    const std::vector<double> f = rope_inv_freq(HS, theta, scaling);
    const int64_t half = HS / 2;
    std::vector<float> table(static_cast<size_t>(positions * HS));
    for (int64_t p = 0; p < positions; ++p) {
        float* row = table.data() + p * HS;
        for (int64_t i = 0; i < half; ++i) {
            const double angle = static_cast<double>(p) * f[static_cast<size_t>(i)];
            row[i] = static_cast<float>(std::cos(angle));
            row[half + i] = static_cast<float>(std::sin(angle));
        }
    }
    return table;
}

RopeDims rope_dims(const RopeArgs& a) {
    MS_CHECK(a.table.defined() && a.table.ndim == 2 && a.table.dtype == DType::kF32,
             "rope: table must be a (P, HS) fp32 tensor (rope_table.h), got {} dims of {}", a.table.ndim,
             dtype_name(a.table.dtype));
    const int64_t P = a.table.dim(0), HS = a.table.dim(1);
    MS_CHECK(HS > 0 && HS % 2 == 0,
             "rope: head size HS = {} (the table's width) is odd; rotary embeddings rotate pairs (i, i + HS/2), so HS "
             "must be even",
             HS);
    MS_CHECK(a.NH > 0 && a.NKV > 0 && a.NH % a.NKV == 0,
             "rope: NKV = {} key/value heads do not divide NH = {} query heads; grouped-query attention shares each "
             "key/value head among NH / NKV query heads",
             a.NKV, a.NH);
    const int64_t row = (a.NH + 2 * a.NKV) * HS;
    MS_CHECK(a.qkv.ndim >= 1 && a.qkv.dim(-1) == row,
             "rope: qkv rows have {} columns, expected (NH({}) + 2 * NKV({})) * HS({}) = {}",
             a.qkv.ndim >= 1 ? a.qkv.dim(-1) : 0, a.NH, a.NKV, HS, row);
    const int64_t N = a.qkv.numel() / row;
    if (a.positions.defined()) {
        MS_CHECK(a.positions.dtype == DType::kI32 && a.positions.numel() == N,
                 "rope: positions must be (N = {}) int32, got {} elements of {}", N, a.positions.numel(),
                 dtype_name(a.positions.dtype));
    } else {
        MS_CHECK(a.T > 0 && N % a.T == 0 && a.T <= P,
                 "rope: without positions row n sits at n % T, so T({}) must divide N({}) and fit the table's P({}) "
                 "rows",
                 a.T, N, P);
    }
    return {.N = N, .HS = HS, .P = P, .row = row, .rotated = (a.NH + a.NKV) * HS};
}

}  // namespace ms
