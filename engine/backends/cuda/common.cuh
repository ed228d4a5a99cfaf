// common.cuh: what every kernel file includes: the CUDA runtime (or its CPU emulation), ms_launch, the error
// macros and the warp reductions.
//
// The same kernel source builds two ways: with nvcc for the GPU, and with the host compiler against
// emu/cuda_emu.h so CI runs every kernel against its CPU twin (emu/cuda_emu.h lists the subset kernels may use).
// Launch only through ms_launch, never with <<<>>>, which the host compiler cannot parse.
//
// The .cu files stay free of engine headers: nvcc's C++20 front end rejects fmt 9's consteval format strings, so
// launchers take raw pointers and sizes (llm.c style) and check them with the printf-style MS_ASSERT.
//
// Storage types (mixed precision, backend.h's precision contract): every kernel is a template on the storage type T
// of its activations and weights, float, bf16 or fp16 (engine/core/half.h), instantiated for the three
// (MS_FOR_EACH_DTYPE). It loads with to_float, computes in fp32 and rounds once on store with from_float<T>; parameter
// gradients and statistics stay fp32. For T = float both conversions are the identity, so the fp32 kernels compute
// exactly what they computed before they were templates.
//
// A third way in: a host file of the real backend (cuda_backend.cpp in ms_cuda_backend) defines MS_CUDA_RUNTIME to
// include the launcher declarations against <cuda_runtime.h>; it sees no kernels, so ms_launch and the warp
// reductions are left out of it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#if defined(__CUDACC__) || defined(MS_CUDA_RUNTIME)
#include <cuda_runtime.h>
#define MS_DYNAMIC_SHARED(T, name)                            \
    extern __shared__ __align__(16) unsigned char ms_smem_[]; \
    T* name = reinterpret_cast<T*>(ms_smem_)
#else
#include "engine/backends/cuda/emu/cuda_emu.h"
#endif

#include "engine/core/half.h"

// X(float) X(bf16) X(fp16): a .cu file's explicit instantiations of its templated launchers, one per storage type.
#define MS_FOR_EACH_DTYPE(X) X(float) X(::ms::bf16) X(::ms::fp16)

namespace ms {

// engine/core/check.h's fatal (declared again here so that nvcc never parses fmt).
[[noreturn]] void fatal(const char* expr, const char* file, int line, const char* func, const std::string& msg);

#if defined(__CUDACC__) || !defined(MS_CUDA_RUNTIME)
// kernel<<<grid, block, shared_bytes, stream>>>(args...) under nvcc; the fiber scheduler on the CPU.
template <class... KArgs, class... Args>
void ms_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
               Args&&... args) {
#if defined(__CUDACC__)
    kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
#else
    (void)stream;
    cuda_emu::launch(kernel, grid, block, shared_bytes, std::forward<Args>(args)...);
#endif
}
#endif

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks for a grid-stride loop over n elements: enough to fill a GPU, never more than the elements need.
inline int grid_stride_blocks(int64_t n, int block_size, int max_blocks = 4096) {
    return static_cast<int>(std::min<int64_t>(ceil_div(n, block_size), max_blocks));
}

namespace cuda {
// How a backward writes an activation gradient: ms::Accumulate (backend.h), which nvcc cannot include.
enum class DinpWrite : uint8_t { kOverwrite, kAdd };

// NoDeduce<T>* (std::type_identity_t, which C++17 nvcc lacks): a launcher's optional pointer that takes no part in
// deducing T, so it accepts nullptr while T comes from the other arguments.
template <class T>
struct NoDeduceImpl {
    using type = T;
};
template <class T>
using NoDeduce = typename NoDeduceImpl<T>::type;
}  // namespace cuda

}  // namespace ms

#define MS_CUDA_CHECK(expr)                                                        \
    do {                                                                           \
        const cudaError_t ms_rc_ = (expr);                                         \
        if (ms_rc_ != cudaSuccess) {                                               \
            ::ms::fatal(#expr, __FILE__, __LINE__, __func__,                       \
                        std::string("CUDA error: ") + cudaGetErrorString(ms_rc_)); \
        }                                                                          \
    } while (0)
#define MS_CUDA_LAUNCH_CHECK() MS_CUDA_CHECK(cudaGetLastError())

// MS_ASSERT(cond, printf-format, ...): a launcher's precondition, reported through ms::fatal.
#define MS_ASSERT(cond, ...)                                           \
    do {                                                               \
        if (!(cond)) {                                                 \
            char ms_msg_[512];                                         \
            std::snprintf(ms_msg_, sizeof(ms_msg_), __VA_ARGS__);      \
            ::ms::fatal(#cond, __FILE__, __LINE__, __func__, ms_msg_); \
        }                                                              \
    } while (0)

#if defined(__CUDACC__) || !defined(MS_CUDA_RUNTIME)
// ----------------------------------------------------------------------------
// warp reductions: xor butterflies, so every lane ends with the same, fixed-order result

__device__ __forceinline__ float warp_reduce_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_reduce_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// ----------------------------------------------------------------------------
// ordered hand-off between blocks: block A's release_store(flag, n) after its writes; block B's one thread
// wait_until_equal(flag, n), then a __syncthreads, then the block reads what A wrote (through L2: ld.global.cg).
// A block may only wait on work whose owner started before it (a ticket from a global atomic counter, not
// blockIdx: a GPU does not promise to start blocks in blockIdx order), or it can deadlock. The emulation runs blocks
// one at a time, so there the wait checks the flag once and aborts if it does not hold yet (cuda_emu.h).

// Spins until *flag == expected, with acquire loads (sm_70+).
__device__ __forceinline__ void wait_until_equal(const int* flag, int expected) {
#if defined(__CUDACC__)
    int value;
    do {
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(value) : "l"(flag) : "memory");
    } while (value != expected);
#else
    ::ms::cuda_emu::check_flag(flag, expected);
#endif
}

// *flag = value with release semantics (sm_70+): whoever acquires it sees the writes the caller made before, and,
// after a __syncthreads, those of its block.
__device__ __forceinline__ void release_store(int* flag, int value) {
#if defined(__CUDACC__)
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(value) : "memory");
#else
    *flag = value;
#endif
}
#endif
