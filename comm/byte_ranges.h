// byte_ranges.h: pointer arithmetic on untyped collective buffers, shared by the communicators (comm/mpi, comm/nccl).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ms {

// The address of element `elems` of a buffer of `elem_size`-byte elements.
inline std::byte* at(void* p, size_t elems, size_t elem_size) { return static_cast<std::byte*>(p) + elems * elem_size; }
inline const std::byte* at(const void* p, size_t elems, size_t elem_size) {
    return static_cast<const std::byte*>(p) + elems * elem_size;
}

// True when the non-empty byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte.
inline bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
    const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
    return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

}  // namespace ms
