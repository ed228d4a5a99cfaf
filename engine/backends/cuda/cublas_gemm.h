// cublas_gemm.h: the Linear layer's three products on cuBLAS, for the CudaBackend on a real GPU (ms_cuda_backend).
//
// The same contract as kernels/matmul.cuh (row-major; weight in Linear orientation (M, K); T the activation dtype,
// float, bf16 or fp16; dweight and dbias fp32 whatever T is):
//   forward   out (N, M)  = inp (N, K) @ weight^T + bias
//   backward  dinp (N, K) = dout @ weight        (= or += per DinpWrite; skipped when dinp is null)
//             dweight (M, K) += dout^T @ inp
//             dbias (M)      += sum over rows of dout (skipped when null)
// cuBLAS is column-major: a row-major (R, C) buffer is a column-major (C, R) matrix, so every product below is the
// transposed one (out^T = weight @ inp^T, dinp^T = weight^T @ dout^T, dweight^T = inp^T @ dout). The bias enters as
// a rank-1 product with a vector of ones (out^T = bias 1^T first, then += weight @ inp^T), and dbias as a GEMV with
// the same ones: no kernel of our own, every step on the backend's stream.
//
// Precision, T = float: true fp32 (CUBLAS_DEFAULT_MATH: no TF32), like PyTorch's default for fp32 matmuls since 1.12,
// so the GPU run is compared with the CPU backend at fp32 tolerances; MS_CUDA_TF32=1 allows TF32 tensor cores instead.
// cuBLAS's results are deterministic for a given shape, device and stream (no split-K atomics without a workspace
// setting that asks for them). T = bf16 / fp16 (mixed precision, backend.h's precision contract): cublasGemmEx on T
// inputs with CUBLAS_COMPUTE_32F (tensor cores, fp32 accumulation). The forward broadcasts the bias into out (a K = 1
// product, exact: the bias is already T) and adds the product with beta = 1, so out = round(acc + bias) is rounded
// once; dinp is T (beta 0 or 1: round(old + new) for kAdd); dweight is an fp32 C (CUDA_R_32F) with beta 1 over T
// inputs; dbias is an fp32 column sum (a GemmEx with n = 1 against a T vector of ones).
// CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION keeps split-K partial sums in fp32. Not yet measured on a GPU
// (written without one): the bf16 path's tolerances and speed are for the next GPU session; cuBLASLt's bias / GELU
// epilogues would fuse the bias broadcast away. The emulated build (tests on the CPU) keeps the tiled kernel of
// kernels/matmul.cu: cuBLAS has no CPU twin.
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

    // T: float, bf16 or fp16 (instantiated in cublas_gemm.cpp); bias and dinp may be null.
    template <class T>
    void forward(T* out, const T* inp, const T* weight, const T* bias, int N, int K, int M);
    template <class T>
    void backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const T* weight, int N, int K,
                  int M, DinpWrite dinp_write);

  private:
    template <class T>
    const T* ones(int n);  // n device values of 1 in T, grown on demand (once per larger N)

    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace ms::cuda
