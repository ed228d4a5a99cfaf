// mma.cuh: the PTX warp-level matrix instructions the tensor-core kernels use, with their documented fragment
// layouts: mma.sync m16n8k16 (bf16 / fp16 operands, fp32 accumulators), ldmatrix .x4 [.trans], and the packing of
// two floats into a 16-bit operand register. Inline PTX under nvcc (sm_80+); emu/mma_emu.h on the CPU emulation.
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), g = lane >> 2, t = lane % 4,
// each uint32_t two 16-bit elements, the lower-indexed one in the low half:
//   A (16 x 16, row-major):  a[0] = (g, 2t..2t+1)  a[1] = (g+8, 2t..2t+1)  a[2] = (g, 2t+8..)  a[3] = (g+8, 2t+8..)
//   B (16 x 8, "col"):       b[0] = (k = 2t..2t+1, n = g)  b[1] = (k = 2t+8..2t+9, n = g)
//   C, D (16 x 8 fp32):      c[0], c[1] = (g, 2t..2t+1)  c[2], c[3] = (g+8, 2t..2t+1)
// So the C fragments of two adjacent n-blocks, rounded and packed pairwise, are the A fragment of a 16-wide k-slice
// (FlashAttention-2's P in registers): a[0] = pack(c_lo[0], c_lo[1]), a[1] = pack(c_lo[2], c_lo[3]),
// a[2] = pack(c_hi[0], c_hi[1]), a[3] = pack(c_hi[2], c_hi[3]).
// ldmatrix .x4: lane l passes the shared-memory address of row l % 8 of 8x8 matrix l / 8 (16-byte aligned); r[j]
// gets matrix j's (row g, columns 2t..2t+1), with .trans its (rows 2t..2t+1, column g), i.e. a B fragment half of
// a row-major (k, n) tile.
// All are warp-collective: every lane of the warp calls them with the same control flow.
// Also here, for the same kernels: cp.async (16-byte global -> shared copies that run while the thread goes on; on
// the CPU emulation they land at the wait_group that covers them, so a missing wait shows) with commit / wait_group.
#pragma once

#include <cstdint>
#include <type_traits>

#include "engine/backends/cuda/common.cuh"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace ms::cuda {

// d = a b + c, S = ms::bf16 or ms::fp16 (the operand type); d may alias c.
template <class S>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                             const float (&c)[4]) {
#if defined(__CUDACC__)
    if constexpr (std::is_same_v<S, bf16>) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %11, %12, %13};\n"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
              "f"(c[3]));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %11, %12, %13};\n"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
              "f"(c[3]));
    }
#else
    cuda_emu::mma_m16n8k16<S>(d, a, b, c);
#endif
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: row is this lane's row address (shared memory, 16-byte aligned).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#if defined(__CUDACC__)
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#else
    cuda_emu::ldmatrix_x4(r, row, false);
#endif
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: as ldmatrix_x4, each 8x8 matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
#if defined(__CUDACC__)
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#else
    cuda_emu::ldmatrix_x4(r, row, true);
#endif
}

// lo and hi rounded to S (round to nearest even) in one operand register, lo in the low half.
template <class S>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
#if defined(__CUDACC__)
    uint32_t r;
    if constexpr (std::is_same_v<S, bf16>) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        r = *reinterpret_cast<const uint32_t*>(&v);
    } else {
        const __half2 v = __floats2half2_rn(lo, hi);
        r = *reinterpret_cast<const uint32_t*>(&v);
    }
    return r;
#else
    return static_cast<uint32_t>(from_float<S>(lo).bits) | static_cast<uint32_t>(from_float<S>(hi).bits) << 16;
#endif
}

// cp.async.cg.shared.global of 16 bytes from src to dst (shared, both 16-byte aligned); with valid false dst is
// zero-filled and nothing is read (src must still be a valid address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
#if defined(__CUDACC__)
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src), "r"(valid ? 16 : 0));
#else
    cuda_emu::cp_async_issue(dst, src, valid);
#endif
}

// Closes the group of this thread's cp.async issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDACC__)
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
    cuda_emu::cp_async_commit();
#endif
}

// Waits until at most kPending of this thread's committed groups are still in flight (other threads' copies need a
// __syncthreads after it).
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDACC__)
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");  // no shared-memory access moves above
#else
    cuda_emu::cp_async_wait(kPending);
#endif
}

}  // namespace ms::cuda
