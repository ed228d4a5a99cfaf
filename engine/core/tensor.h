// tensor.h: a non-owning, contiguous, row-major view {data, dtype, shape}. Storage belongs to memory/.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "engine/core/check.h"
#include "engine/core/dtype.h"
#include "engine/core/half.h"

namespace ms {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Tensor {
    static constexpr int kMaxDims = 4;

    void* data = nullptr;
    DType dtype = DType::kF32;
    int ndim = 0;
    std::array<int64_t, kMaxDims> shape{};
    DeviceType device = DeviceType::kCPU;

    Tensor() = default;
    Tensor(void* d, DType t, std::initializer_list<int64_t> dims, DeviceType dev = DeviceType::kCPU)
        : data(d), dtype(t), device(dev) {
        MS_CHECK(dims.size() <= kMaxDims, "tensor rank {} > {}", dims.size(), kMaxDims);
        for (int64_t d_ : dims) shape[ndim++] = d_;
    }
    static Tensor f32(float* d, std::initializer_list<int64_t> dims) { return Tensor(d, DType::kF32, dims); }
    static Tensor i32(int32_t* d, std::initializer_list<int64_t> dims) { return Tensor(d, DType::kI32, dims); }

    int64_t numel() const {
        int64_t n = 1;
        for (int i = 0; i < ndim; ++i) n *= shape[i];
        return n;
    }
    int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
    // Elements [begin, begin + n) of this tensor's storage as a 1-D tensor of its dtype (a flat buffer's range).
    Tensor slice(int64_t begin, int64_t n) const {
        MS_CHECK(begin >= 0 && n >= 0 && begin + n <= numel(), "slice [{}, {}) of a tensor of {} elements", begin,
                 begin + n, numel());
        return Tensor(static_cast<std::byte*>(data) + static_cast<size_t>(begin) * dtype_size(dtype), dtype, {n},
                      device);
    }
    size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
    bool defined() const { return data != nullptr; }

    float* f32() const {
        MS_CHECK(dtype == DType::kF32, "tensor dtype is {}, expected fp32", dtype_name(dtype));
        return static_cast<float*>(data);
    }
    // The data as T*, checking that T is the tensor's dtype (float, bf16, fp16, int32_t).
    template <class T>
    T* as() const {
        MS_CHECK(dtype == dtype_of<T>(), "tensor dtype is {}, expected {}", dtype_name(dtype),
                 dtype_name(dtype_of<T>()));
        return static_cast<T*>(data);
    }
    int32_t* i32() const {
        MS_CHECK(dtype == DType::kI32, "tensor dtype is {}, expected int32", dtype_name(dtype));
        return static_cast<int32_t*>(data);
    }
};

// f(T{}) with T the storage type of a float dtype (float, bf16, fp16): where a run-time DType becomes a template
// argument (CPU ops, CUDA launchers, the model's typed collectives). Fatal for int32 / uint16.
template <class F>
decltype(auto) visit_float(DType t, F&& f) {
    switch (t) {
        case DType::kF32:
            return f(float{});
        case DType::kBF16:
            return f(bf16{});
        case DType::kF16:
            return f(fp16{});
        default:
            break;
    }
    MS_UNREACHABLE("{} is not a float dtype (fp32, bf16, fp16)", dtype_name(t));
}

}  // namespace ms
