// cross_entropy.cuh: launchers of the vocab-parallel softmax cross-entropy pieces (kernels live in cross_entropy.cu).
#pragma once

#include <cstdint>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// ms::CrossEntropyPhase (backend.h), which nvcc cannot include.
enum class CrossEntropyPhase : uint8_t { kMax, kSumExp, kMaxSumExp };

// kMax:       row_max[n] = max_{j < valid} logits[n, j] (-inf when valid = 0); sum_exp, target_logit, targets unused.
// kSumExp:    sum_exp[n] = sum_{j < valid} exp(logits[n, j] - row_max[n]); target_logit[n] = logits[n, targets[n] -
//             vocab_start] when that column is in [0, valid), else 0.
// kMaxSumExp: all three in one read of the logits (an online max; sum_exp rounds differently from kSumExp's).
// T: the logits' dtype (float, bf16, fp16); the row statistics, dloss are fp32 whatever T is.
template <class T>
void cross_entropy_forward(float* row_max, float* sum_exp, float* target_logit, const T* logits, const int32_t* targets,
                           int N, int Vp, int64_t vocab_start, int valid, CrossEntropyPhase phase, cudaStream_t stream);

// In place over logits: dlogits[n, j] = dloss[n] * (exp(logits - row_max) / sum_exp - [j == target]) for j < valid,
// 0 for the masked columns j >= valid, each rounded once to T.
template <class T>
void cross_entropy_backward(T* logits, const int32_t* targets, const float* row_max, const float* sum_exp,
                            const float* dloss, int N, int Vp, int64_t vocab_start, int valid, cudaStream_t stream);

}  // namespace ms::cuda
