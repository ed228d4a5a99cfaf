/*
Vocab-parallel softmax cross-entropy in pieces (docs/design.md §5), so that tensor parallelism can all-reduce
between them: kMax (then an all-reduce max), kSumExp (then all-reduce sums), backward; without tensor parallelism
kMaxSumExp does both pieces in one read of the logits: each thread keeps a running max m and a sum s of exp(x - m),
scaled by exp(m_old - m_new) when m grows, and the block combines the threads' (m, s) as sum s * exp(m - M) under the
block's max M. The twin is cpu/ops/cross_entropy.cpp.
Layout: logits/dlogits (N, Vp) row-major T, the activation dtype (float, bf16, fp16; Vp = this shard's padded vocab),
targets (N) int32 global ids, row_max/sum_exp/target_logit/dloss (N) fp32. Column j of the shard is global id
vocab_start + j; columns j >= valid (the padded tail) take no part in max or sum and get exactly 0 gradient. Kernels:
one block of kBlockSize threads per row; each thread strides over the columns, then a block reduction (xor butterflies
inside each warp, the warp results through shared memory, warp 0 combines them in warp order), so every run sums in the
same order. The exp-sum is float per thread (Vp / 256 ~ 200 terms at GPT-2's 50k vocab) and float across the block tree;
the CPU reference works in double. Logits are loaded as fp32, every statistic is fp32, and each dlogit is rounded once
to T. bf16 / fp16: when every row starts 16-byte aligned (the base pointer aligned and Vp a multiple of 8, as the
padded vocabulary is), a thread moves 8 columns per 16-byte pack (pack.cuh) and the columns past the last whole pack
of the row one by one, so a 50k-column row of 2-byte logits is read with 16-byte loads (the kernels are bound by
memory: at GPT-2 124M, micro-batch 16, the logits are 1.6 GB per pass); the max and every dlogit are the same bits
either way, only the exp-sum's order differs. Accumulation contract: row statistics are overwritten; the backward
overwrites logits with dlogits.
*/
#include <type_traits>

#include "engine/backends/cuda/kernels/cross_entropy.cuh"
#include "engine/backends/cuda/pack.cuh"

namespace ms::cuda {
namespace {

constexpr int kBlockSize = 256;
constexpr int kWarps = kBlockSize / 32;

enum class Reduce : uint8_t { kSum, kMax };

// Every thread of the block gets the same result; the block must not diverge around the call.
template <Reduce kOp>
__device__ float block_reduce(float v) {
    __shared__ float s_warp[kWarps];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = kOp == Reduce::kSum ? warp_reduce_sum(v) : warp_reduce_max(v);
    if (lane == 0) s_warp[warp] = v;
    __syncthreads();
    float r = lane < kWarps ? s_warp[lane] : (kOp == Reduce::kSum ? 0.0f : -INFINITY);
    r = kOp == Reduce::kSum ? warp_reduce_sum(r) : warp_reduce_max(r);
    __syncthreads();  // s_warp may be reused by a following call
    return r;
}

// Column of the target in this shard, or -1 when another shard holds it (or it falls in the padded tail).
__device__ __forceinline__ int target_column(int32_t target, int64_t vocab_start, int valid) {
    const int64_t j = static_cast<int64_t>(target) - vocab_start;
    return j >= 0 && j < valid ? static_cast<int>(j) : -1;
}

// ----------------------------------------------------------------------------
// CUDA kernels

// f(j, x) for every column j < n of row l, x its logit as fp32: when `packed`, columns [0, n - n % K) by 16-byte packs
// (pack p of the row to thread p % kBlockSize), the rest one per thread; otherwise one per thread throughout. With
// kStore (l then points to T, not const T), each column is overwritten by f's result rounded to T: a thread reads
// its columns before it writes them, so an in-place pass needs no barrier.
template <bool kStore, class P, class F>
__device__ __forceinline__ void over_columns(P* l, int n, bool packed, F&& f) {
    using T = std::remove_const_t<P>;
    auto visit = [&](int j, T& v) {
        if constexpr (kStore) {
            v = from_float<T>(f(j, to_float(v)));
        } else {
            f(j, to_float(v));
        }
    };
    int j0 = 0;
    if constexpr (sizeof(T) == 2) {
        constexpr int K = Pack<T>::kSize;
        if (packed) {
            j0 = n - n % K;
            for (int j = threadIdx.x * K; j < j0; j += kBlockSize * K) {
                Pack<T> x = load_pack(l + j);
                for (int k = 0; k < K; ++k) visit(j + k, x.v[k]);
                if constexpr (kStore) store_pack(l + j, x);
            }
        }
    }
    for (int j = j0 + threadIdx.x; j < n; j += kBlockSize) {
        T v = l[j];
        visit(j, v);
        if constexpr (kStore) l[j] = v;
    }
}

template <class T, class F>
__device__ __forceinline__ void for_each_column(const T* l, int n, bool packed, F&& f) {
    over_columns<false>(l, n, packed, f);
}

template <class T>
__global__ void cross_entropy_max_kernel(float* __restrict__ row_max, const T* __restrict__ logits, int Vp, int valid,
                                         bool packed) {
    const T* l = logits + static_cast<int64_t>(blockIdx.x) * Vp;
    float best = -INFINITY;
    for_each_column(l, valid, packed, [&](int, float x) { best = fmaxf(best, x); });
    best = block_reduce<Reduce::kMax>(best);
    if (threadIdx.x == 0) row_max[blockIdx.x] = best;
}

template <class T>
__global__ void cross_entropy_sum_exp_kernel(float* __restrict__ sum_exp, float* __restrict__ target_logit,
                                             const T* __restrict__ logits, const int32_t* __restrict__ targets,
                                             const float* __restrict__ row_max, int Vp, int64_t vocab_start, int valid,
                                             bool packed) {
    const int n = blockIdx.x;
    const T* l = logits + static_cast<int64_t>(n) * Vp;
    const float max = row_max[n];
    float sum = 0.0f;
    for_each_column(l, valid, packed, [&](int, float x) { sum += expf(x - max); });
    sum = block_reduce<Reduce::kSum>(sum);
    if (threadIdx.x == 0) {
        sum_exp[n] = sum;
        const int tj = target_column(targets[n], vocab_start, valid);
        target_logit[n] = tj >= 0 ? to_float(l[tj]) : 0.0f;
    }
}

template <class T>
__global__ void cross_entropy_max_sum_exp_kernel(float* __restrict__ row_max, float* __restrict__ sum_exp,
                                                 float* __restrict__ target_logit, const T* __restrict__ logits,
                                                 const int32_t* __restrict__ targets, int Vp, int64_t vocab_start,
                                                 int valid, bool packed) {
    const int n = blockIdx.x;
    const T* l = logits + static_cast<int64_t>(n) * Vp;
    float m = -INFINITY, s = 0.0f;  // this thread's running max and sum of exp(x - m)
    for_each_column(l, valid, packed, [&](int, float x) {
        if (x > m) {
            s = s * expf(m - x) + 1.0f;  // exp(-inf) = 0 on the first column
            m = x;
        } else if (m != -INFINITY) {  // (a NaN x lands here and makes s NaN, as in kSumExp)
            s += expf(x - m);
        }
    });
    const float max = block_reduce<Reduce::kMax>(m);
    const float sum = block_reduce<Reduce::kSum>(m == -INFINITY ? 0.0f : s * expf(m - max));
    if (threadIdx.x == 0) {
        row_max[n] = max;
        sum_exp[n] = sum;
        const int tj = target_column(targets[n], vocab_start, valid);
        target_logit[n] = tj >= 0 ? to_float(l[tj]) : 0.0f;
    }
}

template <class T>
__global__ void cross_entropy_backward_kernel(T* __restrict__ logits, const int32_t* __restrict__ targets,
                                              const float* __restrict__ row_max, const float* __restrict__ sum_exp,
                                              const float* __restrict__ dloss, int Vp, int64_t vocab_start, int valid,
                                              bool packed) {
    const int n = blockIdx.x;
    T* l = logits + static_cast<int64_t>(n) * Vp;
    const float max = row_max[n], d = dloss[n];
    const float scale = d / sum_exp[n];
    const int tj = target_column(targets[n], vocab_start, valid);
    over_columns<true>(l, Vp, packed,
                       [&](int j, float x) { return j < valid ? expf(x - max) * scale - (j == tj ? d : 0.0f) : 0.0f; });
}

// Whether every row of an (N, Vp) T matrix at `logits` starts 16-byte aligned (the packed paths above).
template <class T>
bool rows_packed(const T* logits, int Vp) {
    return sizeof(T) == 2 && pack_aligned({logits}) && (static_cast<int64_t>(Vp) * sizeof(T)) % 16 == 0;
}

void check_shape(int N, int Vp, int valid) {
    MS_ASSERT(N >= 0 && Vp > 0, "cross_entropy: N = %d, Vp = %d (Vp must be positive)", N, Vp);
    MS_ASSERT(valid >= 0 && valid <= Vp, "cross_entropy: vocab_valid_local(%d) is outside [0, Vp_local(%d)]", valid,
              Vp);
}

}  // namespace

// ----------------------------------------------------------------------------
// kernel launchers

template <class T>
void cross_entropy_forward(float* row_max, float* sum_exp, float* target_logit, const T* logits, const int32_t* targets,
                           int N, int Vp, int64_t vocab_start, int valid, CrossEntropyPhase phase,
                           cudaStream_t stream) {
    check_shape(N, Vp, valid);
    if (N == 0) return;
    const bool packed = rows_packed(logits, Vp);
    if (phase == CrossEntropyPhase::kMax) {
        ms_launch(cross_entropy_max_kernel<T>, N, kBlockSize, 0, stream, row_max, logits, Vp, valid, packed);
    } else if (phase == CrossEntropyPhase::kMaxSumExp) {
        ms_launch(cross_entropy_max_sum_exp_kernel<T>, N, kBlockSize, 0, stream, row_max, sum_exp, target_logit, logits,
                  targets, Vp, vocab_start, valid, packed);
    } else {
        ms_launch(cross_entropy_sum_exp_kernel<T>, N, kBlockSize, 0, stream, sum_exp, target_logit, logits, targets,
                  row_max, Vp, vocab_start, valid, packed);
    }
    MS_CUDA_LAUNCH_CHECK();
}

template <class T>
void cross_entropy_backward(T* logits, const int32_t* targets, const float* row_max, const float* sum_exp,
                            const float* dloss, int N, int Vp, int64_t vocab_start, int valid, cudaStream_t stream) {
    check_shape(N, Vp, valid);
    if (N == 0) return;
    ms_launch(cross_entropy_backward_kernel<T>, N, kBlockSize, 0, stream, logits, targets, row_max, sum_exp, dloss, Vp,
              vocab_start, valid, rows_packed(logits, Vp));
    MS_CUDA_LAUNCH_CHECK();
}

#define MS_INSTANTIATE(T)                                                                                            \
    template void cross_entropy_forward<T>(float*, float*, float*, const T*, const int32_t*, int, int, int64_t, int, \
                                           CrossEntropyPhase, cudaStream_t);                                         \
    template void cross_entropy_backward<T>(T*, const int32_t*, const float*, const float*, const float*, int, int,  \
                                            int64_t, int, cudaStream_t);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE

}  // namespace ms::cuda
