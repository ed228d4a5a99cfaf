/*
Token + position embedding, vocab-parallel: this rank holds rows [vocab_start, vocab_start + V_local) of the token
table; tokens outside that range contribute 0 here (the TP all-reduce sums them in). Twin: cpu/ops/embedding.cpp.
Layout: tokens (N) int32, table (V_local, C) D, pos (T, C) D optional, out/dout (N, C) D; dtable (V_local, C) and
dpos (T, C) G (parameter gradients: float, or D itself, backend.h precision contract); row n is at position n % T,
N = B * T. D is float, bf16 or fp16: out = table + pos summed in fp32 and rounded once; the gradients sum dout's values
in fp32.
Forward:  one thread per output element (grid-stride).
Backward: no float atomics, and every element is summed in token order n = 0, 1, ... exactly as the CPU twin, so
          the result is bit-identical to it:
          dtable: block (kCols threads = kCols columns) x (blockIdx.y = a slice of kSliceRows vocabulary rows). The
                  block walks the tokens in rounds of kTokensPerThread * kCols; each round compacts the tokens that
                  fall in its slice, in order (a block-wide prefix count: warp shuffles plus one value per warp), and
                  every thread then adds their dout columns into the slice's accumulator in shared memory
                  (kSliceRows x kCols fp32). A row's accumulator is loaded from dtable when the block first meets it
                  and stored back at the end, so rows no token names are never touched, and each element is the
                  CPU's sequence of += in token order. The cost per block is a read of the N tokens (from L2) plus
                  its slice's tokens at shared-memory speed: a frequent token costs a shared-memory add per
                  occurrence, not a dependent global read-modify-write as it did when the accumulator lived in
                  dtable (text is skewed: GPT-2's most frequent tokens share the lowest ids, so one slice held a
                  large share of the tokens and its blocks ran a chain of thousands of global round trips).
          dpos:   one thread per (t, c): the sum over b of dout[b * T + t, c], in b order.
Gradient dtype G: an fp32 element's sum starts from its old value (the CPU twin's sequence of +=, as always); a 16-bit
          one's starts from 0 and is added to the old value on store, one rounding: from_float<G>(old + c), c being
          what the same call adds into an fp32 gradient that starts at 0 (kStartsFromOld below).
Accumulation contract: out is overwritten; dtable and dpos are += (rows of tokens not held here are not touched).
*/
#include <type_traits>

#include "engine/backends/cuda/kernels/embedding.cuh"

namespace ms::cuda {
namespace {

constexpr int kBlockSize = 256;
constexpr int kCols = 128;           // threads (columns) of a dtable block
constexpr int kSliceRows = 64;       // vocabulary rows of a dtable block: its accumulator is 32 KiB of shared memory
constexpr int kTokensPerThread = 4;  // tokens a thread classifies per round (kRound consecutive tokens a round)
constexpr int kRound = kTokensPerThread * kCols;
constexpr int kColWarps = kCols / 32;
static_assert(kSliceRows <= 64, "a thread tracks the rows it has loaded in one 64-bit mask");

// An fp32 gradient's sum starts from its old value; a 16-bit one's from 0, the old value added on store (header).
template <class G>
constexpr bool kStartsFromOld = std::is_same_v<G, float>;

// The start of a gradient element's sum, and its store of the finished sum acc (old: the element's value).
template <class G>
__device__ __forceinline__ float gradient_start(G old) {
    if constexpr (kStartsFromOld<G>) {
        return old;
    } else {
        return 0.0f;
    }
}
template <class G>
__device__ __forceinline__ G gradient_store(G old, float acc) {
    if constexpr (kStartsFromOld<G>) {
        return acc;
    } else {
        return from_float<G>(to_float(old) + acc);
    }
}

// ----------------------------------------------------------------------------
// CUDA kernels

template <class D>
__global__ void embedding_forward_kernel(D* __restrict__ out, const int32_t* __restrict__ tokens,
                                         const D* __restrict__ table, const D* __restrict__ pos, int N, int C,
                                         int V_local, int64_t vocab_start, int T) {
    const int64_t total = static_cast<int64_t>(N) * C;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int n = static_cast<int>(i / C), c = static_cast<int>(i % C);
        const int64_t row = static_cast<int64_t>(tokens[n]) - vocab_start;
        float x = row >= 0 && row < V_local ? to_float(table[row * C + c]) : 0.0f;
        if (pos != nullptr) x += to_float(pos[static_cast<int64_t>(n % T) * C + c]);
        out[i] = from_float<D>(x);
    }
}

template <class D, class G>
__global__ void embedding_backward_table_kernel(G* __restrict__ dtable, const int32_t* __restrict__ tokens,
                                                const D* __restrict__ dout, int N, int C, int V_local,
                                                int64_t vocab_start) {
    __shared__ float s_acc[kSliceRows][kCols];  // the slice's rows, this block's columns
    __shared__ int s_token[kRound];             // this round's tokens in the slice, in order: their n
    __shared__ uint8_t s_row[kRound];           //   and their row in the slice
    __shared__ int s_warp_total[kColWarps];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int c = blockIdx.x * kCols + threadIdx.x;
    const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kSliceRows;
    const int rows = static_cast<int>(V_local - row0 < kSliceRows ? V_local - row0 : kSliceRows);
    uint64_t loaded = 0;  // rows of s_acc holding their dtable value (the same in every thread with c < C)
    for (int n0 = 0; n0 < N; n0 += kRound) {
        // This thread's kTokensPerThread consecutive tokens: which fall in the slice, and where.
        int row[kTokensPerThread], count = 0;
        for (int k = 0; k < kTokensPerThread; ++k) {
            const int n = n0 + threadIdx.x * kTokensPerThread + k;
            row[k] = -1;
            if (n < N) {
                const int64_t r = static_cast<int64_t>(tokens[n]) - vocab_start - row0;
                if (r >= 0 && r < rows) row[k] = static_cast<int>(r), ++count;
            }
        }
        // Exclusive prefix count over the block in thread order = token order.
        int prefix = count;  // inclusive within the warp
        for (int d = 1; d < 32; d *= 2) {
            const int v = __shfl_up_sync(0xffffffffu, prefix, d);
            if (lane >= d) prefix += v;
        }
        if (lane == 31) s_warp_total[warp] = prefix;
        __syncthreads();
        int total = 0;
        for (int w = 0; w < kColWarps; ++w) {
            if (w < warp) prefix += s_warp_total[w];
            total += s_warp_total[w];
        }
        prefix -= count;
        for (int k = 0; k < kTokensPerThread; ++k) {
            if (row[k] >= 0) {
                s_token[prefix] = n0 + threadIdx.x * kTokensPerThread + k;
                s_row[prefix] = static_cast<uint8_t>(row[k]);
                ++prefix;
            }
        }
        __syncthreads();
        if (c < C) {
            for (int i = 0; i < total; ++i) {
                const int r = s_row[i];
                const float d = to_float(dout[static_cast<int64_t>(s_token[i]) * C + c]);
                if (!(loaded >> r & 1u)) {
                    s_acc[r][threadIdx.x] = gradient_start(dtable[(row0 + r) * C + c]);
                    loaded |= uint64_t{1} << r;
                }
                s_acc[r][threadIdx.x] += d;
            }
        }
        __syncthreads();  // the round's lists and warp totals are consumed before the next round overwrites them
    }
    if (c < C) {
        for (int r = 0; r < rows; ++r) {
            G& g = dtable[(row0 + r) * C + c];
            if (loaded >> r & 1u) g = gradient_store(g, s_acc[r][threadIdx.x]);
        }
    }
}

template <class D, class G>
__global__ void embedding_backward_pos_kernel(G* __restrict__ dpos, const D* __restrict__ dout, int N, int C, int T) {
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // t * C + c
    if (i >= static_cast<int64_t>(T) * C) return;
    float acc = gradient_start(dpos[i]);
    for (int n = static_cast<int>(i / C); n < N; n += T) acc += to_float(dout[static_cast<int64_t>(n) * C + i % C]);
    dpos[i] = gradient_store(dpos[i], acc);
}

void check_shape(int N, int C, int V_local, int T) {
    MS_ASSERT(N >= 0 && C > 0 && V_local >= 0, "embedding: N = %d, C = %d, V_local = %d (C must be positive)", N, C,
              V_local);
    MS_ASSERT(T > 0 && N % T == 0, "embedding: N(%d) is not a multiple of T(%d)", N, T);
}

}  // namespace

// ----------------------------------------------------------------------------
// kernel launchers

template <class D>
void embedding_forward(D* out, const int32_t* tokens, const D* table, const NoDeduce<D>* pos, int N, int C, int V_local,
                       int64_t vocab_start, int T, cudaStream_t stream) {
    check_shape(N, C, V_local, T);
    if (N == 0) return;
    ms_launch(embedding_forward_kernel<D>, grid_stride_blocks(static_cast<int64_t>(N) * C, kBlockSize), kBlockSize, 0,
              stream, out, tokens, table, pos, N, C, V_local, vocab_start, T);
    MS_CUDA_LAUNCH_CHECK();
}

template <class D, class G>
void embedding_backward(G* dtable, NoDeduce<G>* dpos, const int32_t* tokens, const D* dout, int N, int C, int V_local,
                        int64_t vocab_start, int T, cudaStream_t stream) {
    check_shape(N, C, V_local, T);
    if (N == 0) return;
    if (V_local > 0) {
        const int64_t slices = ceil_div(V_local, kSliceRows);
        MS_ASSERT(slices <= 65535, "embedding: V_local = %d rows make %lld slices of %d, over the grid's y limit",
                  V_local, static_cast<long long>(slices), kSliceRows);
        const dim3 grid(static_cast<unsigned>(ceil_div(C, kCols)), static_cast<unsigned>(slices));
        ms_launch(embedding_backward_table_kernel<D, G>, grid, kCols, 0, stream, dtable, tokens, dout, N, C, V_local,
                  vocab_start);
        MS_CUDA_LAUNCH_CHECK();
    }
    if (dpos != nullptr) {
        ms_launch(embedding_backward_pos_kernel<D, G>,
                  static_cast<int>(ceil_div(static_cast<int64_t>(T) * C, kBlockSize)), kBlockSize, 0, stream, dpos,
                  dout, N, C, T);
        MS_CUDA_LAUNCH_CHECK();
    }
}

#define MS_INSTANTIATE(D)                                                                                   \
    template void embedding_forward<D>(D*, const int32_t*, const D*, const D*, int, int, int, int64_t, int, \
                                       cudaStream_t);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE
// (D, G): every activation dtype with fp32 gradients, and bf16 / fp16 with gradients of their own dtype.
#define MS_INSTANTIATE(D, G) \
    template void embedding_backward<D, G>(G*, G*, const int32_t*, const D*, int, int, int, int64_t, int, cudaStream_t);
MS_INSTANTIATE(float, float)
MS_INSTANTIATE(bf16, float)
MS_INSTANTIATE(bf16, bf16)
MS_INSTANTIATE(fp16, float)
MS_INSTANTIATE(fp16, fp16)
#undef MS_INSTANTIATE

}  // namespace ms::cuda
