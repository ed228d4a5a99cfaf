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
// Construction: make_backend (backend.h, in ms_engine) only knows the CPU backend, because ms_engine must not
// depend on the CUDA libraries (they depend on it). Code that links ms_cuda_emu or ms_cuda_backend calls
// make_backend_with_cuda instead: kCUDA gives a CudaBackend, anything else is forwarded to make_backend.
//
// Scratch (layernorm_backward's partial sums, sum_squares' chunk partials and its result) is owned here,
// allocated on first use and grown only when a larger shape needs more; so a training loop allocates nothing
// after its first step.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "engine/backends/backend.h"

struct CUstream_st;  // cudaStream_t is CUstream_st* in the CUDA runtime and in the emulation alike

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
    void adamw(const AdamWArgs& a) override;
    double sum_squares(const Tensor& x) override;
    void zero(const Tensor& x) override;

    // True in the host build (kernels on fibers), false when the kernels run on a GPU.
    static bool emulated();

  private:
    CUstream_st* stream_ = nullptr;      // owned (the emulation's is null: launches are synchronous)
    DeviceScratch layernorm_scratch_;    // (layernorm_backward_scratch_floats(N, C)) fp32
    DeviceScratch sum_squares_scratch_;  // (1 + sum_squares_scratch_doubles(n)) fp64: [0] is the result
};

// kCUDA: a CudaBackend (options.mode is ignored: the kernels have one mode); any other kind: make_backend(options).
std::unique_ptr<Backend> make_backend_with_cuda(const BackendOptions& options);

}  // namespace ms
