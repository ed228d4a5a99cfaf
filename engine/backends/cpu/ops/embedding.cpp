// embedding.cpp: token + position embedding, vocab-parallel (each rank holds rows [vocab_start, vocab_start +
// V_local) of the table; tokens outside that range contribute 0 here and are summed in by the TP all-reduce).
//
// Layouts: tokens (N) int32, table (V_local, C), pos (T, C) optional, out/dout (N, C); row n is at position n % T.
// Accumulation: dtable and dpos are += (backend.h); rows of dtable whose token is not held here are not touched.
// Determinism: the backward splits the C columns between threads and walks the rows in order, so every dtable
// element is summed in the same order as the reference, with no atomics and no per-thread copies.
// Precision: table, pos, out and dout are D; dtable and dpos (parameter gradients) are fp32 or D. The forward's
// table + pos is an fp32 add rounded once on store; a row without pos is a copy (exact). A D dtable or dpos gets the
// sums an fp32 one would get added (each element's rows added in order to 0) summed in fp32 scratch -- for dtable one
// scratch row per distinct table row the tokens hit -- and then rounded into it once per element; rows no token hits
// are not touched.
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "engine/backends/cpu/ops.h"
#include "engine/backends/cpu/ops/precision.h"

namespace ms::cpu {
namespace {

struct EmbeddingShape {
    int64_t N, C, V_local;
};

EmbeddingShape check_shapes(const Tensor& tokens, const Tensor& table, const Tensor& pos, const Tensor& out,
                            int64_t T) {
    const int64_t C = table.dim(-1);
    const EmbeddingShape s{tokens.numel(), C, table.numel() / C};
    MS_CHECK(out.numel() == s.N * s.C, "embedding: out has {} elements, expected N({}) * C({})", out.numel(), s.N, s.C);
    MS_CHECK(T > 0 && s.N % T == 0, "embedding: N({}) is not a multiple of T({})", s.N, T);
    if (pos.defined()) {
        MS_CHECK(pos.numel() == T * s.C, "embedding: pos has {} elements, expected T({}) * C({})", pos.numel(), T, s.C);
    }
    return s;
}

// Index of token `tok` in this rank's table, or -1 when another rank holds it.
inline int64_t local_row(int32_t tok, int64_t vocab_start, int64_t V_local) {
    const int64_t row = static_cast<int64_t>(tok) - vocab_start;
    return row >= 0 && row < V_local ? row : -1;
}

template <class D>
void forward_reference(const EmbeddingForwardArgs& a, const EmbeddingShape& s) {
    const int32_t* tokens = a.tokens.i32();
    const D* table = a.table.as<D>();
    const D* pos = a.pos.defined() ? a.pos.as<D>() : nullptr;
    D* out = a.out.as<D>();
    for (int64_t n = 0; n < s.N; ++n) {
        const int64_t row = local_row(tokens[n], a.vocab_start, s.V_local);
        for (int64_t c = 0; c < s.C; ++c) {
            float x = row >= 0 ? to_float(table[row * s.C + c]) : 0.0f;
            if (pos) x += to_float(pos[(n % a.T) * s.C + c]);
            out[n * s.C + c] = from_float<D>(x);
        }
    }
}

template <class D>
void forward_fast(const EmbeddingForwardArgs& a, const EmbeddingShape& s) {
    const int32_t* tokens = a.tokens.i32();
    const D* table = a.table.as<D>();
    const D* pos = a.pos.defined() ? a.pos.as<D>() : nullptr;
    D* out = a.out.as<D>();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < s.N; ++n) {
        const int64_t row = local_row(tokens[n], a.vocab_start, s.V_local);
        D* o = out + n * s.C;
        const D* p = pos ? pos + (n % a.T) * s.C : nullptr;
        if (row >= 0 && p) {
            const D* w = table + row * s.C;
#pragma omp simd
            for (int64_t c = 0; c < s.C; ++c) o[c] = from_float<D>(to_float(w[c]) + to_float(p[c]));
        } else if (row >= 0) {
            std::copy_n(table + row * s.C, s.C, o);
        } else if (p) {
            std::copy_n(p, s.C, o);
        } else {
            std::fill_n(o, s.C, from_float<D>(0.0f));
        }
    }
}

// Where the backward sums each token's row: the fp32 dtable and dpos themselves, or for a D one fp32 scratch that
// starts at 0 and is rounded into it at the end (round_in). A D dtable's scratch has one row per distinct table row
// the tokens hit (`hit`, in order of first use); acc_row[n] is token n's row in the sums (-1: another rank's).
template <class D>
struct GradSums {
    ParamGrad<D> dtable, dpos;
    float* table_sums = nullptr;       // (V_local, C): dtable itself; or (hits, C) scratch
    float* pos_sums = nullptr;         // (T, C): dpos itself, scratch, or null without dpos
    const int64_t* acc_row = nullptr;  // (N)
    const int64_t* hit = nullptr;      // (hits) table rows of a D dtable's scratch rows
    int64_t hits = 0;

    GradSums(const EmbeddingBackwardArgs& a, const EmbeddingShape& s, int64_t T)
        : dtable(ParamGrad<D>::of(a.dtable)), dpos(ParamGrad<D>::of(a.dpos)) {
        const int32_t* tokens = a.tokens.i32();
        int64_t* rows = scratch<int64_t>(Scratch::kA, static_cast<size_t>(s.N));
        if (dtable.f32) {
            for (int64_t n = 0; n < s.N; ++n) rows[n] = local_row(tokens[n], a.vocab_start, s.V_local);
            table_sums = dtable.f32;
        } else {
            int64_t* slot = scratch<int64_t>(Scratch::kB, static_cast<size_t>(s.V_local));
            int64_t* hit_rows = scratch<int64_t>(Scratch::kC, static_cast<size_t>(s.N));
            std::fill_n(slot, s.V_local, int64_t{-1});
            for (int64_t n = 0; n < s.N; ++n) {
                const int64_t row = local_row(tokens[n], a.vocab_start, s.V_local);
                if (row >= 0 && slot[row] < 0) {
                    slot[row] = hits;
                    hit_rows[hits++] = row;
                }
                rows[n] = row >= 0 ? slot[row] : -1;
            }
            hit = hit_rows;
        }
        acc_row = rows;
        pos_sums = dpos.f32;
        if (dtable.d || dpos.d) {  // one scratch: the hit rows' sums, then dpos's
            float* sums = scratch_f32(Scratch::kGrad, static_cast<size_t>((hits + (dpos.d ? T : 0)) * s.C));
            if (dtable.d) table_sums = sums;
            if (dpos.d) pos_sums = sums + hits * s.C;
        }
    }
    // Zeroes the scratch sums of columns [c0, c1).
    void zero(int64_t c0, int64_t c1, const EmbeddingShape& s, int64_t T) const {
        if (dtable.d) {
            for (int64_t u = 0; u < hits; ++u) std::fill(table_sums + u * s.C + c0, table_sums + u * s.C + c1, 0.0f);
        }
        if (dpos.d) {
            for (int64_t t = 0; t < T; ++t) std::fill(pos_sums + t * s.C + c0, pos_sums + t * s.C + c1, 0.0f);
        }
    }
    // Rounds the scratch sums of columns [c0, c1) into the D gradients.
    void round_in(int64_t c0, int64_t c1, const EmbeddingShape& s, int64_t T) const {
        if (dtable.d) {
            for (int64_t u = 0; u < hits; ++u) {
                add_rounded_range(dtable.d + hit[u] * s.C + c0, table_sums + u * s.C + c0, c1 - c0);
            }
        }
        if (dpos.d) {
            for (int64_t t = 0; t < T; ++t) add_rounded_range(dpos.d + t * s.C + c0, pos_sums + t * s.C + c0, c1 - c0);
        }
    }
};

template <class D>
void backward_reference(const EmbeddingBackwardArgs& a, const EmbeddingShape& s) {
    const D* dout = a.dout.as<D>();
    const GradSums<D> g(a, s, a.T);
    g.zero(0, s.C, s, a.T);
    for (int64_t n = 0; n < s.N; ++n) {
        const int64_t row = g.acc_row[n];
        for (int64_t c = 0; c < s.C; ++c) {
            const float d = to_float(dout[n * s.C + c]);
            if (row >= 0) g.table_sums[row * s.C + c] += d;
            if (g.pos_sums) g.pos_sums[(n % a.T) * s.C + c] += d;
        }
    }
    g.round_in(0, s.C, s, a.T);
}

template <class D>
void backward_fast(const EmbeddingBackwardArgs& a, const EmbeddingShape& s) {
    const D* dout = a.dout.as<D>();
    const GradSums<D> g(a, s, a.T);
    float* table_sums = g.table_sums;
    float* pos_sums = g.pos_sums;
#pragma omp parallel
    {
        // Each thread owns a contiguous slice [c0, c1) of the columns, rounded to 16 floats (one cache line).
        const int64_t num_threads = omp_get_num_threads();
        const int64_t chunk = ((s.C + num_threads - 1) / num_threads + 15) / 16 * 16;
        const int64_t c0 = std::min(s.C, omp_get_thread_num() * chunk);
        const int64_t c1 = std::min(s.C, c0 + chunk);
        g.zero(c0, c1, s, a.T);
        for (int64_t n = 0; n < s.N && c0 < c1; ++n) {
            const int64_t row = g.acc_row[n];
            const D* d = dout + n * s.C;
            if (row >= 0) {
                float* w = table_sums + row * s.C;
#pragma omp simd
                for (int64_t c = c0; c < c1; ++c) w[c] += to_float(d[c]);
            }
            if (pos_sums) {
                float* p = pos_sums + (n % a.T) * s.C;
#pragma omp simd
                for (int64_t c = c0; c < c1; ++c) p[c] += to_float(d[c]);
            }
        }
        g.round_in(c0, c1, s, a.T);
    }
}

}  // namespace

void embedding_forward(const EmbeddingForwardArgs& a, OpMode mode) {
    const EmbeddingShape s = check_shapes(a.tokens, a.table, a.pos, a.out, a.T);
    const DType D = activation_dtype(a.out, "embedding_forward", "out");
    expect_d(a.table, D, "embedding_forward", "table", "out");
    expect_d(a.pos, D, "embedding_forward", "pos", "out");
    dispatch_float(D, [&](auto tag) {
        using T = decltype(tag);
        if (mode == OpMode::kReference) {
            forward_reference<T>(a, s);
        } else {
            forward_fast<T>(a, s);
        }
    });
}

void embedding_backward(const EmbeddingBackwardArgs& a, OpMode mode) {
    const EmbeddingShape s = check_shapes(a.tokens, a.dtable, a.dpos, a.dout, a.T);
    const DType D = activation_dtype(a.dout, "embedding_backward", "dout");
    expect_grad(a.dtable, D, "embedding_backward", "dtable", "dout");
    expect_grad(a.dpos, D, "embedding_backward", "dpos", "dout");
    dispatch_float(D, [&](auto tag) {
        using T = decltype(tag);
        if (mode == OpMode::kReference) {
            backward_reference<T>(a, s);
        } else {
            backward_fast<T>(a, s);
        }
    });
}

}  // namespace ms::cpu
