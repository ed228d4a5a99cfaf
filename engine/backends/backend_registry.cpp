// backend_registry.cpp: make_backend(), the registered CUDA backend and its debug options (backend.h).
#include <memory>
#include <string>

#include "engine/backends/backend.h"
#include "engine/backends/cpu/ops.h"
#include "engine/backends/cpu/probe.h"
#include "engine/config/config.h"
#include "engine/core/check.h"
#include "engine/core/log.h"
#include "memory/arena_memory.h"

namespace ms {
namespace {

// Written once by register_cuda_backend() at the top of main(), before any other thread exists; read after.
struct CudaRegistration {
    const char* name = nullptr;
    BackendFactory make = nullptr;
};
CudaRegistration& cuda_registration() {
    static CudaRegistration r;
    return r;
}

}  // namespace

std::unique_ptr<ArenaMemory> Backend::make_arena_memory(size_t) { return nullptr; }

void register_cuda_backend(const char* name, BackendFactory make) {
    MS_CHECK(name != nullptr && make != nullptr, "register_cuda_backend: a name and a factory are required");
    cuda_registration() = {name, make};
}

const char* cuda_backend_name() { return cuda_registration().name; }

std::string_view backend_kind_name(BackendKind kind) { return kind == BackendKind::kCUDA ? "cuda" : "cpu"; }

void register_planning_cuda_backend() {
    if (cuda_backend_name() != nullptr) return;
    register_cuda_backend(
        "cuda (not in this binary: planning only)", [](const BackendOptions&) -> std::unique_ptr<Backend> {
            throw UserError(
                "this binary has no CUDA backend to build (it can only plan run.backend: cuda); hint: rebuild with "
                "-DMS_ENABLE_CUDA=ON to train with run.backend: cuda");
        });
}

// The strings were checked against their choices when the config was read (config_schema.cpp).
CudaDebugOptions cuda_debug_options(const DebugConfig& debug) {
    CudaDebugOptions o;
    o.fp32_gemm = debug.cuda_tf32 ? CudaFp32Gemm::kTf32 : CudaFp32Gemm::kFp32;
    o.gelu = debug.cuda_gelu_epilogue ? CudaGelu::kEpilogue : CudaGelu::kKernels;
    o.attention = debug.cuda_attention == "scalar" ? CudaAttention::kScalar : CudaAttention::kTensorCores;
    o.attention_backward =
        debug.cuda_attention_bwd == "split" ? CudaAttentionBackward::kSplit : CudaAttentionBackward::kFused;
    return o;
}

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
    if (options.kind == BackendKind::kCPU) {
        // Every command's CPU runs go through here: the one place that says when OpenBLAS picked a slow kernel.
        static const bool warned = [] {
            const std::string w = cpu::blas_kernel_warning();
            if (!w.empty()) log_warn("{}", w);
            return true;
        }();
        (void)warned;
        return cpu::make_cpu_backend(options);
    }
    const CudaRegistration& r = cuda_registration();
    MS_CHECK(r.make != nullptr,
             "backend kind cuda: this binary registered no CUDA backend (link ms_cuda_backend or ms_cuda_emu and "
             "call install_cuda_backend() from engine/backends/cuda/cuda_backend.h at the top of main)");
    return r.make(options);
}

}  // namespace ms
