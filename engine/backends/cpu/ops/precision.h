// precision.h: what every CPU op shares to compute on an activation dtype D (fp32, bf16 or fp16): the dtype checks
// of the precision contract (backends/backend.h), the dispatch from a run-time DType to a loop templated on the
// storage type, and thread-local fp32 scratch for the fast paths that hand D operands to sgemm.
//
// Loops are templated on D and load with to_float(), compute in fp32 (double in the reference paths, as before) and
// store with from_float<D>(): for D = float both are the identity, so the fp32 instantiation is the code as it was
// and its results stay bit-identical.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/core/half.h"

namespace ms::cpu {

template <class D>
inline constexpr bool kIsF32 = std::is_same_v<D, float>;

// The activation dtype D of `op`, taken from its first activation tensor `t` (named `name`); fatal unless it is
// fp32, bf16 or fp16.
inline DType activation_dtype(const Tensor& t, const char* op, const char* name) {
    MS_CHECK(is_float(t.dtype), "{}: {} is {}; an op computes on fp32, bf16 or fp16 (precision contract, backend.h)",
             op, name, dtype_name(t.dtype));
    return t.dtype;
}

// An activation or model weight of an op on D must be D (skipped when `t` is undefined: optional tensors).
inline void expect_d(const Tensor& t, DType D, const char* op, const char* name, const char* d_from) {
    if (!t.defined()) return;
    MS_CHECK(t.dtype == D,
             "{}: {} is {} but the op computes on {} (the dtype of {}): activations and the weights an op reads share "
             "one dtype (precision contract, backend.h)",
             op, name, dtype_name(t.dtype), dtype_name(D), d_from);
}

// Parameter gradients and statistics are fp32 whatever D is (skipped when `t` is undefined).
inline void expect_f32(const Tensor& t, const char* op, const char* name, const char* what) {
    if (!t.defined()) return;
    MS_CHECK(t.dtype == DType::kF32, "{}: {} is {}, but {} are always fp32 (precision contract, backend.h)", op, name,
             dtype_name(t.dtype), what);
}

// Calls f(D{}) with D the storage type of `dtype` (float, bf16, fp16); the caller checked is_float(dtype).
template <class F>
decltype(auto) dispatch_float(DType dtype, F&& f) {
    return visit_float(dtype, std::forward<F>(f));
}

// Thread-local fp32 scratch, one buffer per slot: grows to the largest size asked for, then is reused, so a run
// allocates only on the first call of each size. Slots of the calling thread are shared with its OpenMP team
// through the returned pointer (the team only reads and writes disjoint parts of it).
enum class Scratch : uint8_t { kA, kB, kC, kD, kCount };

inline float* scratch_f32(Scratch slot, size_t n) {
    static thread_local std::vector<float> buffers[static_cast<size_t>(Scratch::kCount)];
    std::vector<float>& b = buffers[static_cast<size_t>(slot)];
    if (b.size() < n) b.resize(n);
    return b.data();
}

// dst[i] = to_float(src[i]) for n elements, split over the enclosing OpenMP team (call inside `omp parallel`).
template <class D>
void convert_to_f32_team(const D* src, float* dst, int64_t n) {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

}  // namespace ms::cpu
