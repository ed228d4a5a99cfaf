/*
Causal self-attention, multi-head or grouped-query, forward and backward, as tiled flash attention: online softmax,
no (T, T) matrix in memory, lse saved, the backward recomputes the probabilities from lse. Twin: cpu/ops/attention.cpp.
Layout: qkv/dqkv (B, T, W) with W = (NH + 2*NKV)*HS, rows [Q: NH*HS | K: NKV*HS | V: NKV*HS], each block head-major
(head h owns columns h*HS .. (h+1)*HS of its block); out/dout (B, T, C) with C = NH*HS head-major; lse (B, NH, T)
fp32. HS <= kAttentionMaxHS. Query head h reads key/value head h / G, G = NH / NKV (NKV = NH: multi-head attention).
qkv, dqkv, out, dout are T, the activation dtype (float, bf16, fp16): rows are converted to fp32 as they are staged
into shared memory (which holds fp32 tiles for every T), all math is fp32, and each output element is rounded once.
Per (b, h), with scale = 1/sqrt(HS), query row t, key row u <= t:
  forward:  S = Q K^T * scale;  running max m and sum l per row over key tiles (l *= exp(m_old - m_new) when the
            max grows, the output accumulator likewise);  O = acc / l;  lse = m + log l
  backward: P = exp(S - lse);  D_t = dO_t . O_t;  dS = P * (dO V^T - D);  dQ = dS K * scale;  dK = dS^T Q * scale;
            dV = P^T dO.
Tiles: kTile queries x kTile keys per block of (kTile, kTile) threads, (q, k, v) tiles of kTile rows in shared
memory. The forward and the dQ kernel own a query tile and walk the key tiles up to the diagonal; the dK/dV kernel
owns a key tile and walks the query tiles from the diagonal on. dQ and dK/dV are separate kernels that both
recompute P, so nothing is accumulated across blocks: no atomics, and every run gives the same bits. Grouped-query:
the dK/dV kernel's block owns a key tile of a key/value head and walks the query tiles of its G query heads in head
order, adding into the same accumulators (G = 1 is the multi-head kernel, step for step).
Rows past T (the last tile's tail) read row T-1 (keeping every softmax row non-empty, so no 0/0) and write nothing.
Dispatch: bf16 / fp16 with HS in {16, 32, 48, 64} (and 16-byte aligned tensors) run the tensor-core kernels of
attention_tc.cu, which compute the same equations with bf16 / fp16 mma operands (P and dS rounded to the storage
type before their products); fp32, and every other HS, run the scalar kernels below (fp32 math from shared memory:
16 x 16 tiles, slow, the spec). AttentionKernels::kScalar (the config's debug.cuda_attention: scalar) sends bf16 /
fp16 to the scalar kernels too: on a GPU, it tells a tensor-core kernel fault from one elsewhere. The tensor-core
backward is fused (one kernel, dQ added in a fixed order through scratch) when the caller passes scratch, split (two
kernels, no scratch) otherwise or under AttentionKernels::kTensorCoresSplitBackward (debug.cuda_attention_bwd:
split).
Accumulation contract: out and lse are overwritten; dqkv is overwritten (every element of it, Q, K and V columns).
*/
#include "engine/backends/cuda/kernels/attention.cuh"

#include <type_traits>

#include "engine/backends/cuda/kernels/attention_tc.cuh"

namespace ms::cuda {
namespace {

constexpr int kTile = 16;
constexpr int kMaxHS = kAttentionMaxHS;
constexpr int kDPerThread = kMaxHS / kTile;  // head-dim columns d = tx + i * kTile a thread accumulates

// The kTile threads of a tile row are consecutive lanes of one warp (threadIdx.x fastest), so the xor butterfly
// over offsets < kTile stays in the row; every one of them ends with the same result.
__device__ __forceinline__ float row_reduce_sum(float v) {
    for (int offset = kTile / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset, kTile);
    return v;
}
__device__ __forceinline__ float row_reduce_max(float v) {
    for (int offset = kTile / 2; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset, kTile));
    }
    return v;
}

__device__ __forceinline__ float dot_hs(const float* a, const float* b, int HS) {
    float acc = 0.0f;
    for (int d = 0; d < HS; ++d) acc += a[d] * b[d];
    return acc;
}

// Copies row `row` of the (T, *) matrix at src (row stride `stride`) into dst as fp32; the calling tile row's threads
// split the HS columns.
template <class S>
__device__ __forceinline__ void load_row(float* dst, const S* src, int64_t row, int64_t stride, int HS) {
    for (int d = threadIdx.x; d < HS; d += kTile) dst[d] = to_float(src[row * stride + d]);
}

// D = dO . O for one query row, over the calling tile row's threads.
template <class S>
__device__ __forceinline__ float row_dot(const S* dout_row, const S* out_row, int HS) {
    float acc = 0.0f;
    for (int d = threadIdx.x; d < HS; d += kTile) acc += to_float(dout_row[d]) * to_float(out_row[d]);
    return row_reduce_sum(acc);
}

// ----------------------------------------------------------------------------
// CUDA kernels

// grid (query tiles, NH, B), block (kTile, kTile): threadIdx.y is the query row of the tile, threadIdx.x the key.
template <class S>
__global__ void attention_forward_kernel(S* __restrict__ out, float* __restrict__ lse, const S* __restrict__ qkv, int T,
                                         int NH, int NKV, int HS, float scale) {
    __shared__ float s_q[kTile][kMaxHS];
    __shared__ float s_k[kTile][kMaxHS];
    __shared__ float s_v[kTile][kMaxHS];
    __shared__ float s_p[kTile][kTile];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int h = blockIdx.y, b = blockIdx.z;
    const int64_t C = static_cast<int64_t>(NH) * HS;
    const QkvHead<S> qh = qkv_head(qkv, b, h, T, NH, NKV, HS);
    const int64_t stride = qh.stride;
    const int q0 = blockIdx.x * kTile;
    const int query = q0 + ty < T ? q0 + ty : T - 1;
    load_row(s_q[ty], qh.q, query, stride, HS);

    float m = -INFINITY, l = 0.0f, acc[kDPerThread] = {};
    for (int k0 = 0; k0 <= q0; k0 += kTile) {
        load_row(s_k[ty], qh.k, k0 + ty < T ? k0 + ty : T - 1, stride, HS);
        load_row(s_v[ty], qh.v, k0 + ty < T ? k0 + ty : T - 1, stride, HS);
        __syncthreads();  // the q, k, v tiles are in
        const int key = k0 + tx;
        const bool visible = key <= query;  // key 0 of tile 0 is visible to every row, so m is finite from here on
        const float s = visible ? dot_hs(s_q[ty], s_k[tx], HS) * scale : -INFINITY;
        const float m_new = fmaxf(m, row_reduce_max(s));
        const float p = visible ? expf(s - m_new) : 0.0f;
        const float correction = expf(m - m_new);  // 0 on the first tile, where m = -inf and l = acc = 0
        l = l * correction + row_reduce_sum(p);
        s_p[ty][tx] = p;
        __syncthreads();  // the tile row's probabilities are in
        for (int i = 0; i < kDPerThread; ++i) {
            const int d = tx + i * kTile;
            if (d >= HS) break;
            float pv = 0.0f;
            for (int u = 0; u < kTile; ++u) pv += s_p[ty][u] * s_v[u][d];
            acc[i] = acc[i] * correction + pv;
        }
        m = m_new;
        __syncthreads();  // every read of s_k, s_v, s_p is done before the next tile overwrites them
    }
    if (q0 + ty >= T) return;
    S* o = out + (static_cast<int64_t>(b) * T + query) * C + static_cast<int64_t>(h) * HS;
    for (int i = 0; i < kDPerThread; ++i) {
        const int d = tx + i * kTile;
        if (d < HS) o[d] = from_float<S>(acc[i] / l);
    }
    if (tx == 0) lse[(static_cast<int64_t>(b) * NH + h) * T + query] = m + logf(l);
}

// dQ for one query tile: grid (query tiles, NH, B), block (kTile, kTile), threadIdx.y the query row.
template <class S>
__global__ void attention_backward_dq_kernel(S* __restrict__ dqkv, const S* __restrict__ dout,
                                             const S* __restrict__ qkv, const S* __restrict__ out,
                                             const float* __restrict__ lse, int T, int NH, int NKV, int HS,
                                             float scale) {
    __shared__ float s_q[kTile][kMaxHS];
    __shared__ float s_do[kTile][kMaxHS];
    __shared__ float s_k[kTile][kMaxHS];
    __shared__ float s_v[kTile][kMaxHS];
    __shared__ float s_ds[kTile][kTile];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int h = blockIdx.y, b = blockIdx.z;
    const int64_t C = static_cast<int64_t>(NH) * HS;
    const QkvHead<S> qh = qkv_head(qkv, b, h, T, NH, NKV, HS);
    const int64_t stride = qh.stride;
    const S* do_base = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS;
    const S* o_base = out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS;
    const int q0 = blockIdx.x * kTile;
    const int query = q0 + ty < T ? q0 + ty : T - 1;
    load_row(s_q[ty], qh.q, query, stride, HS);
    load_row(s_do[ty], do_base, query, C, HS);
    const float D = row_dot(do_base + query * C, o_base + query * C, HS);
    const float row_lse = lse[(static_cast<int64_t>(b) * NH + h) * T + query];

    float acc[kDPerThread] = {};
    for (int k0 = 0; k0 <= q0; k0 += kTile) {
        load_row(s_k[ty], qh.k, k0 + ty < T ? k0 + ty : T - 1, stride, HS);
        load_row(s_v[ty], qh.v, k0 + ty < T ? k0 + ty : T - 1, stride, HS);
        __syncthreads();
        const int key = k0 + tx;
        float ds = 0.0f;
        if (key <= query) {
            const float p = expf(dot_hs(s_q[ty], s_k[tx], HS) * scale - row_lse);
            ds = p * (dot_hs(s_do[ty], s_v[tx], HS) - D);
        }
        s_ds[ty][tx] = ds;
        __syncthreads();
        for (int i = 0; i < kDPerThread; ++i) {
            const int d = tx + i * kTile;
            if (d >= HS) break;
            for (int u = 0; u < kTile; ++u) acc[i] += s_ds[ty][u] * s_k[u][d];
        }
        __syncthreads();
    }
    if (q0 + ty >= T) return;
    S* dq = dqkv + (static_cast<int64_t>(b) * T + query) * stride + static_cast<int64_t>(h) * HS;
    for (int i = 0; i < kDPerThread; ++i) {
        const int d = tx + i * kTile;
        if (d < HS) dq[d] = from_float<S>(acc[i] * scale);
    }
}

// dK and dV for one key tile of a key/value head: grid (key tiles, NKV, B), block (kTile, kTile). The block walks the
// query tiles of its G query heads in head order. While P and dS are formed threadIdx.y is the query row and
// threadIdx.x the key; while they are accumulated threadIdx.y is the key.
template <class S>
__global__ void attention_backward_dkv_kernel(S* __restrict__ dqkv, const S* __restrict__ dout,
                                              const S* __restrict__ qkv, const S* __restrict__ out,
                                              const float* __restrict__ lse, int T, int NH, int NKV, int HS,
                                              float scale) {
    __shared__ float s_k[kTile][kMaxHS];
    __shared__ float s_v[kTile][kMaxHS];
    __shared__ float s_q[kTile][kMaxHS];
    __shared__ float s_do[kTile][kMaxHS];
    __shared__ float s_p[kTile][kTile];
    __shared__ float s_ds[kTile][kTile];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int kv = blockIdx.y, b = blockIdx.z, G = NH / NKV;
    const int64_t C = static_cast<int64_t>(NH) * HS;
    const int k0 = blockIdx.x * kTile;
    const QkvHead<S> kvh = qkv_head(qkv, b, kv * G, T, NH, NKV, HS);
    const int64_t stride = kvh.stride;
    load_row(s_k[ty], kvh.k, k0 + ty < T ? k0 + ty : T - 1, stride, HS);
    load_row(s_v[ty], kvh.v, k0 + ty < T ? k0 + ty : T - 1, stride, HS);

    float acc_k[kDPerThread] = {}, acc_v[kDPerThread] = {};
    for (int h = kv * G; h < (kv + 1) * G; ++h) {
        const S* q_base = qkv_head(qkv, b, h, T, NH, NKV, HS).q;
        const S* do_base = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS;
        const S* o_base = out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * HS;
        const float* lse_row = lse + (static_cast<int64_t>(b) * NH + h) * T;
        for (int q0 = k0; q0 < T; q0 += kTile) {
            const int query = q0 + ty < T ? q0 + ty : T - 1;
            load_row(s_q[ty], q_base, query, stride, HS);
            load_row(s_do[ty], do_base, query, C, HS);
            const float D = row_dot(do_base + query * C, o_base + query * C, HS);
            __syncthreads();
            const int key = k0 + tx;
            float p = 0.0f, ds = 0.0f;
            if (q0 + ty < T && key <= q0 + ty) {
                p = expf(dot_hs(s_q[ty], s_k[tx], HS) * scale - lse_row[query]);
                ds = p * (dot_hs(s_do[ty], s_v[tx], HS) - D);
            }
            s_p[ty][tx] = p;
            s_ds[ty][tx] = ds;
            __syncthreads();
            for (int i = 0; i < kDPerThread; ++i) {
                const int d = tx + i * kTile;
                if (d >= HS) break;
                for (int t = 0; t < kTile; ++t) {
                    acc_v[i] += s_p[t][ty] * s_do[t][d];
                    acc_k[i] += s_ds[t][ty] * s_q[t][d];
                }
            }
            __syncthreads();
        }
    }
    if (k0 + ty >= T) return;
    S* dk = dqkv + (static_cast<int64_t>(b) * T + k0 + ty) * stride + C + static_cast<int64_t>(kv) * HS;
    S* dv = dk + static_cast<int64_t>(NKV) * HS;
    for (int i = 0; i < kDPerThread; ++i) {
        const int d = tx + i * kTile;
        if (d >= HS) break;
        dk[d] = from_float<S>(acc_k[i] * scale);
        dv[d] = from_float<S>(acc_v[i]);
    }
}

void check_shape(int B, int T, int NH, int NKV, int HS) {
    MS_ASSERT(B >= 0 && T >= 0 && NH > 0, "attention: B = %d, T = %d, NH = %d (NH must be positive)", B, T, NH);
    MS_ASSERT(NKV > 0 && NH % NKV == 0, "attention: NKV = %d key/value heads do not divide NH = %d query heads", NKV,
              NH);
    MS_ASSERT(HS > 0 && HS <= kMaxHS, "attention: head size HS = %d is outside [1, %d], the kernels' tile width", HS,
              kMaxHS);
    MS_ASSERT(B <= 65535 && NH <= 65535, "attention: B = %d or NH = %d is over the grid's y/z limit of 65535", B, NH);
}

// The tensor-core path, unless the caller asks for the scalar kernels (header).
bool tensor_cores_allowed(AttentionKernels kernels) { return kernels != AttentionKernels::kScalar; }

// The tensor-core backward given scratch (header).
AttentionTcBackward tc_backward_kind(AttentionKernels kernels) {
    return kernels == AttentionKernels::kTensorCoresSplitBackward ? AttentionTcBackward::kSplit
                                                                  : AttentionTcBackward::kFused;
}

}  // namespace

// ----------------------------------------------------------------------------
// kernel launchers

template <class S>
void attention_forward(S* out, float* lse, const S* qkv, int B, int T, int NH, int NKV, int HS, cudaStream_t stream,
                       AttentionKernels kernels) {
    check_shape(B, T, NH, NKV, HS);
    if (B == 0 || T == 0) return;
    if constexpr (!std::is_same_v<S, float>) {
        if (tensor_cores_allowed(kernels) && attention_tc_eligible(HS, {out, qkv})) {
            return attention_tc_forward(out, lse, qkv, B, T, NH, NKV, HS, stream);
        }
    }
    const dim3 grid(static_cast<unsigned>(ceil_div(T, kTile)), static_cast<unsigned>(NH), static_cast<unsigned>(B));
    ms_launch(attention_forward_kernel<S>, grid, dim3(kTile, kTile), 0, stream, out, lse, qkv, T, NH, NKV, HS,
              1.0f / sqrtf(static_cast<float>(HS)));
    MS_CUDA_LAUNCH_CHECK();
}

template <class S>
size_t attention_backward_scratch_bytes(int B, int T, int NH, int HS, AttentionKernels kernels) {
    if constexpr (std::is_same_v<S, float>) {
        return 0;
    } else {
        if (!tensor_cores_allowed(kernels) || !attention_tc_eligible(HS, {}) ||
            tc_backward_kind(kernels) == AttentionTcBackward::kSplit) {
            return 0;
        }
        return attention_tc_backward_scratch_bytes(B, T, NH, HS);
    }
}

template <class S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, void* scratch, int B,
                        int T, int NH, int NKV, int HS, cudaStream_t stream, AttentionKernels kernels) {
    check_shape(B, T, NH, NKV, HS);
    if (B == 0 || T == 0) return;
    if constexpr (!std::is_same_v<S, float>) {
        if (tensor_cores_allowed(kernels) && attention_tc_eligible(HS, {dqkv, dout, qkv, out})) {
            const AttentionTcBackward kind =
                scratch != nullptr ? tc_backward_kind(kernels) : AttentionTcBackward::kSplit;
            return attention_tc_backward(dqkv, dout, qkv, out, lse, scratch, B, T, NH, NKV, HS, kind, stream);
        }
    }
    const unsigned tiles = static_cast<unsigned>(ceil_div(T, kTile));
    const float scale = 1.0f / sqrtf(static_cast<float>(HS));
    ms_launch(attention_backward_dq_kernel<S>, dim3(tiles, static_cast<unsigned>(NH), static_cast<unsigned>(B)),
              dim3(kTile, kTile), 0, stream, dqkv, dout, qkv, out, lse, T, NH, NKV, HS, scale);
    MS_CUDA_LAUNCH_CHECK();
    ms_launch(attention_backward_dkv_kernel<S>, dim3(tiles, static_cast<unsigned>(NKV), static_cast<unsigned>(B)),
              dim3(kTile, kTile), 0, stream, dqkv, dout, qkv, out, lse, T, NH, NKV, HS, scale);
    MS_CUDA_LAUNCH_CHECK();
}

#define MS_INSTANTIATE(S)                                                                                              \
    template void attention_forward<S>(S*, float*, const S*, int, int, int, int, int, cudaStream_t, AttentionKernels); \
    template void attention_backward<S>(S*, const S*, const S*, const S*, const float*, void*, int, int, int, int,     \
                                        int, cudaStream_t, AttentionKernels);                                          \
    template size_t attention_backward_scratch_bytes<S>(int, int, int, int, AttentionKernels);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE

}  // namespace ms::cuda
