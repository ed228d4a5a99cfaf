// attention_wmma.h: launchers of the nvcuda::wmma causal attention (bench/gpu/attention_wmma.cu), the alternative
// gpu_kernel_bench times next to the shipped mma.sync kernels. Arguments as attention_tc_forward / _backward
// (engine/backends/cuda/kernels/attention_tc.cuh), S = ms::bf16 or ms::fp16, device pointers, HS in {16, 32, 48, 64}.
#pragma once

#include <cuda_runtime.h>

#include "engine/core/half.h"

namespace ms::bench {

template <class S>
void attention_wmma_forward(S* out, float* lse, const S* qkv, int B, int T, int NH, int HS, cudaStream_t stream);
template <class S>
void attention_wmma_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, int B, int T, int NH,
                             int HS, cudaStream_t stream);

}  // namespace ms::bench
