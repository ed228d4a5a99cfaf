// lm_head_loss.cpp: the LM head's matmul and softmax cross-entropy, forward and backward, chunk by chunk over the
// rows (backend.h, LmHeadLossArgs), so that no more than one chunk of logits is ever held.
//
// Layouts (row-major): lnf/dlnf (N, C), wte (Vp, C) (Linear orientation), dwte (Vp, C) fp32 or D, targets (N) int32,
// losses/dloss (N) fp32; scratch: the chunk's logits (R, Vp) fp32 (values rounded to D), then row_max and sum_exp
// (R) fp32. Columns j >= vocab_valid_local (the padded vocabulary) take no part in the max or the sum and get exactly
// 0 gradient, so the padded rows of dwte get nothing added.
// Per chunk of R rows (the last one shorter), the same steps as the unfused ops:
//   logits = lnf_chunk @ wte^T                 (matmul_forward; rounded to D, as a D logits tensor would hold them)
//   row_max, sum_exp, target logit, loss       (cross_entropy_forward kMax then kSumExp; loss as the model forms it)
//   dlogits in place                           (cross_entropy_backward; rounded to D)
//   dlnf_chunk = dlogits @ wte                 (matmul_backward's dinp, overwritten)
//   dwte += dlogits^T @ lnf_chunk              (matmul_backward's dweight: one fp32 product per chunk added in)
// Fast path: one OpenMP team for the whole call; the GEMMs are single-threaded sgemm calls on the tiles of
// column_blocks.h, those matmul.cpp cuts the same products into (output_tiles for the logits and dlnf, weight_tiles
// for dwte), the row phases split over rows, with barriers between phases. A row's statistics use the loops of
// cross_entropy.cpp's fast path (an fp32 max, the exp-sum in float blocks of kBlock columns added in double), so for
// fp32 a row's loss and dlogits are those of the cross-entropy ops on the same logits. Every output element comes from
// the same calls in the same order whatever the thread count: the results do not depend on it. bf16 / fp16: lnf and wte
// are converted to fp32 once per call (thread-local scratch, as matmul.cpp does), the logits and dlogits are rounded to
// D in the fp32 scratch (so sgemm reads them directly), and dlnf is rounded once on store from an fp32 (R, C) staging
// buffer. A D dwte (16-bit gradients): each chunk's tile of dwte is computed by the same sgemm call into a thread's
// fp32 tile scratch zeroed first (what an fp32 dwte starting at 0 would get added), then rounded into dwte once.
// Reference path: naive loops with double accumulators, no chunks: bit-identical to the reference modes of
// matmul_forward, cross_entropy_forward, cross_entropy_backward and matmul_backward called on the whole logits (with
// the loss formed as the model forms it); it allocates its (N, Vp) dlogits, being the executable spec for tests. A D
// dwte takes the chunks of the fast path, as the contract has it: each chunk's double sum over its rows, as fp32,
// rounded in once; an fp32 dwte gets the double sum over all rows added, as matmul_backward's reference does.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "engine/backends/cpu/ops.h"
#include "engine/backends/cpu/ops/column_blocks.h"
#include "engine/backends/cpu/ops/precision.h"
#include "engine/backends/cpu/ops/vec_math.h"

namespace ms {

namespace {

// The CPU's chunk. Every chunk streams wte twice and dwte in and out (4 Vp C floats) whatever its row count, and its
// dwte product's inner dimension is its row count, so the rows must amortise both; a chunk of GPT-2's 50304-column
// logits cannot stay in L2 anyway (one row is 196 KiB). 512 rows hold 98 MiB of fp32 logits, where the unfused ops
// at N = 8 x 1024 hold 1.5 GiB.
constexpr int64_t kCpuChunkRows = 512;
// A GPU's chunk: up to 2^26 logits (128 MiB in bf16) in rows of a multiple of 64.
constexpr int64_t kGpuChunkLogits = int64_t{1} << 26;

}  // namespace

int64_t lm_head_loss_chunk_rows(BackendKind kind, DType, int64_t N, int64_t Vp_local) {
    const int64_t n = std::max<int64_t>(N, 1);
    if (kind == BackendKind::kCPU) return std::min(n, kCpuChunkRows);
    const int64_t rows = std::max<int64_t>(1, kGpuChunkLogits / std::max<int64_t>(Vp_local, 1));
    return std::min(n, rows >= 64 ? rows / 64 * 64 : rows);
}

int64_t lm_head_loss_scratch_elems(BackendKind kind, DType D, int64_t N, int64_t Vp_local, int64_t chunk_rows) {
    const int64_t R =
        chunk_rows > 0 ? std::min(chunk_rows, std::max<int64_t>(N, 1)) : lm_head_loss_chunk_rows(kind, D, N, Vp_local);
    if (kind == BackendKind::kCPU) return R * Vp_local + 2 * R;  // fp32 logits, row_max, sum_exp
    // CUDA (cuda_backend.cpp): row_max, sum_exp, target_logit (3R fp32) padded to 256 bytes, then the logits in D.
    return (3 * R + 63) / 64 * 64 + (R * Vp_local * static_cast<int64_t>(dtype_size(D)) + 3) / 4;
}

namespace cpu {
namespace {

constexpr int64_t kBlock = 512;  // cross_entropy.cpp's exp-sum block

struct HeadShape {
    int64_t N, C, Vp, valid, R;
};

HeadShape check_args(const LmHeadLossArgs& a) {
    const char* op = "lm_head_loss";
    const DType D = activation_dtype(a.lnf, op, "lnf");
    const int64_t C = a.lnf.dim(-1);
    MS_CHECK(C > 0 && a.wte.dim(-1) == C, "{}: wte is (.., {}) but lnf is (.., {})", op, a.wte.dim(-1), C);
    HeadShape s{a.lnf.numel() / C, C, a.wte.numel() / C, a.vocab_valid_local, 0};
    MS_CHECK(s.valid >= 0 && s.valid <= s.Vp, "{}: vocab_valid_local({}) is outside [0, Vp_local({})]", op, s.valid,
             s.Vp);
    MS_CHECK(a.vocab_start == 0,
             "{}: vocab_start = {}: the fused head is for a tensor-parallel group of one (vocab_start 0); a "
             "vocab-parallel head runs the unfused ops, which all-reduce between the cross-entropy phases",
             op, a.vocab_start);
    MS_CHECK(a.chunk_rows >= 0, "{}: chunk_rows = {} is negative", op, a.chunk_rows);
    MS_CHECK(a.targets.numel() == s.N && a.targets.dtype == DType::kI32, "{}: targets must be (N = {}) int32", op, s.N);
    MS_CHECK(a.losses.numel() == s.N, "{}: losses has {} elements, expected N = {}", op, a.losses.numel(), s.N);
    expect_d(a.wte, D, op, "wte", "lnf");
    expect_f32(a.losses, op, "losses", "statistics");
    if (a.dloss.defined()) {
        MS_CHECK(a.dloss.numel() == s.N, "{}: dloss has {} elements, expected N = {}", op, a.dloss.numel(), s.N);
        MS_CHECK(a.dlnf.defined() && a.dlnf.numel() == s.N * s.C, "{}: with dloss, dlnf must be (N = {}, C = {})", op,
                 s.N, s.C);
        MS_CHECK(a.dwte.defined() && a.dwte.numel() == s.Vp * s.C,
                 "{}: with dloss, dwte must be (Vp_local = {}, C = {})", op, s.Vp, s.C);
        expect_f32(a.dloss, op, "dloss", "statistics");
        expect_d(a.dlnf, D, op, "dlnf", "lnf");
        expect_grad(a.dwte, D, op, "dwte", "lnf");
    }
    s.R = a.chunk_rows > 0 ? std::min(a.chunk_rows, std::max<int64_t>(s.N, 1))
                           : lm_head_loss_chunk_rows(BackendKind::kCPU, D, s.N, s.Vp);
    const int64_t need = lm_head_loss_scratch_elems(BackendKind::kCPU, D, s.N, s.Vp, s.R);
    MS_CHECK(a.scratch.numel() >= need && a.scratch.dtype == DType::kF32,
             "{}: scratch is {} {} elements, but chunks of {} rows need {} fp32 (lm_head_loss_scratch_elems)", op,
             a.scratch.numel(), dtype_name(a.scratch.dtype), s.R, need);
    // sgemm takes int dimensions.
    MS_CHECK(s.N <= INT32_MAX && s.C <= INT32_MAX && s.Vp <= INT32_MAX, "{}: a dimension exceeds INT32_MAX", op);
    return s;
}

// Column of the target (global id) in the vocabulary, or -1 when it is outside [0, valid).
inline int64_t target_column(int32_t target, int64_t valid) {
    const int64_t j = static_cast<int64_t>(target);
    return j >= 0 && j < valid ? j : -1;
}

// ---- reference ----

template <class D>
void reference(const LmHeadLossArgs& a, const HeadShape& s) {
    const D* lnf = a.lnf.as<D>();
    const D* wte = a.wte.as<D>();
    const int32_t* targets = a.targets.i32();
    const bool backward = a.dloss.defined();
    std::vector<float> dlogits(backward ? static_cast<size_t>(s.N * s.Vp) : 0);
    std::vector<float> l(static_cast<size_t>(s.Vp));
    for (int64_t n = 0; n < s.N; ++n) {
        for (int64_t m = 0; m < s.Vp; ++m) {  // matmul_forward's reference, stored in D
            double acc = 0.0;
            for (int64_t k = 0; k < s.C; ++k) {
                acc += static_cast<double>(to_float(lnf[n * s.C + k])) * to_float(wte[m * s.C + k]);
            }
            l[m] = to_float(from_float<D>(static_cast<float>(acc)));
        }
        float max = -std::numeric_limits<float>::infinity();  // cross_entropy_forward's reference
        for (int64_t j = 0; j < s.valid; ++j) max = std::max(max, l[j]);
        double sum_d = 0.0;
        for (int64_t j = 0; j < s.valid; ++j) sum_d += std::exp(static_cast<double>(l[j]) - max);
        const float sum = static_cast<float>(sum_d);
        const int64_t tj = target_column(targets[n], s.valid);
        const float target = tj >= 0 ? l[tj] : 0.0f;
        a.losses.f32()[n] = std::log(sum) + max - target;
        if (!backward) continue;
        const double dmax = max, dsum = sum, dloss = a.dloss.f32()[n];  // cross_entropy_backward's reference
        for (int64_t j = 0; j < s.Vp; ++j) {
            const double p = j < s.valid ? std::exp(l[j] - dmax) / dsum : 0.0;
            const double indicator = j == tj ? 1.0 : 0.0;
            dlogits[n * s.Vp + j] =
                to_float(from_float<D>(j < s.valid ? static_cast<float>(dloss * (p - indicator)) : 0.0f));
        }
    }
    if (!backward) return;
    // matmul_backward's reference: dlnf = dlogits @ wte, dwte += dlogits^T @ lnf
    D* dlnf = a.dlnf.as<D>();
    const ParamGrad<D> dwte = ParamGrad<D>::of(a.dwte);
    std::vector<double> acc(static_cast<size_t>(s.C));
    for (int64_t n = 0; n < s.N; ++n) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t m = 0; m < s.Vp; ++m) {
            const double d = dlogits[n * s.Vp + m];
            for (int64_t k = 0; k < s.C; ++k) acc[k] += d * to_float(wte[m * s.C + k]);
        }
        for (int64_t k = 0; k < s.C; ++k) dlnf[n * s.C + k] = from_float<D>(static_cast<float>(acc[k]));
    }
    const int64_t rows_per_sum = dwte.f32 ? s.N : s.R;  // fp32: one sum over all rows; D: one per chunk
    for (int64_t r0 = 0; r0 < s.N; r0 += rows_per_sum) {
        const int64_t r1 = std::min(s.N, r0 + rows_per_sum);
        for (int64_t m = 0; m < s.Vp; ++m) {
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int64_t n = r0; n < r1; ++n) {
                const double d = dlogits[n * s.Vp + m];
                for (int64_t k = 0; k < s.C; ++k) acc[k] += d * to_float(lnf[n * s.C + k]);
            }
            for (int64_t k = 0; k < s.C; ++k) dwte.add(m * s.C + k, static_cast<float>(acc[k]));
        }
    }
}

// ---- fast ----

// x[i] = what a D tensor would hold of x[i], for n values (nothing for fp32).
template <class D>
void round_through(float* x, int64_t n) {
    if constexpr (!kIsF32<D>) {
        for (int64_t i = 0; i < n; ++i) x[i] = to_float(from_float<D>(x[i]));
    }
}

// One row of logits l (Vp, fp32 holding D values): its max, exp-sum and loss, and with dloss its dlogits in place,
// in cross_entropy.cpp's fast loops. Returns the loss.
template <class D>
float row_loss(float* l, const HeadShape& s, int32_t target, const float* dloss) {
    float max = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max)
    for (int64_t j = 0; j < s.valid; ++j) max = l[j] > max ? l[j] : max;
    double sum_d = 0.0;
    for (int64_t j0 = 0; j0 < s.valid; j0 += kBlock) {
        const int64_t j1 = std::min(s.valid, j0 + kBlock);
        float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
        for (int64_t j = j0; j < j1; ++j) block_sum += exp_approx(l[j] - max);
        sum_d += block_sum;
    }
    const float sum = static_cast<float>(sum_d);
    const int64_t tj = target_column(target, s.valid);
    const float target_logit = tj >= 0 ? l[tj] : 0.0f;
    const float loss = std::log(sum) + max - target_logit;
    if (dloss) {
        const float scale = *dloss / sum;
#pragma omp simd
        for (int64_t j = 0; j < s.valid; ++j) l[j] = exp_approx(l[j] - max) * scale;
        std::fill(l + s.valid, l + s.Vp, 0.0f);
        if (tj >= 0) l[tj] -= *dloss;  // p - 1 in fp32, rounded once (below) for bf16 / fp16
        round_through<D>(l, s.valid);
    }
    return loss;
}

// G: dwte's storage type (float or D).
template <class D, class G>
void fast(const LmHeadLossArgs& a, const HeadShape& s) {
    use_single_threaded_blas();
    const bool backward = a.dloss.defined();
    const int C = static_cast<int>(s.C), Vp = static_cast<int>(s.Vp);
    float* logits = a.scratch.f32();
    // fp32 operands for sgemm: the tensors themselves, or converted copies in thread-local scratch.
    const float* lnf_f = nullptr;
    const float* wte_f = nullptr;
    float* lnf_conv = nullptr;
    float* wte_conv = nullptr;
    float* dlnf_f = nullptr;  // the chunk's dlnf in fp32: dlnf itself for fp32, else (R, C) staging
    if constexpr (kIsF32<D>) {
        lnf_f = a.lnf.f32();
        wte_f = a.wte.f32();
    } else {
        lnf_conv = scratch_f32(Scratch::kA, static_cast<size_t>(s.N * s.C));
        wte_conv = scratch_f32(Scratch::kB, static_cast<size_t>(s.Vp * s.C));
        lnf_f = lnf_conv;
        wte_f = wte_conv;
        if (backward) dlnf_f = scratch_f32(Scratch::kC, static_cast<size_t>(s.R * s.C));
    }
    const int32_t* targets = a.targets.i32();
    const float* dloss = backward ? a.dloss.f32() : nullptr;
    float* losses = a.losses.f32();
    G* dwte = backward ? a.dwte.as<G>() : nullptr;
    // A D dwte: each thread's tile of the chunk's fp32 product (at most tile_rows x tile_cols), zeroed before its
    // sgemm.
    const TileGrid dwte_tiles = weight_tiles(s.Vp, s.C);
    const int64_t tile_elems = dwte_tiles.tile_rows * dwte_tiles.tile_cols;
    float* dwte_scratch = kIsF32<G> || !backward
                              ? nullptr
                              : scratch_f32(Scratch::kGrad, static_cast<size_t>(omp_get_max_threads() * tile_elems));
#pragma omp parallel
    {
        if constexpr (!kIsF32<D>) {
            convert_to_f32_team(a.lnf.as<D>(), lnf_conv, s.N * s.C);
            convert_to_f32_team(a.wte.as<D>(), wte_conv, s.Vp * s.C);  // the implicit barrier: both complete below
        }
        for (int64_t r0 = 0; r0 < s.N; r0 += s.R) {
            const int rows = static_cast<int>(std::min(s.R, s.N - r0));
            const float* x = lnf_f + r0 * s.C;
            for_each_thread_tile(output_tiles(rows, s.Vp), [&](const Slice& i, const Slice& b) {
                // logits[i, b] = x[i, :] (i, C) @ wte[b, :]^T (C, b)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i.size(), b.size(), C, 1.0f, x + i.begin * s.C, C,
                            wte_f + b.begin * C, C, 0.0f, logits + i.begin * s.Vp + b.begin, Vp);
                for (int64_t r = i.begin; r < i.end; ++r) round_through<D>(logits + r * s.Vp + b.begin, b.size());
            });
#pragma omp barrier
#pragma omp for schedule(static)
            for (int i = 0; i < rows; ++i) {
                losses[r0 + i] = row_loss<D>(logits + i * s.Vp, s, targets[r0 + i], dloss ? dloss + r0 + i : nullptr);
            }  // the implicit barrier: every dlogit is written
            if (backward) {
                float* dx = kIsF32<D> ? a.dlnf.f32() + r0 * s.C : dlnf_f;
                for_each_thread_tile(output_tiles(rows, s.C), [&](const Slice& i, const Slice& b) {
                    // dlnf[i, b] = dlogits[i, :] (i, Vp) @ wte[:, b] (Vp, b)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i.size(), b.size(), Vp, 1.0f,
                                logits + i.begin * s.Vp, Vp, wte_f + b.begin, C, 0.0f, dx + i.begin * s.C + b.begin, C);
                    if constexpr (!kIsF32<D>) {
                        D* dlnf = a.dlnf.as<D>() + r0 * s.C;
                        for (int64_t r = i.begin; r < i.end; ++r) {
                            for (int64_t k = b.begin; k < b.end; ++k)
                                dlnf[r * s.C + k] = from_float<D>(dx[r * s.C + k]);
                        }
                    }
                });
                for_each_thread_tile(dwte_tiles, [&](const Slice& v, const Slice& b) {
                    // dwte[v, b] += dlogits[:, v]^T (v, rows) @ x[:, b] (rows, b); the padded rows' dlogits are 0
                    if (v.begin >= s.valid) return;
                    const auto product_into = [&](float* out, int ldc) {
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, v.size(), b.size(), rows, 1.0f,
                                    logits + v.begin, Vp, x + b.begin, C, 1.0f, out, ldc);
                    };
                    if constexpr (kIsF32<G>) {
                        product_into(dwte + v.begin * s.C + b.begin, C);
                    } else {
                        float* tile = dwte_scratch + omp_get_thread_num() * tile_elems;
                        std::fill_n(tile, v.size() * b.size(), 0.0f);
                        product_into(tile, b.size());
                        for (int64_t r = 0; r < v.size(); ++r) {
                            add_rounded_range(dwte + (v.begin + r) * s.C + b.begin, tile + r * b.size(), b.size());
                        }
                    }
                });
            }
#pragma omp barrier
        }
    }
}

}  // namespace

void lm_head_loss(const LmHeadLossArgs& a, OpMode mode) {
    const HeadShape s = check_args(a);
    if (s.N == 0) return;
    dispatch_float(a.lnf.dtype, [&](auto tag) {
        using T = decltype(tag);
        if (mode == OpMode::kReference) return reference<T>(a, s);
        const DType dwte_dtype = a.dloss.defined() ? a.dwte.dtype : DType::kF32;  // unused without dloss
        dispatch_grad<T>(dwte_dtype, [&](auto g) { fast<T, decltype(g)>(a, s); });
    });
}

}  // namespace cpu
}  // namespace ms
