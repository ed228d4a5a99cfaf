// wgmma.cuh: the sm_90a warpgroup matrix instructions (PTX wgmma.mma_async) the Hopper attention forward uses, with
// their documented layouts; inline PTX under nvcc when compiling for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL: build with
// CMAKE_CUDA_ARCHITECTURES=90a), a trap on any other device architecture, and emu/wgmma_emu.h on the CPU emulation.
//
// A warpgroup is 4 consecutive warps (128 threads, the first a multiple of 128). wgmma.mma_async m64nNk16 computes
// D (64 x N, fp32) = A (64 x 16) B (16 x N) + (accumulate ? D : 0), A and B bf16 or fp16, asynchronously: it reads
// its operands and writes D some time before the wgmma.wait_group that covers its group. Fragments (PTX ISA,
// "Register Fragments and Shared Memory Matrix Layouts"), warp w of the warpgroup, g = lane >> 2, t = lane % 4:
//   D (m64nN):  d[j][0], d[j][1] = (16 w + g, 8 j + 2 t .. + 1), d[j][2], d[j][3] = (16 w + g + 8, same columns),
//               for each 8-column block j < N / 8: the mma.sync m16n8 accumulator of rows 16 w .. 16 w + 15, per block;
//   A in registers (m64k16): a[0..3] = mma.sync m16n8k16's A fragment of rows 16 w .. 16 w + 15, so two adjacent D
//               blocks, rounded and packed pairwise (attention_tc.cu's to_a), are the A operand of a 16-wide k-slice.
// Operands in shared memory are described by a 64-bit matrix descriptor; only the no-swizzle ("interleave") layout
// is used here, whose unit is the core matrix: 8 rows of 16 bytes (8 elements), 128 contiguous bytes. In element
// units (canonical layouts of the PTX ISA, T = 8 elements of 16 bits):
//   K-major  (A, or B with trans_b = 0), element (mn, k): (mn % 8) * 16 B + (mn / 8) * SBO + (k % 8) * 2 B + (k / 8) *
//   LBO MN-major (B with trans_b = 1),       element (mn, k): (mn % 8) * 2 B + (mn / 8) * SBO + (k % 8) * 16 B + (k /
//   8) * LBO
// so SBO steps 8 rows (K-major) or 8 columns (MN-major) of the M / N side, LBO steps 8 along K. The descriptor: bits
// 0-13 the start address, 16-29 LBO, 32-45 SBO, each (x & 0x3FFFF) >> 4; bits 62-63 the swizzle mode, 0 here.
// Ordering: shared-memory operands written by this thread (stores or cp.async) need fence_proxy_async_shared() and
// then a barrier before a wgmma reads them (wgmma reads through the async proxy); wgmma_fence() before the first wgmma
// of a batch whose registers (D or A) other instructions wrote; wgmma_commit() closes the batch into a group;
// wgmma_wait<N>() returns when at most N groups are pending. D and A must not be touched between the wgmma and the wait
// that covers it (the emulation computes D at that wait, so a kernel that reads D early reads its old value and fails
// its test). All are warpgroup-collective.
#pragma once

#include <cstdint>
#include <type_traits>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

#if defined(__CUDACC__) && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MS_WGMMA_TRAP() __trap()  // compiled for a device without wgmma: the launcher never starts these kernels
#endif

// The 32 fp32 accumulator registers of an m64n64 wgmma: operands %0 .. %31, bound to d[8][4] in fragment order.
#define MS_WGMMA_D_REGS                                                                                               \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
    "%24, %25, %26, %27, %28, %29, %30, %31}"
#define MS_WGMMA_D_OUTPUTS(d)                                                                                    \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),     \
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), \
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), \
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])

// The descriptor of a no-swizzle operand at shared-memory address p (16-byte aligned), lbo / sbo in bytes.
__device__ __forceinline__ uint64_t wgmma_desc(const void* p, uint32_t lbo, uint32_t sbo) {
#if defined(__CUDACC__)
    const uint64_t start = static_cast<uint32_t>(__cvta_generic_to_shared(p));
#else
    const uint64_t start = cuda_emu::wgmma_shared_address(p);
#endif
    return ((start & 0x3FFFF) >> 4) | uint64_t((lbo & 0x3FFFF) >> 4) << 16 | uint64_t((sbo & 0x3FFFF) >> 4) << 32;
}

// Keeps the compiler from moving accesses of an accumulator across the asynchronous instructions (CUTLASS's
// warpgroup_fence_operand): the registers are live and may change under the asm statements.
__device__ __forceinline__ void wgmma_fence_operand(float (&d)[8][4]) {
#if defined(__CUDACC__)
    for (int j = 0; j < 8; ++j) {
        for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(d[j][i])::"memory");
    }
#else
    (void)d;
#endif
}

// fence.proxy.async.shared::cta: this thread's earlier writes to shared memory (plain stores, landed cp.async) become
// visible to wgmma, which reads through the async proxy. Each writing thread fences, then a barrier, then the wgmma.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(MS_WGMMA_TRAP)
    MS_WGMMA_TRAP();
#elif defined(__CUDACC__)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
    cuda_emu::fence_proxy_async();
#endif
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(MS_WGMMA_TRAP)
    MS_WGMMA_TRAP();
#elif defined(__CUDACC__)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if defined(MS_WGMMA_TRAP)
    MS_WGMMA_TRAP();
#elif defined(__CUDACC__)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
    cuda_emu::wgmma_commit();
#endif
}

template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#if defined(MS_WGMMA_TRAP)
    MS_WGMMA_TRAP();
#elif defined(__CUDACC__)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#else
    cuda_emu::wgmma_wait(kPending);
#endif
}

// d (64 x 64) = A B + (accumulate ? d : 0): A (64 x 16) and B (16 x 64) K-major in shared memory (descriptors).
template <class S>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[8][4], uint64_t a_desc, uint64_t b_desc,
                                                   bool accumulate) {
#if defined(MS_WGMMA_TRAP)
    MS_WGMMA_TRAP();
#elif defined(__CUDACC__)
#define MS_WGMMA_SS(TYPE)                                                               \
    asm volatile(                                                                       \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                    \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " MS_WGMMA_D_REGS \
        ", %32, %33, p, 1, 1, 0, 0;\n}\n"                                               \
        : MS_WGMMA_D_OUTPUTS(d)                                                         \
        : "l"(a_desc), "l"(b_desc), "r"(static_cast<int>(accumulate)))
    if constexpr (std::is_same_v<S, bf16>) {
        MS_WGMMA_SS("bf16");
    } else {
        MS_WGMMA_SS("f16");
    }
#undef MS_WGMMA_SS
#else
    cuda_emu::wgmma_m64n64k16<S>(d, nullptr, a_desc, b_desc, accumulate, false);
#endif
}

// d (64 x 64) = A B + (accumulate ? d : 0): A (64 x 16) in registers (a, the fragment above), B (16 x 64) MN-major
// in shared memory (trans_b = 1: a row-major (k, n) tile such as V's (keys, head) rows).
template <class S>
__device__ __forceinline__ void wgmma_m64n64k16_rs_mn(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b_desc,
                                                      bool accumulate) {
#if defined(MS_WGMMA_TRAP)
    MS_WGMMA_TRAP();
#elif defined(__CUDACC__)
#define MS_WGMMA_RS(TYPE)                                                               \
    asm volatile(                                                                       \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                    \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " MS_WGMMA_D_REGS \
        ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                 \
        : MS_WGMMA_D_OUTPUTS(d)                                                         \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(static_cast<int>(accumulate)))
    if constexpr (std::is_same_v<S, bf16>) {
        MS_WGMMA_RS("bf16");
    } else {
        MS_WGMMA_RS("f16");
    }
#undef MS_WGMMA_RS
#else
    cuda_emu::wgmma_m64n64k16<S>(d, &a, 0, b_desc, accumulate, true);
#endif
}

}  // namespace ms::cuda
