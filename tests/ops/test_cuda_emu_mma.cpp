// test_cuda_emu_mma.cpp: the PTX warp-level matrix wrappers of engine/backends/cuda/mma.cuh on the CPU emulation
// (emu/mma_emu.h), with exact expectations.
//
// The fragments are built here from row-major host arrays by the layout the PTX ISA documents ("Matrix Fragments
// for mma.m16n8k16 with floating point type"), written out again independently of mma_emu.h, so a wrong lane
// mapping in either shows up. Inputs are small integers, exact in bf16 and fp16, so every product and partial sum is
// exact in fp32 and D is compared with == against a plain loop. ldmatrix .x4 (plain and .trans) must give the same
// registers as the documented layout applied to the tile in shared memory; pack2 rounds to nearest even, low half
// first; a cp.async lands at the wait_group that covers its group, not before; a misaligned ldmatrix row aborts.
#include <gtest/gtest.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/mma.cuh"
#include "engine/core/half.h"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

// The documented A element (row, col) of register i, half h (0: low) for lane (g, t).
int a_row(int g, int i) { return g + 8 * (i % 2); }
int a_col(int t, int i, int h) { return 2 * t + 8 * (i / 2) + h; }

// a (16, 16), b (16, 8) as (k, n), c and d (16, 8): row-major.
template <class S>
__global__ void mma_kernel(float* d, const float* a, const float* b, const float* c) {
    const int lane = threadIdx.x, g = lane >> 2, t = lane % 4;
    uint32_t fa[4], fb[2];
    float fc[4], fd[4];
    for (int i = 0; i < 4; ++i) {
        fa[i] = bits_of<S>(a[a_row(g, i) * 16 + a_col(t, i, 0)], a[a_row(g, i) * 16 + a_col(t, i, 1)]);
        fc[i] = c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
    }
    for (int i = 0; i < 2; ++i) fb[i] = bits_of<S>(b[(2 * t + 8 * i) * 8 + g], b[(2 * t + 8 * i + 1) * 8 + g]);
    cuda::mma_m16n8k16<S>(fd, fa, fb, fc);
    for (int i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = fd[i];
}

template <class S>
void check_mma() {
    const std::vector<float> a = small_ints(256, 1), b = small_ints(128, 2), c = small_ints(128, 3);
    std::vector<float> want(128), d(128, -1.0f);
    for (int i = 0; i < 16; ++i) {
        for (int n = 0; n < 8; ++n) {
            float acc = c[i * 8 + n];
            for (int k = 0; k < 16; ++k) acc += a[i * 16 + k] * b[k * 8 + n];
            want[i * 8 + n] = acc;
        }
    }
    ms_launch(mma_kernel<S>, dim3(1), dim3(32), 0, nullptr, d.data(), a.data(), b.data(), c.data());
    EXPECT_EQ(d, want);
}

TEST(CudaEmuMma, M16n8k16MatchesALoopBf16) { check_mma<bf16>(); }
TEST(CudaEmuMma, M16n8k16MatchesALoopFp16) { check_mma<fp16>(); }

constexpr int kLd = 24;  // padded row stride of the shared tile, in elements (48 bytes: rows stay 16-byte aligned)

// tile (16, 16) row-major values. Per lane, 12 registers out: ldmatrix_x4 with lane l pointing at row
// l % 8 + 8 * ((l / 8) % 2), column 8 * (l / 16) (so the four matrices are the A fragment's quadrants), then
// ldmatrix_x4_trans with the same addresses, then ldmatrix_x4 with row l % 8 + 8 * (l / 16), column
// 8 * ((l / 8) % 2) (the B fragments of two n-blocks of a tile stored as (n, k)).
template <class S>
__global__ void ldmatrix_kernel(uint32_t* out, const float* tile) {
    MS_DYNAMIC_SHARED(S, s);
    for (int i = threadIdx.x; i < 256; i += 32) s[i / 16 * kLd + i % 16] = from_float<S>(tile[i]);
    __syncwarp();
    const int l = threadIdx.x;
    uint32_t r[4];
    cuda::ldmatrix_x4(r, s + (l % 8 + 8 * ((l / 8) % 2)) * kLd + 8 * (l / 16));
    for (int j = 0; j < 4; ++j) out[l * 12 + j] = r[j];
    cuda::ldmatrix_x4_trans(r, s + (l % 8 + 8 * ((l / 8) % 2)) * kLd + 8 * (l / 16));
    for (int j = 0; j < 4; ++j) out[l * 12 + 4 + j] = r[j];
    cuda::ldmatrix_x4(r, s + (l % 8 + 8 * (l / 16)) * kLd + 8 * ((l / 8) % 2));
    for (int j = 0; j < 4; ++j) out[l * 12 + 8 + j] = r[j];
}

template <class S>
void check_ldmatrix() {
    std::vector<float> tile(256);
    for (int i = 0; i < 256; ++i) tile[i] = static_cast<float>(i - 128);  // every element distinct, exact
    std::vector<uint32_t> out(32 * 12, 0);
    ms_launch(ldmatrix_kernel<S>, dim3(1), dim3(32), size_t{16} * kLd * sizeof(S), nullptr, out.data(), tile.data());
    const auto at = [&](int row, int col) { return tile[row * 16 + col]; };
    for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = l % 4;
        for (int i = 0; i < 4; ++i) {  // the A fragment of the tile
            EXPECT_EQ(out[l * 12 + i], bits_of<S>(at(a_row(g, i), a_col(t, i, 0)), at(a_row(g, i), a_col(t, i, 1))))
                << "ldmatrix_x4 lane " << l << " register " << i;
        }
        for (int i = 0; i < 4; ++i) {  // the B fragments of n-blocks 0 and 1 of the tile as (k, n)
            const int k = 2 * t + 8 * (i % 2), n = g + 8 * (i / 2);
            EXPECT_EQ(out[l * 12 + 4 + i], bits_of<S>(at(k, n), at(k + 1, n)))
                << "ldmatrix_x4_trans lane " << l << " register " << i;
        }
        for (int i = 0; i < 4; ++i) {  // the B fragments of n-blocks 0 and 1 of the tile as (n, k)
            const int k = 2 * t + 8 * (i % 2), n = g + 8 * (i / 2);
            EXPECT_EQ(out[l * 12 + 8 + i], bits_of<S>(at(n, k), at(n, k + 1)))
                << "ldmatrix_x4 (B from (n, k)) lane " << l << " register " << i;
        }
    }
}

TEST(CudaEmuMma, LdmatrixGivesTheDocumentedFragmentsBf16) { check_ldmatrix<bf16>(); }
TEST(CudaEmuMma, LdmatrixGivesTheDocumentedFragmentsFp16) { check_ldmatrix<fp16>(); }

__global__ void pack_kernel(uint32_t* out, float lo, float hi) {
    out[0] = cuda::pack2<bf16>(lo, hi);
    out[1] = cuda::pack2<fp16>(lo, hi);
}

TEST(CudaEmuMma, Pack2RoundsToNearestEvenLowHalfFirst) {
    uint32_t out[2];
    const float lo = 1.0f + 1.0f / 256 + 1.0f / 4096, hi = -3.0f;  // lo: bf16 rounds up, fp16 rounds to nearest
    ms_launch(pack_kernel, dim3(1), dim3(1), 0, nullptr, out, lo, hi);
    EXPECT_EQ(out[0], static_cast<uint32_t>(from_float<bf16>(lo).bits) | uint32_t{from_float<bf16>(hi).bits} << 16);
    EXPECT_EQ(out[1], static_cast<uint32_t>(from_float<fp16>(lo).bits) | uint32_t{from_float<fp16>(hi).bits} << 16);
    EXPECT_EQ(to_float(bf16{static_cast<uint16_t>(out[0] & 0xffffu)}), 1.0f + 1.0f / 128);
}

// Thread i copies 16 bytes (4 floats) from src[4 i ..] in two groups: group 1 into a, group 2 into b
// (with valid = false for odd i: zero-fill). seen[i * 4 + k] records a[4 i] / b[4 i] before any wait (k = 0: old
// contents), after wait_group 1 (k = 1: a landed, b not) and after wait_group 0 (k = 2, 3: a, b).
__global__ void cp_async_kernel(float* seen, const float* src) {
    MS_DYNAMIC_SHARED(float, s);
    float* a = s;
    float* b = s + 4 * 32;
    const int i = threadIdx.x;
    a[4 * i] = -1.0f;
    b[4 * i] = -1.0f;
    cuda::cp_async16(a + 4 * i, src + 4 * i, true);
    cuda::cp_async_commit();
    cuda::cp_async16(b + 4 * i, src + 4 * (32 + i), i % 2 == 0);
    cuda::cp_async_commit();
    seen[4 * i] = a[4 * i];
    cuda::cp_async_wait<1>();
    seen[4 * i + 1] = a[4 * i] + 1000.0f * (b[4 * i] != -1.0f);
    cuda::cp_async_wait<0>();
    seen[4 * i + 2] = a[4 * i];
    seen[4 * i + 3] = b[4 * i];
}

TEST(CudaEmuMma, CpAsyncLandsAtTheWaitThatCoversItsGroup) {
    alignas(16) static float src[4 * 64];
    for (int i = 0; i < 4 * 64; ++i) src[i] = static_cast<float>(i);
    std::vector<float> seen(4 * 32);
    ms_launch(cp_async_kernel, dim3(1), dim3(32), size_t{2 * 4 * 32 * sizeof(float)}, nullptr, seen.data(),
              static_cast<const float*>(src));
    for (int i = 0; i < 32; ++i) {
        EXPECT_EQ(seen[4 * i], -1.0f) << "thread " << i << ": a before any wait";
        EXPECT_EQ(seen[4 * i + 1], src[4 * i]) << "thread " << i << ": a landed, b not, after wait_group 1";
        EXPECT_EQ(seen[4 * i + 2], src[4 * i]) << "thread " << i;
        EXPECT_EQ(seen[4 * i + 3], i % 2 == 0 ? src[4 * (32 + i)] : 0.0f) << "thread " << i << ": b, or zero-filled";
    }
}

__global__ void misaligned_ldmatrix_kernel() {
    MS_DYNAMIC_SHARED(bf16, s);
    uint32_t r[4];
    cuda::ldmatrix_x4(r, s + 4);  // 8 bytes past a 16-byte boundary
}

TEST(CudaEmuMmaDeathTest, MisalignedLdmatrixAborts) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(ms_launch(misaligned_ldmatrix_kernel, dim3(1), dim3(32), 512, nullptr), "16-byte aligned");
}

}  // namespace
}  // namespace ms::test
