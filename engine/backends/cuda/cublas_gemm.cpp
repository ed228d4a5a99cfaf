// cublas_gemm.cpp: CublasGemm (cublas_gemm.h). Built only into ms_cuda_backend (MS_CUDA_RUNTIME).
#include "engine/backends/cuda/cublas_gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <compare>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/kernels/gelu.cuh"
#include "engine/backends/cuda/kernels/matmul.cuh"
#include "engine/core/check.h"
#include "engine/core/half.h"

// cuBLAS and cuBLASLt share cublasStatus_t.
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

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLASLt's workspace (split-K partial sums)

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
constexpr cudaDataType_t cuda_type<float>() {
    return CUDA_R_32F;
}
template <>
constexpr cudaDataType_t cuda_type<bf16>() {
    return CUDA_R_16BF;
}
template <>
constexpr cudaDataType_t cuda_type<fp16>() {
    return CUDA_R_16F;
}

enum class Product : uint8_t { kForward, kDinp, kDweight };

const char* product_name(Product p) {
    switch (p) {
        case Product::kForward:
            return "forward";
        case Product::kDinp:
            return "dinp";
        case Product::kDweight:
            return "dweight";
    }
    return "?";
}

const char* epilogue_name(cublasLtEpilogue_t e) {
    switch (e) {
        case CUBLASLT_EPILOGUE_DEFAULT:
            return "DEFAULT";
        case CUBLASLT_EPILOGUE_BIAS:
            return "BIAS";
        case CUBLASLT_EPILOGUE_GELU_AUX:
            return "GELU_AUX";
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
            return "GELU_AUX_BIAS";
        case CUBLASLT_EPILOGUE_DGELU:
            return "DGELU";
        case CUBLASLT_EPILOGUE_BGRADB:
            return "BGRADB";
        default:
            return "other";
    }
}

const char* type_name(cudaDataType_t t) {
    return t == CUDA_R_32F ? "fp32" : t == CUDA_R_16BF ? "bf16" : t == CUDA_R_16F ? "fp16" : "?";
}

// The largest power of two (at most 256) that divides p's address; 256 for null (no pointer, no constraint).
uint32_t alignment(const void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    uint32_t align = 256;
    while (align > 1 && a % align != 0) align /= 2;
    return align;
}

// One column-major product D (m, n) = op(A) op(B) + beta C with C = D, on cuBLASLt. alpha is 1.
struct LtProduct {
    Product product;
    cudaDataType_t ab_type;  // A and B
    cudaDataType_t c_type;   // C and D (and the bias, bias gradient and aux: cuBLASLt's defaults)
    cublasOperation_t ta, tb;
    int m, n, k;
    const void* a;
    int lda;
    const void* b;
    int ldb;
    void* c;
    int ldc;
    float beta;
    cublasLtEpilogue_t epilogue;
    const void* bias;  // BIAS / GELU_AUX_BIAS: read; BGRADB: written
    const void* aux;   // GELU_AUX(_BIAS): written; DGELU: read; (m, n) with ld m
};

struct PlanKey {
    Product product;
    cudaDataType_t ab_type, c_type;
    cublasLtEpilogue_t epilogue;
    int m, n, k;
    uint32_t align_a, align_b, align_c, align_bias, align_aux;
    auto operator<=>(const PlanKey&) const = default;
};

// The descriptors of one key and the heuristic's algorithm; lt false: this key runs on the cuBLAS fallback.
struct Plan {
    bool lt = false;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};

    Plan() = default;
    Plan(const Plan&) = delete;
    Plan& operator=(const Plan&) = delete;
    ~Plan() {  // no checks: a destructor must not abort during unwinding
        if (c) cublasLtMatrixLayoutDestroy(c);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (desc) cublasLtMatmulDescDestroy(desc);
    }
};

// A matmul preference, destroyed at the end of the scope.
class Preference {
  public:
    Preference() { MS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_)); }
    ~Preference() { cublasLtMatmulPreferenceDestroy(pref_); }
    Preference(const Preference&) = delete;
    Preference& operator=(const Preference&) = delete;
    template <class V>
    void set(cublasLtMatmulPreferenceAttributes_t attr, V value) {
        MS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref_, attr, &value, sizeof(value)));
    }
    cublasLtMatmulPreference_t get() const { return pref_; }

  private:
    cublasLtMatmulPreference_t pref_ = nullptr;
};

template <class V>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, V value) {
    MS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

}  // namespace

struct CublasGemm::Impl {
    GemmPath path = GemmPath::kLt;
    bool tf32 = false;           // CudaFp32Gemm::kTf32 (debug.cuda_tf32)
    bool gelu_epilogues = true;  // CudaGelu::kKernels (debug.cuda_gelu_epilogue: false): gelu.cu's kernels instead
    cublasLtHandle_t lt = nullptr;
    void* workspace = nullptr;  // (kWorkspaceBytes) for cuBLASLt
    std::map<PlanKey, std::unique_ptr<Plan>> plans;
    size_t fallbacks = 0;
    float* dbias_scratch = nullptr;  // (dbias_scratch_n) fp32: BGRADB's output, added to dbias
    int dbias_scratch_n = 0;

    // the cuBLAS v2 fallback
    cublasHandle_t handle = nullptr;
    cudaStream_t handle_stream = nullptr;  // the stream `handle` is bound to
    void* ones[3] = {};                    // per type_index
    int ones_n[3] = {};

    // The fallback handle, bound to `stream`.
    cublasHandle_t cublas(cudaStream_t stream) {
        if (stream != handle_stream) {
            MS_CUBLAS_CHECK(cublasSetStream(handle, stream));
            handle_stream = stream;
        }
        return handle;
    }

    template <class T>
    const T* ones_of(int n, cudaStream_t stream);  // n device values of 1 in T, grown on demand
    float* bias_scratch(int n, cudaStream_t stream);

    // Runs p on cuBLASLt and returns true, or returns false when its key has no cuBLASLt algorithm (or the path is
    // kCublas): the caller then runs the product on the fallback.
    bool run(const LtProduct& p, cudaStream_t stream);
    std::unique_ptr<Plan> make_plan(const LtProduct& p, const PlanKey& key);
};

CublasGemm::CublasGemm(const CudaDebugOptions& debug, GemmPath path) : impl_(std::make_unique<Impl>()) {
    Impl& g = *impl_;
    g.path = path;
    // fp32 products stay fp32 unless debug.cuda_tf32 lets them use TF32 tensor cores (PyTorch's allow_tf32)
    g.tf32 = debug.fp32_gemm == CudaFp32Gemm::kTf32;
    g.gelu_epilogues = debug.gelu == CudaGelu::kEpilogue;
    MS_CUBLAS_CHECK(cublasLtCreate(&g.lt));
    MS_CUDA_CHECK(cudaMalloc(&g.workspace, kWorkspaceBytes));
    MS_CUBLAS_CHECK(cublasCreate(&g.handle));
    // bf16 / fp16 products keep split-K partial sums in fp32 (one rounding per output element); no effect on fp32.
    const int math =
        (g.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    MS_CUBLAS_CHECK(cublasSetMathMode(g.handle, static_cast<cublasMath_t>(math)));
}

CublasGemm::~CublasGemm() {
    // no checks: a destructor must not abort during unwinding. The owner synchronized the stream first.
    Impl& g = *impl_;
    g.plans.clear();
    for (void* p : g.ones) {
        if (p) cudaFree(p);
    }
    if (g.dbias_scratch) cudaFree(g.dbias_scratch);
    if (g.workspace) cudaFree(g.workspace);
    if (g.handle) cublasDestroy(g.handle);
    if (g.lt) cublasLtDestroy(g.lt);
}

size_t CublasGemm::plans() const { return impl_->plans.size(); }
size_t CublasGemm::fallbacks() const { return impl_->fallbacks; }

template <class T>
const T* CublasGemm::Impl::ones_of(int n, cudaStream_t stream) {
    void*& p = ones[type_index<T>()];
    int& have = ones_n[type_index<T>()];
    if (n <= have) return static_cast<const T*>(p);
    if (p) {
        MS_CUDA_CHECK(cudaStreamSynchronize(stream));  // earlier products may still read the old vector
        MS_CUDA_CHECK(cudaFree(p));
        p = nullptr;
    }
    MS_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(T)));
    const std::vector<T> host(static_cast<size_t>(n), from_float<T>(1.0f));
    MS_CUDA_CHECK(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    have = n;
    return static_cast<const T*>(p);
}

float* CublasGemm::Impl::bias_scratch(int n, cudaStream_t stream) {
    if (n <= dbias_scratch_n) return dbias_scratch;
    if (dbias_scratch) {
        MS_CUDA_CHECK(cudaStreamSynchronize(stream));  // an earlier saxpy may still read it
        MS_CUDA_CHECK(cudaFree(dbias_scratch));
        dbias_scratch = nullptr;
    }
    MS_CUDA_CHECK(cudaMalloc(&dbias_scratch, static_cast<size_t>(n) * sizeof(float)));
    dbias_scratch_n = n;
    return dbias_scratch;
}

std::unique_ptr<Plan> CublasGemm::Impl::make_plan(const LtProduct& p, const PlanKey& key) {
    auto plan = std::make_unique<Plan>();
    auto fall_back = [&](const char* why) {
        ++fallbacks;
        std::fprintf(
            stderr,
            "mindspeed-train: cuBLASLt: no algorithm for the %s product (%s inputs, %s output, epilogue %s, "
            "m %d n %d k %d, alignments A %u B %u C %u bias %u aux %u: %s); the fallback of cublas_gemm.h runs it\n",
            product_name(p.product), type_name(p.ab_type), type_name(p.c_type), epilogue_name(p.epilogue), p.m, p.n,
            p.k, key.align_a, key.align_b, key.align_c, key.align_bias, key.align_aux, why);
        return std::move(plan);
    };
    const bool gelu_aux = p.aux != nullptr;
    if (gelu_aux && p.m % 8 != 0) return fall_back("the GELU aux matrix's leading dimension is not a multiple of 8");

    const cublasComputeType_t compute =
        p.ab_type == CUDA_R_32F && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    MS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F));
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(p.ta));
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(p.tb));
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(p.epilogue));
    // The heuristic reads the bias and aux pointers' alignment (part of the key); run() sets each call's pointers.
    if (p.bias) set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
    // A 16-bit dweight's bias gradient stays fp32 in the scratch (cublas_gemm.h); an fp32 one is fp32 by default.
    if (p.epilogue == CUBLASLT_EPILOGUE_BGRADB && p.c_type != CUDA_R_32F)
        set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(CUDA_R_32F));
    if (gelu_aux) {
        set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux);
        set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(p.m));
    }
    const bool na = p.ta == CUBLAS_OP_N, nb = p.tb == CUBLAS_OP_N;
    MS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, p.ab_type, na ? p.m : p.k, na ? p.k : p.m, p.lda));
    MS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, p.ab_type, nb ? p.k : p.n, nb ? p.n : p.k, p.ldb));
    MS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, p.c_type, p.m, p.n, p.ldc));

    Preference pref;
    pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes));
    // split-K only with fp32 partial sums reduced in a fixed order (cublas_gemm.h); unsplit algorithms pass any mask
    pref.set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE));
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);

    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, plan->desc, plan->a, plan->b, plan->c, plan->c,
                                                             pref.get(), 1, &result, &count);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE)
        return fall_back(cublasGetStatusName(st));
    MS_CUBLAS_CHECK(st);
    if (count == 0) return fall_back("the heuristic returned no algorithm");
    plan->lt = true;
    plan->algo = result.algo;
    return plan;
}

bool CublasGemm::Impl::run(const LtProduct& p, cudaStream_t stream) {
    if (path == GemmPath::kCublas) return false;
    const PlanKey key{p.product,      p.ab_type,      p.c_type,          p.epilogue,      p.m, p.n, p.k, alignment(p.a),
                      alignment(p.b), alignment(p.c), alignment(p.bias), alignment(p.aux)};
    auto it = plans.find(key);
    if (it == plans.end()) it = plans.emplace(key, make_plan(p, key)).first;
    const Plan& plan = *it->second;
    if (!plan.lt) return false;
    if (p.bias) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
    if (p.aux) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux);
    const float alpha = 1.0f;
    MS_CUBLAS_CHECK(cublasLtMatmul(lt, plan.desc, &alpha, p.a, plan.a, p.b, plan.b, &p.beta, p.c, plan.c, p.c, plan.c,
                                   &plan.algo, workspace, kWorkspaceBytes, stream));
    return true;
}

namespace {

// C (m, n) = alpha A(op) B(op) + beta C, column-major, T inputs, C of type TC, fp32 compute (the fallback).
template <class T, class TC>
void gemm_ex(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* alpha,
             const T* a, int lda, const T* b, int ldb, const float* beta, TC* c, int ldc) {
    if constexpr (std::is_same_v<T, float>) {
        static_assert(std::is_same_v<TC, float>);
        MS_CUBLAS_CHECK(cublasSgemm(handle, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
    } else {
        constexpr cudaDataType_t c_type = std::is_same_v<TC, float> ? CUDA_R_32F : cuda_type<T>();
        MS_CUBLAS_CHECK(cublasGemmEx(handle, ta, tb, m, n, k, alpha, a, cuda_type<T>(), lda, b, cuda_type<T>(), ldb,
                                     beta, c, c_type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}

}  // namespace

// Each product tries cuBLASLt with its fused epilogue first; where that key has no algorithm, cuBLASLt without the
// GELU / bias-gradient part plus gelu.cu's kernel / the GEMV; where that has none either, the cuBLAS v2 path.

template <class T>
void CublasGemm::forward(T* out, T* gelu_out, const T* inp, const T* weight, const T* bias, int N, int K, int M,
                         CUstream_st* stream) {
    Impl& g = *impl_;
    // out^T (M, N) = weight (M, K) @ inp^T (K, N): the row-major weight is the column-major (K, M) weight^T (op T),
    // the row-major inp the column-major (K, N) inp^T
    LtProduct p{.product = Product::kForward,
                .ab_type = cuda_type<T>(),
                .c_type = cuda_type<T>(),
                .ta = CUBLAS_OP_T,
                .tb = CUBLAS_OP_N,
                .m = M,
                .n = N,
                .k = K,
                .a = weight,
                .lda = K,
                .b = inp,
                .ldb = K,
                .c = out,
                .ldc = M,
                .beta = 0.0f,
                .epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT,
                .bias = bias,
                .aux = nullptr};
    if (gelu_out && g.gelu_epilogues) {  // D = gelu_out, aux = out (the pre-activation, ld M)
        LtProduct fused = p;
        fused.c = gelu_out;
        fused.aux = out;
        fused.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        if (g.run(fused, stream)) return;
    }
    if (!g.run(p, stream)) {
        cublasHandle_t h = g.cublas(stream);
        const float one = 1.0f, zero = 0.0f;
        float beta = 0.0f;
        if (bias) {  // out^T (M, N) = bias (M, 1) @ ones (1, N): exact, the bias is already T
            gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_N, M, N, 1, &one, bias, M, g.ones_of<T>(N, stream), 1, &zero, out, M);
            beta = 1.0f;
        }
        // out^T (M, N) = round(weight (M, K) @ inp^T (K, N) + beta out^T): one rounding of the fp32 sum
        gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, M, N, K, &one, weight, K, inp, K, &beta, out, M);
    }
    if (gelu_out) gelu_forward(gelu_out, static_cast<const T*>(out), static_cast<int64_t>(N) * M, stream);
}

template <class T, class G>
void CublasGemm::backward(T* dinp, G* dweight, std::type_identity_t<G>* dbias, const T* dout, const T* inp,
                          const T* weight, const T* gelu_inp, int N, int K, int M, DinpWrite dinp_write,
                          CUstream_st* stream) {
    Impl& g = *impl_;
    const float one = 1.0f;
    if (dinp) {
        // dinp^T (K, N) = weight^T (K, M) @ dout^T (M, N), T out: round(acc), round(old + acc), or with gelu_inp (aux,
        // ld K) round(gelu'(gelu_inp) * acc)
        MS_CHECK(!gelu_inp || dinp_write == DinpWrite::kOverwrite, "matmul: gelu_inp with dinp += is not supported");
        const float beta = dinp_write == DinpWrite::kAdd ? 1.0f : 0.0f;
        LtProduct p{.product = Product::kDinp,
                    .ab_type = cuda_type<T>(),
                    .c_type = cuda_type<T>(),
                    .ta = CUBLAS_OP_N,
                    .tb = CUBLAS_OP_N,
                    .m = K,
                    .n = N,
                    .k = M,
                    .a = weight,
                    .lda = K,
                    .b = dout,
                    .ldb = M,
                    .c = dinp,
                    .ldc = K,
                    .beta = beta,
                    .epilogue = CUBLASLT_EPILOGUE_DEFAULT,
                    .bias = nullptr,
                    .aux = nullptr};
        bool fused = false;
        if (gelu_inp && g.gelu_epilogues) {
            LtProduct dgelu = p;
            dgelu.epilogue = CUBLASLT_EPILOGUE_DGELU;
            dgelu.aux = gelu_inp;
            fused = g.run(dgelu, stream);
        }
        if (!fused) {
            if (!g.run(p, stream)) {
                gemm_ex(g.cublas(stream), CUBLAS_OP_N, CUBLAS_OP_N, K, N, M, &one, weight, K, dout, M, &beta, dinp, K);
            }
            if (gelu_inp) {
                gelu_backward(dinp, gelu_inp, static_cast<const T*>(dinp), static_cast<int64_t>(N) * K, stream);
            }
        }
    }
    // dweight^T (K, M) += inp^T (K, N) @ dout (N, M): T inputs, G C (one rounding of old + product). dbias: the sum
    // of D's M columns over the GEMM's k = N, written by BGRADB into the fp32 scratch, then added (cublas_gemm.h says
    // why not the GEMV)
    LtProduct p{.product = Product::kDweight,
                .ab_type = cuda_type<T>(),
                .c_type = cuda_type<G>(),
                .ta = CUBLAS_OP_N,
                .tb = CUBLAS_OP_T,
                .m = K,
                .n = M,
                .k = N,
                .a = inp,
                .lda = K,
                .b = dout,
                .ldb = M,
                .c = dweight,
                .ldc = K,
                .beta = 1.0f,
                .epilogue = CUBLASLT_EPILOGUE_DEFAULT,
                .bias = nullptr,
                .aux = nullptr};
    if (dbias) {
        LtProduct bgrad = p;
        bgrad.epilogue = CUBLASLT_EPILOGUE_BGRADB;
        bgrad.bias = g.bias_scratch(M, stream);
        if (g.run(bgrad, stream)) {
            if constexpr (std::is_same_v<G, float>) {
                MS_CUBLAS_CHECK(cublasSaxpy(g.cublas(stream), M, &one, g.dbias_scratch, 1, dbias, 1));
            } else {
                add_to_gradient(dbias, static_cast<const float*>(g.dbias_scratch), M, stream);
            }
            return;
        }
    }
    cublasHandle_t h = g.cublas(stream);
    if (!g.run(p, stream)) gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_T, K, M, N, &one, inp, K, dout, M, &one, dweight, K);
    if (dbias) {  // dbias (M, 1) += dout^T (M, N) @ ones (N, 1): G C, one rounding of old + sum
        if constexpr (std::is_same_v<T, float>) {
            MS_CUBLAS_CHECK(
                cublasSgemv(h, CUBLAS_OP_N, M, N, &one, dout, M, g.ones_of<float>(N, stream), 1, &one, dbias, 1));
        } else {
            gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_N, M, 1, N, &one, dout, M, g.ones_of<T>(N, stream), N, &one, dbias, M);
        }
    }
}

#define MS_INSTANTIATE(T) \
    template void CublasGemm::forward<T>(T*, T*, const T*, const T*, const T*, int, int, int, CUstream_st*);
MS_FOR_EACH_DTYPE(MS_INSTANTIATE)
#undef MS_INSTANTIATE
// (T, G): every activation dtype with fp32 gradients, and bf16 / fp16 with gradients of their own dtype.
#define MS_INSTANTIATE(T, G)                                                                                    \
    template void CublasGemm::backward<T, G>(T*, G*, G*, const T*, const T*, const T*, const T*, int, int, int, \
                                             DinpWrite, CUstream_st*);
MS_INSTANTIATE(float, float)
MS_INSTANTIATE(bf16, float)
MS_INSTANTIATE(bf16, bf16)
MS_INSTANTIATE(fp16, float)
MS_INSTANTIATE(fp16, fp16)
#undef MS_INSTANTIATE

}  // namespace ms::cuda
