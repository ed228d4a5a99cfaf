/*
Rotary position embedding (HF / Megatron, non-interleaved), in place on the Q and K heads of qkv.
Layout: qkv (N, row) T (float, bf16, fp16), row = (NH + 2 NKV) HS with [Q | K | V] head-major, so each row's first
`rotated` = (NH + NKV) HS columns are the heads rotated; table (P, HS) fp32 [cos(p f_i), i < HS/2 | sin(p f_i)];
positions (N) int32 or row n at n % T.
One thread per pair (row n, head, i < HS/2), grid-stride: x0 = x[i], x1 = x[i + HS/2] of the head and
  kForward: x0 c - x1 s, x1 c + x0 s;   kInverse: x0 c + x1 s, x1 c - x0 s,
fp32 math with explicit fmaf (as nvcc contracts them, so the CPU emulation computes the same), one rounding per
stored element. Each pair is read and written by its own thread only, so the op is in place without a race.
*/
#include "engine/backends/cuda/kernels/rope.cuh"

namespace ms::cuda {
namespace {

constexpr int kBlockSize = 256;

template <class T>
__global__ void rope_kernel(T* __restrict__ qkv, const float* __restrict__ table, const int32_t* __restrict__ positions,
                            int64_t N, int row, int rotated, int HS, int T_len, float sign) {
    const int half = HS / 2;
    const int pairs_per_row = rotated / 2;
    const int64_t pairs = N * pairs_per_row;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < pairs; idx += stride) {
        const int64_t n = idx / pairs_per_row;
        const int j = static_cast<int>(idx % pairs_per_row);
        const int head = j / half, i = j % half;
        const int64_t p = positions ? positions[n] : n % T_len;
        const float c = table[p * HS + i], s = sign * table[p * HS + half + i];
        T* x = qkv + n * row + static_cast<int64_t>(head) * HS;
        const float x0 = to_float(x[i]), x1 = to_float(x[half + i]);
        x[i] = from_float<T>(fmaf(x0, c, -(x1 * s)));
        x[half + i] = from_float<T>(fmaf(x1, c, x0 * s));
    }
}

}  // namespace

template <class T>
void rope(T* qkv, const float* table, const int32_t* positions, int64_t N, int row, int rotated, int HS, int T_len,
          RopeRotation rotation, cudaStream_t stream) {
    MS_ASSERT(N >= 0 && HS > 0 && HS % 2 == 0 && rotated % HS == 0 && rotated <= row,
              "rope: N = %lld, HS = %d (must be even), rotated = %d (a multiple of HS, at most row = %d)",
              static_cast<long long>(N), HS, rotated, row);
    MS_ASSERT(positions != nullptr || T_len > 0, "rope: T = %d must be positive without positions", T_len);
    const int64_t pairs = N * (rotated / 2);
    if (pairs == 0) return;
    ms_launch(rope_kernel<T>, grid_stride_blocks(pairs, kBlockSize), kBlockSize, 0, stream, qkv, table, positions, N,
              row, rotated, HS, T_len, rotation == RopeRotation::kInverse ? -1.0f : 1.0f);
    MS_CUDA_LAUNCH_CHECK();
}

#define MS_INSTANTIATE(T) \
    template void rope<T>(T*, const float*, const int32_t*, int64_t, int, int, int, int, RopeRotation, cudaStream_t);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE

}  // namespace ms::cuda
