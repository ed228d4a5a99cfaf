// test_cuda_emu_wgmma.cpp: the sm_90a warpgroup wrappers of engine/backends/cuda/wgmma.cuh on the CPU emulation
// (emu/wgmma_emu.h), with exact expectations.
//
// Operands are placed in shared memory here by the PTX ISA's canonical no-swizzle layouts, written out again
// independently of the emulation, with core-matrix strides other than the attention kernel's (so a descriptor
// field read as the wrong one shows up), and the D and A fragments are built and read by the documented layout
// ("Register Fragments": warp w holds rows 16 w .. 16 w + 15 as mma.sync m16n8 does). Inputs are small integers,
// exact in bf16 and fp16, so every product and partial sum is exact in fp32 and D is compared with == against a
// plain loop: A from shared memory with B K-major, and A from registers with B MN-major (the attention kernel's
// two products), each with and without accumulating. D keeps its old value until the wait that covers the group;
// a descriptor outside dynamic shared memory, or one asking for a swizzle, aborts, and so does a wgmma on data a
// cp.async wrote without the async-proxy fence after it.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/mma.cuh"
#include "engine/backends/cuda/wgmma.cuh"
#include "engine/core/half.h"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

// Strides of the test's layouts, bytes: A (64 x 16) K-major, B (N = 64, K = 16) K-major or MN-major.
constexpr uint32_t kALbo = 128, kASbo = 256;      // A: the two 8-column halves of a band side by side
constexpr uint32_t kBLbo = 8 * 128, kBSbo = 128;  // B: all 8 bands (8 rows of N, or 8 columns of N) of k 0..7 first
constexpr size_t kABytes = 64 * 16 * 2, kBBytes = 64 * 16 * 2;

// Byte offset of element (mn, k) in the canonical no-swizzle layouts (PTX ISA, "Shared Memory Matrix Layout").
uint32_t k_major(int mn, int k, uint32_t lbo, uint32_t sbo) {
    return (mn % 8) * 16 + (mn / 8) * sbo + (k % 8) * 2 + (k / 8) * lbo;
}
uint32_t mn_major(int mn, int k, uint32_t lbo, uint32_t sbo) {
    return (mn % 8) * 2 + (mn / 8) * sbo + (k % 8) * 16 + (k / 8) * lbo;
}

// D element (row, col) of accumulator register (j, i) for thread `thread` of the warpgroup.
int d_row(int thread, int i) { return 16 * (thread / 32) + (thread % 32) / 4 + 8 * (i / 2); }
int d_col(int thread, int j, int i) { return 8 * j + 2 * (thread % 4) + i % 2; }

// a (64, 16) row-major; b (16, 64) as (k, n) row-major; c, d (64, 64) row-major. seen: per thread, D's first register
// after the commit and before the wait.
template <class S, bool kARegisters>
__global__ void wgmma_kernel(float* d, float* seen, const float* a, const float* b, const float* c, bool accumulate) {
    MS_DYNAMIC_SHARED(unsigned char, s);
    unsigned char* sa = s;
    unsigned char* sb = s + kABytes;
    const int thread = threadIdx.x;
    for (int e = thread; e < 64 * 16; e += 128) {
        const int row = e / 16, k = e % 16, n = e / 16;  // A's (row, k); B's (k = e % 16, n)
        const uint16_t a_bits = from_float<S>(a[row * 16 + k]).bits, b_bits = from_float<S>(b[k * 64 + n]).bits;
        std::memcpy(sa + k_major(row, k, kALbo, kASbo), &a_bits, 2);
        std::memcpy(sb + (kARegisters ? mn_major(n, k, kBLbo, kBSbo) : k_major(n, k, kBLbo, kBSbo)), &b_bits, 2);
    }
    cuda::fence_proxy_async_shared();  // the stores, for wgmma's async proxy (on a GPU; the emulation tracks cp.async)
    __syncthreads();
    float acc[8][4];
    for (int j = 0; j < 8; ++j) {
        for (int i = 0; i < 4; ++i) acc[j][i] = c[d_row(thread, i) * 64 + d_col(thread, j, i)];
    }
    const uint64_t b_desc = cuda::wgmma_desc(sb, kBLbo, kBSbo);
    cuda::wgmma_fence();
    if constexpr (kARegisters) {
        const int g = (thread % 32) / 4, t = thread % 4, r0 = 16 * (thread / 32);
        uint32_t frag[4];
        for (int i = 0; i < 4; ++i) {
            const int row = r0 + g + 8 * (i % 2), k = 2 * t + 8 * (i / 2);
            frag[i] = bits_of<S>(a[row * 16 + k], a[row * 16 + k + 1]);
        }
        cuda::wgmma_m64n64k16_rs_mn<S>(acc, frag, b_desc, accumulate);
    } else {
        cuda::wgmma_m64n64k16_ss<S>(acc, cuda::wgmma_desc(sa, kALbo, kASbo), b_desc, accumulate);
    }
    cuda::wgmma_commit();
    seen[thread] = acc[0][0];
    cuda::wgmma_wait<0>();
    for (int j = 0; j < 8; ++j) {
        for (int i = 0; i < 4; ++i) d[d_row(thread, i) * 64 + d_col(thread, j, i)] = acc[j][i];
    }
}

template <class S, bool kARegisters>
void check_wgmma() {
    const std::vector<float> a = small_ints(64 * 16, 1), b = small_ints(16 * 64, 2), c = small_ints(64 * 64, 3);
    for (bool accumulate : {true, false}) {
        SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
        std::vector<float> want(64 * 64), d(64 * 64, NAN), seen(128, NAN);
        for (int row = 0; row < 64; ++row) {
            for (int n = 0; n < 64; ++n) {
                float acc = accumulate ? c[row * 64 + n] : 0.0f;
                for (int k = 0; k < 16; ++k) acc += a[row * 16 + k] * b[k * 64 + n];
                want[row * 64 + n] = acc;
            }
        }
        ms_launch(wgmma_kernel<S, kARegisters>, dim3(1), dim3(128), kABytes + kBBytes, nullptr, d.data(), seen.data(),
                  a.data(), b.data(), c.data(), accumulate);
        EXPECT_EQ(d, want);
        for (int thread = 0; thread < 128; ++thread) {
            ASSERT_EQ(seen[thread], c[d_row(thread, 0) * 64 + d_col(thread, 0, 0)])
                << "thread " << thread << ": D changed before the wait that covers its group";
        }
    }
}

TEST(CudaEmuWgmma, SharedAKMajorBMatchesALoopBf16) { check_wgmma<bf16, false>(); }
TEST(CudaEmuWgmma, SharedAKMajorBMatchesALoopFp16) { check_wgmma<fp16, false>(); }
TEST(CudaEmuWgmma, RegisterAMnMajorBMatchesALoopBf16) { check_wgmma<bf16, true>(); }
TEST(CudaEmuWgmma, RegisterAMnMajorBMatchesALoopFp16) { check_wgmma<fp16, true>(); }

__global__ void desc_kernel(uint64_t* out) {
    MS_DYNAMIC_SHARED(unsigned char, s);
    if (threadIdx.x == 0) *out = cuda::wgmma_desc(s + 4096, 128, 1024);
}

TEST(CudaEmuWgmma, DescriptorFieldsFollowThePtxEncoding) {
    // the start address is the offset in shared memory (here: in the block's dynamic shared memory), >> 4
    uint64_t desc = 0;
    ms_launch(desc_kernel, dim3(1), dim3(128), 8192, nullptr, &desc);
    EXPECT_EQ(desc & 0x3FFF, 4096u >> 4);
    EXPECT_EQ(desc >> 16 & 0x3FFF, 128u >> 4);
    EXPECT_EQ(desc >> 32 & 0x3FFF, 1024u >> 4);
    EXPECT_EQ(desc >> 46, 0u) << "no base offset, no swizzle";
}

__global__ void swizzled_wgmma_kernel() {
    MS_DYNAMIC_SHARED(unsigned char, s);
    float acc[8][4] = {};
    const uint64_t desc = cuda::wgmma_desc(s, 128, 1024) | uint64_t{1} << 62;  // 128-byte swizzle
    cuda::wgmma_m64n64k16_ss<bf16>(acc, desc, desc, false);
    cuda::wgmma_commit();
    cuda::wgmma_wait<0>();
}

__global__ void host_pointer_wgmma_kernel(const unsigned char* global) { (void)cuda::wgmma_desc(global, 128, 1024); }

// Thread i copies 16 bytes into shared memory by cp.async and waits; with `fence`, it then fences for the async
// proxy. After a barrier the warpgroup runs a wgmma on the tile.
__global__ void cp_async_then_wgmma_kernel(const unsigned char* global, bool fence) {
    MS_DYNAMIC_SHARED(unsigned char, s);
    cuda::cp_async16(s + 16 * threadIdx.x, global + 16 * threadIdx.x, true);
    cuda::cp_async_commit();
    cuda::cp_async_wait<0>();
    if (fence) cuda::fence_proxy_async_shared();
    __syncthreads();
    float acc[8][4] = {};
    const uint64_t desc = cuda::wgmma_desc(s, 128, 256);
    cuda::wgmma_m64n64k16_ss<bf16>(acc, desc, desc, false);
    cuda::wgmma_commit();
    cuda::wgmma_wait<0>();
}

TEST(CudaEmuWgmmaDeathTest, WgmmaOnCpAsyncDataWithoutProxyFenceAborts) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    alignas(16) static unsigned char global[16 * 128] = {};
    const auto* g = static_cast<const unsigned char*>(global);
    ms_launch(cp_async_then_wgmma_kernel, dim3(1), dim3(128), 16 * 128, nullptr, g, true);  // fenced: runs
    EXPECT_DEATH(ms_launch(cp_async_then_wgmma_kernel, dim3(1), dim3(128), 16 * 128, nullptr, g, false),
                 "no fence.proxy.async");
}

TEST(CudaEmuWgmmaDeathTest, SwizzledOrOutsideDescriptorsAbort) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(ms_launch(swizzled_wgmma_kernel, dim3(1), dim3(128), 8192, nullptr), "swizzle");
    alignas(16) static unsigned char global[64];
    EXPECT_DEATH(ms_launch(host_pointer_wgmma_kernel, dim3(1), dim3(128), 8192, nullptr,
                           static_cast<const unsigned char*>(global)),
                 "dynamic shared memory");
}

}  // namespace
}  // namespace ms::test
