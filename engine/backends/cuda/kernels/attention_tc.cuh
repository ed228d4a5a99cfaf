// attention_tc.cuh: launchers of the tensor-core (PTX mma.sync m16n8k16) causal attention for bf16 / fp16 (kernels in
// attention_tc.cu). attention_forward / attention_backward (attention.cuh) dispatch here when
// attention_tc_eligible() holds; tests call these directly to pin the path they check.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <type_traits>

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

// Where query head h of sequence b reads in qkv (B, T, (NH + 2*NKV)*HS), rows [Q | K | V] of NH, NKV, NKV heads: its Q
// at q, its key/value head's (h / (NH / NKV)) K at k and V at v, row 0 of the sequence. dqkv has the same layout, so
// dqkv + (q - qkv) is where its dQ goes. For the scalar and tensor-core kernels alike.
template <class S>
struct QkvHead {
    const S* q;
    const S* k;
    const S* v;
    int64_t stride;  // (NH + 2*NKV)*HS elements between consecutive rows
};
template <class S>
__host__ __device__ inline QkvHead<S> qkv_head(const S* qkv, int b, int h, int T, int NH, int NKV, int HS) {
    const int64_t stride = static_cast<int64_t>(NH + 2 * NKV) * HS, kv = h / (NH / NKV);
    const S* row = qkv + static_cast<int64_t>(b) * T * stride;
    const S* k = row + (static_cast<int64_t>(NH) + kv) * HS;
    return {row + static_cast<int64_t>(h) * HS, k, k + static_cast<int64_t>(NKV) * HS, stride};
}

// For the launchers of tensor-core attention kernels (these and bench/gpu/attention_wmma.cu): checks the shape and
// eligibility (`who` names the kernels in the message), then calls launch(std::integral_constant<int, HS>{}) with
// HS as a constant the kernels are instantiated for, or nothing when B or T is 0.
template <class Launch>
void launch_attention_tc(const char* who, int B, int T, int NH, int HS, std::initializer_list<const void*> tensors,
                         Launch&& launch) {
    MS_ASSERT(B >= 0 && T >= 0 && NH > 0, "attention (%s): B = %d, T = %d, NH = %d", who, B, T, NH);
    MS_ASSERT(B <= 65535 && NH <= 65535, "attention (%s): B = %d or NH = %d is over the grid's limit", who, B, NH);
    MS_ASSERT(attention_tc_eligible(HS, tensors),
              "attention (%s): HS = %d must be 16, 32, 48 or 64 and every tensor 16-byte aligned", who, HS);
    if (B == 0 || T == 0) return;
    switch (HS) {
        case 16:
            return launch(std::integral_constant<int, 16>{});
        case 32:
            return launch(std::integral_constant<int, 32>{});
        case 48:
            return launch(std::integral_constant<int, 48>{});
        default:
            return launch(std::integral_constant<int, 64>{});
    }
}

// The two backwards (attention_tc.cu's header): kSplit, a dQ kernel and a dK/dV kernel that both recompute P and dP;
// kFused, one kernel per key tile that also adds its dQ share into an fp32 accumulator in scratch, in a fixed order.
// kFusedMisorderedForTest takes the fused kernel's work in the reverse order, so a block waits on one that has not
// started: it must abort on the CPU emulation (a test hook; it would hang a GPU).
enum class AttentionTcBackward : uint8_t { kSplit, kFused, kFusedMisorderedForTest };

// Bytes of scratch the fused backward needs (the split one none): the fp32 dQ accumulator (B, NH, T, HS), then an
// int32 work ticket and one int32 semaphore per (b, h, 64-row query tile). Reset on the stream by each launch, so
// launches that share scratch must not overlap (another stream needs its own).
size_t attention_tc_backward_scratch_bytes(int B, int T, int NH, int HS);

// As attention_forward / attention_backward (attention.cuh), S = bf16 or fp16, HS and pointers as eligible above;
// scratch (16-byte aligned) holds attention_tc_backward_scratch_bytes for the fused backward, or is null for kSplit.
template <class S>
void attention_tc_forward(S* out, float* lse, const S* qkv, int B, int T, int NH, int NKV, int HS, cudaStream_t stream);
template <class S>
void attention_tc_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, void* scratch, int B,
                           int T, int NH, int NKV, int HS, AttentionTcBackward kind, cudaStream_t stream);

// The Hopper forward (attention_tc.cu): attention_tc_forward's results on wgmma instead of mma.sync, HS = 64 only,
// where attention_wgmma_supported() (a GPU of compute capability 9.0 running a build for sm_90a; always on the CPU
// emulation). Not dispatched by attention_forward yet: tests and gpu_kernel_bench call it.
// schedule: kSerial waits for each product before the softmax that reads it and before the next tile; kOverlapped
// runs a tile's softmax while the previous tile's P V is still on the tensor cores (attention_tc.cu). Same bits on
// the emulation; which is faster is for gpu_kernel_bench to say.
inline constexpr int kAttentionWgmmaHS = 64;
enum class WgmmaSchedule : uint8_t { kSerial, kOverlapped };
bool attention_wgmma_supported();
template <class S>
void attention_tc_forward_wgmma(S* out, float* lse, const S* qkv, int B, int T, int NH, int NKV, int HS,
                                WgmmaSchedule schedule, cudaStream_t stream);

// Multi-head attention (NKV = NH).
template <class S>
void attention_tc_forward(S* out, float* lse, const S* qkv, int B, int T, int NH, int HS, cudaStream_t stream) {
    attention_tc_forward(out, lse, qkv, B, T, NH, NH, HS, stream);
}
template <class S>
void attention_tc_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, void* scratch, int B,
                           int T, int NH, int HS, AttentionTcBackward kind, cudaStream_t stream) {
    attention_tc_backward(dqkv, dout, qkv, out, lse, scratch, B, T, NH, NH, HS, kind, stream);
}

}  // namespace ms::cuda
