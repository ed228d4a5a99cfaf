/*
The LM head's loss per row, for the fused LM head + cross-entropy (backend.h, LmHeadLossArgs). The CudaBackend runs
the op chunk by chunk over the rows: the chunk's logits (R, Vp) in T from one GEMM (cuBLASLt on a GPU, matmul.cu's
tiled kernel on the emulation) into the caller's scratch, cross_entropy.cu's kMaxSumExp kernel for its row_max,
sum_exp and target_logit, this kernel for the losses, then with a loss gradient cross_entropy.cu's backward in place
and the matmul backward (dlnf rows overwritten, dwte +=: fp32, or T for 16-bit gradients, which the matmul backward
rounds once per chunk, from_float<T>(old + the chunk's fp32 product)). The twin is cpu/ops/lm_head_loss.cpp.
Layout: row_max, sum_exp, target_logit, losses (N) fp32. Accumulation: losses are overwritten; one thread per row,
in fp32 (logf, as the CPU's std::log on a float).
*/
#include "engine/backends/cuda/kernels/lm_head_loss.cuh"

namespace ms::cuda {
namespace {

constexpr int kBlockSize = 256;

// ----------------------------------------------------------------------------
// CUDA kernels

__global__ void lm_head_loss_forward_kernel(float* __restrict__ losses, const float* __restrict__ row_max,
                                            const float* __restrict__ sum_exp, const float* __restrict__ target_logit,
                                            int N) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N) losses[n] = logf(sum_exp[n]) + row_max[n] - target_logit[n];
}

}  // namespace

// ----------------------------------------------------------------------------
// kernel launchers

void lm_head_loss_forward(float* losses, const float* row_max, const float* sum_exp, const float* target_logit, int N,
                          cudaStream_t stream) {
    MS_ASSERT(N >= 0, "lm_head_loss: N = %d is negative", N);
    if (N == 0) return;
    ms_launch(lm_head_loss_forward_kernel, (N + kBlockSize - 1) / kBlockSize, kBlockSize, 0, stream, losses, row_max,
              sum_exp, target_logit, N);
    MS_CUDA_LAUNCH_CHECK();
}

}  // namespace ms::cuda
