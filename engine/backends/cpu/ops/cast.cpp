// cast.cpp: dst = src converted to dst's dtype (fp32 <-> bf16 / fp16, or a copy), elementwise, rounding to nearest
// even (engine/core/half.h). Both modes are the same loop: a conversion has one correct answer.
#include <cstdint>
#include <cstring>

#include "engine/backends/cpu/ops.h"
#include "engine/core/half.h"

namespace ms::cpu {
namespace {

template <class S, class D>
void convert(const S* src, D* dst, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) dst[i] = from_float<D>(to_float(src[i]));
}

template <class S>
void convert_from(const S* src, const Tensor& dst, int64_t n) {
    switch (dst.dtype) {
        case DType::kF32: return convert(src, dst.as<float>(), n);
        case DType::kBF16: return convert(src, dst.as<bf16>(), n);
        case DType::kF16: return convert(src, dst.as<fp16>(), n);
        default: MS_UNREACHABLE("cast: destination dtype {} is not fp32, bf16 or fp16", dtype_name(dst.dtype));
    }
}

}  // namespace

void cast(const CastArgs& a, OpMode) {
    const int64_t n = a.src.numel();
    MS_CHECK(a.dst.numel() == n, "cast: dst has {} elements, src {}", a.dst.numel(), n);
    if (a.src.dtype == a.dst.dtype) {
        if (a.src.data != a.dst.data) std::memmove(a.dst.data, a.src.data, a.src.bytes());
        return;
    }
    switch (a.src.dtype) {
        case DType::kF32: return convert_from(a.src.as<float>(), a.dst, n);
        case DType::kBF16: return convert_from(a.src.as<bf16>(), a.dst, n);
        case DType::kF16: return convert_from(a.src.as<fp16>(), a.dst, n);
        default: MS_UNREACHABLE("cast: source dtype {} is not fp32, bf16 or fp16", dtype_name(a.src.dtype));
    }
}

}  // namespace ms::cpu
