/*
One key/value block of ring attention (context parallelism; backend.h, AttentionBlockForwardArgs), forward with the
log-sum-exp merge and backward from the final statistics, and copy_columns. Twin: cpu/ops/attention_block.cpp.
Layout: qkv (B, T, W) with W = (NH + 2*NKV)*HS, rows [Q | K | V] head-major; acc, out, dout, dq (B, T, C) with
C = NH*HS; lse (B, NH, T) fp32; kv (B, Tk, Wkv) with key/value head j's K at columns kv_column + j*HS and V at
kv_column + (NKV + j)*HS; dkv (B, Tk, 2*NKV*HS) fp32 packed [dK | dV]. Query head h reads key/value head h / G,
G = NH / NKV. qkv, kv, out, dout are S (float, bf16, fp16), loaded as fp32; all math is fp32 and every output is fp32.
Per (b, h), query row t in [q_begin, q_begin + q_rows), key row u in [0, keys(t)), keys(t) = t - q_begin + 1 with
`causal`, kv_rows without; scale = 1/sqrt(HS):
  forward:  s_u = q_t . k_u * scale; running max m and sum l over chunks of 32 keys (l and the output accumulator
            rescaled by exp(m_old - m_new) when the max grows); o_b = acc / l, lse_b = m + log l, then merged into
            (acc, lse): lse' = log(exp(lse) + exp(lse_b)), acc' = acc e^(lse - lse') + o_b e^(lse_b - lse')
  backward: p_u = exp(s_u - lse_t) (the final lse);  D_t = dO_t . O_t;  ds_u = p_u (dO_t . v_u - D_t);
            dq_t += scale sum_u ds_u k_u;  dk_u += scale sum_t ds_u q_t;  dv_u += sum_t p_u dO_t
Scalar kernels, one warp per row, kRows warps per block. The forward and the dq kernel own a query row: the lanes
take 32 keys at a time (one dot product each, a warp max and sum), then each lane owns head-dim columns d = lane +
32 i of the row's output. The dk/dv kernel owns a key row of a key/value head and walks its G query heads in head
order, 32 query rows at a time (with `causal`, rows t - q_begin >= u only). Each row's result is one warp's fixed
sequence of operations: no atomics, every element written by one lane, the same bits for any grid.
copy_columns: one thread per element, grid-stride; from_float rounds to nearest even as cast.cu does.
Accumulation contract: acc and lse are overwritten (merge false) or merged, for the query rows only; dq and dkv +=.
*/
#include "engine/backends/cuda/kernels/attention_block.cuh"

#include "engine/backends/cuda/kernels/attention.cuh"

namespace ms::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRows = 4;  // warps (rows) per block
constexpr int kMaxHS = kAttentionMaxHS;
constexpr int kDPerLane = kMaxHS / kWarp;  // head-dim columns d = lane + i * kWarp a lane accumulates
constexpr int kCopyBlockSize = 256;

// sum_d a[d] * to_float(b[d]) over the HS columns, by the calling lane alone.
template <class S>
__device__ __forceinline__ float dot_row(const float* a, const S* b, int HS) {
    float acc = 0.0f;
    for (int d = 0; d < HS; ++d) acc += a[d] * to_float(b[d]);
    return acc;
}

// Copies HS values of src into dst as fp32, split over the warp's lanes.
template <class S>
__device__ __forceinline__ void load_row(float* dst, const S* src, int HS) {
    for (int d = threadIdx.x; d < HS; d += kWarp) dst[d] = to_float(src[d]);
}

// ----------------------------------------------------------------------------
// CUDA kernels

// grid (query rows / kRows, NH, B), block (kWarp, kRows): warp threadIdx.y owns query row q_begin + blockIdx.x *
// kRows + threadIdx.y.
template <class S>
__global__ void attention_block_forward_kernel(float* __restrict__ acc, float* __restrict__ lse,
                                               const S* __restrict__ qkv, const S* __restrict__ kv,
                                               AttentionBlockShape s, bool merge, float scale) {
    __shared__ float s_q[kRows][kMaxHS];
    __shared__ float s_p[kRows][kWarp];
    const int lane = threadIdx.x, w = threadIdx.y;
    const int row = blockIdx.x * kRows + w;
    if (row >= s.q_rows) return;  // the whole warp: no collective below misses a lane
    const int h = blockIdx.y, b = blockIdx.z, j = h / (s.NH / s.NKV);
    const int t = s.q_begin + row, HS = s.HS;
    const int64_t W = static_cast<int64_t>(s.NH + 2 * s.NKV) * HS, C = static_cast<int64_t>(s.NH) * HS;
    const S* k0 = kv + static_cast<int64_t>(b) * s.Tk * s.Wkv + s.kv_column + static_cast<int64_t>(j) * HS;
    const S* v0 = k0 + static_cast<int64_t>(s.NKV) * HS;
    load_row(s_q[w], qkv + (static_cast<int64_t>(b) * s.T + t) * W + static_cast<int64_t>(h) * HS, HS);
    __syncwarp();

    const int n = s.causal ? row + 1 : s.kv_rows;
    float m = -INFINITY, l = 0.0f, o[kDPerLane] = {};
    for (int u0 = 0; u0 < n; u0 += kWarp) {
        const int u = u0 + lane;
        const float score = u < n ? dot_row(s_q[w], k0 + static_cast<int64_t>(u) * s.Wkv, HS) * scale : -INFINITY;
        const float m_new = fmaxf(m, warp_reduce_max(score));  // key 0 is in the first chunk: finite from here on
        const float p = u < n ? expf(score - m_new) : 0.0f;
        const float correction = expf(m - m_new);  // 0 on the first chunk, where m = -inf and l = o = 0
        l = l * correction + warp_reduce_sum(p);
        s_p[w][lane] = p;
        __syncwarp();  // the chunk's probabilities are in
        const int keys = n - u0 < kWarp ? n - u0 : kWarp;
        for (int i = 0; i < kDPerLane; ++i) {
            const int d = lane + i * kWarp;
            if (d >= HS) break;
            float pv = 0.0f;
            for (int k = 0; k < keys; ++k) pv += s_p[w][k] * to_float(v0[static_cast<int64_t>(u0 + k) * s.Wkv + d]);
            o[i] = o[i] * correction + pv;
        }
        m = m_new;
        __syncwarp();  // every read of s_p is done before the next chunk overwrites it
    }

    const float block_lse = m + logf(l), inv_l = 1.0f / l;
    float* acc_row = acc + (static_cast<int64_t>(b) * s.T + t) * C + static_cast<int64_t>(h) * HS;
    float* lse_row = lse + (static_cast<int64_t>(b) * s.NH + h) * s.T + t;
    float keep = 0.0f, add = 1.0f, new_lse = block_lse;
    if (merge) {
        const float old = *lse_row;
        const float mm = fmaxf(old, block_lse);
        new_lse = mm + logf(expf(old - mm) + expf(block_lse - mm));
        keep = expf(old - new_lse);
        add = expf(block_lse - new_lse);
        __syncwarp();  // every lane has read the old lse before lane 0 overwrites it
    }
    for (int i = 0; i < kDPerLane; ++i) {
        const int d = lane + i * kWarp;
        if (d >= HS) break;
        acc_row[d] = merge ? acc_row[d] * keep + o[i] * inv_l * add : o[i] * inv_l;
    }
    if (lane == 0) *lse_row = new_lse;
}

// dq for one query row: grid (query rows / kRows, NH, B), block (kWarp, kRows) as the forward's.
template <class S>
__global__ void attention_block_dq_kernel(float* __restrict__ dq, const S* __restrict__ dout, const S* __restrict__ qkv,
                                          const S* __restrict__ out, const float* __restrict__ lse,
                                          const S* __restrict__ kv, AttentionBlockShape s, float scale) {
    __shared__ float s_q[kRows][kMaxHS];
    __shared__ float s_do[kRows][kMaxHS];
    __shared__ float s_ds[kRows][kWarp];
    const int lane = threadIdx.x, w = threadIdx.y;
    const int row = blockIdx.x * kRows + w;
    if (row >= s.q_rows) return;
    const int h = blockIdx.y, b = blockIdx.z, j = h / (s.NH / s.NKV);
    const int t = s.q_begin + row, HS = s.HS;
    const int64_t W = static_cast<int64_t>(s.NH + 2 * s.NKV) * HS, C = static_cast<int64_t>(s.NH) * HS;
    const S* k0 = kv + static_cast<int64_t>(b) * s.Tk * s.Wkv + s.kv_column + static_cast<int64_t>(j) * HS;
    const S* v0 = k0 + static_cast<int64_t>(s.NKV) * HS;
    const int64_t at = (static_cast<int64_t>(b) * s.T + t) * C + static_cast<int64_t>(h) * HS;  // (b, t, h) of C
    load_row(s_q[w], qkv + (static_cast<int64_t>(b) * s.T + t) * W + static_cast<int64_t>(h) * HS, HS);
    load_row(s_do[w], dout + at, HS);
    float D = 0.0f;
    for (int d = lane; d < HS; d += kWarp) D += to_float(dout[at + d]) * to_float(out[at + d]);
    D = warp_reduce_sum(D);
    __syncwarp();  // the q and dO rows are in
    const float row_lse = lse[(static_cast<int64_t>(b) * s.NH + h) * s.T + t];

    const int n = s.causal ? row + 1 : s.kv_rows;
    float g[kDPerLane] = {};
    for (int u0 = 0; u0 < n; u0 += kWarp) {
        const int u = u0 + lane;
        float ds = 0.0f;
        if (u < n) {
            const float p = expf(dot_row(s_q[w], k0 + static_cast<int64_t>(u) * s.Wkv, HS) * scale - row_lse);
            ds = p * (dot_row(s_do[w], v0 + static_cast<int64_t>(u) * s.Wkv, HS) - D);
        }
        s_ds[w][lane] = ds;
        __syncwarp();
        const int keys = n - u0 < kWarp ? n - u0 : kWarp;
        for (int i = 0; i < kDPerLane; ++i) {
            const int d = lane + i * kWarp;
            if (d >= HS) break;
            for (int k = 0; k < keys; ++k) g[i] += s_ds[w][k] * to_float(k0[static_cast<int64_t>(u0 + k) * s.Wkv + d]);
        }
        __syncwarp();
    }
    for (int i = 0; i < kDPerLane; ++i) {
        const int d = lane + i * kWarp;
        if (d < HS) dq[at + d] += g[i] * scale;
    }
}

// dk and dv for one key row of a key/value head: grid (kv_rows / kRows, NKV, B), block (kWarp, kRows), warp
// threadIdx.y owning key row blockIdx.x * kRows + threadIdx.y. The lanes take 32 query rows at a time, one (p, ds)
// each, then each lane owns head-dim columns of the key row's dk and dv.
template <class S>
__global__ void attention_block_dkv_kernel(float* __restrict__ dkv, const S* __restrict__ dout,
                                           const S* __restrict__ qkv, const S* __restrict__ out,
                                           const float* __restrict__ lse, const S* __restrict__ kv,
                                           AttentionBlockShape s, float scale) {
    __shared__ float s_k[kRows][kMaxHS];
    __shared__ float s_v[kRows][kMaxHS];
    __shared__ float s_p[kRows][kWarp];
    __shared__ float s_ds[kRows][kWarp];
    const int lane = threadIdx.x, w = threadIdx.y;
    const int u = blockIdx.x * kRows + w;
    if (u >= s.kv_rows) return;
    const int j = blockIdx.y, b = blockIdx.z, G = s.NH / s.NKV, HS = s.HS;
    const int64_t W = static_cast<int64_t>(s.NH + 2 * s.NKV) * HS, C = static_cast<int64_t>(s.NH) * HS;
    const S* k = kv + (static_cast<int64_t>(b) * s.Tk + u) * s.Wkv + s.kv_column + static_cast<int64_t>(j) * HS;
    load_row(s_k[w], k, HS);
    load_row(s_v[w], k + static_cast<int64_t>(s.NKV) * HS, HS);
    __syncwarp();

    const int first = s.causal ? u : 0;  // with causal, query row q_begin + r sees key u when u <= r
    float gk[kDPerLane] = {}, gv[kDPerLane] = {};
    for (int h = j * G; h < (j + 1) * G; ++h) {
        const S* q0 = qkv + (static_cast<int64_t>(b) * s.T + s.q_begin) * W + static_cast<int64_t>(h) * HS;
        const int64_t at0 = (static_cast<int64_t>(b) * s.T + s.q_begin) * C + static_cast<int64_t>(h) * HS;
        const float* lse0 = lse + (static_cast<int64_t>(b) * s.NH + h) * s.T + s.q_begin;
        for (int r0 = first; r0 < s.q_rows; r0 += kWarp) {
            const int r = r0 + lane;
            float p = 0.0f, ds = 0.0f;
            if (r < s.q_rows) {
                const S* dO = dout + at0 + static_cast<int64_t>(r) * C;
                const S* O = out + at0 + static_cast<int64_t>(r) * C;
                float D = 0.0f;
                for (int d = 0; d < HS; ++d) D += to_float(dO[d]) * to_float(O[d]);
                p = expf(dot_row(s_k[w], q0 + static_cast<int64_t>(r) * W, HS) * scale - lse0[r]);
                ds = p * (dot_row(s_v[w], dO, HS) - D);
            }
            s_p[w][lane] = p;
            s_ds[w][lane] = ds;
            __syncwarp();
            const int rows = s.q_rows - r0 < kWarp ? s.q_rows - r0 : kWarp;
            for (int i = 0; i < kDPerLane; ++i) {
                const int d = lane + i * kWarp;
                if (d >= HS) break;
                for (int x = 0; x < rows; ++x) {
                    const int64_t row = r0 + x;
                    gv[i] += s_p[w][x] * to_float(dout[at0 + row * C + d]);
                    gk[i] += s_ds[w][x] * to_float(q0[row * W + d]);
                }
            }
            __syncwarp();
        }
    }
    float* dk = dkv + (static_cast<int64_t>(b) * s.Tk + u) * (2 * static_cast<int64_t>(s.NKV) * HS) +
                static_cast<int64_t>(j) * HS;
    float* dv = dk + static_cast<int64_t>(s.NKV) * HS;
    for (int i = 0; i < kDPerLane; ++i) {
        const int d = lane + i * kWarp;
        if (d >= HS) break;
        dk[d] += gk[i] * scale;
        dv[d] += gv[i];
    }
}

template <class S, class D>
__global__ void copy_columns_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t rows, int64_t ws,
                                    int64_t wd, int64_t src_column, int64_t dst_column, int64_t cols) {
    const int64_t n = rows * cols;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int64_t r = i / cols, c = i % cols;
        dst[r * wd + dst_column + c] = from_float<D>(to_float(src[r * ws + src_column + c]));
    }
}

void check_shape(const AttentionBlockShape& s) {
    MS_ASSERT(s.B >= 0 && s.NH > 0 && s.NKV > 0 && s.NH % s.NKV == 0,
              "attention_block: B = %d, NH = %d, NKV = %d (NKV must divide NH)", s.B, s.NH, s.NKV);
    MS_ASSERT(s.HS > 0 && s.HS <= kMaxHS, "attention_block: head size HS = %d is outside [1, %d]", s.HS, kMaxHS);
    MS_ASSERT(s.q_begin >= 0 && s.q_rows >= 0 && s.q_begin + s.q_rows <= s.T && s.kv_rows >= 1 && s.kv_rows <= s.Tk,
              "attention_block: query rows [%d, %d) of T = %d, key rows [0, %d) of Tk = %d", s.q_begin,
              s.q_begin + s.q_rows, s.T, s.kv_rows, s.Tk);
    MS_ASSERT(s.kv_column >= 0 && s.kv_column + 2 * s.NKV * s.HS <= s.Wkv,
              "attention_block: keys and values at column %d need %d columns of kv's %d", s.kv_column, 2 * s.NKV * s.HS,
              s.Wkv);
    MS_ASSERT(!s.causal || (s.q_begin == 0 && s.kv_rows == s.q_rows),
              "attention_block: a causal block has q_begin = 0 (got %d) and kv_rows = q_rows (got %d, %d)", s.q_begin,
              s.kv_rows, s.q_rows);
    MS_ASSERT(s.B <= 65535 && s.NH <= 65535, "attention_block: B = %d or NH = %d is over the grid's y/z limit of 65535",
              s.B, s.NH);
}

float attention_scale(int HS) { return 1.0f / sqrtf(static_cast<float>(HS)); }

}  // namespace

// ----------------------------------------------------------------------------
// kernel launchers

template <class S>
void attention_block_forward(float* acc, float* lse, const S* qkv, const S* kv, const AttentionBlockShape& shape,
                             bool merge, cudaStream_t stream) {
    check_shape(shape);
    if (shape.B == 0 || shape.q_rows == 0) return;
    const dim3 grid(static_cast<unsigned>(ceil_div(shape.q_rows, kRows)), static_cast<unsigned>(shape.NH),
                    static_cast<unsigned>(shape.B));
    ms_launch(attention_block_forward_kernel<S>, grid, dim3(kWarp, kRows), 0, stream, acc, lse, qkv, kv, shape, merge,
              attention_scale(shape.HS));
    MS_CUDA_LAUNCH_CHECK();
}

template <class S>
void attention_block_backward(float* dq, float* dkv, const S* dout, const S* qkv, const S* out, const float* lse,
                              const S* kv, const AttentionBlockShape& shape, cudaStream_t stream) {
    check_shape(shape);
    if (shape.B == 0 || shape.q_rows == 0) return;
    const float scale = attention_scale(shape.HS);
    const dim3 dq_grid(static_cast<unsigned>(ceil_div(shape.q_rows, kRows)), static_cast<unsigned>(shape.NH),
                       static_cast<unsigned>(shape.B));
    ms_launch(attention_block_dq_kernel<S>, dq_grid, dim3(kWarp, kRows), 0, stream, dq, dout, qkv, out, lse, kv, shape,
              scale);
    MS_CUDA_LAUNCH_CHECK();
    const dim3 dkv_grid(static_cast<unsigned>(ceil_div(shape.kv_rows, kRows)), static_cast<unsigned>(shape.NKV),
                        static_cast<unsigned>(shape.B));
    ms_launch(attention_block_dkv_kernel<S>, dkv_grid, dim3(kWarp, kRows), 0, stream, dkv, dout, qkv, out, lse, kv,
              shape, scale);
    MS_CUDA_LAUNCH_CHECK();
}

template <class S, class D>
void copy_columns(D* dst, const S* src, int64_t rows, int64_t ws, int64_t wd, int64_t src_column, int64_t dst_column,
                  int64_t cols, cudaStream_t stream) {
    MS_ASSERT(rows >= 0 && cols >= 0 && src_column >= 0 && dst_column >= 0 && src_column + cols <= ws &&
                  dst_column + cols <= wd,
              "copy_columns: %lld columns from %lld of %lld to %lld of %lld", static_cast<long long>(cols),
              static_cast<long long>(src_column), static_cast<long long>(ws), static_cast<long long>(dst_column),
              static_cast<long long>(wd));
    if (rows == 0 || cols == 0) return;
    ms_launch(copy_columns_kernel<S, D>, grid_stride_blocks(rows * cols, kCopyBlockSize), kCopyBlockSize, 0, stream,
              dst, src, rows, ws, wd, src_column, dst_column, cols);
    MS_CUDA_LAUNCH_CHECK();
}

#define MS_INSTANTIATE(S)                                                                                           \
    template void attention_block_forward<S>(float*, float*, const S*, const S*, const AttentionBlockShape&, bool,  \
                                             cudaStream_t);                                                         \
    template void attention_block_backward<S>(float*, float*, const S*, const S*, const S*, const float*, const S*, \
                                              const AttentionBlockShape&, cudaStream_t);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE

#define MS_INSTANTIATE_COPY(S, D) \
    template void copy_columns<S, D>(D*, const S*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, cudaStream_t);
#define MS_INSTANTIATE_COPY_FROM(S) \
    MS_INSTANTIATE_COPY(S, float) MS_INSTANTIATE_COPY(S, ::ms::bf16) MS_INSTANTIATE_COPY(S, ::ms::fp16)
MS_FOR_EACH_DTYPE(MS_INSTANTIATE_COPY_FROM)
#undef MS_INSTANTIATE_COPY_FROM
#undef MS_INSTANTIATE_COPY

}  // namespace ms::cuda
