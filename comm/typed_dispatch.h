// typed_dispatch.h: from a buffer's DType back to its C++ type, for communicator decorators that re-issue an
// untyped operation through the typed Communicator calls (comm/synchronizing_communicator.cpp,
// comm/link_model_communicator.cpp).
#pragma once

#include <cstdint>

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

}  // namespace ms
