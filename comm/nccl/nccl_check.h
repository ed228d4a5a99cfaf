// nccl_check.h: MS_NCCL_CHECK and MS_NCCL_CUDA_CHECK, the NCCL members of the error-macro family in
// engine/core/check.h (ms_nccl only: this header includes nccl.h and the CUDA runtime).
//
// A failing call prints the expression, the NCCL error string (ncclGetErrorString) and NCCL's last error message
// (ncclGetLastError), or the CUDA error string, with file:line, function and the error context (world rank, host),
// then ends the job through ms::fatal -> MPI_Abort, so peers do not hang in a collective.
#pragma once

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <string>

#include "engine/core/check.h"

namespace ms {

// "NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details) (code 1): <last error>"
inline std::string nccl_error_message(ncclResult_t rc) {
    const char* last = ncclGetLastError(nullptr);
    return fmt::format("NCCL error: {} (code {}){}{}; hint: NCCL_DEBUG=WARN (or INFO) prints NCCL's own trace",
                       ncclGetErrorString(rc), static_cast<int>(rc), last && *last ? ": " : "", last ? last : "");
}

}  // namespace ms

#define MS_NCCL_CHECK(expr)                                                                          \
    do {                                                                                             \
        const ncclResult_t ms_nccl_rc_ = (expr);                                                     \
        if (ms_nccl_rc_ != ncclSuccess)                                                              \
            ::ms::fatal(#expr, __FILE__, __LINE__, __func__, ::ms::nccl_error_message(ms_nccl_rc_)); \
    } while (0)

#define MS_NCCL_CUDA_CHECK(expr)                                                             \
    do {                                                                                     \
        const cudaError_t ms_nccl_cuda_rc_ = (expr);                                         \
        if (ms_nccl_cuda_rc_ != cudaSuccess)                                                 \
            ::ms::fatal(#expr, __FILE__, __LINE__, __func__,                                 \
                        std::string("CUDA error: ") + cudaGetErrorString(ms_nccl_cuda_rc_)); \
    } while (0)
