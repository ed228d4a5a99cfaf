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

}  // namespace

void cast(const CastArgs& a, OpMode) {
    const int64_t n = a.src.numel();
    MS_CHECK(a.dst.numel() == n, "cast: dst has {} elements, src {}", a.dst.numel(), n);
    if (a.src.dtype == a.dst.dtype) {
        if (a.src.data != a.dst.data) std::memmove(a.dst.data, a.src.data, a.src.bytes());
        return;
    }
    visit_float(a.src.dtype, [&](auto s) {
        visit_float(a.dst.dtype, [&](auto d) {
            using S = decltype(s);
            using D = decltype(d);
            convert(a.src.as<S>(), a.dst.as<D>(), n);
        });
    });
}

}  // namespace ms::cpu
