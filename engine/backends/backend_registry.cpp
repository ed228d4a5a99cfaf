// backend_registry.cpp: make_backend() and the registered CUDA backend (backend.h).
#include <memory>

#include "engine/backends/backend.h"
#include "engine/backends/cpu/ops.h"
#include "engine/core/check.h"
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

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
    if (options.kind == BackendKind::kCPU) return cpu::make_cpu_backend(options);
    const CudaRegistration& r = cuda_registration();
    MS_CHECK(r.make != nullptr,
             "backend kind cuda: this binary registered no CUDA backend (link ms_cuda_backend or ms_cuda_emu and "
             "call install_cuda_backend() from engine/backends/cuda/cuda_backend.h at the top of main)");
    return r.make(options);
}

}  // namespace ms
