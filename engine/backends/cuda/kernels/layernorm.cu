/*
LayerNorm over the last dim (GPT-2 style), forward and backward.
Layout: inp/out/dout/dinp (N, C) row-major T, weight/bias (C) T, dweight/dbias (C) G, mean/rstd (N) fp32, where
T (float, bf16, fp16) is the activation dtype and G the parameter gradients' (float, or T itself: backend.h precision
contract); every sum is fp32 and each T or G output is rounded once.
Forward:  one warp per row: mean, then the biased variance of (x - mean) (two passes, as cpu/ops/layernorm.cpp),
          rstd = 1 / sqrt(var + eps), out = (x - mean) * rstd * weight + bias; mean and rstd are saved.
Backward: g = dout * weight; dinp = (g - mean(g) - norm * mean(g * norm)) * rstd, one warp per row;
          dweight += sum_n dout * norm, dbias += sum_n dout in two deterministic passes: blocks of (32 columns x 8
          row lanes) sum a chunk of kRowsPerChunk rows each into a scratch (2, chunks, C), then one thread per
          column adds the chunks in order, from 0, and adds that sum to the old value with one rounding to G (for
          G = float the bits of an fp32 +=). Atomics would be one pass, but their order, and so the bits, would vary.
Residual fusion (layernorm_residual_forward): the residual stream's add in front of the forward, one kernel. Each
          row's warp computes r = a + (b + bias) in fp32 as residual.cu does, rounds it to T, writes it to
          residual_out and sums it in the forward's order; the forward's other passes (normalise_row) then re-read
          the row from residual_out, which the same lanes have just written (no barrier needed; L1/L2-resident), so
          the result is bit-identical to residual.cu's kernel followed by the forward, and the second kernel's read of
          the row from memory is saved. residual_out may alias a, and out may alias b: a lane reads its columns
          of a and b before the warp's shuffles and writes the same columns of out after them. Every forward kernel
          writes the variance's multiply-add and out's ((x - mean) * rstd) * weight + bias as explicit fmaf, as
          nvcc contracts them anyway, so that the host compiler of the CPU emulation cannot contract them in one
          kernel and not in the other.
Accumulation contract: dinp per DinpWrite (kAdd: it feeds the residual stream); dweight and dbias +=.
bf16 / fp16 (the *_16 kernels): lane l of a row's warp owns the packs p = l, l + 32, ... of 8 columns [8p, 8p + 8)
and sums its elements in that order, read as one 16-byte load per pack (Access::kPacked: C % 8 == 0 and 16-byte
aligned pointers, pack.cuh) or one element at a time (Access::kScalar: any other width or alignment), so both give
the same bits; every multiply-add of a sum is an explicit fmaf (a host compiler that vectorises one loop and not the
other would otherwise contract one and not the other). Each element's math and rounding are the fp32 kernels'. The
partial sums of dweight and dbias take 8 columns per thread, each column's rows in the fp32 kernel's order.
*/
#include "engine/backends/cuda/kernels/layernorm.cuh"
#include "engine/backends/cuda/pack.cuh"

namespace ms::cuda {
namespace {

constexpr int kBlockSize = 256;  // 8 warps, one row each
constexpr int kWarpsPerBlock = kBlockSize / 32;
constexpr int kRowLanes = 8;  // threadIdx.y of the partial-sum kernel
constexpr int kRowsPerChunk = 64;

// ----------------------------------------------------------------------------
// CUDA kernels

// The forward after its first pass: m = sum / C, the variance of the row x around m, rstd, and out (row pointer o);
// lane 0 saves mean and rstd. x is re-read (the lane's own columns, L1/L2-resident), so the fused kernel below,
// which summed values it had just written, normalises them exactly as the plain forward does.
template <class T>
__device__ __forceinline__ void normalise_row(T* o, float* mean, float* rstd, const T* x, const T* weight,
                                              const T* bias, float sum, int row, int C, float eps) {
    const int lane = threadIdx.x % 32;
    const float m = warp_reduce_sum(sum) / C;
    float sq = 0.0f;
    for (int c = lane; c < C; c += 32) sq = fmaf(to_float(x[c]) - m, to_float(x[c]) - m, sq);
    const float s = rsqrtf(warp_reduce_sum(sq) / C + eps);
    for (int c = lane; c < C; c += 32) {
        o[c] = from_float<T>(fmaf((to_float(x[c]) - m) * s, to_float(weight[c]), to_float(bias[c])));
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

template <class T>
__global__ void layernorm_forward_kernel(T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                         const T* __restrict__ inp, const T* __restrict__ weight,
                                         const T* __restrict__ bias, int N, int C, float eps) {
    const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= N) return;  // the whole warp: the shuffles below stay full-warp
    const T* x = inp + static_cast<int64_t>(row) * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) sum += to_float(x[c]);
    normalise_row(out + static_cast<int64_t>(row) * C, mean, rstd, x, weight, bias, sum, row, C, eps);
}

// layernorm_forward_kernel on res_out = res_a + (res_b + res_bias) (residual.cu's arithmetic, each sum rounded to T),
// written and summed in the first pass (one warp per row). res_out may alias res_a and out may alias res_b, so none
// of the four is __restrict__.
template <class T>
__global__ void layernorm_residual_forward_kernel(T* out, float* __restrict__ mean, float* __restrict__ rstd,
                                                  T* res_out, const T* res_a, const T* res_b,
                                                  const T* __restrict__ res_bias, const T* __restrict__ weight,
                                                  const T* __restrict__ bias, int N, int C, float eps) {
    const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= N) return;  // the whole warp: the shuffles below stay full-warp
    const int64_t base = static_cast<int64_t>(row) * C;
    T* x = res_out + base;
    const T *a = res_a + base, *b = res_b + base;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const T r = from_float<T>(res_bias ? to_float(a[c]) + (to_float(b[c]) + to_float(res_bias[c]))
                                           : to_float(a[c]) + to_float(b[c]));
        x[c] = r;
        sum += to_float(r);
    }
    normalise_row(out + base, mean, rstd, x, weight, bias, sum, row, C, eps);
}

template <DinpWrite kWrite, class T>
__global__ void layernorm_backward_kernel(T* __restrict__ dinp, const T* __restrict__ dout, const T* __restrict__ inp,
                                          const T* __restrict__ weight, const float* __restrict__ mean,
                                          const float* __restrict__ rstd, int N, int C) {
    const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= N) return;
    const int64_t base = static_cast<int64_t>(row) * C;
    const float mu = mean[row], rs = rstd[row];
    float g_sum = 0.0f, g_norm_sum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float g = to_float(dout[base + c]) * to_float(weight[c]);
        g_sum += g;
        g_norm_sum += g * (to_float(inp[base + c]) - mu) * rs;
    }
    const float g_mean = warp_reduce_sum(g_sum) / C;
    const float g_norm_mean = warp_reduce_sum(g_norm_sum) / C;
    for (int c = lane; c < C; c += 32) {
        const float d = (to_float(dout[base + c]) * to_float(weight[c]) - g_mean -
                         (to_float(inp[base + c]) - mu) * rs * g_norm_mean) *
                        rs;
        if constexpr (kWrite == DinpWrite::kAdd) {
            dinp[base + c] = from_float<T>(to_float(dinp[base + c]) + d);
        } else {
            dinp[base + c] = from_float<T>(d);
        }
    }
}

// Block (32, kRowLanes) sums rows [blockIdx.y * kRowsPerChunk, +kRowsPerChunk) of 32 columns into partials.
template <class T>
__global__ void layernorm_backward_partials_kernel(float* __restrict__ partials, const T* __restrict__ dout,
                                                   const T* __restrict__ inp, const float* __restrict__ mean,
                                                   const float* __restrict__ rstd, int N, int C) {
    __shared__ float s_dw[kRowLanes][32];
    __shared__ float s_db[kRowLanes][32];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const int row0 = blockIdx.y * kRowsPerChunk;
    const int row1 = row0 + kRowsPerChunk < N ? row0 + kRowsPerChunk : N;
    float dw = 0.0f, db = 0.0f;
    if (c < C) {
        for (int r = row0 + threadIdx.y; r < row1; r += kRowLanes) {
            const float d = to_float(dout[static_cast<int64_t>(r) * C + c]);
            dw += d * (to_float(inp[static_cast<int64_t>(r) * C + c]) - mean[r]) * rstd[r];
            db += d;
        }
    }
    s_dw[threadIdx.y][threadIdx.x] = dw;
    s_db[threadIdx.y][threadIdx.x] = db;
    __syncthreads();  // every column's kRowLanes sums are in shared memory
    if (threadIdx.y == 0 && c < C) {
        float sum_dw = 0.0f, sum_db = 0.0f;
        for (int y = 0; y < kRowLanes; ++y) {
            sum_dw += s_dw[y][threadIdx.x];
            sum_db += s_db[y][threadIdx.x];
        }
        const int chunks = gridDim.y;
        partials[static_cast<int64_t>(blockIdx.y) * C + c] = sum_dw;
        partials[static_cast<int64_t>(chunks + blockIdx.y) * C + c] = sum_db;
    }
}

// ---- bf16 / fp16: packs of 8 columns

enum class Access : uint8_t { kScalar, kPacked };

// Columns of pack p of a row that exist: all K when packed (C % K == 0), fewer for the last pack of an odd width.
template <Access kAccess, int K>
__device__ __forceinline__ int pack_width(int p, int C) {
    if constexpr (kAccess == Access::kPacked) {
        return K;
    } else {
        return C - p * K < K ? C - p * K : K;
    }
}

// f[k] = row[K p + k] as fp32 for k < pack_width (the rest untouched).
template <Access kAccess, class T, int K>
__device__ __forceinline__ void load_floats(float (&f)[K], const T* row, int p, int C) {
    if constexpr (kAccess == Access::kPacked) {
        const Pack<T> v = load_pack(row + p * K);
        for (int k = 0; k < K; ++k) f[k] = to_float(v.v[k]);
    } else {
        const int w = pack_width<kAccess, K>(p, C);
        for (int k = 0; k < w; ++k) f[k] = to_float(row[p * K + k]);
    }
}

// row[K p + k] = f[k] rounded to T, for k < pack_width.
template <Access kAccess, class T, int K>
__device__ __forceinline__ void store_floats(T* row, int p, int C, const float (&f)[K]) {
    if constexpr (kAccess == Access::kPacked) {
        Pack<T> v;
        for (int k = 0; k < K; ++k) v.v[k] = from_float<T>(f[k]);
        store_pack(row + p * K, v);
    } else {
        const int w = pack_width<kAccess, K>(p, C);
        for (int k = 0; k < w; ++k) row[p * K + k] = from_float<T>(f[k]);
    }
}

// normalise_row for packs of K columns (lane l owns packs l, l + 32, ...).
template <Access kAccess, class T>
__device__ __forceinline__ void normalise_row_16(T* o, float* mean, float* rstd, const T* x, const T* weight,
                                                 const T* bias, float sum, int row, int C, float eps) {
    constexpr int K = Pack<T>::kSize;
    const int lane = threadIdx.x % 32;
    const int packs = (C + K - 1) / K;
    float f[K], w[K], b[K];
    const float m = warp_reduce_sum(sum) / C;
    float sq = 0.0f;
    for (int p = lane; p < packs; p += 32) {
        load_floats<kAccess>(f, x, p, C);
        for (int k = 0; k < pack_width<kAccess, K>(p, C); ++k) sq = fmaf(f[k] - m, f[k] - m, sq);
    }
    const float s = rsqrtf(warp_reduce_sum(sq) / C + eps);
    for (int p = lane; p < packs; p += 32) {
        load_floats<kAccess>(f, x, p, C);
        load_floats<kAccess>(w, weight, p, C);
        load_floats<kAccess>(b, bias, p, C);
        for (int k = 0; k < pack_width<kAccess, K>(p, C); ++k) f[k] = fmaf((f[k] - m) * s, w[k], b[k]);
        store_floats<kAccess>(o, p, C, f);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

template <Access kAccess, class T>
__global__ void layernorm_forward_kernel_16(T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                            const T* __restrict__ inp, const T* __restrict__ weight,
                                            const T* __restrict__ bias, int N, int C, float eps) {
    constexpr int K = Pack<T>::kSize;
    const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= N) return;  // the whole warp: the shuffles below stay full-warp
    const int packs = (C + K - 1) / K;
    const T* x = inp + static_cast<int64_t>(row) * C;
    float f[K];
    float sum = 0.0f;
    for (int p = lane; p < packs; p += 32) {
        load_floats<kAccess>(f, x, p, C);
        for (int k = 0; k < pack_width<kAccess, K>(p, C); ++k) sum += f[k];
    }
    normalise_row_16<kAccess>(out + static_cast<int64_t>(row) * C, mean, rstd, x, weight, bias, sum, row, C, eps);
}

// layernorm_forward_kernel_16 on res_out = res_a + (res_b + res_bias), written and summed in the first pass; kPacked
// also needs res_a, res_b, res_bias and res_out 16-byte aligned. Aliasing as layernorm_residual_forward_kernel.
template <Access kAccess, class T>
__global__ void layernorm_residual_forward_kernel_16(T* out, float* __restrict__ mean, float* __restrict__ rstd,
                                                     T* res_out, const T* res_a, const T* res_b,
                                                     const T* __restrict__ res_bias, const T* __restrict__ weight,
                                                     const T* __restrict__ bias, int N, int C, float eps) {
    constexpr int K = Pack<T>::kSize;
    const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= N) return;  // the whole warp: the shuffles below stay full-warp
    const int packs = (C + K - 1) / K;
    const int64_t base = static_cast<int64_t>(row) * C;
    T* x = res_out + base;
    float fa[K], fb[K], fc[K] = {}, r[K];
    float sum = 0.0f;
    for (int p = lane; p < packs; p += 32) {  // r = a + (b + bias), residual.cu's arithmetic, rounded to T
        load_floats<kAccess>(fa, res_a + base, p, C);
        load_floats<kAccess>(fb, res_b + base, p, C);
        if (res_bias) load_floats<kAccess>(fc, res_bias, p, C);
        const int width = pack_width<kAccess, K>(p, C);
        for (int k = 0; k < width; ++k) {
            r[k] = to_float(from_float<T>(res_bias ? fa[k] + (fb[k] + fc[k]) : fa[k] + fb[k]));
        }
        store_floats<kAccess>(x, p, C, r);
        for (int k = 0; k < width; ++k) sum += r[k];
    }
    normalise_row_16<kAccess>(out + base, mean, rstd, x, weight, bias, sum, row, C, eps);
}

template <DinpWrite kWrite, Access kAccess, class T>
__global__ void layernorm_backward_kernel_16(T* __restrict__ dinp, const T* __restrict__ dout,
                                             const T* __restrict__ inp, const T* __restrict__ weight,
                                             const float* __restrict__ mean, const float* __restrict__ rstd, int N,
                                             int C) {
    constexpr int K = Pack<T>::kSize;
    const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= N) return;
    const int packs = (C + K - 1) / K;
    const int64_t base = static_cast<int64_t>(row) * C;
    const float mu = mean[row], rs = rstd[row];
    float dy[K], x[K], w[K], d[K];
    float g_sum = 0.0f, g_norm_sum = 0.0f;
    for (int p = lane; p < packs; p += 32) {
        load_floats<kAccess>(dy, dout + base, p, C);
        load_floats<kAccess>(x, inp + base, p, C);
        load_floats<kAccess>(w, weight, p, C);
        for (int k = 0; k < pack_width<kAccess, K>(p, C); ++k) {
            g_sum = fmaf(dy[k], w[k], g_sum);
            g_norm_sum = fmaf(dy[k] * w[k] * (x[k] - mu), rs, g_norm_sum);
        }
    }
    const float g_mean = warp_reduce_sum(g_sum) / C;
    const float g_norm_mean = warp_reduce_sum(g_norm_sum) / C;
    for (int p = lane; p < packs; p += 32) {
        load_floats<kAccess>(dy, dout + base, p, C);
        load_floats<kAccess>(x, inp + base, p, C);
        load_floats<kAccess>(w, weight, p, C);
        if constexpr (kWrite == DinpWrite::kAdd) load_floats<kAccess>(d, dinp + base, p, C);
        for (int k = 0; k < pack_width<kAccess, K>(p, C); ++k) {
            const float t = (dy[k] * w[k] - g_mean - (x[k] - mu) * rs * g_norm_mean) * rs;
            if constexpr (kWrite == DinpWrite::kAdd) {
                d[k] = d[k] + t;
            } else {
                d[k] = t;
            }
        }
        store_floats<kAccess>(dinp + base, p, C, d);
    }
}

// layernorm_backward_partials_kernel with K columns per thread: block (32, kRowLanes) sums rows
// [blockIdx.y * kRowsPerChunk, +kRowsPerChunk) of 32 K columns, each column's rows and row lanes in the fp32 kernel's
// order; kPacked needs C % K == 0 and 16-byte aligned dout and inp.
template <Access kAccess, class T>
__global__ void layernorm_backward_partials_kernel_16(float* __restrict__ partials, const T* __restrict__ dout,
                                                      const T* __restrict__ inp, const float* __restrict__ mean,
                                                      const float* __restrict__ rstd, int N, int C) {
    constexpr int K = Pack<T>::kSize;
    __shared__ float s_dw[kRowLanes][K][32];  // [row lane][column within the pack][thread]: no bank conflicts
    __shared__ float s_db[kRowLanes][K][32];
    const int p = blockIdx.x * 32 + threadIdx.x;  // this thread's pack of columns [K p, K p + K)
    const int row0 = blockIdx.y * kRowsPerChunk;
    const int row1 = row0 + kRowsPerChunk < N ? row0 + kRowsPerChunk : N;
    float dw[K], db[K], dy[K], x[K];
    for (int k = 0; k < K; ++k) dw[k] = db[k] = 0.0f;
    const int width = p * K < C ? pack_width<kAccess, K>(p, C) : 0;
    if (width > 0) {
        for (int r = row0 + threadIdx.y; r < row1; r += kRowLanes) {
            load_floats<kAccess>(dy, dout + static_cast<int64_t>(r) * C, p, C);
            load_floats<kAccess>(x, inp + static_cast<int64_t>(r) * C, p, C);
            const float mu = mean[r], rs = rstd[r];
            for (int k = 0; k < width; ++k) {
                dw[k] = fmaf(dy[k] * (x[k] - mu), rs, dw[k]);
                db[k] += dy[k];
            }
        }
    }
    for (int k = 0; k < K; ++k) {
        s_dw[threadIdx.y][k][threadIdx.x] = dw[k];
        s_db[threadIdx.y][k][threadIdx.x] = db[k];
    }
    __syncthreads();  // every column's kRowLanes sums are in shared memory
    if (threadIdx.y == 0) {
        const int chunks = gridDim.y;
        for (int k = 0; k < width; ++k) {
            float sum_dw = 0.0f, sum_db = 0.0f;
            for (int y = 0; y < kRowLanes; ++y) {
                sum_dw += s_dw[y][k][threadIdx.x];
                sum_db += s_db[y][k][threadIdx.x];
            }
            partials[static_cast<int64_t>(blockIdx.y) * C + p * K + k] = sum_dw;
            partials[static_cast<int64_t>(chunks + blockIdx.y) * C + p * K + k] = sum_db;
        }
    }
}

template <class G>
__global__ void layernorm_backward_reduce_kernel(G* __restrict__ dweight, G* __restrict__ dbias,
                                                 const float* __restrict__ partials, int chunks, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float dw = 0.0f, db = 0.0f;
    for (int k = 0; k < chunks; ++k) {
        dw += partials[static_cast<int64_t>(k) * C + c];
        db += partials[static_cast<int64_t>(chunks + k) * C + c];
    }
    dweight[c] = from_float<G>(to_float(dweight[c]) + dw);
    dbias[c] = from_float<G>(to_float(dbias[c]) + db);
}

int num_chunks(int N) { return static_cast<int>(ceil_div(N, kRowsPerChunk)); }

}  // namespace

// ----------------------------------------------------------------------------
// kernel launchers

template <class T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N, int C,
                       float eps, cudaStream_t stream) {
    MS_ASSERT(N >= 0 && C > 0, "layernorm: N = %d, C = %d (C must be positive)", N, C);
    if (N == 0) return;
    const int blocks = static_cast<int>(ceil_div(N, kWarpsPerBlock));
    if constexpr (sizeof(T) == 2) {
        if (C % Pack<T>::kSize == 0 && pack_aligned({out, inp, weight, bias})) {
            ms_launch(layernorm_forward_kernel_16<Access::kPacked, T>, blocks, kBlockSize, 0, stream, out, mean, rstd,
                      inp, weight, bias, N, C, eps);
        } else {
            ms_launch(layernorm_forward_kernel_16<Access::kScalar, T>, blocks, kBlockSize, 0, stream, out, mean, rstd,
                      inp, weight, bias, N, C, eps);
        }
    } else {
        ms_launch(layernorm_forward_kernel<T>, blocks, kBlockSize, 0, stream, out, mean, rstd, inp, weight, bias, N, C,
                  eps);
    }
    MS_CUDA_LAUNCH_CHECK();
}

template <class T>
void layernorm_residual_forward(T* out, float* mean, float* rstd, T* res_out, const T* res_a, const T* res_b,
                                const NoDeduce<T>* res_bias, const T* weight, const T* bias, int N, int C, float eps,
                                cudaStream_t stream) {
    MS_ASSERT(N >= 0 && C > 0, "layernorm: N = %d, C = %d (C must be positive)", N, C);
    if (N == 0) return;
    const int blocks = static_cast<int>(ceil_div(N, kWarpsPerBlock));
    if constexpr (sizeof(T) == 2) {
        if (C % Pack<T>::kSize == 0 && pack_aligned({out, res_out, res_a, res_b, res_bias, weight, bias})) {
            ms_launch(layernorm_residual_forward_kernel_16<Access::kPacked, T>, blocks, kBlockSize, 0, stream, out,
                      mean, rstd, res_out, res_a, res_b, res_bias, weight, bias, N, C, eps);
        } else {
            ms_launch(layernorm_residual_forward_kernel_16<Access::kScalar, T>, blocks, kBlockSize, 0, stream, out,
                      mean, rstd, res_out, res_a, res_b, res_bias, weight, bias, N, C, eps);
        }
    } else {
        ms_launch(layernorm_residual_forward_kernel<T>, blocks, kBlockSize, 0, stream, out, mean, rstd, res_out, res_a,
                  res_b, res_bias, weight, bias, N, C, eps);
    }
    MS_CUDA_LAUNCH_CHECK();
}

size_t layernorm_backward_scratch_floats(int N, int C) { return 2 * static_cast<size_t>(num_chunks(N)) * C; }

template <class T, class G>
void layernorm_backward(T* dinp, G* dweight, G* dbias, float* scratch, const T* dout, const T* inp, const T* weight,
                        const float* mean, const float* rstd, int N, int C, DinpWrite write, cudaStream_t stream) {
    MS_ASSERT(N >= 0 && C > 0, "layernorm: N = %d, C = %d (C must be positive)", N, C);
    if (N == 0) return;
    const int row_blocks = static_cast<int>(ceil_div(N, kWarpsPerBlock));
    const int chunks = num_chunks(N);
    MS_ASSERT(chunks <= 65535, "layernorm: N = %d rows make %d chunks of %d, over the grid's y limit of 65535", N,
              chunks, kRowsPerChunk);
    if constexpr (sizeof(T) == 2) {
        constexpr int K = Pack<T>::kSize;
        const bool packed = C % K == 0 && pack_aligned({dinp, dout, inp, weight});
        if (packed && write == DinpWrite::kAdd) {
            ms_launch(layernorm_backward_kernel_16<DinpWrite::kAdd, Access::kPacked, T>, row_blocks, kBlockSize, 0,
                      stream, dinp, dout, inp, weight, mean, rstd, N, C);
        } else if (packed) {
            ms_launch(layernorm_backward_kernel_16<DinpWrite::kOverwrite, Access::kPacked, T>, row_blocks, kBlockSize,
                      0, stream, dinp, dout, inp, weight, mean, rstd, N, C);
        } else if (write == DinpWrite::kAdd) {
            ms_launch(layernorm_backward_kernel_16<DinpWrite::kAdd, Access::kScalar, T>, row_blocks, kBlockSize, 0,
                      stream, dinp, dout, inp, weight, mean, rstd, N, C);
        } else {
            ms_launch(layernorm_backward_kernel_16<DinpWrite::kOverwrite, Access::kScalar, T>, row_blocks, kBlockSize,
                      0, stream, dinp, dout, inp, weight, mean, rstd, N, C);
        }
        MS_CUDA_LAUNCH_CHECK();
        const dim3 grid(static_cast<unsigned>(ceil_div(C, 32 * K)), static_cast<unsigned>(chunks));
        if (C % K == 0 && pack_aligned({dout, inp})) {
            ms_launch(layernorm_backward_partials_kernel_16<Access::kPacked, T>, grid, dim3(32, kRowLanes), 0, stream,
                      scratch, dout, inp, mean, rstd, N, C);
        } else {
            ms_launch(layernorm_backward_partials_kernel_16<Access::kScalar, T>, grid, dim3(32, kRowLanes), 0, stream,
                      scratch, dout, inp, mean, rstd, N, C);
        }
        MS_CUDA_LAUNCH_CHECK();
    } else {
        if (write == DinpWrite::kAdd) {
            ms_launch(layernorm_backward_kernel<DinpWrite::kAdd, T>, row_blocks, kBlockSize, 0, stream, dinp, dout, inp,
                      weight, mean, rstd, N, C);
        } else {
            ms_launch(layernorm_backward_kernel<DinpWrite::kOverwrite, T>, row_blocks, kBlockSize, 0, stream, dinp,
                      dout, inp, weight, mean, rstd, N, C);
        }
        MS_CUDA_LAUNCH_CHECK();
        const dim3 partial_grid(static_cast<unsigned>(ceil_div(C, 32)), static_cast<unsigned>(chunks));
        ms_launch(layernorm_backward_partials_kernel<T>, partial_grid, dim3(32, kRowLanes), 0, stream, scratch, dout,
                  inp, mean, rstd, N, C);
        MS_CUDA_LAUNCH_CHECK();
    }
    ms_launch(layernorm_backward_reduce_kernel<G>, static_cast<int>(ceil_div(C, kBlockSize)), kBlockSize, 0, stream,
              dweight, dbias, scratch, chunks, C);
    MS_CUDA_LAUNCH_CHECK();
}

#define MS_INSTANTIATE(T)                                                                                       \
    template void layernorm_forward<T>(T*, float*, float*, const T*, const T*, const T*, int, int, float,       \
                                       cudaStream_t);                                                           \
    template void layernorm_residual_forward<T>(T*, float*, float*, T*, const T*, const T*, const T*, const T*, \
                                                const T*, int, int, float, cudaStream_t);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE
// (T, G): every activation dtype with fp32 gradients, and bf16 / fp16 with gradients of their own dtype.
#define MS_INSTANTIATE(T, G)                                                                               \
    template void layernorm_backward<T, G>(T*, G*, G*, float*, const T*, const T*, const T*, const float*, \
                                           const float*, int, int, DinpWrite, cudaStream_t);
MS_INSTANTIATE(float, float)
MS_INSTANTIATE(bf16, float)
MS_INSTANTIATE(bf16, bf16)
MS_INSTANTIATE(fp16, float)
MS_INSTANTIATE(fp16, fp16)
#undef MS_INSTANTIATE

}  // namespace ms::cuda
