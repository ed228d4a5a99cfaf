// cublas_gemm.cpp: CublasGemm (cublas_gemm.h). Built only into ms_cuda_backend (MS_CUDA_RUNTIME).
#include "engine/backends/cuda/cublas_gemm.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/backends/cuda/common.cuh"
#include "engine/core/check.h"
#include "engine/core/half.h"

#define MS_CUBLAS_CHECK(expr)                                                                \
    do {                                                                                     \
        const cublasStatus_t ms_st_ = (expr);                                                \
        if (ms_st_ != CUBLAS_STATUS_SUCCESS) {                                               \
            ::ms::fatal(#expr, __FILE__, __LINE__, __func__,                                 \
                        std::string("cuBLAS error: ") + cublasGetStatusName(ms_st_) + " (" + \
                            cublasGetStatusString(ms_st_) + ")");                            \
        }                                                                                    \
    } while (0)

namespace ms::cuda {

namespace {

// Index of T's ones vector in Impl, and its cuBLAS data type.
template <class T>
constexpr int type_index();
template <>
constexpr int type_index<float>() {
    return 0;
}
template <>
constexpr int type_index<bf16>() {
    return 1;
}
template <>
constexpr int type_index<fp16>() {
    return 2;
}

template <class T>
constexpr cudaDataType_t cuda_type();
template <>
constexpr cudaDataType_t cuda_type<bf16>() {
    return CUDA_R_16BF;
}
template <>
constexpr cudaDataType_t cuda_type<fp16>() {
    return CUDA_R_16F;
}

}  // namespace

struct CublasGemm::Impl {
    cublasHandle_t handle = nullptr;
    cudaStream_t stream = nullptr;
    void* ones[3] = {};  // per type_index
    int ones_n[3] = {};
};

CublasGemm::CublasGemm(CUstream_st* stream) : impl_(std::make_unique<Impl>()) {
    impl_->stream = stream;
    MS_CUBLAS_CHECK(cublasCreate(&impl_->handle));
    MS_CUBLAS_CHECK(cublasSetStream(impl_->handle, impl_->stream));
    // fp32 products stay fp32 unless MS_CUDA_TF32=1 lets them use TF32 tensor cores (PyTorch's allow_tf32)
    const char* tf32 = std::getenv("MS_CUDA_TF32");
    const bool use_tf32 = tf32 != nullptr && std::string(tf32) == "1";
    // bf16 / fp16 products keep split-K partial sums in fp32 (one rounding per output element); no effect on fp32.
    const int math = (use_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
                     CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    MS_CUBLAS_CHECK(cublasSetMathMode(impl_->handle, static_cast<cublasMath_t>(math)));
}

CublasGemm::~CublasGemm() {
    for (void* p : impl_->ones) {
        if (p) cudaFree(p);  // no checks: a destructor must not abort during unwinding
    }
    if (impl_->handle) cublasDestroy(impl_->handle);
}

template <class T>
const T* CublasGemm::ones(int n) {
    void*& ones = impl_->ones[type_index<T>()];
    int& ones_n = impl_->ones_n[type_index<T>()];
    if (n <= ones_n) return static_cast<const T*>(ones);
    if (ones) {
        MS_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));  // earlier products may still read the old vector
        MS_CUDA_CHECK(cudaFree(ones));
        ones = nullptr;
    }
    MS_CUDA_CHECK(cudaMalloc(&ones, static_cast<size_t>(n) * sizeof(T)));
    const std::vector<T> host(static_cast<size_t>(n), from_float<T>(1.0f));
    MS_CUDA_CHECK(cudaMemcpy(ones, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    ones_n = n;
    return static_cast<const T*>(ones);
}

namespace {

// C (m, n) = alpha A(op) B(op) + beta C, column-major, T inputs, C of type TC, fp32 compute.
template <class T, class TC>
void gemm_ex(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* alpha,
             const T* a, int lda, const T* b, int ldb, const float* beta, TC* c, int ldc) {
    constexpr cudaDataType_t c_type = std::is_same_v<TC, float> ? CUDA_R_32F : cuda_type<T>();
    MS_CUBLAS_CHECK(cublasGemmEx(handle, ta, tb, m, n, k, alpha, a, cuda_type<T>(), lda, b, cuda_type<T>(), ldb, beta,
                                 c, c_type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

template <class T>
void CublasGemm::forward(T* out, const T* inp, const T* weight, const T* bias, int N, int K, int M) {
    if constexpr (!std::is_same_v<T, float>) {
        const float one = 1.0f, zero = 0.0f;
        float beta = 0.0f;
        if (bias) {  // out^T (M, N) = bias (M, 1) @ ones (1, N): exact, the bias is already T
            gemm_ex(impl_->handle, CUBLAS_OP_N, CUBLAS_OP_N, M, N, 1, &one, bias, M, ones<T>(N), 1, &zero, out, M);
            beta = 1.0f;
        }
        // out^T (M, N) = round(weight (M, K) @ inp^T (K, N) + beta out^T): one rounding of the fp32 sum
        gemm_ex(impl_->handle, CUBLAS_OP_T, CUBLAS_OP_N, M, N, K, &one, weight, K, inp, K, &beta, out, M);
    } else {
        const float one = 1.0f, zero = 0.0f;
        float beta = 0.0f;
        if (bias) {  // out^T (M, N) = bias (M, 1) @ ones (1, N)
            MS_CUBLAS_CHECK(cublasSgemm(impl_->handle, CUBLAS_OP_N, CUBLAS_OP_N, M, N, 1, &one, bias, M, ones<float>(N),
                                        1, &zero, out, M));
            beta = 1.0f;
        }
        // out^T (M, N) (+)= weight (M, K) @ inp^T (K, N); the row-major weight is the column-major (K, M) weight^T
        MS_CUBLAS_CHECK(
            cublasSgemm(impl_->handle, CUBLAS_OP_T, CUBLAS_OP_N, M, N, K, &one, weight, K, inp, K, &beta, out, M));
    }
}

template <class T>
void CublasGemm::backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const T* weight, int N,
                          int K, int M, DinpWrite dinp_write) {
    const float one = 1.0f;
    if constexpr (!std::is_same_v<T, float>) {
        if (dinp) {  // dinp^T (K, N) = weight^T (K, M) @ dout^T (M, N), T out: round(acc) or round(old + acc)
            const float beta = dinp_write == DinpWrite::kAdd ? 1.0f : 0.0f;
            gemm_ex(impl_->handle, CUBLAS_OP_N, CUBLAS_OP_N, K, N, M, &one, weight, K, dout, M, &beta, dinp, K);
        }
        // dweight^T (K, M) += inp^T (K, N) @ dout (N, M): T inputs, fp32 C
        gemm_ex(impl_->handle, CUBLAS_OP_N, CUBLAS_OP_T, K, M, N, &one, inp, K, dout, M, &one, dweight, K);
        if (dbias) {  // dbias (M, 1) += dout^T (M, N) @ ones (N, 1): fp32 C
            gemm_ex(impl_->handle, CUBLAS_OP_N, CUBLAS_OP_N, M, 1, N, &one, dout, M, ones<T>(N), N, &one, dbias, M);
        }
    } else {
        if (dinp) {  // dinp^T (K, N) = weight^T (K, M) @ dout^T (M, N)
            const float beta = dinp_write == DinpWrite::kAdd ? 1.0f : 0.0f;
            MS_CUBLAS_CHECK(cublasSgemm(impl_->handle, CUBLAS_OP_N, CUBLAS_OP_N, K, N, M, &one, weight, K, dout, M,
                                        &beta, dinp, K));
        }
        // dweight^T (K, M) += inp^T (K, N) @ dout (N, M)
        MS_CUBLAS_CHECK(
            cublasSgemm(impl_->handle, CUBLAS_OP_N, CUBLAS_OP_T, K, M, N, &one, inp, K, dout, M, &one, dweight, K));
        if (dbias) {  // dbias (M) += dout^T (M, N) @ ones (N)
            MS_CUBLAS_CHECK(
                cublasSgemv(impl_->handle, CUBLAS_OP_N, M, N, &one, dout, M, ones<float>(N), 1, &one, dbias, 1));
        }
    }
}

#define MS_INSTANTIATE(T)                                                                  \
    template void CublasGemm::forward<T>(T*, const T*, const T*, const T*, int, int, int); \
    template void CublasGemm::backward<T>(T*, float*, float*, const T*, const T*, const T*, int, int, int, DinpWrite);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE

}  // namespace ms::cuda
