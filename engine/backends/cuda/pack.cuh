// pack.cuh: 16-byte packs of a kernel's storage type (llm.c's Packed128), for the memory-bound kernels on 16-bit
// activations (layernorm.cu, gelu.cu, residual.cu): one 128-bit load or store moves 8 bf16 / fp16 values where a
// scalar access moves one, and the math stays fp32 per element, so a packed loop computes exactly what the scalar
// loop computes. A pointer takes the packed path only when it is 16-byte aligned (pack_aligned); the kernels keep a
// scalar path for the rest (a tail, an odd width, a misaligned view). fp32 kernels do not use packs.
// On the CPU emulation (emu/cuda_emu.h has no vector types) a pack moves through memcpy.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "engine/backends/cuda/common.cuh"

namespace ms::cuda {

template <class T>
struct alignas(16) Pack {
    static constexpr int kSize = 16 / static_cast<int>(sizeof(T));
    T v[kSize];
};

// p must be 16-byte aligned.
template <class T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {
    Pack<T> r;
#if defined(__CUDACC__)
    const int4 raw = *reinterpret_cast<const int4*>(p);  // one ld.global.v4
    memcpy(&r, &raw, sizeof(r));
#else
    std::memcpy(&r, p, sizeof(r));
#endif
    return r;
}

template <class T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& x) {
#if defined(__CUDACC__)
    int4 raw;
    memcpy(&raw, &x, sizeof(raw));
    *reinterpret_cast<int4*>(p) = raw;  // one st.global.v4
#else
    std::memcpy(p, &x, sizeof(x));
#endif
}

// Host side: may these pointers (null ones ignored) take the packed path?
inline bool pack_aligned(std::initializer_list<const void*> ptrs) {
    for (const void* p : ptrs)
        if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
    return true;
}

}  // namespace ms::cuda
