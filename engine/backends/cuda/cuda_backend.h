// cuda_backend.h: the CUDA Backend: every op of backend.h validated from its Tensor views, then run by the raw
// launchers of cuda/kernels/<op>.cuh on the backend's own stream.
//
// One source, two builds (engine/backends/cuda/CMakeLists.txt):
//   - ms_cuda_backend (MS_HAVE_CUDA): compiled by the host compiler against the CUDA runtime, linked with the
//     nvcc-built kernels (ms_cuda_kernels) and cudart. name() is "cuda". Tensors must hold device (or managed)
//     memory; sum_squares copies its device scalar back and synchronizes the stream.
//   - ms_cuda_emu (always): the same kernels compiled by the host compiler against emu/cuda_emu.h, which runs
//     each block's threads as fibers on the calling CPU thread. name() is "cuda-emulated". Launches are
//     synchronous and "device" memory is host memory. It is for tests (the kernels checked against the CPU
//     reference, down to the whole model), single-threaded and slow: only for tiny shapes.
//
// Construction: ms_engine must not depend on the CUDA libraries (they depend on it), so make_backend (backend.h)
// builds a CudaBackend only in a binary that called install_cuda_backend() (apps/main.cpp when built with one).
// Tests that link ms_cuda_emu or ms_cuda_backend may call make_backend_with_cuda directly instead.
//
// Device and memory (ms_cuda_backend): the constructor selects device options.local_rank % (devices visible)
// before anything else touches CUDA, so every rank of a node that shares a GPU, or has its own, allocates there.
// make_arena_memory() gives the trainer's arena CUDA managed memory (cudaMallocManaged) preferring that device:
// the kernels read it at device bandwidth once it has migrated there (prefetch_to_device() after initialisation),
// while the host code that touches arena memory -- weight initialisation, the token and target copies, the loss,
// MPI collectives on host pointers -- stays correct without an explicit copy at each of those places (pages that
// the host touches migrate to it and back on demand). That needs concurrent managed access (Linux, sm_60 and
// later), checked at construction. The emulation uses plain host memory.
//
// Asynchrony: asynchronous() is true in both builds. Launches go to the backend's own stream and return at once,
// so the host must synchronize() before it touches what an op reads or writes (backend.h); the emulation runs
// them synchronously, but claims the same contract so that CI runs the synchronizing code paths too.
//
// Scratch (layernorm_backward's partial sums, sum_squares' chunk partials and its result, the fused attention
// backward's fp32 dQ and semaphores) is owned here, allocated on first use and grown only when a larger shape needs
// more; so a training loop allocates nothing after its first step.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "engine/backends/backend.h"

struct CUstream_st;  // cudaStream_t is CUstream_st* in the CUDA runtime and in the emulation alike
namespace ms::cuda {
class CublasGemm;  // cublas_gemm.h (the real backend only)
}  // namespace ms::cuda

namespace ms {

// Device memory (host memory in the emulation) that only grows. Move-only; freed on destruction.
class DeviceScratch {
  public:
    DeviceScratch() = default;
    ~DeviceScratch();
    DeviceScratch(const DeviceScratch&) = delete;
    DeviceScratch& operator=(const DeviceScratch&) = delete;
    // At least `bytes` bytes, 256-byte aligned; the content is undefined after a growth.
    void* reserve(size_t bytes);
    size_t capacity() const { return bytes_; }

  private:
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};

class CudaBackend final : public Backend {
  public:
    explicit CudaBackend(const BackendOptions& options);
    ~CudaBackend() override;
    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;

    std::string_view name() const override;
    bool supports(OpKind op, DType dtype) const override;
    void synchronize() override;
    bool asynchronous() const override { return true; }
    std::string device_name() const override { return device_name_; }
    // The selected device's total memory and the visible device count; {} in the emulation (host memory).
    DeviceMemory device_memory() const override { return device_memory_; }
    std::string pci_bus_id() const override { return pci_bus_id_; }
    std::unique_ptr<ArenaMemory> make_arena_memory(size_t bytes) override;

    void embedding_forward(const EmbeddingForwardArgs& a) override;
    void embedding_backward(const EmbeddingBackwardArgs& a) override;
    void layernorm_forward(const LayerNormForwardArgs& a) override;
    void layernorm_backward(const LayerNormBackwardArgs& a) override;
    void matmul_forward(const MatmulForwardArgs& a) override;
    void matmul_backward(const MatmulBackwardArgs& a) override;
    void attention_forward(const AttentionForwardArgs& a) override;
    void attention_backward(const AttentionBackwardArgs& a) override;
    void gelu_forward(const GeluForwardArgs& a) override;
    void gelu_backward(const GeluBackwardArgs& a) override;
    void residual_forward(const ResidualForwardArgs& a) override;
    void cross_entropy_forward(const CrossEntropyForwardArgs& a) override;
    void cross_entropy_backward(const CrossEntropyBackwardArgs& a) override;
    void lm_head_loss(const LmHeadLossArgs& a) override;
    void adamw(const AdamWArgs& a) override;
    double sum_squares(const Tensor& x) override;
    void cast(const CastArgs& a) override;
    void rmsnorm_forward(const RmsNormForwardArgs& a) override;
    void rmsnorm_backward(const RmsNormBackwardArgs& a) override;
    void rope(const RopeArgs& a) override;
    void swiglu_forward(const SwiGluForwardArgs& a) override;
    void swiglu_backward(const SwiGluBackwardArgs& a) override;
    void attention_block_forward(const AttentionBlockForwardArgs& a) override;
    void attention_block_backward(const AttentionBlockBackwardArgs& a) override;
    void copy_columns(const CopyColumnsArgs& a) override;
    void zero(const Tensor& x) override;

    // True in the host build (kernels on fibers), false when the kernels run on a GPU.
    static bool emulated();

  private:
    int device_ = 0;                     // the CUDA device this backend runs on
    std::string device_name_;            // e.g. "NVIDIA H200 (device 0 of 1, sm_90, 139.8 GiB)"
    DeviceMemory device_memory_;         // its total memory and the visible device count ({} in the emulation)
    std::string pci_bus_id_;             // e.g. "0000:3b:00.0" ("" in the emulation)
    CUstream_st* stream_ = nullptr;      // owned (the emulation's is null: launches are synchronous)
    DeviceScratch layernorm_scratch_;    // (layernorm_backward_scratch_floats(N, C)) fp32
    DeviceScratch sum_squares_scratch_;  // (1 + sum_squares_scratch_doubles(n)) fp64: [0] is the result
    DeviceScratch rmsnorm_scratch_;      // (rmsnorm_backward_scratch_floats(N, C)) fp32
    DeviceScratch attention_scratch_;    // (attention_backward_scratch_bytes) fused backward: fp32 dQ, semaphores
    CudaDebugOptions debug_;             // the config's debug.cuda_* (BackendOptions::cuda)
    // The matmuls on a GPU (cublas_gemm.h): the cuBLASLt handle, its workspace and the per-shape plan cache, with
    // the cuBLAS fallback. Null in the emulation, which has no cuBLAS; the deleter is a function pointer so that the
    // emulation build needs no CublasGemm destructor.
    std::unique_ptr<cuda::CublasGemm, void (*)(cuda::CublasGemm*)> gemm_{nullptr, nullptr};
};

// kCUDA: a CudaBackend (options.mode is ignored: the kernels have one mode); any other kind: make_backend(options).
std::unique_ptr<Backend> make_backend_with_cuda(const BackendOptions& options);

// Registers CudaBackend with make_backend (backend.h) as "cuda", or "cuda-emulated" in the emulation build. Call it
// once at the top of main(), before any other thread exists.
void install_cuda_backend();

}  // namespace ms
