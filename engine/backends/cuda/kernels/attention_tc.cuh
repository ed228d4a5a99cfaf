// attention_tc.cuh: launchers of the tensor-core (PTX mma.sync m16n8k16) causal attention for bf16 / fp16 (kernels in
// attention_tc.cu). attention_forward / attention_backward (attention.cuh) dispatch here when
// attention_tc_eligible() holds; tests call these directly to pin the path they check.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

// Head sizes the tensor-core kernels are instantiated for: multiples of the 16-wide mma tile up to this.
inline constexpr int kAttentionTcMaxHS = 64;

// The tensor-core path takes HS in {16, 32, 48, 64} and tensors whose base pointers are 16-byte aligned (its
// global loads and stores move 8 elements at a time); anything else keeps the scalar kernels of attention.cu.
inline bool attention_tc_eligible(int HS, std::initializer_list<const void*> tensors) {
    if (HS <= 0 || HS % 16 != 0 || HS > kAttentionTcMaxHS) return false;
    for (const void* p : tensors) {
        if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
    }
    return true;
}

// As attention_forward / attention_backward (attention.cuh), S = bf16 or fp16, HS and pointers as eligible above.
template <class S>
void attention_tc_forward(S* out, float* lse, const S* qkv, int B, int T, int NH, int HS, cudaStream_t stream);
template <class S>
void attention_tc_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, int B, int T, int NH,
                           int HS, cudaStream_t stream);

}  // namespace ms::cuda
