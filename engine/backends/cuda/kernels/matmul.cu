/*
The Linear layer, out = inp @ weight^T + bias, and its backward. Twin: cpu/ops/matmul.cpp.
Layout (row-major): inp/dinp (N, K) T, weight (M, K) T (Linear orientation), bias (M) T, out/dout (N, M) T, where T is
the activation dtype (float, bf16, fp16); dweight (M, K) and dbias (M) G, the parameter gradients' dtype: float, or T
itself (16-bit gradients, backend.h precision contract).
Backward: dinp = dout @ weight (= or += per DinpWrite), dweight += dout^T @ inp, dbias += sum_n dout[n, :].
One plain tiled SGEMM kernel serves all three products: C (R, Q) = or += A (R, I) @ B (I, Q) (+ a bias per column),
with A and B addressed through (row, column) strides, so a transposed operand is only a swap of strides. Blocks
of (kTile, kTile) threads each own a kTile x kTile tile of C, one element per thread, and walk the inner dim in
kTile steps through shared memory (fp32 tiles, converted on load); every element is one thread's float sum in k
order, so runs are bit-identical. The kernel is a template on the operands' type TA and the output's TC: the
forward and dinp are (T, T), dweight (T, G); the fp32 accumulator (plus the bias, plus the old value for kAdd) is
rounded to TC once. So a G = T dweight is from_float<T>(old + the product), the product being exactly what an fp32
dweight gets added: the contract's one rounding per call.
dbias is one thread per column summing the rows in order from 0, then adding the sum to the old value (one rounding to
G; for G = float the same bits as before 16-bit gradients existed).
Status: the spec on the CPU emulation, not the GPU path: on H100/H200 the products will go to cuBLASLt (bf16/tf32
tensor cores, the bias and GELU epilogues fused); this kernel is a correctness fallback and nothing more.
Accumulation contract: out overwritten; dinp per DinpWrite; dweight and dbias +=.
*/
#include "engine/backends/cuda/kernels/matmul.cuh"

namespace ms::cuda {
namespace {

constexpr int kTile = 16;
constexpr int kBlockSize = 256;

// A (R, I) or B (I, Q) element (row, col) at p[row * row_stride + col * col_stride].
template <class TA>
struct Strided {
    const TA* p;
    int64_t row_stride, col_stride;
};

// ----------------------------------------------------------------------------
// CUDA kernels

// grid (ceil(Q / kTile), ceil(R / kTile)), block (kTile, kTile): threadIdx.x the column of C, threadIdx.y the row.
template <DinpWrite kWrite, class TA, class TC>
__global__ void matmul_kernel(TC* __restrict__ c, Strided<TA> a, Strided<TA> b, const TC* __restrict__ bias, int R,
                              int I, int Q) {
    __shared__ float s_a[kTile][kTile + 1];  // +1: the column reads of s_a stay free of bank conflicts
    __shared__ float s_b[kTile][kTile];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * kTile + ty, col = blockIdx.x * kTile + tx;
    float acc = 0.0f;
    for (int i0 = 0; i0 < I; i0 += kTile) {
        const int a_row = row, a_col = i0 + tx;
        s_a[ty][tx] = a_row < R && a_col < I ? to_float(a.p[a_row * a.row_stride + a_col * a.col_stride]) : 0.0f;
        const int b_row = i0 + ty, b_col = col;
        s_b[ty][tx] = b_row < I && b_col < Q ? to_float(b.p[b_row * b.row_stride + b_col * b.col_stride]) : 0.0f;
        __syncthreads();
        for (int i = 0; i < kTile; ++i) acc += s_a[ty][i] * s_b[i][tx];
        __syncthreads();
    }
    if (row >= R || col >= Q) return;
    if (bias != nullptr) acc += to_float(bias[col]);
    TC* out = c + static_cast<int64_t>(row) * Q + col;
    if constexpr (kWrite == DinpWrite::kAdd) {
        *out = from_float<TC>(to_float(*out) + acc);
    } else {
        *out = from_float<TC>(acc);
    }
}

template <class T, class G>
__global__ void matmul_backward_bias_kernel(G* __restrict__ dbias, const T* __restrict__ dout, int N, int M) {
    const int m = blockIdx.x * blockDim.x + threadIdx.x;
    if (m >= M) return;
    float sum = 0.0f;
    for (int n = 0; n < N; ++n) sum += to_float(dout[static_cast<int64_t>(n) * M + m]);
    dbias[m] = from_float<G>(to_float(dbias[m]) + sum);
}

template <class G>
__global__ void add_to_gradient_kernel(G* __restrict__ grad, const float* __restrict__ contribution, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) grad[i] = from_float<G>(to_float(grad[i]) + contribution[i]);
}

// c (R, Q) = or += a @ b (+ bias).
template <class TA, class TC>
void gemm(TC* c, Strided<TA> a, Strided<TA> b, const TC* bias, int R, int I, int Q, DinpWrite write,
          cudaStream_t stream) {
    MS_ASSERT(ceil_div(R, kTile) <= 65535, "matmul: %d output rows make %lld row tiles, over the grid's y limit", R,
              static_cast<long long>(ceil_div(R, kTile)));
    const dim3 grid(static_cast<unsigned>(ceil_div(Q, kTile)), static_cast<unsigned>(ceil_div(R, kTile)));
    if (write == DinpWrite::kAdd) {
        ms_launch(matmul_kernel<DinpWrite::kAdd, TA, TC>, grid, dim3(kTile, kTile), 0, stream, c, a, b, bias, R, I, Q);
    } else {
        ms_launch(matmul_kernel<DinpWrite::kOverwrite, TA, TC>, grid, dim3(kTile, kTile), 0, stream, c, a, b, bias, R,
                  I, Q);
    }
    MS_CUDA_LAUNCH_CHECK();
}

void check_shape(int N, int K, int M) {
    MS_ASSERT(N >= 0 && K > 0 && M > 0, "matmul: N = %d, K = %d, M = %d (K and M must be positive)", N, K, M);
}

}  // namespace

// ----------------------------------------------------------------------------
// kernel launchers

template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, const NoDeduce<T>* bias, int N, int K, int M,
                    cudaStream_t stream) {
    check_shape(N, K, M);
    if (N == 0) return;
    // A = inp (N, K); B(k, m) = weight[m, k].
    gemm<T, T>(out, {inp, K, 1}, {weight, 1, K}, bias, N, K, M, DinpWrite::kOverwrite, stream);
}

template <class T, class G>
void matmul_backward(NoDeduce<T>* dinp, G* dweight, NoDeduce<G>* dbias, const T* dout, const T* inp, const T* weight,
                     int N, int K, int M, DinpWrite write, cudaStream_t stream) {
    check_shape(N, K, M);
    if (N == 0) return;
    // dinp (N, K): A = dout (N, M), B = weight (M, K).
    if (dinp != nullptr) gemm<T, T>(dinp, {dout, M, 1}, {weight, K, 1}, nullptr, N, M, K, write, stream);
    // dweight (M, K) G: A(m, n) = dout[n, m], B = inp (N, K).
    gemm<T, G>(dweight, {dout, 1, M}, {inp, K, 1}, nullptr, M, N, K, DinpWrite::kAdd, stream);
    if (dbias != nullptr) {
        ms_launch(matmul_backward_bias_kernel<T, G>, static_cast<int>(ceil_div(M, kBlockSize)), kBlockSize, 0, stream,
                  dbias, dout, N, M);
        MS_CUDA_LAUNCH_CHECK();
    }
}

template <class G>
void add_to_gradient(G* grad, const float* contribution, int n, cudaStream_t stream) {
    if (n == 0) return;
    ms_launch(add_to_gradient_kernel<G>, static_cast<int>(ceil_div(n, kBlockSize)), kBlockSize, 0, stream, grad,
              contribution, n);
    MS_CUDA_LAUNCH_CHECK();
}

#define MS_INSTANTIATE(T) \
    template void matmul_forward<T>(T*, const T*, const T*, const T*, int, int, int, cudaStream_t);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE
// (T, G): every activation dtype with fp32 gradients, and bf16 / fp16 with gradients of their own dtype.
#define MS_INSTANTIATE(T, G)                                                                                \
    template void matmul_backward<T, G>(T*, G*, G*, const T*, const T*, const T*, int, int, int, DinpWrite, \
                                        cudaStream_t);
MS_INSTANTIATE(float, float)
MS_INSTANTIATE(bf16, float)
MS_INSTANTIATE(bf16, bf16)
MS_INSTANTIATE(fp16, float)
MS_INSTANTIATE(fp16, fp16)
#undef MS_INSTANTIATE
#define MS_INSTANTIATE(G) template void add_to_gradient<G>(G*, const float*, int, cudaStream_t);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE

}  // namespace ms::cuda
