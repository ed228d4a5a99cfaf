// embedding.cpp: token + position embedding, vocab-parallel (each rank holds rows [vocab_start, vocab_start +
// V_local) of the table; tokens outside that range contribute 0 here and are summed in by the TP all-reduce).
//
// Layouts: tokens (N) int32, table (V_local, C), pos (T, C) optional, out/dout (N, C); row n is at position n % T.
// Accumulation: dtable and dpos are += (backend.h); rows of dtable whose token is not held here are not touched.
// Determinism: the backward splits the C columns between threads and walks the rows in order, so every dtable
// element is summed in the same order as the reference, with no atomics and no per-thread copies.
// Precision: table, pos, out and dout are D; dtable and dpos are fp32 (parameter gradients). The forward's
// table + pos is an fp32 add rounded once on store; a row without pos is a copy (exact).
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

template <class D>
void backward_reference(const EmbeddingBackwardArgs& a, const EmbeddingShape& s) {
    const int32_t* tokens = a.tokens.i32();
    const D* dout = a.dout.as<D>();
    float* dtable = a.dtable.f32();
    float* dpos = a.dpos.defined() ? a.dpos.f32() : nullptr;
    for (int64_t n = 0; n < s.N; ++n) {
        const int64_t row = local_row(tokens[n], a.vocab_start, s.V_local);
        for (int64_t c = 0; c < s.C; ++c) {
            const float d = to_float(dout[n * s.C + c]);
            if (row >= 0) dtable[row * s.C + c] += d;
            if (dpos) dpos[(n % a.T) * s.C + c] += d;
        }
    }
}

template <class D>
void backward_fast(const EmbeddingBackwardArgs& a, const EmbeddingShape& s) {
    const int32_t* tokens = a.tokens.i32();
    const D* dout = a.dout.as<D>();
    float* dtable = a.dtable.f32();
    float* dpos = a.dpos.defined() ? a.dpos.f32() : nullptr;
#pragma omp parallel
    {
        // Each thread owns a contiguous slice [c0, c1) of the columns, rounded to 16 floats (one cache line).
        const int64_t num_threads = omp_get_num_threads();
        const int64_t chunk = ((s.C + num_threads - 1) / num_threads + 15) / 16 * 16;
        const int64_t c0 = std::min(s.C, omp_get_thread_num() * chunk);
        const int64_t c1 = std::min(s.C, c0 + chunk);
        for (int64_t n = 0; n < s.N && c0 < c1; ++n) {
            const int64_t row = local_row(tokens[n], a.vocab_start, s.V_local);
            const D* d = dout + n * s.C;
            if (row >= 0) {
                float* w = dtable + row * s.C;
#pragma omp simd
                for (int64_t c = c0; c < c1; ++c) w[c] += to_float(d[c]);
            }
            if (dpos) {
                float* p = dpos + (n % a.T) * s.C;
#pragma omp simd
                for (int64_t c = c0; c < c1; ++c) p[c] += to_float(d[c]);
            }
        }
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
    expect_f32(a.dtable, "embedding_backward", "dtable", "parameter gradients");
    expect_f32(a.dpos, "embedding_backward", "dpos", "parameter gradients");
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
