// lm_head_loss.cuh: the per-row piece of the fused LM head + cross-entropy (kernels live in lm_head_loss.cu); the
// CudaBackend composes it per chunk of rows with the GEMMs and cross_entropy.cuh's kernels (cuda_backend.cpp).
#pragma once

#include <cstdint>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// losses[n] = log(sum_exp[n]) + row_max[n] - target_logit[n] for n < N, all fp32 (the loss as the model forms it
// from cross_entropy_forward's statistics).
void lm_head_loss_forward(float* losses, const float* row_max, const float* sum_exp, const float* target_logit, int N,
                          cudaStream_t stream);

}  // namespace ms::cuda
