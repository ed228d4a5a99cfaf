// precision.h: what every CPU op shares to compute on an activation dtype D (fp32, bf16 or fp16): the dtype checks
// of the precision contract (backends/backend.h), the dispatch from a run-time DType to a loop templated on the
// storage type, parameter gradients that are fp32 or D (ParamGrad), and thread-local scratch for the fast paths that
// hand D operands to sgemm or sum a D gradient's contribution in fp32.
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

// Statistics and the optimizer's tensors are fp32 whatever D is (skipped when `t` is undefined).
inline void expect_f32(const Tensor& t, const char* op, const char* name, const char* what) {
    if (!t.defined()) return;
    MS_CHECK(t.dtype == DType::kF32, "{}: {} is {}, but {} are always fp32 (precision contract, backend.h)", op, name,
             dtype_name(t.dtype), what);
}

// A parameter gradient of an op on D is fp32 or D (skipped when `t` is undefined).
inline void expect_grad(const Tensor& t, DType D, const char* op, const char* name, const char* d_from) {
    if (!t.defined()) return;
    MS_CHECK(t.dtype == DType::kF32 || t.dtype == D,
             "{}: {} is {}, but a parameter gradient is fp32 or the op's activation dtype {} (the dtype of {}) "
             "(precision contract, backend.h)",
             op, name, dtype_name(t.dtype), dtype_name(D), d_from);
}

// from_float<G>(to_float(g) + c): a gradient element g updated by the fp32 contribution c, rounded once (for G =
// float, g + c). c + 0.0f is the contribution as an fp32 gradient starting at +0 holds it (a -0 becomes +0), so a D
// gradient is exactly the contract's from_float<D>(old + what an fp32 gradient from 0 gets).
template <class G>
inline G add_rounded(G g, float c) {
    if constexpr (kIsF32<G>) {
        return g + c;
    } else {
        return from_float<G>(to_float(g) + (c + 0.0f));
    }
}

// A parameter gradient (dweight, dbias, dtable, dpos, dwte) of an op on D: fp32, or D itself (backend.h). Exactly
// one pointer is set when the tensor is defined.
template <class D>
struct ParamGrad {
    float* f32 = nullptr;
    D* d = nullptr;  // only when D is bf16 / fp16

    static ParamGrad of(const Tensor& t) {
        if (!t.defined()) return {};
        if (t.dtype == DType::kF32) return {t.f32(), nullptr};
        return {nullptr, t.as<D>()};
    }
    // Element i += c (once-rounded for D).
    void add(int64_t i, float c) const {
        if (f32) {
            f32[i] += c;
        } else {
            d[i] = add_rounded(d[i], c);
        }
    }
};

// d[i] = add_rounded(d[i], c[i]) for i in [0, n): a D gradient takes a contribution summed in fp32 scratch.
template <class D>
void add_rounded_range(D* d, const float* c, int64_t n) {
    for (int64_t i = 0; i < n; ++i) d[i] = add_rounded(d[i], c[i]);
}

// Calls f(D{}) with D the storage type of `dtype` (float, bf16, fp16); the caller checked is_float(dtype).
template <class F>
decltype(auto) dispatch_float(DType dtype, F&& f) {
    return visit_float(dtype, std::forward<F>(f));
}

// Calls f(G{}) with G the storage type of a parameter gradient of dtype `grad` on an op on D: float or D (the caller
// checked expect_grad).
template <class D, class F>
decltype(auto) dispatch_grad(DType grad, F&& f) {
    if constexpr (!kIsF32<D>) {
        if (grad != DType::kF32) return f(D{});
    }
    return f(float{});
}

// Thread-local scratch, one buffer per slot and element type: grows to the largest size asked for, then is reused,
// so a run allocates only on the first call of each size. Slots of the calling thread are shared with its OpenMP
// team through the returned pointer (the team only reads and writes disjoint parts of it). kGrad holds the fp32
// contribution of an op to a D parameter gradient before it is rounded in.
enum class Scratch : uint8_t { kA, kB, kC, kD, kGrad, kCount };

template <class T>
T* scratch(Scratch slot, size_t n) {
    static thread_local std::vector<T> buffers[static_cast<size_t>(Scratch::kCount)];
    std::vector<T>& b = buffers[static_cast<size_t>(slot)];
    if (b.size() < n) b.resize(n);
    return b.data();
}

inline float* scratch_f32(Scratch slot, size_t n) { return scratch<float>(slot, n); }

// dst[i] = to_float(src[i]) for n elements, split over the enclosing OpenMP team (call inside `omp parallel`).
template <class D>
void convert_to_f32_team(const D* src, float* dst, int64_t n) {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

}  // namespace ms::cpu
