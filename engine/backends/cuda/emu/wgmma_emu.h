// wgmma_emu.h: the sm_90a warpgroup instructions behind cuda/wgmma.cuh for the CPU emulation: wgmma.mma_async
// m64n64k16 (f32 accumulators, bf16 / f16 operands, A in shared memory or registers, B in shared memory K-major or
// MN-major, no swizzle), wgmma.commit_group and wgmma.wait_group, and the matrix descriptor's start address.
// Included by cuda_emu.h, never by nvcc. Kernels call the wrappers of wgmma.cuh.
//
// The layouts are wgmma.cuh's (the PTX ISA's fragments and canonical no-swizzle layouts); the emulation computes
// exactly that mapping, so a kernel that builds a descriptor or a fragment wrongly fails its test here.
// Asynchrony as on a GPU at its latest: a wgmma is queued by the thread that issues it (with a copy of its A
// registers and the address of its D) and runs at the wgmma.wait_group that covers its committed group; only then
// are its shared-memory operands read and D written. So a kernel that reads D, or overwrites a shared-memory operand,
// before the wait sees or causes the old values and fails its test; a wgmma no wait covers never runs.
// Running a queued wgmma is warpgroup-collective (every thread of the warpgroup waits on the same groups, as
// .sync.aligned requires): each thread publishes its A fragment to the warpgroup's staging area, the warpgroup
// meets at a barrier, each thread computes its own D elements (products of two 16-bit values, exact in fp32, summed
// over k = 0..15 in order from D or 0, as mma_emu.h's mma.sync), and the warpgroup meets again.
// wgmma reads shared memory through the async proxy: what a thread wrote by cp.async must be followed by its
// fence.proxy.async (cuda/wgmma.cuh's fence_proxy_async_shared) before a wgmma reads it, or the wgmma aborts here
// with a message naming the byte and the thread. Plain stores to shared memory need the same fence on a GPU; the
// emulation cannot see them, so it does not check those.
// Descriptors hold an offset into the block's dynamic shared memory (the only shared memory a descriptor may name
// here); every element read is checked to lie inside it, and the swizzle and base-offset fields must be 0.
// wgmma.fence is not checked (nothing here reorders register accesses).
#pragma once

#if defined(__CUDACC__)
#error "wgmma_emu.h is for kernel sources compiled by the host compiler; nvcc uses the inline PTX in wgmma.cuh"
#endif

#include <cstdint>
#include <type_traits>

#include "engine/core/half.h"

namespace ms::cuda_emu {

// A queued wgmma.mma_async m64nNk16 (cuda_emu.cpp runs it).
struct WgmmaOp {
    float* d;  // the issuing thread's accumulator, N / 2 floats: [N / 8][4]
    int n;     // N
    bool a_in_registers;
    uint32_t a[4];    // the issuing thread's A fragment when a_in_registers
    uint64_t a_desc;  // otherwise A's descriptor (K-major)
    uint64_t b_desc;
    bool accumulate;  // false: D = A B
    bool b_mn_major;  // trans-b
    bool bf16;        // the operand type: bf16, else fp16
};

// The descriptor's start-address value for p: its offset in the block's dynamic shared memory (checked: inside it,
// 16-byte aligned).
uint64_t wgmma_shared_address(const void* p);
// fence.proxy.async.shared::cta: the calling thread's landed cp.async writes become visible to wgmma.
void fence_proxy_async();
void wgmma_issue(const WgmmaOp& op);
void wgmma_commit();
void wgmma_wait(int pending);

template <class S>
void wgmma_m64n64k16(float (&d)[8][4], const uint32_t (*a)[4], uint64_t a_desc, uint64_t b_desc, bool accumulate,
                     bool b_mn_major) {
    static_assert(std::is_same_v<S, bf16> || std::is_same_v<S, fp16>, "wgmma: bf16 or fp16 operands");
    WgmmaOp op{&d[0][0], 64,         a != nullptr, {0, 0, 0, 0},           a_desc,
               b_desc,   accumulate, b_mn_major,   std::is_same_v<S, bf16>};
    if (a != nullptr) {
        for (int i = 0; i < 4; ++i) op.a[i] = (*a)[i];
    }
    wgmma_issue(op);
}

}  // namespace ms::cuda_emu
