// cublas_gemm.h: the Linear layer's three products on cuBLAS, for the CudaBackend on a real GPU (ms_cuda_backend).
//
// The same contract as kernels/matmul.cuh (row-major fp32; weight in Linear orientation (M, K)):
//   forward   out (N, M)  = inp (N, K) @ weight^T + bias
//   backward  dinp (N, K) = dout @ weight        (= or += per DinpWrite; skipped when dinp is null)
//             dweight (M, K) += dout^T @ inp
//             dbias (M)      += sum over rows of dout (skipped when null)
// cuBLAS is column-major: a row-major (R, C) buffer is a column-major (C, R) matrix, so every product below is the
// transposed one (out^T = weight @ inp^T, dinp^T = weight^T @ dout^T, dweight^T = inp^T @ dout). The bias enters as
// a rank-1 product with a vector of ones (out^T = bias 1^T first, then += weight @ inp^T), and dbias as a GEMV with
// the same ones: no kernel of our own, every step on the backend's stream.
//
// Precision: true fp32 (CUBLAS_DEFAULT_MATH: no TF32), like PyTorch's default for fp32 matmuls since 1.12, so the
// GPU run is compared with the CPU backend at fp32 tolerances; MS_CUDA_TF32=1 allows TF32 tensor cores instead. cuBLAS's results are deterministic for a given
// shape, device and stream (no split-K atomics without a workspace setting that asks for them).
// The emulated build (tests on the CPU) keeps the tiled kernel of kernels/matmul.cu: cuBLAS has no CPU twin.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

struct CUstream_st;

namespace ms::cuda {

enum class DinpWrite : uint8_t;

class CublasGemm {
  public:
    explicit CublasGemm(CUstream_st* stream);
    ~CublasGemm();
    CublasGemm(const CublasGemm&) = delete;
    CublasGemm& operator=(const CublasGemm&) = delete;

    void forward(float* out, const float* inp, const float* weight, const float* bias, int N, int K, int M);
    void backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                  int N, int K, int M, DinpWrite dinp_write);

  private:
    const float* ones(int n);  // n device floats of 1.0, grown on demand (once per larger N)

    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace ms::cuda
