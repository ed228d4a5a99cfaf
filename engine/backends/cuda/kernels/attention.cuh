// attention.cuh: launchers of causal multi-head self-attention, flash style (kernels live in attention.cu).
#pragma once

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// Largest head size the kernels take (their shared-memory tiles are sized for it).
inline constexpr int kAttentionMaxHS = 64;

// Which kernels bf16 / fp16 attention runs (fp32, and head sizes the tensor-core kernels do not take, always run the
// scalar ones). The CudaBackend maps the config's debug.cuda_attention and debug.cuda_attention_bwd onto it.
enum class AttentionKernels : uint8_t {
    kTensorCores,               // tensor cores; the fused backward when given scratch (the default)
    kTensorCoresSplitBackward,  // tensor cores; always the split backward
    kScalar,                    // the scalar kernels (on a GPU: tells a tensor-core kernel fault from one elsewhere)
};

// S: the activation dtype of qkv, out, dout, dqkv (float, bf16, fp16), computed in fp32; lse is fp32 whatever S is.
// NKV key/value heads (dividing NH; NKV = NH: multi-head attention): qkv and dqkv are (B, T, (NH + 2*NKV)*HS), rows
// [Q | K | V] with NH, NKV, NKV heads; query head h reads key/value head h / (NH / NKV); out, dout (B, T, NH*HS).
// out = softmax(Q K^T / sqrt(HS) + causal mask) V per query head; lse (B, NH, T) = log-sum-exp of each softmax row.
template <class S>
void attention_forward(S* out, float* lse, const S* qkv, int B, int T, int NH, int NKV, int HS, cudaStream_t stream,
                       AttentionKernels kernels = AttentionKernels::kTensorCores);

// dqkv overwritten (dK, dV of a key/value head summed over its query heads in a fixed order), the probabilities
// recomputed from lse; `out` is the forward's output. scratch: attention_backward_scratch_bytes<S>(B, T, NH, HS)
// bytes of device memory, 16-byte aligned (null when that is 0), for the fused tensor-core backward (attention.cu's
// header says when it runs); null runs the split one.
template <class S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, void* scratch, int B,
                        int T, int NH, int NKV, int HS, cudaStream_t stream,
                        AttentionKernels kernels = AttentionKernels::kTensorCores);

// Multi-head attention (NKV = NH), with and without scratch.
template <class S>
void attention_forward(S* out, float* lse, const S* qkv, int B, int T, int NH, int HS, cudaStream_t stream,
                       AttentionKernels kernels = AttentionKernels::kTensorCores) {
    attention_forward(out, lse, qkv, B, T, NH, NH, HS, stream, kernels);
}
template <class S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, void* scratch, int B,
                        int T, int NH, int HS, cudaStream_t stream,
                        AttentionKernels kernels = AttentionKernels::kTensorCores) {
    attention_backward(dqkv, dout, qkv, out, lse, scratch, B, T, NH, NH, HS, stream, kernels);
}
template <class S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, int B, int T, int NH,
                        int HS, cudaStream_t stream, AttentionKernels kernels = AttentionKernels::kTensorCores) {
    attention_backward(dqkv, dout, qkv, out, lse, nullptr, B, T, NH, NH, HS, stream, kernels);
}
// The scratch attention_backward<S> may use at these sizes with these kernels (0 when it runs no fused backward).
template <class S>
size_t attention_backward_scratch_bytes(int B, int T, int NH, int HS,
                                        AttentionKernels kernels = AttentionKernels::kTensorCores);

}  // namespace ms::cuda
