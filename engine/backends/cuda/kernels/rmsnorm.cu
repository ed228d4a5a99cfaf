/*
RMSNorm (Llama) over the last dim, forward and backward.
Layout: inp/out/dout/dinp (N, C) row-major T, weight (C) T, rstd (N) fp32, dweight (C) G (fp32 or T), where T (float,
bf16, fp16) is the activation dtype; every sum is fp32 and each T output is rounded once.
Forward:  one warp per row: rstd = 1 / sqrt(mean(x^2) + eps), out = x * rstd * weight; rstd is saved.
Backward: norm = x * rstd, g = dout * weight; dinp = (g - norm * mean(g * norm)) * rstd, one warp per row;
          dweight += sum_n dout * norm in two deterministic passes, as layernorm.cu's dweight: blocks of (32 columns x
          8 row lanes) sum a chunk of kRowsPerChunk rows each into a scratch (chunks, C), then one thread per column
          adds the chunks in order and updates dweight once (a T gradient: the fp32 sum of the old value and the
          contribution, rounded once).
Multiply-adds that nvcc would contract are written as explicit fmaf, so the host compiler of the CPU emulation
computes what the GPU does.
Accumulation contract: dinp per DinpWrite (kAdd: it feeds the residual stream); dweight +=.
*/
#include "engine/backends/cuda/kernels/rmsnorm.cuh"

namespace ms::cuda {
namespace {

constexpr int kBlockSize = 256;  // 8 warps, one row each
constexpr int kWarpsPerBlock = kBlockSize / 32;
constexpr int kRowLanes = 8;  // threadIdx.y of the partial-sum kernel
constexpr int kRowsPerChunk = 64;

// ----------------------------------------------------------------------------
// CUDA kernels

template <class T>
__global__ void rmsnorm_forward_kernel(T* __restrict__ out, float* __restrict__ rstd, const T* __restrict__ inp,
                                       const T* __restrict__ weight, int N, int C, float eps) {
    const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= N) return;  // the whole warp: the shuffles below stay full-warp
    const int64_t base = static_cast<int64_t>(row) * C;
    float sq = 0.0f;
    for (int c = lane; c < C; c += 32) sq = fmaf(to_float(inp[base + c]), to_float(inp[base + c]), sq);
    const float s = rsqrtf(warp_reduce_sum(sq) / C + eps);
    for (int c = lane; c < C; c += 32) out[base + c] = from_float<T>(to_float(inp[base + c]) * s * to_float(weight[c]));
    if (lane == 0) rstd[row] = s;
}

template <DinpWrite kWrite, class T>
__global__ void rmsnorm_backward_kernel(T* __restrict__ dinp, const T* __restrict__ dout, const T* __restrict__ inp,
                                        const T* __restrict__ weight, const float* __restrict__ rstd, int N, int C) {
    const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= N) return;
    const int64_t base = static_cast<int64_t>(row) * C;
    const float rs = rstd[row];
    float g_norm_sum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        g_norm_sum = fmaf(to_float(dout[base + c]) * to_float(weight[c]), to_float(inp[base + c]) * rs, g_norm_sum);
    }
    const float g_norm_mean = warp_reduce_sum(g_norm_sum) / C;
    for (int c = lane; c < C; c += 32) {
        const float d =
            fmaf(-to_float(inp[base + c]) * rs, g_norm_mean, to_float(dout[base + c]) * to_float(weight[c])) * rs;
        if constexpr (kWrite == DinpWrite::kAdd) {
            dinp[base + c] = from_float<T>(to_float(dinp[base + c]) + d);
        } else {
            dinp[base + c] = from_float<T>(d);
        }
    }
}

// Block (32, kRowLanes) sums rows [blockIdx.y * kRowsPerChunk, +kRowsPerChunk) of 32 columns into partials.
template <class T>
__global__ void rmsnorm_backward_partials_kernel(float* __restrict__ partials, const T* __restrict__ dout,
                                                 const T* __restrict__ inp, const float* __restrict__ rstd, int N,
                                                 int C) {
    __shared__ float s_dw[kRowLanes][32];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const int row0 = blockIdx.y * kRowsPerChunk;
    const int row1 = row0 + kRowsPerChunk < N ? row0 + kRowsPerChunk : N;
    float dw = 0.0f;
    if (c < C) {
        for (int r = row0 + threadIdx.y; r < row1; r += kRowLanes) {
            const int64_t i = static_cast<int64_t>(r) * C + c;
            dw = fmaf(to_float(dout[i]), to_float(inp[i]) * rstd[r], dw);
        }
    }
    s_dw[threadIdx.y][threadIdx.x] = dw;
    __syncthreads();  // every column's kRowLanes sums are in shared memory
    if (threadIdx.y == 0 && c < C) {
        float sum = 0.0f;
        for (int y = 0; y < kRowLanes; ++y) sum += s_dw[y][threadIdx.x];
        partials[static_cast<int64_t>(blockIdx.y) * C + c] = sum;
    }
}

template <class G>
__global__ void rmsnorm_backward_reduce_kernel(G* __restrict__ dweight, const float* __restrict__ partials, int chunks,
                                               int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float dw = 0.0f;
    for (int k = 0; k < chunks; ++k) dw += partials[static_cast<int64_t>(k) * C + c];
    if constexpr (sizeof(G) == 4) {
        dweight[c] += dw;
    } else {  // dw + 0.0f: the contribution as an fp32 dweight from +0 holds it (-0 becomes +0)
        dweight[c] = from_float<G>(to_float(dweight[c]) + (dw + 0.0f));
    }
}

int num_chunks(int N) { return static_cast<int>(ceil_div(N, kRowsPerChunk)); }

}  // namespace

// ----------------------------------------------------------------------------
// kernel launchers

template <class T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps, cudaStream_t stream) {
    MS_ASSERT(N >= 0 && C > 0, "rmsnorm: N = %d, C = %d (C must be positive)", N, C);
    if (N == 0) return;
    ms_launch(rmsnorm_forward_kernel<T>, static_cast<int>(ceil_div(N, kWarpsPerBlock)), kBlockSize, 0, stream, out,
              rstd, inp, weight, N, C, eps);
    MS_CUDA_LAUNCH_CHECK();
}

size_t rmsnorm_backward_scratch_floats(int N, int C) { return static_cast<size_t>(num_chunks(N)) * C; }

template <class T, class G>
void rmsnorm_backward(T* dinp, G* dweight, float* scratch, const T* dout, const T* inp, const T* weight,
                      const float* rstd, int N, int C, DinpWrite write, cudaStream_t stream) {
    MS_ASSERT(N >= 0 && C > 0, "rmsnorm: N = %d, C = %d (C must be positive)", N, C);
    if (N == 0) return;
    const int row_blocks = static_cast<int>(ceil_div(N, kWarpsPerBlock));
    const int chunks = num_chunks(N);
    MS_ASSERT(chunks <= 65535, "rmsnorm: N = %d rows make %d chunks of %d, over the grid's y limit of 65535", N, chunks,
              kRowsPerChunk);
    if (write == DinpWrite::kAdd) {
        ms_launch(rmsnorm_backward_kernel<DinpWrite::kAdd, T>, row_blocks, kBlockSize, 0, stream, dinp, dout, inp,
                  weight, rstd, N, C);
    } else {
        ms_launch(rmsnorm_backward_kernel<DinpWrite::kOverwrite, T>, row_blocks, kBlockSize, 0, stream, dinp, dout, inp,
                  weight, rstd, N, C);
    }
    MS_CUDA_LAUNCH_CHECK();
    const dim3 grid(static_cast<unsigned>(ceil_div(C, 32)), static_cast<unsigned>(chunks));
    ms_launch(rmsnorm_backward_partials_kernel<T>, grid, dim3(32, kRowLanes), 0, stream, scratch, dout, inp, rstd, N,
              C);
    MS_CUDA_LAUNCH_CHECK();
    ms_launch(rmsnorm_backward_reduce_kernel<G>, static_cast<int>(ceil_div(C, kBlockSize)), kBlockSize, 0, stream,
              dweight, scratch, chunks, C);
    MS_CUDA_LAUNCH_CHECK();
}

#define MS_INSTANTIATE(T)                                                                                              \
    template void rmsnorm_forward<T>(T*, float*, const T*, const T*, int, int, float, cudaStream_t);                   \
    template void rmsnorm_backward<T, float>(T*, float*, float*, const T*, const T*, const T*, const float*, int, int, \
                                             DinpWrite, cudaStream_t);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE
// 16-bit parameter gradients: G = T.
template void rmsnorm_backward<bf16, bf16>(bf16*, bf16*, float*, const bf16*, const bf16*, const bf16*, const float*,
                                           int, int, DinpWrite, cudaStream_t);
template void rmsnorm_backward<fp16, fp16>(fp16*, fp16*, float*, const fp16*, const fp16*, const fp16*, const float*,
                                           int, int, DinpWrite, cudaStream_t);

}  // namespace ms::cuda
