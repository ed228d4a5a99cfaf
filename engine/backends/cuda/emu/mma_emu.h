// mma_emu.h: the PTX warp-level matrix instructions behind cuda/mma.cuh for the CPU emulation:
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 and ldmatrix.sync.aligned.m8n8.x4[.trans].b16.
// Included by cuda_emu.h, never by nvcc (which gets the inline asm in mma.cuh). Kernels call the wrappers of
// mma.cuh, not these.
//
// Unlike wmma (wmma_emu.h), these instructions document which lane holds which element (PTX ISA, "Matrix Fragments
// for mma.m16n8k16 with floating point type", and "ldmatrix"), and kernels rely on it, so the emulation computes
// exactly that mapping. With g = lane >> 2 (groupID) and t = lane % 4 (threadID_in_group), each 32-bit register
// holding two 16-bit elements, the lower-indexed one in the low half:
//   A (16 x 16, row): a[0] = (g, 2t..2t+1)  a[1] = (g+8, 2t..2t+1)  a[2] = (g, 2t+8..2t+9)  a[3] = (g+8, 2t+8..2t+9)
//   B (16 x 8, col):  b[0] = (k = 2t..2t+1, n = g)  b[1] = (k = 2t+8..2t+9, n = g)
//   C, D (16 x 8 f32): c[0], c[1] = (g, 2t), (g, 2t+1)  c[2], c[3] = (g+8, 2t), (g+8, 2t+1)
//   ldmatrix .x4: lane l gives the address of row l % 8 of matrix l / 8 (16-byte aligned: checked, abort); register
//   r[j] receives matrix j's (row g, columns 2t..2t+1), or with .trans its (rows 2t..2t+1, column g).
//
// All are warp-collective (every live lane must call them, as on a GPU where .aligned requires it). They go through
// the warp's staging area (warp_mma_staging, shared with wmma): each lane publishes its operands (mma) or its row
// address (ldmatrix), the warp waits, each lane computes its own elements, the warp waits again. Two barriers per
// instruction instead of one shuffle per element keeps the emulated attention kernels fast enough for CI.
// ldmatrix reads memory after the first barrier, so it sees every earlier write of the warp: unlike wmma_emu.h's
// loads it cannot expose a missing __syncwarp before it.
// cp.async (cuda/mma.cuh's cp_async16 / cp_async_commit / cp_async_wait): each thread's copies are queued and land
// at the cp.async.wait_group that covers their group, the latest moment a GPU allows, so a kernel that reads a
// staged tile before its wait (or, for other threads' copies, before the barrier after it) reads the old contents
// (the NaN poison at block start, or the previous tile) and fails its test. Copies no wait covered never land.
// mma: d = a b + c in fp32, products of two bf16 / fp16 values (exact in fp32) summed over k = 0..15 in order,
// starting from c; a tensor core's order and internal precision are unspecified, so a GPU may differ in the last
// bits of d.
#pragma once

#if defined(__CUDACC__)
#error "mma_emu.h is for kernel sources compiled by the host compiler; nvcc uses the inline PTX in mma.cuh"
#endif

#include <cstdint>
#include <cstring>

#include "engine/backends/cuda/emu/wmma_emu.h"  // warp_mma_staging
#include "engine/core/half.h"

namespace ms::cuda_emu {

// Aborts unless the row address p of an ldmatrix is 16-byte aligned (cuda_emu.cpp).
void ldmatrix_check_row(const void* p);

// cp.async of 16 bytes (valid false: zero-fill), commit_group, wait_group(pending), per calling thread
// (cuda_emu.cpp).
void cp_async_issue(void* dst, const void* src, bool valid);
void cp_async_commit();
void cp_async_wait(int pending);

// The two 16-bit elements of a fragment register as floats: low half first.
template <class S>
inline void unpack2(uint32_t r, float& lo, float& hi) {
    lo = to_float(S{static_cast<uint16_t>(r & 0xffffu)});
    hi = to_float(S{static_cast<uint16_t>(r >> 16)});
}

// S = ms::bf16 or ms::fp16: the operand type.
template <class S>
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
    float* a_tile = warp_mma_staging();  // (16, 16) row-major: a[row][k]
    float* b_tile = a_tile + 256;        // (16, 8) row-major: b[k][n]
    const int lane = lane_id(), g = lane >> 2, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i % 2), col = 2 * t + 8 * (i / 2);
        unpack2<S>(a[i], a_tile[row * 16 + col], a_tile[row * 16 + col + 1]);
    }
    for (int i = 0; i < 2; ++i) {
        const int k = 2 * t + 8 * i;
        unpack2<S>(b[i], b_tile[k * 8 + g], b_tile[(k + 1) * 8 + g]);
    }
    __syncwarp();
    float result[4];
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
        float acc = c[i];
        for (int k = 0; k < 16; ++k) acc += a_tile[row * 16 + k] * b_tile[k * 8 + col];
        result[i] = acc;
    }
    __syncwarp();  // every lane has read the staging area before the next instruction overwrites it
    for (int i = 0; i < 4; ++i) d[i] = result[i];
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 with this lane's row address.
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans) {
    ldmatrix_check_row(row);
    unsigned char* rows = reinterpret_cast<unsigned char*>(warp_mma_staging());  // 32 addresses
    const int lane = lane_id(), g = lane >> 2, t = lane % 4;
    std::memcpy(rows + lane * sizeof(void*), &row, sizeof(void*));
    __syncwarp();
    const auto row_of = [&](int matrix, int i) {
        const unsigned char* p;
        std::memcpy(&p, rows + (8 * matrix + i) * sizeof(void*), sizeof(void*));
        return p;
    };
    uint32_t result[4];
    for (int j = 0; j < 4; ++j) {
        if (trans) {
            uint16_t lo, hi;
            std::memcpy(&lo, row_of(j, 2 * t) + 2 * g, 2);
            std::memcpy(&hi, row_of(j, 2 * t + 1) + 2 * g, 2);
            result[j] = lo | static_cast<uint32_t>(hi) << 16;
        } else {
            std::memcpy(&result[j], row_of(j, g) + 4 * t, 4);
        }
    }
    __syncwarp();
    for (int j = 0; j < 4; ++j) r[j] = result[j];
}

}  // namespace ms::cuda_emu
