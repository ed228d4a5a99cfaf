// test_cuda_emu_wmma.cpp: the emulated nvcuda::wmma (engine/backends/cuda/emu/wmma_emu.h) and its 16-bit types,
// with exact expectations.
//
// One warp loads A (16 x 16) and B (16 x 16) in every row/col-major combination, from padded shared memory
// (ldm 24), multiplies onto C loaded from memory, and stores D = A B + C row- and column-major; the result is
// compared with a plain loop. The inputs are multiples of 1/8 below 4 in magnitude, exact in bf16 and fp16, so every
// product and partial sum is exact in fp32 and the comparison is ==. Also: __nv_bfloat16 / half convert with
// half.h's bits, and the misuses mma.h forbids (a misaligned pointer, more than 48 KiB of dynamic shared memory
// without cudaFuncSetAttribute) abort.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "engine/backends/cuda/common.cuh"
#include "engine/core/half.h"

namespace ms::test {
namespace {

namespace wmma = nvcuda::wmma;

enum class Major : uint8_t { kRow, kCol };

template <class H>
H to_h(float x) {
    if constexpr (std::is_same_v<H, __nv_bfloat16>) {
        return __float2bfloat16(x);
    } else {
        return __float2half(x);
    }
}
constexpr int kLd = 24;  // padded leading dimension of the shared-memory tiles (a multiple of 8 elements)

// a, b: (16, 16) row-major values; c: (16, 16) row-major float; d: (16, 16) row-major result (and its transpose).
template <class H, Major AMajor, Major BMajor>
__global__ void wmma_kernel(float* d_row, float* d_col, const float* a, const float* b, const float* c) {
    using LayoutA = std::conditional_t<AMajor == Major::kRow, wmma::row_major, wmma::col_major>;
    using LayoutB = std::conditional_t<BMajor == Major::kRow, wmma::row_major, wmma::col_major>;
    MS_DYNAMIC_SHARED(unsigned char, smem);
    H* s_a = reinterpret_cast<H*>(smem);
    H* s_b = s_a + 16 * kLd;
    float* s_c = reinterpret_cast<float*>(s_b + 16 * kLd);  // (16, kLd) float
    for (int i = threadIdx.x; i < 256; i += 32) {
        const int row = i / 16, col = i % 16;
        s_a[AMajor == Major::kRow ? row * kLd + col : col * kLd + row] = to_h<H>(a[i]);
        s_b[BMajor == Major::kRow ? row * kLd + col : col * kLd + row] = to_h<H>(b[i]);
        s_c[row * kLd + col] = c[i];
    }
    __syncwarp();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, H, LayoutA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, H, LayoutB> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::load_matrix_sync(fa, s_a, kLd);
    wmma::load_matrix_sync(fb, s_b, kLd);
    wmma::load_matrix_sync(fc, s_c, kLd, wmma::mem_row_major);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(s_c, fc, kLd, wmma::mem_col_major);  // transposed, through shared memory
    __syncwarp();
    for (int i = threadIdx.x; i < 256; i += 32) d_col[i] = s_c[(i % 16) * kLd + i / 16];
    wmma::store_matrix_sync(d_row, fc, 16, wmma::mem_row_major);
}

// Multiples of 1/8 in (-4, 4): exact in bf16 and fp16, and so are their products and sums of 16 in fp32.
std::vector<float> eighths(uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> dist(-31, 31);
    std::vector<float> v(256);
    for (float& x : v) x = static_cast<float>(dist(rng)) / 8.0f;
    return v;
}

struct alignas(32) AlignedTile {
    float v[256];
};

template <class H, Major AMajor, Major BMajor>
void check_mma() {
    SCOPED_TRACE(testing::Message() << (std::is_same_v<H, half> ? "half" : "bf16") << " A "
                                    << (AMajor == Major::kRow ? "row" : "col") << " B "
                                    << (BMajor == Major::kRow ? "row" : "col"));
    const std::vector<float> a = eighths(1), b = eighths(2), c = eighths(3);
    std::vector<float> want(256);
    for (int i = 0; i < 16; ++i) {
        for (int j = 0; j < 16; ++j) {
            float acc = c[i * 16 + j];
            for (int k = 0; k < 16; ++k) acc += a[i * 16 + k] * b[k * 16 + j];
            want[i * 16 + j] = acc;
        }
    }
    AlignedTile d_row, d_col;  // store_matrix_sync writes d_row in global memory: 256-bit aligned
    const size_t shared = 2 * 16 * kLd * sizeof(H) + 16 * kLd * sizeof(float);
    ms_launch(wmma_kernel<H, AMajor, BMajor>, dim3(1), dim3(32), shared, nullptr, d_row.v, d_col.v, a.data(), b.data(),
              c.data());
    EXPECT_EQ(std::vector<float>(d_row.v, d_row.v + 256), want);
    EXPECT_EQ(std::vector<float>(d_col.v, d_col.v + 256), want);
}

TEST(CudaEmuWmma, MmaMatchesALoopInEveryLayout) {
    check_mma<__nv_bfloat16, Major::kRow, Major::kRow>();
    check_mma<__nv_bfloat16, Major::kRow, Major::kCol>();
    check_mma<__nv_bfloat16, Major::kCol, Major::kRow>();
    check_mma<__nv_bfloat16, Major::kCol, Major::kCol>();
    check_mma<half, Major::kRow, Major::kRow>();
    check_mma<half, Major::kRow, Major::kCol>();
    check_mma<half, Major::kCol, Major::kRow>();
    check_mma<half, Major::kCol, Major::kCol>();
}

// mma_sync multiplies in fp32 what the fragments hold: values rounded to bf16 / fp16 on the way into shared memory.
TEST(CudaEmuWmma, OperandsAreTheRounded16BitValues) {
    std::vector<float> a(256, 0.0f), b(256, 0.0f), c(256, 0.0f);
    a[0] = 1.0f + 1.0f / 512;  // rounds to 1 in bf16 (8 mantissa bits), kept by fp16 (11)
    b[0] = 3.0f;
    AlignedTile d_row, d_col;
    const size_t shared = 2 * 16 * kLd * 2 + 16 * kLd * sizeof(float);
    ms_launch(wmma_kernel<__nv_bfloat16, Major::kRow, Major::kRow>, dim3(1), dim3(32), shared, nullptr, d_row.v,
              d_col.v, a.data(), b.data(), c.data());
    EXPECT_EQ(d_row.v[0], 3.0f);
    ms_launch(wmma_kernel<half, Major::kRow, Major::kRow>, dim3(1), dim3(32), shared, nullptr, d_row.v, d_col.v,
              a.data(), b.data(), c.data());
    EXPECT_EQ(d_row.v[0], 3.0f + 3.0f / 512);
}

TEST(CudaEmuWmma, SixteenBitTypesHaveHalfHsBits) {
    for (float x : {0.0f, -1.5f, 3.14159f, 1e-6f, 65504.0f, 1e30f}) {
        EXPECT_EQ(__float2bfloat16(x).bits, from_float<bf16>(x).bits) << x;
        EXPECT_EQ(__float2half(x).bits, from_float<fp16>(x).bits) << x;
        EXPECT_EQ(__bfloat162float(__float2bfloat16(x)), round_to<bf16>(x)) << x;
        EXPECT_EQ(__half2float(__float2half(x)), round_to<fp16>(x)) << x;
    }
}

__global__ void misaligned_load_kernel(const float* p) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
    wmma::load_matrix_sync(f, p + 1, 16, wmma::mem_row_major);  // 4 bytes past a 256-bit boundary
}

__global__ void big_shared_kernel(float* out) {
    MS_DYNAMIC_SHARED(float, buf);
    buf[threadIdx.x] = 1.0f;
    out[threadIdx.x] = buf[threadIdx.x];
}

TEST(CudaEmuWmmaDeathTest, MisusesAbort) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    alignas(32) static float tile[17 * 16];
    EXPECT_DEATH(ms_launch(misaligned_load_kernel, dim3(1), dim3(32), 0, nullptr, static_cast<const float*>(tile)),
                 "256-bit aligned");
    float out[32];
    EXPECT_DEATH(ms_launch(big_shared_kernel, dim3(1), dim3(32), size_t{64} << 10, nullptr, out),
                 "cudaFuncSetAttribute");
    // with the opt-in, the same launch runs
    ASSERT_EQ(cudaFuncSetAttribute(big_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10),
              cudaSuccess);
    ms_launch(big_shared_kernel, dim3(1), dim3(32), size_t{64} << 10, nullptr, out);
    EXPECT_EQ(out[31], 1.0f);
}

}  // namespace
}  // namespace ms::test
