// wmma_emu.h: nvcuda::wmma (CUDA's mma.h) and the 16-bit float types __nv_bfloat16 / half (cuda_bf16.h,
// cuda_fp16.h) for the CPU emulation; included by cuda_emu.h, never by nvcc.
//
// What is emulated, with mma.h's semantics:
//   - fragment<matrix_a | matrix_b, 16, 16, 16, __nv_bfloat16 | half, row_major | col_major> and
//     fragment<accumulator, 16, 16, 16, float>: each thread holds its own num_elements = 8 of the tile's 256
//     elements (lane l holds the tile's row-major elements l, l + 32, ..., l + 224: a mapping CUDA leaves
//     unspecified, so kernels must never index x[i]).
//   - fill_fragment (per thread), load_matrix_sync, store_matrix_sync and mma_sync: warp-collective, so every live
//     lane of the warp must call them (a lane that does not is a deadlock the scheduler reports). A load reads
//     memory when its lane arrives and then waits for the warp; a store waits for the warp and then writes. So a
//     kernel that reads another lane's shared-memory writes without a __syncwarp / __syncthreads in between sees
//     stale data here, as it may on a GPU.
//   - load/store pointers must be 256-bit aligned and ldm a multiple of 16 bytes (mma.h's rules): checked, abort.
//   - mma_sync: d = a * b + c in fp32. The products of two bf16 or two fp16 values are exact in fp32, and the sum
//     runs over k = 0..15 in order, starting from c (a tensor core's order and internal precision are unspecified;
//     a GPU may differ from this in the last bits of d).
//   - __nv_bfloat16 / half: 2-byte storage with the bits of ms::bf16 / ms::fp16 (engine/core/half.h), converted
//     to and from float with half.h's round-to-nearest-even; no arithmetic.
#pragma once

#if defined(__CUDACC__)
#error "wmma_emu.h is for kernel sources compiled by the host compiler; nvcc uses <mma.h>"
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/core/half.h"

struct __nv_bfloat16 {
    uint16_t bits;
};
struct __half {
    uint16_t bits;
};
using half = __half;

inline float __bfloat162float(__nv_bfloat16 x) { return ms::to_float(ms::bf16{x.bits}); }
inline __nv_bfloat16 __float2bfloat16(float f) { return {ms::from_float<ms::bf16>(f).bits}; }
inline float __half2float(__half x) { return ms::to_float(ms::fp16{x.bits}); }
inline __half __float2half(float f) { return {ms::from_float<ms::fp16>(f).bits}; }

namespace ms::cuda_emu {
// The calling warp's exchange for mma_sync: 512 floats (cuda_emu.cpp).
float* warp_mma_staging();
// Aborts unless p is 256-bit aligned and ldm * element_bytes a multiple of 16.
void wmma_check_pointer(const void* p, unsigned ldm, size_t element_bytes, const char* op);
}  // namespace ms::cuda_emu

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
    static_assert(M == 16 && N == 16 && K == 16, "cuda_emu: only the m16n16k16 wmma shape is emulated");
    static_assert(std::is_same_v<Use, accumulator> ? std::is_same_v<T, float>
                                                   : std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, half>,
                  "cuda_emu: wmma fragments are emulated for __nv_bfloat16 / half operands and float accumulators");
    static_assert(std::is_same_v<Use, accumulator> == std::is_same_v<Layout, void>,
                  "cuda_emu: matrix_a / matrix_b fragments need a layout (row_major, col_major), accumulators none");

  public:
    using element_type = T;
    static constexpr int num_elements = 16 * 16 / 32;
    T x[num_elements];
};

namespace detail {

inline int lane() { return ms::cuda_emu::lane_id(); }
// Element i of a lane's fragment is the tile's row-major element lane + 32 i: row (lane + 32 i) / 16, column % 16.
inline int element(int i) { return lane() + 32 * i; }

inline float to_f(float x) { return x; }
inline float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float to_f(half x) { return __half2float(x); }
template <class T>
T from_f(float x) {
    if constexpr (std::is_same_v<T, float>) {
        return x;
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        return __float2bfloat16(x);
    } else {
        return __float2half(x);
    }
}

// Offset of the tile's element (row, col) in memory of leading dimension ldm.
inline size_t offset(int row, int col, unsigned ldm, bool row_major) {
    return row_major ? static_cast<size_t>(row) * ldm + col : static_cast<size_t>(col) * ldm + row;
}

template <class T>
void load(T (&x)[8], const T* p, unsigned ldm, bool row_major) {
    ms::cuda_emu::wmma_check_pointer(p, ldm, sizeof(T), "load_matrix_sync");
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(p);
    for (int i = 0; i < 8; ++i) {
        const int e = element(i);
        std::memcpy(&x[i], bytes + offset(e / 16, e % 16, ldm, row_major) * sizeof(T), sizeof(T));
    }
    __syncwarp();
}

}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout, class V>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const V& v) {
    for (T& x : f.x) x = detail::from_f<T>(static_cast<float>(v));
}

template <class Use, int M, int N, int K, class T, class Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm) {
    static_assert(!std::is_same_v<Use, accumulator>, "wmma: an accumulator load takes a layout_t");
    detail::load(f.x, p, ldm, std::is_same_v<Layout, row_major>);
}

template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm, layout_t layout) {
    detail::load(f.x, p, ldm, layout == mem_row_major);
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t layout) {
    ms::cuda_emu::wmma_check_pointer(p, ldm, sizeof(float), "store_matrix_sync");
    __syncwarp();
    for (int i = 0; i < 8; ++i) {
        const int e = detail::element(i);
        p[detail::offset(e / 16, e % 16, ldm, layout == mem_row_major)] = f.x[i];
    }
}

// d = a b + c: the lanes publish their elements of a and b in the warp's exchange, wait for each other, compute
// their own elements of d, and wait again before the exchange can be reused. d may be c.
template <int M, int N, int K, class T, class LayoutA, class LayoutB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LayoutA>& a,
              const fragment<matrix_b, M, N, K, T, LayoutB>& b, const fragment<accumulator, M, N, K, float>& c) {
    float* a_tile = ms::cuda_emu::warp_mma_staging();  // (16, 16) row-major: a[row][k]
    float* b_tile = a_tile + 256;                      // (16, 16) row-major: b[k][col]
    for (int i = 0; i < 8; ++i) {
        a_tile[detail::element(i)] = detail::to_f(a.x[i]);
        b_tile[detail::element(i)] = detail::to_f(b.x[i]);
    }
    __syncwarp();
    float result[8];
    for (int i = 0; i < 8; ++i) {
        const int e = detail::element(i), row = e / 16, col = e % 16;
        float acc = c.x[i];
        for (int k = 0; k < 16; ++k) acc += a_tile[row * 16 + k] * b_tile[k * 16 + col];
        result[i] = acc;
    }
    __syncwarp();
    for (int i = 0; i < 8; ++i) d.x[i] = result[i];
}

}  // namespace nvcuda::wmma
