/*
Sum of x[i]^2 over n elements, in double, for the global gradient norm. Twin: cpu/ops/sum_squares.cpp.
Layout: x (n) T contiguous (a gradient buffer's dtype: fp32, or bf16 / fp16 for 16-bit gradients, each element widened
to fp32 and then to double); scratch (chunks) double; out a device double. Two passes, deterministic: x is cut into
fixed chunks of kChunk elements (depending on n only, not on the GPU); pass 1 gives each chunk one block, whose threads
sum x^2 in double (strided), then a block tree (xor butterflies, then warp 0 over the warp sums) writes the chunk's
partial; pass 2 is one warp that adds the partials in a fixed order (strided per lane, then a butterfly) and writes
*out. No atomics, so the bits never depend on scheduling. Accumulation contract: *out is overwritten.
*/
#include "engine/backends/cuda/kernels/sum_squares.cuh"

namespace ms::cuda {
namespace {

constexpr int kBlockSize = 256;
constexpr int kWarps = kBlockSize / 32;
constexpr int64_t kChunk = 1 << 16;

__device__ __forceinline__ double warp_reduce_sum_double(double v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// ----------------------------------------------------------------------------
// CUDA kernels

template <class T>
__global__ void sum_squares_partials_kernel(double* __restrict__ partials, const T* __restrict__ x, int64_t n) {
    __shared__ double s_warp[kWarps];
    const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kChunk;
    const int64_t i1 = i0 + kChunk < n ? i0 + kChunk : n;
    double sum = 0.0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += kBlockSize) {
        const double xi = to_float(x[i]);
        sum += xi * xi;
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    sum = warp_reduce_sum_double(sum);
    if (lane == 0) s_warp[warp] = sum;
    __syncthreads();
    if (warp == 0) {
        double total = warp_reduce_sum_double(lane < kWarps ? s_warp[lane] : 0.0);
        if (lane == 0) partials[blockIdx.x] = total;
    }
}

__global__ void sum_squares_reduce_kernel(double* __restrict__ out, const double* __restrict__ partials, int chunks) {
    double sum = 0.0;
    for (int k = threadIdx.x; k < chunks; k += 32) sum += partials[k];
    sum = warp_reduce_sum_double(sum);
    if (threadIdx.x == 0) *out = sum;
}

int num_chunks(int64_t n) { return static_cast<int>(ceil_div(n, kChunk)); }

}  // namespace

// ----------------------------------------------------------------------------
// kernel launchers

size_t sum_squares_scratch_doubles(int64_t n) { return static_cast<size_t>(num_chunks(n)); }

template <class T>
void sum_squares(double* out, double* scratch, const T* x, int64_t n, cudaStream_t stream) {
    MS_ASSERT(n >= 0, "sum_squares: n = %lld is negative", static_cast<long long>(n));
    const int chunks = num_chunks(n);
    if (chunks > 0) {
        ms_launch(sum_squares_partials_kernel<T>, chunks, kBlockSize, 0, stream, scratch, x, n);
        MS_CUDA_LAUNCH_CHECK();
    }
    // With n = 0 the reduce still runs, over no partials, and writes 0.
    ms_launch(sum_squares_reduce_kernel, 1, 32, 0, stream, out, static_cast<const double*>(scratch), chunks);
    MS_CUDA_LAUNCH_CHECK();
}

#define MS_INSTANTIATE(T) template void sum_squares<T>(double*, double*, const T*, int64_t, cudaStream_t);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE

}  // namespace ms::cuda
