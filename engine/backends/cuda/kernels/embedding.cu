/*
Token + position embedding, vocab-parallel: this rank holds rows [vocab_start, vocab_start + V_local) of the token
table; tokens outside that range contribute 0 here (the TP all-reduce sums them in). Twin: cpu/ops/embedding.cpp.
Layout: tokens (N) int32, table (V_local, C) T, pos (T, C) T optional, out/dout (N, C) T; dtable (V_local, C) and
dpos (T, C) fp32 (parameter gradients, whatever T is); row n is at position n % T, N = B * T. T is float, bf16 or
fp16: out = table + pos summed in fp32 and rounded once; the gradients sum dout's values in fp32.
Forward:  one thread per output element (grid-stride).
Backward: no float atomics, and every element is summed in token order n = 0, 1, ... exactly as the CPU twin, so
          the result is bit-identical to it:
          dtable: block (kCols threads = kCols columns) x (blockIdx.y = a slice of kRowsPerSlice vocabulary rows);
                  the block stages the tokens through shared memory in chunks and each thread adds the dout
                  columns of the tokens that fall in its slice, in order. Every block reads all N tokens, so the
                  cost grows with V_local / kRowsPerSlice; a bucketed (sorted) variant is for the GPU-tuning session.
          dpos:   one thread per (t, c): the sum over b of dout[b * T + t, c], in b order.
Accumulation contract: out is overwritten; dtable and dpos are += (rows of tokens not held here are not touched).
*/
#include "engine/backends/cuda/kernels/embedding.cuh"

namespace ms::cuda {
namespace {

constexpr int kBlockSize = 256;
constexpr int kCols = 128;  // threads (columns) of a dtable block
constexpr int kRowsPerSlice = 1024;

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

template <class D>
__global__ void embedding_backward_table_kernel(float* __restrict__ dtable, const int32_t* __restrict__ tokens,
                                                const D* __restrict__ dout, int N, int C, int V_local,
                                                int64_t vocab_start) {
    __shared__ int s_rows[kCols];
    const int c = blockIdx.x * kCols + threadIdx.x;
    const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kRowsPerSlice;
    const int64_t row1 = row0 + kRowsPerSlice < V_local ? row0 + kRowsPerSlice : V_local;
    for (int n0 = 0; n0 < N; n0 += kCols) {
        const int n = n0 + threadIdx.x;
        // The local row of token n when it falls in this block's slice, else -1.
        int row = -1;
        if (n < N) {
            const int64_t r = static_cast<int64_t>(tokens[n]) - vocab_start;
            row = r >= row0 && r < row1 ? static_cast<int>(r) : -1;
        }
        s_rows[threadIdx.x] = row;
        __syncthreads();
        const int count = N - n0 < kCols ? N - n0 : kCols;
        if (c < C) {
            for (int k = 0; k < count; ++k) {
                const int r = s_rows[k];
                if (r >= 0) {
                    dtable[static_cast<int64_t>(r) * C + c] += to_float(dout[static_cast<int64_t>(n0 + k) * C + c]);
                }
            }
        }
        __syncthreads();  // the chunk is consumed before the next one overwrites it
    }
}

template <class D>
__global__ void embedding_backward_pos_kernel(float* __restrict__ dpos, const D* __restrict__ dout, int N, int C,
                                              int T) {
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // t * C + c
    if (i >= static_cast<int64_t>(T) * C) return;
    float acc = dpos[i];
    for (int n = static_cast<int>(i / C); n < N; n += T) acc += to_float(dout[static_cast<int64_t>(n) * C + i % C]);
    dpos[i] = acc;
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

template <class D>
void embedding_backward(float* dtable, float* dpos, const int32_t* tokens, const D* dout, int N, int C, int V_local,
                        int64_t vocab_start, int T, cudaStream_t stream) {
    check_shape(N, C, V_local, T);
    if (N == 0) return;
    if (V_local > 0) {
        const int64_t slices = ceil_div(V_local, kRowsPerSlice);
        MS_ASSERT(slices <= 65535, "embedding: V_local = %d rows make %lld slices of %d, over the grid's y limit",
                  V_local, static_cast<long long>(slices), kRowsPerSlice);
        const dim3 grid(static_cast<unsigned>(ceil_div(C, kCols)), static_cast<unsigned>(slices));
        ms_launch(embedding_backward_table_kernel<D>, grid, kCols, 0, stream, dtable, tokens, dout, N, C, V_local,
                  vocab_start);
        MS_CUDA_LAUNCH_CHECK();
    }
    if (dpos != nullptr) {
        ms_launch(embedding_backward_pos_kernel<D>, static_cast<int>(ceil_div(static_cast<int64_t>(T) * C, kBlockSize)),
                  kBlockSize, 0, stream, dpos, dout, N, C, T);
        MS_CUDA_LAUNCH_CHECK();
    }
}

#define MS_INSTANTIATE(D)                                                                                      \
    template void embedding_forward<D>(D*, const int32_t*, const D*, const D*, int, int, int, int64_t, int,    \
                                       cudaStream_t);                                                          \
    template void embedding_backward<D>(float*, float*, const int32_t*, const D*, int, int, int, int64_t, int, \
                                        cudaStream_t);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE

}  // namespace ms::cuda
