// attention_tiles.h: the kernels of attention_block.cpp's fast path (ring blocks; CLIP's and self-play's
// bidirectional attention) for one query head, in fp32.
//
// Query rows go in tiles of kTile, so that a tile's scores, softmax sums and weighted rows are kTile independent
// chains of additions: one row alone is a chain as long as its keys, whose latency bounds a row-at-a-time loop. A
// row's own sums run in a fixed order whatever the tile around it (scores over d from 0, softmax sum and weighted
// rows over u from 0), so results do not depend on the thread count. Keys and values are read transposed (HS rows
// of np = kv_rows rounded up to kLanes, zero past kv_rows), so a tile's scores are kLanes-wide vector updates.
//   forward:  s_u = (q_t * scale) . k_u;  lse_t = max + log sum_u exp(s_u - max);  o_t = sum_u p_u v_u
//   backward: p_u = exp(s_u - lse_t);  ds_u = p_u (dO_t . v_u - D_t) * scale, D_t = dO_t . O_t;
//             dq_t += sum_u ds_u k_u;  dk_u += sum_t ds_u q_t;  dv_u += sum_t p_u dO_t
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/backends/cpu/ops/vec_math.h"

namespace ms::cpu::tiles {

constexpr int64_t kTile = 8;
constexpr int64_t kLanes = 16;

inline int64_t round_up_lanes(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// Query rows [t0, t0 + rows) and the keys each sees, [0, n); the kTile - rows rows past the end repeat the last row,
// so the kernels always run kTile rows, and their results are not kept.
struct Tile {
    int64_t t[kTile], n[kTile];
    int64_t rows, n_min, n_max;
};

// keys(t): the number of keys query row t sees.
template <class Keys>
Tile make_tile(int64_t t0, int64_t end, Keys keys) {
    Tile tile{};
    tile.rows = std::min(kTile, end - t0);
    for (int64_t r = 0; r < kTile; ++r) {
        tile.t[r] = t0 + std::min(r, tile.rows - 1);
        tile.n[r] = keys(tile.t[r]);
    }
    tile.n_min = *std::min_element(tile.n, tile.n + kTile);
    tile.n_max = *std::max_element(tile.n, tile.n + kTile);
    return tile;
}

// Per-thread scratch, grown once to the largest shapes seen.
struct HeadScratch {
    std::vector<float> kt, vt;     // a key/value head's keys and values transposed: HS rows of np
    std::vector<float> qs, dos;    // a tile's queries (times the scale) and output gradients: HS rows of kTile
    std::vector<float> p, dp, ds;  // kTile rows of np: scores, then probabilities; dO . v; the scores' gradients
    std::vector<float> outs;       // kTile rows of HS
};

inline HeadScratch& head_scratch() {
    thread_local HeadScratch scratch;
    return scratch;
}

// dst (HS rows of np) = rows [0, rows) of src (row u at src + u * stride) transposed; zero past them.
inline void transpose_rows(const float* src, int64_t stride, int64_t rows, int64_t HS, int64_t np,
                           std::vector<float>& dst) {
    dst.assign(static_cast<size_t>(HS * np), 0.0f);
    for (int64_t d = 0; d < HS; ++d) {
        for (int64_t u = 0; u < rows; ++u) dst[d * np + u] = src[u * stride + d];
    }
}

// dst[d * kTile + r] = scale * src[t_r * stride + d]: the tile's rows of a head, transposed.
inline void tile_columns(const float* src, int64_t stride, const Tile& tile, int64_t HS, float scale,
                         std::vector<float>& dst) {
    dst.resize(static_cast<size_t>(HS * kTile));
    for (int64_t r = 0; r < kTile; ++r) {
        for (int64_t d = 0; d < HS; ++d) dst[d * kTile + r] = src[tile.t[r] * stride + d] * scale;
    }
}

// out[r * np + u] = sum over d of a[d * kTile + r] * bt[d * np + u] for u < width (a multiple of kLanes), summed
// from d = 0 in kTile x kLanes accumulators.
inline void tile_dots(const float* a, const float* bt, int64_t HS, int64_t np, int64_t width, float* out) {
    for (int64_t u0 = 0; u0 < width; u0 += kLanes) {
        float acc[kTile][kLanes] = {};
        for (int64_t d = 0; d < HS; ++d) {
            const float* brow = bt + d * np + u0;
            for (int64_t r = 0; r < kTile; ++r) {
                const float x = a[d * kTile + r];
#pragma omp simd
                for (int64_t k = 0; k < kLanes; ++k) acc[r][k] += x * brow[k];
            }
        }
        for (int64_t r = 0; r < kTile; ++r) std::copy_n(acc[r], kLanes, out + r * np + u0);
    }
}

// Rows r < out_rows of out (row r at out + r * out_stride, HS columns) = (their values if accumulate, else 0) plus
// the sum over u < n[r], from u = 0, of w[r * np + u] * src row u (at src + u * stride).
inline void tile_weighted_rows(const float* w, int64_t np, const Tile& tile, const float* src, int64_t stride,
                               int64_t HS, float* out, int64_t out_stride, int64_t out_rows, bool accumulate) {
    int64_t c0 = 0;
    for (; c0 + kLanes <= HS; c0 += kLanes) {
        float acc[kTile][kLanes] = {};
        if (accumulate) {
            for (int64_t r = 0; r < out_rows; ++r) std::copy_n(out + r * out_stride + c0, kLanes, acc[r]);
        }
        for (int64_t u = 0; u < tile.n_min; ++u) {
            const float* row = src + u * stride + c0;
            for (int64_t r = 0; r < kTile; ++r) {
                const float x = w[r * np + u];
#pragma omp simd
                for (int64_t k = 0; k < kLanes; ++k) acc[r][k] += x * row[k];
            }
        }
        for (int64_t u = tile.n_min; u < tile.n_max; ++u) {
            const float* row = src + u * stride + c0;
            for (int64_t r = 0; r < kTile; ++r) {
                if (u >= tile.n[r]) continue;
                const float x = w[r * np + u];
#pragma omp simd
                for (int64_t k = 0; k < kLanes; ++k) acc[r][k] += x * row[k];
            }
        }
        for (int64_t r = 0; r < out_rows; ++r) std::copy_n(acc[r], kLanes, out + r * out_stride + c0);
    }
    for (; c0 < HS; ++c0) {
        for (int64_t r = 0; r < out_rows; ++r) {
            float acc = accumulate ? out[r * out_stride + c0] : 0.0f;
            for (int64_t u = 0; u < tile.n[r]; ++u) acc += w[r * np + u] * src[u * stride + c0];
            out[r * out_stride + c0] = acc;
        }
    }
}

// A key/value head's kv_rows keys and values (rows at k + u * stride, v + u * stride) into x.kt and x.vt (values
// only when with_values); returns their width np.
inline int64_t load_keys(HeadScratch& x, const float* k, const float* v, int64_t stride, int64_t kv_rows, int64_t HS,
                         bool with_values) {
    const int64_t np = round_up_lanes(kv_rows);
    transpose_rows(k, stride, kv_rows, HS, np, x.kt);
    if (with_values) transpose_rows(v, stride, kv_rows, HS, np, x.vt);
    return np;
}

// The forward of one query head over query rows [q_begin, q_end), row t seeing keys [0, keys(t)) of kv_rows: queries
// at q + t * q_stride, keys and values at k + u * kv_stride, v + u * kv_stride. Calls store(t, o_t (HS floats), lse_t)
// once per row, in row order.
template <class Keys, class Store>
void head_forward(const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_stride, int64_t kv_rows,
                  int64_t HS, int64_t q_begin, int64_t q_end, Keys keys, Store store) {
    HeadScratch& x = head_scratch();
    const int64_t np = load_keys(x, k, v, kv_stride, kv_rows, HS, false);
    x.p.resize(static_cast<size_t>(kTile * np));
    x.outs.resize(static_cast<size_t>(kTile * HS));
    const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
    for (int64_t t0 = q_begin; t0 < q_end; t0 += kTile) {
        const Tile tile = make_tile(t0, q_end, keys);
        tile_columns(q, q_stride, tile, HS, scale, x.qs);
        tile_dots(x.qs.data(), x.kt.data(), HS, np, round_up_lanes(tile.n_max), x.p.data());
        float sum[kTile], max[kTile];
        for (int64_t r = 0; r < kTile; ++r) {
            float* p = x.p.data() + r * np;
            max[r] = max_f32(p, tile.n[r]);
#pragma omp simd
            for (int64_t u = 0; u < tile.n[r]; ++u) p[u] = exp_approx(p[u] - max[r]);
            sum[r] = 0.0f;
        }
        for (int64_t u = 0; u < tile.n_max; ++u) {
            for (int64_t r = 0; r < kTile; ++r) {
                if (u < tile.n[r]) sum[r] += x.p[r * np + u];
            }
        }
        for (int64_t r = 0; r < kTile; ++r) {
            const float inv_sum = 1.0f / sum[r];
            float* p = x.p.data() + r * np;
#pragma omp simd
            for (int64_t u = 0; u < tile.n[r]; ++u) p[u] *= inv_sum;
        }
        tile_weighted_rows(x.p.data(), np, tile, v, kv_stride, HS, x.outs.data(), HS, kTile, false);
        for (int64_t r = 0; r < tile.rows; ++r) store(tile.t[r], x.outs.data() + r * HS, max[r] + std::log(sum[r]));
    }
}

// One query head's tensors for head_backward: row t of each at base + t * stride; lse[t] the row's final
// log-sum-exp; the key/value head's rows at k (and with its values in x.kt, x.vt: load_keys, np wide); dq, dk, dv
// added into.
struct HeadGrads {
    const float *q, *dO, *O, *lse, *k;
    int64_t q_stride, dO_stride, O_stride, k_stride;
    float *dq, *dk, *dv;
    int64_t dq_stride, dkv_stride;
};

// The backward of one query head over query rows [q_begin, q_end), row t seeing keys [0, keys(t)): adds its terms
// into dq, dk and dv (HeadGrads), the tile's rows in order.
template <class Keys>
void head_backward(const HeadGrads& g, int64_t HS, int64_t np, int64_t q_begin, int64_t q_end, Keys keys,
                   HeadScratch& x) {
    for (auto* m : {&x.p, &x.dp, &x.ds}) m->resize(static_cast<size_t>(kTile * np));
    const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
    for (int64_t t0 = q_begin; t0 < q_end; t0 += kTile) {
        const Tile tile = make_tile(t0, q_end, keys);
        const int64_t width = round_up_lanes(tile.n_max);
        tile_columns(g.q, g.q_stride, tile, HS, scale, x.qs);
        tile_dots(x.qs.data(), x.kt.data(), HS, np, width, x.p.data());
        tile_columns(g.dO, g.dO_stride, tile, HS, 1.0f, x.dos);
        tile_dots(x.dos.data(), x.vt.data(), HS, np, width, x.dp.data());
        for (int64_t r = 0; r < kTile; ++r) {
            const int64_t t = tile.t[r], n = tile.n[r];
            const float D_t = dot_f32(g.dO + t * g.dO_stride, g.O + t * g.O_stride, HS);
            const float row_lse = g.lse[t];
            float* p = x.p.data() + r * np;
            const float* dp = x.dp.data() + r * np;
            float* ds = x.ds.data() + r * np;
#pragma omp simd
            for (int64_t u = 0; u < width; ++u) {
                p[u] = u < n ? exp_approx(p[u] - row_lse) : 0.0f;
                ds[u] = p[u] * (dp[u] - D_t) * scale;
            }
        }
        tile_weighted_rows(x.ds.data(), np, tile, g.k, g.k_stride, HS, g.dq + t0 * g.dq_stride, g.dq_stride, tile.rows,
                           true);
        // dk_u and dv_u kLanes columns at a time, in registers, over the tile's rows in order.
        int64_t c0 = 0;
        for (; c0 + kLanes <= HS; c0 += kLanes) {
            for (int64_t u = 0; u < tile.n_max; ++u) {
                float* dk = g.dk + u * g.dkv_stride + c0;
                float* dv = g.dv + u * g.dkv_stride + c0;
                float gk[kLanes], gv[kLanes];
                std::copy_n(dk, kLanes, gk);
                std::copy_n(dv, kLanes, gv);
                for (int64_t r = 0; r < tile.rows; ++r) {
                    if (u >= tile.n[r]) continue;
                    const float a = x.ds[r * np + u], w = x.p[r * np + u];
                    const float* q = g.q + tile.t[r] * g.q_stride + c0;
                    const float* dO = g.dO + tile.t[r] * g.dO_stride + c0;
#pragma omp simd
                    for (int64_t k = 0; k < kLanes; ++k) {
                        gk[k] += a * q[k];
                        gv[k] += w * dO[k];
                    }
                }
                std::copy_n(gk, kLanes, dk);
                std::copy_n(gv, kLanes, dv);
            }
        }
        for (; c0 < HS; ++c0) {
            for (int64_t u = 0; u < tile.n_max; ++u) {
                float gk = g.dk[u * g.dkv_stride + c0], gv = g.dv[u * g.dkv_stride + c0];
                for (int64_t r = 0; r < tile.rows; ++r) {
                    if (u >= tile.n[r]) continue;
                    gk += x.ds[r * np + u] * g.q[tile.t[r] * g.q_stride + c0];
                    gv += x.p[r * np + u] * g.dO[tile.t[r] * g.dO_stride + c0];
                }
                g.dk[u * g.dkv_stride + c0] = gk;
                g.dv[u * g.dkv_stride + c0] = gv;
            }
        }
    }
}

}  // namespace ms::cpu::tiles
