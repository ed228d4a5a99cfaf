// cublas_gemm.h: the Linear layer's three products on cuBLASLt, for the CudaBackend on a real GPU (ms_cuda_backend).
//
// The same contract as kernels/matmul.cuh (row-major; weight in Linear orientation (M, K); T the activation dtype,
// float, bf16 or fp16; dweight and dbias G, float or T itself for 16-bit gradients), plus backend.h's GELU fusion:
//   forward   out (N, M)      = inp (N, K) @ weight^T + bias               (bias optional)
//             gelu_out (N, M) = gelu(out)                                   (optional: the MLP's c_fc)
//   backward  dinp (N, K)     = dout @ weight       (= or += per DinpWrite; skipped when dinp is null)
//                               or gelu'(gelu_inp) * (dout @ weight)        (with gelu_inp: = only)
//             dweight (M, K) += dout^T @ inp
//             dbias (M)      += sum over rows of dout                       (skipped when null)
// cuBLAS is column-major: a row-major (R, C) buffer is a column-major (C, R) matrix, so every product below is the
// transposed one (out^T = weight @ inp^T, dinp^T = weight^T @ dout^T, dweight^T = inp^T @ dout).
//
// cuBLASLt and its epilogues: the forward is one cublasLtMatmul with CUBLASLT_EPILOGUE_BIAS (the bias, in T, added
// to the fp32 accumulator before the one rounding), or CUBLASLT_EPILOGUE_GELU_AUX_BIAS for the fused c_fc (D =
// gelu_out, the aux matrix = out, the pre-activation, in T with ld M). The input gradient uses CUBLASLT_EPILOGUE_DGELU
// with gelu_inp as aux when fused. dbias comes from CUBLASLT_EPILOGUE_BGRADB on the dweight product (B = dout with
// op T: the bias gradient is the sum of D's columns over the GEMM's k = N). BGRADB WRITES the bias gradient, while
// dbias accumulates: it goes to an fp32 scratch of M values owned here, then one cublasSaxpy adds it to dbias. Bytes
// moved, for the 124M model's c_fc (N = 4096 rows, M = 3072, bf16): a separate column sum (the old GEMV with a ones
// vector) reads all of dout again, N * M * 2 = 25 MB per product, where the epilogue reads it inside the dweight
// GEMM that reads it anyway and the saxpy moves 3 * M * 4 = 37 KB: BGRADB plus the add, not the GEMV.
//
// cuBLASLt's GELU is the tanh approximation (GeluForwardArgs' function, which gelu.cu computes): the documentation
// says only "GELU"; TransformerEngine fuses its GELU, the tanh form, into GELU_AUX_BIAS / DGELU_BGRAD (Megatron's
// MLP through it), XLA's GEMM rewriter fuses the tanh ("approximate") GELU pattern into them, and a public test of
// the epilogues on an RTX 3060 (cuBLASLt 13.0) passes comparing GELU_AUX_BIAS / DGELU_BGRAD with the tanh formula at
// fp32 to a relative 2e-4, which erf's GELU would fail (it is 4.7e-4 away from tanh's at x = -2.7). Not yet seen on our
// own GPU run: tests/gpu's fp32 model test compares the fused MLP with the CPU's tanh GELU (GpuTrain).
// CudaGelu::kKernels (the config's debug.cuda_gelu_epilogue: false) runs the GELU and dGELU as gelu.cu's kernels
// instead (the plain epilogues stay), for diagnosis.
//
// Plans: a product's matmul descriptor, its three matrix layouts and the algorithm the heuristic picked are made once
// per key (product, dtypes, epilogue, m, n, k and the alignments of the pointers, which the heuristic reads) and
// cached, so a training step makes no heuristic query after the first. Where the heuristic finds no algorithm
// (CUBLAS_STATUS_NOT_SUPPORTED, CUBLAS_STATUS_INVALID_VALUE or 0 results: an epilogue this GPU or version cannot run
// for these types, an alignment, an aux ld that is not a multiple of 8), that key falls back for good (one line on
// stderr, once per key): a fused product to cuBLASLt without the fused part (then gelu.cu's kernel for the GELU or
// dGELU, the fallback's GEMV for dbias), and a plain one to the cuBLAS v2 path below: an unsupported epilogue never
// stops training.
//
// Fallback (cuBLAS v2): cublasGemmEx (T inputs, CUBLAS_COMPUTE_32F) or cublasSgemm; the bias as a rank-1 product
// with a vector of ones (out^T = bias 1^T, then += weight @ inp^T, one rounding), dbias as a GemmEx / GEMV against
// the same ones.
//
// Precision, T = float: true fp32 (CUBLAS_COMPUTE_32F, no TF32), like PyTorch's default for fp32 matmuls since 1.12,
// so the GPU run is compared with the CPU backend at fp32 tolerances; CudaFp32Gemm::kTf32 (debug.cuda_tf32: true)
// allows TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32) instead. T = bf16 / fp16: T inputs, fp32 accumulation
// (CUBLAS_COMPUTE_32F), one rounding per output element: out = round(acc + bias), gelu_out = round(gelu(acc + bias))
// and out = round(acc + bias) (so the GELU's input is the fp32 value, not the rounded out: backend.h), dinp =
// round(acc) or round(old + acc), or round(gelu'(gelu_inp) * acc); dweight is a G C with beta 1: for G = T,
// round(old + acc) once, the fp32 product added to the widened old value in the epilogue, which is backend.h's
// contract for a 16-bit gradient (matmul.cu's tiled kernel computes the same, up to the product's summation order).
// A 16-bit dbias: BGRADB writes the fp32 column sums (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE fp32, not D's dtype) into
// the scratch, and matmul.cuh's add_to_gradient adds them with one rounding; the fallback's GemmEx against the ones
// vector with a T C and beta 1 rounds round(old + sum) once too. Split-K: only the
// reduction scheme CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE (fp32 partial sums in the workspace, reduced in a fixed
// order), never in the output type, and never the in-place one; the fallback sets
// CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION. So the results are deterministic for a given shape, alignment,
// device and library version.
//
// Streams: every call takes the stream it runs on. The workspace (32 MiB, cudaMalloc'd once) and the dbias scratch
// are shared by all calls, so calls on different streams must not overlap (the CudaBackend has one stream).
// The emulated build (tests on the CPU) keeps the tiled kernel of kernels/matmul.cu: cuBLAS has no CPU twin.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

struct CUstream_st;

namespace ms {
struct CudaDebugOptions;  // engine/backends/backend.h
}

namespace ms::cuda {

enum class DinpWrite : uint8_t;

// kLt: cuBLASLt with epilogues (the cuBLAS fallback per key); kCublas: the cuBLAS v2 path for every product, for
// bench/gpu/gemm_bench.cpp to compare the two.
enum class GemmPath : uint8_t { kLt, kCublas };

class CublasGemm {
  public:
    // debug: the fp32 products' math (fp32 or TF32) and the GELU fusion (BackendOptions::cuda).
    explicit CublasGemm(const CudaDebugOptions& debug, GemmPath path = GemmPath::kLt);
    ~CublasGemm();
    CublasGemm(const CublasGemm&) = delete;
    CublasGemm& operator=(const CublasGemm&) = delete;

    // T: float, bf16 or fp16 (instantiated in cublas_gemm.cpp); bias, gelu_out, dinp, dbias and gelu_inp may be null.
    template <class T>
    void forward(T* out, T* gelu_out, const T* inp, const T* weight, const T* bias, int N, int K, int M,
                 CUstream_st* stream);
    // G: the gradients' dtype, float or T (instantiated for those pairs).
    template <class T, class G>
    void backward(T* dinp, G* dweight, std::type_identity_t<G>* dbias, const T* dout, const T* inp, const T* weight,
                  const T* gelu_inp, int N, int K, int M, DinpWrite dinp_write, CUstream_st* stream);

    // Plans made so far, and how many of them fall back to cuBLAS (for the bench's report).
    size_t plans() const;
    size_t fallbacks() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace ms::cuda
