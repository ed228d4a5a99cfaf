// dtype.h: run-time element types. Precision is a config value, not a compile-time type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ms {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kU16 };

constexpr size_t dtype_size(DType t) {
    switch (t) {
        case DType::kF32:
            return 4;
        case DType::kI32:
            return 4;
        case DType::kBF16:
            return 2;
        case DType::kF16:
            return 2;
        case DType::kU16:
            return 2;
    }
    return 0;
}

constexpr std::string_view dtype_name(DType t) {
    switch (t) {
        case DType::kF32:
            return "fp32";
        case DType::kBF16:
            return "bf16";
        case DType::kF16:
            return "fp16";
        case DType::kI32:
            return "int32";
        case DType::kU16:
            return "uint16";
    }
    return "?";
}

// The DType of a storage type (engine/core/half.h defines bf16 and fp16).
struct bf16;
struct fp16;
template <class T>
constexpr DType dtype_of() {
    static_assert(sizeof(T) == 0, "no DType for this element type");
    return DType::kF32;
}
template <>
constexpr DType dtype_of<float>() {
    return DType::kF32;
}
template <>
constexpr DType dtype_of<bf16>() {
    return DType::kBF16;
}
template <>
constexpr DType dtype_of<fp16>() {
    return DType::kF16;
}
template <>
constexpr DType dtype_of<int32_t>() {
    return DType::kI32;
}

// fp32, bf16 or fp16: the dtypes an op computes on (mixed precision, backends/backend.h).
constexpr bool is_float(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

}  // namespace ms
