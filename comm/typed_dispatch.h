// typed_dispatch.h: from a buffer's DType back to its C++ type, for communicator decorators that re-issue an
// untyped operation through the typed Communicator calls (comm/synchronizing_communicator.cpp,
// comm/link_model_communicator.cpp, comm/hierarchical_communicator.cpp), and the kAvg division they share.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

#include "comm/communicator.h"
#include "engine/core/check.h"
#include "engine/core/half.h"

namespace ms {

// Calls f(T*) with a null pointer of the C++ type of t (the typed collectives: fp32, bf16, fp16 and int32).
template <class F>
Handle with_comm_type(DType t, F&& f) {
    switch (t) {
        case DType::kF32:
            return f(static_cast<float*>(nullptr));
        case DType::kBF16:
            return f(static_cast<bf16*>(nullptr));
        case DType::kF16:
            return f(static_cast<fp16*>(nullptr));
        case DType::kI32:
            return f(static_cast<int32_t*>(nullptr));
        default:
            MS_UNREACHABLE("collective on {} data: only fp32, bf16, fp16 and int32 have typed collectives",
                           dtype_name(t));
    }
}

// x[i] /= divisor, as a kAvg reduction finishes its sum: fp16 and bf16 through float, int32 by C++ integer division
// (toward zero). The one definition, so that every communicator averages alike.
template <typename T>
void divide_elements(std::span<T> x, int divisor) {
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, fp16>) {
        for (T& v : x) v = from_float<T>(to_float(v) / static_cast<float>(divisor));
    } else {
        const T d = static_cast<T>(divisor);
        for (T& v : x) v /= d;
    }
}

}  // namespace ms
