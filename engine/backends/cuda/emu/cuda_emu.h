// cuda_emu.h: CUDA-on-CPU, so that the kernel sources under cuda/kernels/ run in CI without a GPU.
//
// A .cu file compiled by the host compiler (no __CUDACC__) gets this header from cuda/common.cuh instead of
// <cuda_runtime.h>. ms_launch (common.cuh) then runs the grid's blocks one after another on the calling OS thread,
// and each block's threads as cooperative fibers (ucontext; 64 KiB stacks with a guard page, mapped once per OS
// thread and reused). A fiber runs until it reaches a barrier (__syncthreads, __syncwarp, a shuffle) or returns;
// the scheduler resumes the fibers in thread order, so every run interleaves the same way and is bit-reproducible.
//
// The subset kernels must stay inside (anything else fails to compile here, or aborts with a message):
//   - threadIdx, blockIdx, blockDim, gridDim (dim3) and warpSize = 32; blocks of up to 1024 threads, any grid.
//   - __global__, __device__, __host__, __forceinline__, __launch_bounds__(...), __restrict__.
//   - `__shared__ T x[n];` inside a kernel or device function. It becomes `static thread_local`: one instance per
//     OS thread, which is one per block because blocks run one at a time. As on a GPU its content is undefined at
//     block start (here: what the previous block left), so no initialisers. Dynamic shared memory (the launch's
//     shared_bytes, 16-byte aligned, filled with 0xff = NaN at each block start): MS_DYNAMIC_SHARED(T, x).
//   - __syncthreads(): waits for every thread of the block that has not returned (early return is fine, as on
//     sm_70+). A barrier no thread can pass (a deadlock) aborts.
//   - __syncwarp(mask) and __shfl_sync / __shfl_xor_sync / __shfl_down_sync / __shfl_up_sync (any width) on 4- or
//     8-byte values, over warps of 32 consecutive linear thread ids. Only full-warp collectives: mask must name
//     every lane of the warp that has not returned. A source lane outside the segment or already returned gives
//     the caller its own value (CUDA leaves the latter undefined).
//   - atomicAdd (float, double, int, unsigned, unsigned long long), atomicMax (int), atomicCAS (int, unsigned):
//     a plain read-modify-write, since fibers never interleave inside one. Their order is the fixed fiber order,
//     so a kernel whose result depends on atomic order passes here and is still nondeterministic on a GPU.
//   - __threadfence() (nothing to order: blocks run one at a time) and volatile loads. An ordered wait between
//     blocks (common.cuh's wait_until_equal: block A spins until block B has stored a flag) cannot wait here: a
//     block runs to its end before the next one starts, so a flag the waiting block does not already see would
//     never change. check_flag aborts with a message instead, so a kernel that orders its blocks wrongly (one that
//     would deadlock or depend on the hardware's dispatch order on a GPU) fails its test rather than hangs.
//   - cudaMemsetAsync: an immediate memset, as every launch is synchronous.
//   - math: __expf, __logf, __fdividef, rsqrtf (exact here, approximate on a GPU) and <cmath>'s float functions.
//   - dynamic shared memory is 128-byte aligned; a launch asking for more than 48 KiB of it aborts unless
//     cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n) allowed at least that much
//     first (as on a GPU, where such a launch fails), and the opt-in is capped at 227 KiB (sm_90's limit).
//   - nvcuda::wmma (mma.h) with __nv_bfloat16 / half operands and float accumulators, m16n16k16 only, and the two
//     16-bit types with their float conversions: emu/wmma_emu.h.
//   - the PTX mma.sync m16n8k16 (bf16 / f16 operands, f32 accumulators) and ldmatrix .x4 [.trans], with their
//     documented fragment layouts, and 16-byte cp.async with commit / wait_group (a copy lands at the wait that
//     covers it), through the wrappers of cuda/mma.cuh: emu/mma_emu.h.
//   - the sm_90a wgmma.mma_async m64n64k16 (bf16 / f16, f32 accumulators, no-swizzle shared-memory descriptors, A
//     in shared memory or registers) with commit / wait_group, through the wrappers of cuda/wgmma.cuh, in blocks of
//     whole warpgroups: emu/wgmma_emu.h.
//   - cudaStream_t is opaque and launches are synchronous; cudaGetLastError() always returns cudaSuccess.
// Not emulated: cooperative groups, __ballot/__any/match, half/bf16 arithmetic and vector types, textures,
// clusters, launches from inside a kernel, host-device memory separation (kernels dereference host pointers).
#pragma once

#if defined(__CUDACC__)
#error "cuda_emu.h is for kernel sources compiled by the host compiler; nvcc uses <cuda_runtime.h>"
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define MS_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(::ms::cuda_emu::dynamic_shared())

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The CUDA builtins. The scheduler sets threadIdx before it resumes a fiber (fibers share their OS thread).
extern thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
inline constexpr int warpSize = 32;

struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaError_t { cudaSuccess = 0 };
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t) { return "no error"; }
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t = nullptr) {
    if (bytes > 0) std::memset(p, value, bytes);
    return cudaSuccess;
}
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

namespace ms::cuda_emu {

// Runs body(ctx) once per thread of every block of the grid.
void run_grid(dim3 grid, dim3 block, size_t shared_bytes, void (*body)(const void*), const void* ctx);
void* dynamic_shared();
// The dynamic shared memory a kernel may launch with: 48 KiB, or what cudaFuncSetAttribute allowed.
void set_max_dynamic_shared(const void* kernel, int bytes);
void check_dynamic_shared(const void* kernel, size_t bytes);
void syncthreads();
void syncwarp(unsigned mask);
// Exchanges `bits` across the calling warp; returns lane src's value, or the caller's own when src < 0 or src has
// returned.
uint64_t shuffle(unsigned mask, uint64_t bits, int src);
int lane_id();
// An ordered wait (common.cuh's wait_until_equal) on *flag == expected: returns if it holds, aborts with a message
// naming the block otherwise (no block that could still change the flag runs before this one ends).
void check_flag(const volatile int* flag, int expected);

// The launch: arguments are converted to the kernel's parameter types and stored once, as a launch copies them
// to the device; every thread then gets its own by-value copy.
template <class... KArgs, class... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t shared_bytes, Args&&... args) {
    static_assert(sizeof...(KArgs) == sizeof...(Args), "ms_launch: argument count differs from the kernel's");
    struct Call {
        void (*kernel)(KArgs...);
        std::tuple<std::decay_t<KArgs>...> params;
    };
    check_dynamic_shared(reinterpret_cast<const void*>(kernel), shared_bytes);
    const Call call{kernel, {std::forward<Args>(args)...}};
    auto body = [](const void* ctx) {
        const Call* c = static_cast<const Call*>(ctx);
        std::apply(c->kernel, c->params);
    };
    run_grid(grid, block, shared_bytes, body, &call);
}

template <class T>
T shuffle_value(unsigned mask, T v, int src) {
    static_assert(std::is_trivially_copyable_v<T> && (sizeof(T) == 4 || sizeof(T) == 8),
                  "cuda_emu: shuffles move 4- or 8-byte values");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = shuffle(mask, bits, src);
    std::memcpy(&v, &bits, sizeof(T));
    return v;
}

}  // namespace ms::cuda_emu

template <class... KArgs>
cudaError_t cudaFuncSetAttribute(void (*kernel)(KArgs...), cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        ms::cuda_emu::set_max_dynamic_shared(reinterpret_cast<const void*>(kernel), value);
    }
    return cudaSuccess;
}

inline void __syncthreads() { ms::cuda_emu::syncthreads(); }
inline void __threadfence() {}
inline void __syncwarp(unsigned mask = 0xffffffffu) { ms::cuda_emu::syncwarp(mask); }

// Segment-relative source lanes, as CUDA defines them for width < 32; -1 means "keep your own value".
template <class T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = warpSize) {
    const int lane = ms::cuda_emu::lane_id();
    return ms::cuda_emu::shuffle_value(mask, v, (lane & ~(width - 1)) + (src_lane & (width - 1)));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
    const int lane = ms::cuda_emu::lane_id();
    const int src = lane ^ lane_mask;
    return ms::cuda_emu::shuffle_value(mask, v, (src & ~(width - 1)) == (lane & ~(width - 1)) ? src : -1);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
    const int lane = ms::cuda_emu::lane_id();
    const int in_segment = (lane & (width - 1)) + static_cast<int>(delta);
    return ms::cuda_emu::shuffle_value(mask, v, in_segment < width ? lane + static_cast<int>(delta) : -1);
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
    const int lane = ms::cuda_emu::lane_id();
    const int in_segment = (lane & (width - 1)) - static_cast<int>(delta);
    return ms::cuda_emu::shuffle_value(mask, v, in_segment >= 0 ? lane - static_cast<int>(delta) : -1);
}

template <class T>
T ms_emu_atomic_add(T* address, T value) {
    const T old = *address;
    *address = old + value;
    return old;
}
inline float atomicAdd(float* p, float v) { return ms_emu_atomic_add(p, v); }
inline double atomicAdd(double* p, double v) { return ms_emu_atomic_add(p, v); }
inline int atomicAdd(int* p, int v) { return ms_emu_atomic_add(p, v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return ms_emu_atomic_add(p, v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { return ms_emu_atomic_add(p, v); }
inline int atomicMax(int* p, int v) {
    const int old = *p;
    *p = old > v ? old : v;
    return old;
}
template <class T>
T ms_emu_atomic_cas(T* address, T compare, T value) {
    const T old = *address;
    if (old == compare) *address = value;
    return old;
}
inline int atomicCAS(int* p, int compare, int v) { return ms_emu_atomic_cas(p, compare, v); }
inline unsigned atomicCAS(unsigned* p, unsigned compare, unsigned v) { return ms_emu_atomic_cas(p, compare, v); }

inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

#include "engine/backends/cuda/emu/mma_emu.h"
#include "engine/backends/cuda/emu/wgmma_emu.h"
#include "engine/backends/cuda/emu/wmma_emu.h"
