// cublas_gemm.cpp: CublasGemm (cublas_gemm.h). Built only into ms_cuda_backend (MS_CUDA_RUNTIME).
#include "engine/backends/cuda/cublas_gemm.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "engine/backends/cuda/common.cuh"
#include "engine/core/check.h"

#define MS_CUBLAS_CHECK(expr)                                                                               \
    do {                                                                                                    \
        const cublasStatus_t ms_st_ = (expr);                                                               \
        if (ms_st_ != CUBLAS_STATUS_SUCCESS) {                                                              \
            ::ms::fatal(#expr, __FILE__, __LINE__, __func__,                                                \
                        std::string("cuBLAS error: ") + cublasGetStatusName(ms_st_) + " (" +                \
                            cublasGetStatusString(ms_st_) + ")");                                           \
        }                                                                                                   \
    } while (0)

namespace ms::cuda {

struct CublasGemm::Impl {
    cublasHandle_t handle = nullptr;
    cudaStream_t stream = nullptr;
    float* ones = nullptr;
    int ones_n = 0;
};

CublasGemm::CublasGemm(CUstream_st* stream) : impl_(std::make_unique<Impl>()) {
    impl_->stream = stream;
    MS_CUBLAS_CHECK(cublasCreate(&impl_->handle));
    MS_CUBLAS_CHECK(cublasSetStream(impl_->handle, impl_->stream));
    // fp32 products stay fp32 unless MS_CUDA_TF32=1 lets them use TF32 tensor cores (PyTorch's allow_tf32)
    const char* tf32 = std::getenv("MS_CUDA_TF32");
    const bool use_tf32 = tf32 != nullptr && std::string(tf32) == "1";
    MS_CUBLAS_CHECK(cublasSetMathMode(impl_->handle, use_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}

CublasGemm::~CublasGemm() {
    if (impl_->ones) cudaFree(impl_->ones);  // no checks: a destructor must not abort during unwinding
    if (impl_->handle) cublasDestroy(impl_->handle);
}

const float* CublasGemm::ones(int n) {
    if (n <= impl_->ones_n) return impl_->ones;
    if (impl_->ones) {
        MS_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));  // earlier products may still read the old vector
        MS_CUDA_CHECK(cudaFree(impl_->ones));
        impl_->ones = nullptr;
    }
    MS_CUDA_CHECK(cudaMalloc(&impl_->ones, static_cast<size_t>(n) * sizeof(float)));
    const std::vector<float> host(static_cast<size_t>(n), 1.0f);
    MS_CUDA_CHECK(cudaMemcpy(impl_->ones, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
    impl_->ones_n = n;
    return impl_->ones;
}

void CublasGemm::forward(float* out, const float* inp, const float* weight, const float* bias, int N, int K, int M) {
    const float one = 1.0f, zero = 0.0f;
    float beta = 0.0f;
    if (bias) {  // out^T (M, N) = bias (M, 1) @ ones (1, N)
        MS_CUBLAS_CHECK(cublasSgemm(impl_->handle, CUBLAS_OP_N, CUBLAS_OP_N, M, N, 1, &one, bias, M, ones(N), 1, &zero,
                                    out, M));
        beta = 1.0f;
    }
    // out^T (M, N) (+)= weight (M, K) @ inp^T (K, N); the row-major weight buffer is the column-major (K, M) weight^T
    MS_CUBLAS_CHECK(cublasSgemm(impl_->handle, CUBLAS_OP_T, CUBLAS_OP_N, M, N, K, &one, weight, K, inp, K, &beta, out,
                                M));
}

void CublasGemm::backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, int N, int K, int M, DinpWrite dinp_write) {
    const float one = 1.0f;
    if (dinp) {  // dinp^T (K, N) = weight^T (K, M) @ dout^T (M, N)
        const float beta = dinp_write == DinpWrite::kAdd ? 1.0f : 0.0f;
        MS_CUBLAS_CHECK(cublasSgemm(impl_->handle, CUBLAS_OP_N, CUBLAS_OP_N, K, N, M, &one, weight, K, dout, M, &beta,
                                    dinp, K));
    }
    // dweight^T (K, M) += inp^T (K, N) @ dout (N, M)
    MS_CUBLAS_CHECK(cublasSgemm(impl_->handle, CUBLAS_OP_N, CUBLAS_OP_T, K, M, N, &one, inp, K, dout, M, &one, dweight,
                                K));
    if (dbias) {  // dbias (M) += dout^T (M, N) @ ones (N)
        MS_CUBLAS_CHECK(cublasSgemv(impl_->handle, CUBLAS_OP_N, M, N, &one, dout, M, ones(N), 1, &one, dbias, 1));
    }
}

}  // namespace ms::cuda
