// cross_entropy.cpp: vocab-parallel softmax cross-entropy in pieces (backend.h, docs/design.md §5).
//
// Layouts: logits (N, Vp_local), targets (N) int32 global ids, row_max/sum_exp/target_logit/dloss (N) fp32.
// Column j of this shard is global id vocab_start + j; columns j >= vocab_valid_local are the padded tail of the
// vocabulary: they take no part in the max or the sum and get exactly 0 gradient.
//   kMax:    row_max[n] = max_{j < valid} logits[n, j]
//   kSumExp: sum_exp[n] = sum_{j < valid} exp(logits[n, j] - row_max[n]);  target_logit[n] = the target's logit
//            when this shard holds it, else 0
//   kMaxSumExp: kMax, then kSumExp (a tensor-parallel group of one; the CUDA kernel reads the logits once instead)
//   backward (in place over logits): dlogits[n, j] = dloss[n] * (exp(logits - row_max) / sum_exp - [j == target])
// The fast path runs rows in parallel; each row's exp-sum is taken in float blocks of kBlock columns (vectorised)
// whose sums are added in double, so the rounding error does not grow with Vp ~ 50k.
// Precision: logits/dlogits are D; row_max, sum_exp, target_logit and dloss are fp32. Each dlogit (the target's
// included: p - 1 is formed in fp32) is rounded once on store.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "engine/backends/cpu/ops.h"
#include "engine/backends/cpu/ops/precision.h"
#include "engine/backends/cpu/ops/vec_math.h"

namespace ms::cpu {
namespace {

constexpr int64_t kBlock = 512;

struct CrossEntropyShape {
    int64_t N, Vp, valid;
};

CrossEntropyShape check_shapes(const Tensor& logits, int64_t vocab_valid_local) {
    const int64_t Vp = logits.dim(-1);
    const CrossEntropyShape s{logits.numel() / Vp, Vp, vocab_valid_local};
    MS_CHECK(s.valid >= 0 && s.valid <= Vp, "cross_entropy: vocab_valid_local({}) is outside [0, Vp_local({})]",
             s.valid, Vp);
    return s;
}

void check_row_stat(const Tensor& t, int64_t N, const char* what) {
    MS_CHECK(t.numel() == N, "cross_entropy: {} has {} elements, expected N = {}", what, t.numel(), N);
}

// Column of the target in this shard, or -1 when another shard holds it.
inline int64_t target_column(int32_t target, int64_t vocab_start, int64_t valid) {
    const int64_t j = static_cast<int64_t>(target) - vocab_start;
    return j >= 0 && j < valid ? j : -1;
}

template <class D>
void forward_reference(const CrossEntropyForwardArgs& a, const CrossEntropyShape& s) {
    const D* logits = a.logits.as<D>();
    float* row_max = a.row_max.f32();
    for (int64_t n = 0; n < s.N; ++n) {
        const D* l = logits + n * s.Vp;
        if (a.phase == CrossEntropyPhase::kMax) {
            float best = -std::numeric_limits<float>::infinity();
            for (int64_t j = 0; j < s.valid; ++j) best = std::max(best, to_float(l[j]));
            row_max[n] = best;
        } else {
            double sum = 0.0;
            for (int64_t j = 0; j < s.valid; ++j) sum += std::exp(static_cast<double>(to_float(l[j])) - row_max[n]);
            a.sum_exp.f32()[n] = static_cast<float>(sum);
            const int64_t tj = target_column(a.targets.i32()[n], a.vocab_start, s.valid);
            a.target_logit.f32()[n] = tj >= 0 ? to_float(l[tj]) : 0.0f;
        }
    }
}

template <class D>
void forward_fast(const CrossEntropyForwardArgs& a, const CrossEntropyShape& s) {
    const D* logits = a.logits.as<D>();
    float* row_max = a.row_max.f32();
    if (a.phase == CrossEntropyPhase::kMax) {
#pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < s.N; ++n) {
            const D* l = logits + n * s.Vp;
            float best = -std::numeric_limits<float>::infinity();
            // The select form, not std::max, is what GCC turns into vmaxps here.
#pragma omp simd reduction(max : best)
            for (int64_t j = 0; j < s.valid; ++j) best = to_float(l[j]) > best ? to_float(l[j]) : best;
            row_max[n] = best;
        }
        return;
    }
    const int32_t* targets = a.targets.i32();
    float* sum_exp = a.sum_exp.f32();
    float* target_logit = a.target_logit.f32();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < s.N; ++n) {
        const D* l = logits + n * s.Vp;
        const float max = row_max[n];
        double sum = 0.0;
        for (int64_t j0 = 0; j0 < s.valid; j0 += kBlock) {
            const int64_t j1 = std::min(s.valid, j0 + kBlock);
            float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
            for (int64_t j = j0; j < j1; ++j) block_sum += exp_approx(to_float(l[j]) - max);
            sum += block_sum;
        }
        sum_exp[n] = static_cast<float>(sum);
        const int64_t tj = target_column(targets[n], a.vocab_start, s.valid);
        target_logit[n] = tj >= 0 ? to_float(l[tj]) : 0.0f;
    }
}

template <class D>
void backward_reference(const CrossEntropyBackwardArgs& a, const CrossEntropyShape& s) {
    D* logits = a.logits.as<D>();
    for (int64_t n = 0; n < s.N; ++n) {
        D* l = logits + n * s.Vp;
        const int64_t tj = target_column(a.targets.i32()[n], a.vocab_start, s.valid);
        const double max = a.row_max.f32()[n], sum = a.sum_exp.f32()[n], dloss = a.dloss.f32()[n];
        for (int64_t j = 0; j < s.Vp; ++j) {
            const double p = j < s.valid ? std::exp(to_float(l[j]) - max) / sum : 0.0;
            const double indicator = j == tj ? 1.0 : 0.0;
            l[j] = from_float<D>(j < s.valid ? static_cast<float>(dloss * (p - indicator)) : 0.0f);
        }
    }
}

template <class D>
void backward_fast(const CrossEntropyBackwardArgs& a, const CrossEntropyShape& s) {
    D* logits = a.logits.as<D>();
    const int32_t* targets = a.targets.i32();
    const float* row_max = a.row_max.f32();
    const float* sum_exp = a.sum_exp.f32();
    const float* dloss = a.dloss.f32();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < s.N; ++n) {
        D* l = logits + n * s.Vp;
        const float max = row_max[n];
        const float scale = dloss[n] / sum_exp[n];
        const int64_t tj = target_column(targets[n], a.vocab_start, s.valid);
        const float target = tj >= 0 ? to_float(l[tj]) : 0.0f;  // read before the row is overwritten
#pragma omp simd
        for (int64_t j = 0; j < s.valid; ++j) l[j] = from_float<D>(exp_approx(to_float(l[j]) - max) * scale);
        std::fill(l + s.valid, l + s.Vp, from_float<D>(0.0f));
        if (tj >= 0) {
            if constexpr (kIsF32<D>) {
                l[tj] -= dloss[n];
            } else {  // p - 1 in fp32, rounded once
                l[tj] = from_float<D>(exp_approx(target - max) * scale - dloss[n]);
            }
        }
    }
}

}  // namespace

void cross_entropy_forward(const CrossEntropyForwardArgs& a, OpMode mode) {
    if (a.phase == CrossEntropyPhase::kMaxSumExp) {  // the two pieces, so the bits are theirs
        CrossEntropyForwardArgs piece = a;
        piece.phase = CrossEntropyPhase::kMax;
        cross_entropy_forward(piece, mode);
        piece.phase = CrossEntropyPhase::kSumExp;
        cross_entropy_forward(piece, mode);
        return;
    }
    const CrossEntropyShape s = check_shapes(a.logits, a.vocab_valid_local);
    check_row_stat(a.row_max, s.N, "row_max");
    if (a.phase == CrossEntropyPhase::kSumExp) {
        check_row_stat(a.targets, s.N, "targets");
        check_row_stat(a.sum_exp, s.N, "sum_exp");
        check_row_stat(a.target_logit, s.N, "target_logit");
        expect_f32(a.sum_exp, "cross_entropy_forward", "sum_exp", "statistics");
        expect_f32(a.target_logit, "cross_entropy_forward", "target_logit", "statistics");
    }
    const DType D = activation_dtype(a.logits, "cross_entropy_forward", "logits");
    expect_f32(a.row_max, "cross_entropy_forward", "row_max", "statistics");
    dispatch_float(D, [&](auto tag) {
        using T = decltype(tag);
        if (mode == OpMode::kReference) {
            forward_reference<T>(a, s);
        } else {
            forward_fast<T>(a, s);
        }
    });
}

void cross_entropy_backward(const CrossEntropyBackwardArgs& a, OpMode mode) {
    const CrossEntropyShape s = check_shapes(a.logits, a.vocab_valid_local);
    check_row_stat(a.targets, s.N, "targets");
    check_row_stat(a.row_max, s.N, "row_max");
    check_row_stat(a.sum_exp, s.N, "sum_exp");
    check_row_stat(a.dloss, s.N, "dloss");
    const DType D = activation_dtype(a.logits, "cross_entropy_backward", "logits");
    expect_f32(a.row_max, "cross_entropy_backward", "row_max", "statistics");
    expect_f32(a.sum_exp, "cross_entropy_backward", "sum_exp", "statistics");
    expect_f32(a.dloss, "cross_entropy_backward", "dloss", "statistics");
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
