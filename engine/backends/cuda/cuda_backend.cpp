// cuda_backend.cpp: CudaBackend (cuda_backend.h): shape checks on the Tensor views, then the raw launchers of
// kernels/<op>.cuh on this backend's stream. Built against the CUDA runtime when MS_CUDA_RUNTIME is defined
// (ms_cuda_backend), else against the CPU emulation (ms_cuda_emu); only the device selection, the arena memory,
// DeviceScratch, the stream, zero() and the copy of sum_squares' result differ between the two.
#include "engine/backends/cuda/cuda_backend.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "engine/backends/cuda/cublas_gemm.h"
#include "engine/backends/cuda/kernels/adamw.cuh"
#include "engine/backends/cuda/kernels/attention.cuh"
#include "engine/backends/cuda/kernels/attention_block.cuh"
#include "engine/backends/cuda/kernels/cast.cuh"
#include "engine/backends/cuda/kernels/cross_entropy.cuh"
#include "engine/backends/cuda/kernels/embedding.cuh"
#include "engine/backends/cuda/kernels/gelu.cuh"
#include "engine/backends/cuda/kernels/layernorm.cuh"
#include "engine/backends/cuda/kernels/lm_head_loss.cuh"
#include "engine/backends/cuda/kernels/matmul.cuh"
#include "engine/backends/cuda/kernels/residual.cuh"
#include "engine/backends/cuda/kernels/rmsnorm.cuh"
#include "engine/backends/cuda/kernels/rope.cuh"
#include "engine/backends/cuda/kernels/sum_squares.cuh"
#include "engine/backends/cuda/kernels/swiglu.cuh"
#include "engine/backends/rope_table.h"
#include "engine/core/check.h"
#include "engine/core/switches.h"
#include "memory/arena_memory.h"

namespace ms {
namespace {

constexpr size_t kScratchAlign = 256;

// The launchers take int sizes: every dimension handed to one is checked against this first.
int to_int(int64_t v, const char* op, const char* what) {
    MS_CHECK(v >= 0 && v <= INT_MAX, "{}: {} = {} is outside [0, INT_MAX] (the CUDA launchers take int sizes)", op,
             what, v);
    return static_cast<int>(v);
}

cuda::DinpWrite dinp_write(Accumulate a) {
    return a == Accumulate::kAdd ? cuda::DinpWrite::kAdd : cuda::DinpWrite::kOverwrite;
}

void check_numel(const Tensor& t, int64_t expected, const char* op, const char* what) {
    MS_CHECK(t.numel() == expected, "{}: {} has {} elements, expected {}", op, what, t.numel(), expected);
}

// ---- the precision contract (backend.h): one activation dtype D per op, fp32 or D gradients, fp32 statistics ----

// D, taken from the op's `from` tensor; the CUDA kernels are built for fp32, bf16 and fp16.
DType activation_dtype(const Tensor& from, const char* op, const char* what) {
    MS_CHECK(is_float(from.dtype),
             "{}: {} is {}, but the CUDA kernels compute on fp32, bf16 or fp16 (the activation dtype is taken from {})",
             op, what, dtype_name(from.dtype), what);
    return from.dtype;
}

// An activation, or a weight the op reads, of an op computing on D (skipped when undefined: optional tensors).
void check_d(const Tensor& t, DType D, const char* op, const char* what) {
    if (!t.defined()) return;
    MS_CHECK(t.dtype == D,
             "{}: {} is {} but the op's activation dtype is {}: activations and the weights an op reads share one "
             "dtype (backend.h precision contract)",
             op, what, dtype_name(t.dtype), dtype_name(D));
}

// The dtype G of an op's parameter gradients, taken from `grad` (the first of them the op has): fp32, or D itself
// (16-bit gradients); the op's other gradients are checked against it with check_grad.
DType grad_dtype(const Tensor& grad, DType D, const char* op, const char* what) {
    MS_CHECK(grad.dtype == DType::kF32 || grad.dtype == D,
             "{}: {} is {}, but a parameter gradient is fp32 or the op's activation dtype {} (backend.h precision "
             "contract)",
             op, what, dtype_name(grad.dtype), dtype_name(D));
    return grad.dtype;
}

// Another parameter gradient of the op (skipped when undefined): G, the dtype grad_dtype took from `first`.
void check_grad(const Tensor& t, DType G, const char* op, const char* what, const char* first) {
    if (!t.defined()) return;
    MS_CHECK(t.dtype == G, "{}: {} is {} but {} is {}: an op's parameter gradients share one dtype", op, what,
             dtype_name(t.dtype), first, dtype_name(G));
}

// A statistic, a master weight or optimizer state (`kind` names which): fp32 whatever D is.
void check_fp32(const Tensor& t, const char* op, const char* what, const char* kind) {
    if (!t.defined()) return;
    MS_CHECK(t.dtype == DType::kF32,
             "{}: {} is {}, but a {} is fp32 whatever the activation dtype is (backend.h precision contract)", op, what,
             dtype_name(t.dtype), kind);
}

// f(T{}) for the storage type T of D (float, bf16, fp16): the one place a run-time dtype becomes a kernel template.
template <class F>
void dispatch(DType D, F&& f) {
    visit_float(D, std::forward<F>(f));
}

// f(T{}, G{}) for D's storage type T and the parameter gradients' G (grad_dtype: float, or T itself).
template <class F>
void dispatch_grad(DType D, DType G, F&& f) {
    dispatch(D, [&]<class T>(T) {
        if (G == DType::kF32) {
            f(T{}, float{});
        } else if constexpr (!std::is_same_v<T, float>) {
            f(T{}, T{});
        }
    });
}

// t's data as T*, or nullptr when t is undefined (optional tensors).
template <class T>
T* opt(const Tensor& t) {
    return t.defined() ? t.as<T>() : nullptr;
}

}  // namespace

// ---- memory and stream: the two builds ----

DeviceScratch::~DeviceScratch() {
#if defined(MS_CUDA_RUNTIME)
    if (ptr_) cudaFree(ptr_);  // no check: a destructor must not abort during unwinding
#else
    std::free(ptr_);
#endif
}

void* DeviceScratch::reserve(size_t bytes) {
    if (bytes <= bytes_ && ptr_) return ptr_;
    const size_t rounded = (std::max<size_t>(bytes, 1) + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
#if defined(MS_CUDA_RUNTIME)
    if (ptr_) MS_CUDA_CHECK(cudaFree(ptr_));
    ptr_ = nullptr;
    MS_CUDA_CHECK(cudaMalloc(&ptr_, rounded));  // cudaMalloc aligns to at least 256 bytes
#else
    std::free(ptr_);
    ptr_ = std::aligned_alloc(kScratchAlign, rounded);
    MS_CHECK(ptr_ != nullptr, "cuda-emulated: cannot allocate {} bytes of scratch", rounded);
#endif
    bytes_ = rounded;
    return ptr_;
}

#if defined(MS_CUDA_RUNTIME)
namespace {

// The trainer's arena in CUDA managed memory preferring the backend's device (cuda_backend.h says why managed).
// zero() and prefetch_to_device() run on the backend's stream; zero() waits for its memset, so host writes that
// follow it (weight initialisation) cannot race with it.
class ManagedArenaMemory final : public ArenaMemory {
  public:
    ManagedArenaMemory(size_t bytes, int device, cudaStream_t stream) : bytes_(bytes), stream_(stream) {
        location_.type = cudaMemLocationTypeDevice;
        location_.id = device;
        size_t free = 0, total = 0;
        MS_CUDA_CHECK(cudaMemGetInfo(&free, &total));
        // Managed memory may exceed the device's (it would page in and out of host memory at every step): refuse.
        if (bytes > free) {
            throw UserError(fmt::format(
                "memory error: the arena needs {:.2f} GiB of device memory but CUDA device {} has {:.2f} GiB free "
                "(of {:.2f} GiB)\n---> HINT: lower training.micro_batch_size (activations scale with it), raise "
                "parallel.pipeline_model_parallel_size, or run fewer ranks per GPU",
                static_cast<double>(bytes) / (1 << 30), device, static_cast<double>(free) / (1 << 30),
                static_cast<double>(total) / (1 << 30)));
        }
        const cudaError_t rc = cudaMallocManaged(&data_, bytes, cudaMemAttachGlobal);
        if (rc != cudaSuccess) {
            throw UserError(
                fmt::format("memory error: cudaMallocManaged of the {:.2f} GiB arena on CUDA device {} "
                            "failed: {}\n---> HINT: lower training.micro_batch_size",
                            static_cast<double>(bytes) / (1 << 30), device, cudaGetErrorString(rc)));
        }
        MS_CUDA_CHECK(cudaMemAdvise(data_, bytes, cudaMemAdviseSetPreferredLocation, location_));
    }
    ~ManagedArenaMemory() override {
        if (data_) cudaFree(data_);  // no check: a destructor must not abort during unwinding
    }
    ManagedArenaMemory(const ManagedArenaMemory&) = delete;
    ManagedArenaMemory& operator=(const ManagedArenaMemory&) = delete;

    void* data() const override { return data_; }
    size_t size() const override { return bytes_; }
    void zero(void* p, size_t bytes) override {
        if (bytes == 0) return;
        MS_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
        MS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    void prefetch_to_device() override { MS_CUDA_CHECK(cudaMemPrefetchAsync(data_, bytes_, location_, 0, stream_)); }
    const char* describe() const override { return "CUDA managed memory"; }

  private:
    void* data_ = nullptr;
    size_t bytes_;
    cudaStream_t stream_;
    cudaMemLocation location_{};
};

}  // namespace
#endif

CudaBackend::CudaBackend(const BackendOptions& options) : debug_(options.cuda) {
    MS_CHECK(options.kind == BackendKind::kCUDA, "CudaBackend built for backend kind {}",
             static_cast<int>(options.kind));
    switches();  // refuses the retired MS_CUDA_* variables, which debug_ replaces, if nothing read them before
#if defined(MS_CUDA_RUNTIME)
    // The device first: every later CUDA call of this process (stream, scratch, arena) then lands on it.
    int count = 0;
    const cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count == 0) {
        throw UserError(fmt::format(
            "run.backend = 'cuda' but local rank {} sees no CUDA device ({})\n---> HINT: check that nvidia-smi "
            "lists a GPU and that CUDA_VISIBLE_DEVICES does not hide it, or set run.backend: cpu",
            options.local_rank, rc != cudaSuccess ? cudaGetErrorString(rc) : "cudaGetDeviceCount found 0 devices"));
    }
    device_ = options.local_rank % count;
    MS_CUDA_CHECK(cudaSetDevice(device_));
    cudaDeviceProp prop{};
    MS_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    int concurrent_managed = 0;
    MS_CUDA_CHECK(cudaDeviceGetAttribute(&concurrent_managed, cudaDevAttrConcurrentManagedAccess, device_));
    if (!concurrent_managed) {
        throw UserError(fmt::format(
            "CUDA device {} ({}) cannot access managed memory concurrently with the CPU "
            "(cudaDevAttrConcurrentManagedAccess = 0), which the trainer's arena needs\n---> HINT: run on Linux "
            "with a GPU of compute capability 6.0 or later, or set run.backend: cpu",
            device_, prop.name));
    }
    device_name_ = fmt::format("{} (device {} of {}, sm_{}{}, {:.1f} GiB)", prop.name, device_, count, prop.major,
                               prop.minor, static_cast<double>(prop.totalGlobalMem) / (1 << 30));
    device_memory_ = {prop.totalGlobalMem, count};
    char bus_id[32] = {};  // "dddd:bb:dd.f" and its terminator
    MS_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device_));
    pci_bus_id_ = bus_id;
    MS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    gemm_ = {new cuda::CublasGemm(debug_), [](cuda::CublasGemm* g) { delete g; }};
#else
    device_name_ = "the CPU emulation of the CUDA kernels";
#endif
}

std::unique_ptr<ArenaMemory> CudaBackend::make_arena_memory(size_t bytes) {
#if defined(MS_CUDA_RUNTIME)
    return std::make_unique<ManagedArenaMemory>(bytes, device_, stream_);
#else
    (void)bytes;
    return nullptr;  // the emulated kernels read host memory
#endif
}

CudaBackend::~CudaBackend() {
#if defined(MS_CUDA_RUNTIME)
    if (stream_) {
        cudaStreamSynchronize(stream_);  // scratch is freed next: no kernel may still read it
        gemm_.reset();                   // its cuBLAS handles and workspace, which the stream's GEMMs used
        cudaStreamDestroy(stream_);
    }
#endif
}

bool CudaBackend::emulated() {
#if defined(MS_CUDA_RUNTIME)
    return false;
#else
    return true;
#endif
}

std::string_view CudaBackend::name() const { return emulated() ? "cuda-emulated" : "cuda"; }

// Every kernel is built for the three activation dtypes (backend.h precision contract).
bool CudaBackend::supports(OpKind op, DType dtype) const { return op < OpKind::kCount && is_float(dtype); }

void CudaBackend::synchronize() { MS_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void CudaBackend::zero(const Tensor& x) {
    if (x.numel() == 0) return;
#if defined(MS_CUDA_RUNTIME)
    MS_CUDA_CHECK(cudaMemsetAsync(x.data, 0, x.bytes(), stream_));
#else
    std::memset(x.data, 0, x.bytes());
#endif
}

double CudaBackend::sum_squares(const Tensor& x) {
    const int64_t n = x.numel();
    const size_t doubles = 1 + cuda::sum_squares_scratch_doubles(n);
    double* scratch = static_cast<double*>(sum_squares_scratch_.reserve(doubles * sizeof(double)));
    dispatch(activation_dtype(x, "sum_squares", "x"),
             [&]<class T>(T) { cuda::sum_squares(scratch, scratch + 1, x.as<T>(), n, stream_); });
    MS_CUDA_LAUNCH_CHECK();
    double result = 0.0;
#if defined(MS_CUDA_RUNTIME)
    MS_CUDA_CHECK(cudaMemcpyAsync(&result, scratch, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    MS_CUDA_CHECK(cudaStreamSynchronize(stream_));
#else
    result = scratch[0];
#endif
    return result;
}

void CudaBackend::cast(const CastArgs& a) {
    const int64_t n = a.src.numel();
    check_numel(a.dst, n, "cast", "dst");
    if (n == 0) return;
    if (a.src.dtype == a.dst.dtype) {
        if (a.src.data == a.dst.data) return;
#if defined(MS_CUDA_RUNTIME)
        MS_CUDA_CHECK(cudaMemcpyAsync(a.dst.data, a.src.data, a.src.bytes(), cudaMemcpyDefault, stream_));
#else
        std::memmove(a.dst.data, a.src.data, a.src.bytes());
#endif
        return;
    }
    // Different dtypes, both of them fp32, bf16 or fp16: the kernel for the pair.
    dispatch(activation_dtype(a.src, "cast", "src"), [&]<class S>(S) {
        dispatch(activation_dtype(a.dst, "cast", "dst"), [&]<class D>(D) {
            if constexpr (!std::is_same_v<S, D>) cuda::cast(a.dst.as<D>(), a.src.as<S>(), n, stream_);
        });
    });
}

// ---- ops ----
// Each op takes its activation dtype D from one tensor, checks every other tensor against the precision contract
// (D; fp32 or D for parameter gradients; fp32 for statistics), then runs the launcher instantiated for D (and the
// gradients' dtype).

void CudaBackend::embedding_forward(const EmbeddingForwardArgs& a) {
    const int64_t C = a.table.dim(-1), N = a.tokens.numel();
    MS_CHECK(C > 0, "embedding: table has no columns");
    check_numel(a.out, N * C, "embedding", "out (N * C)");
    MS_CHECK(a.T > 0 && N % a.T == 0, "embedding: N({}) is not a multiple of T({})", N, a.T);
    if (a.pos.defined()) check_numel(a.pos, a.T * C, "embedding", "pos (T * C)");
    const DType D = activation_dtype(a.out, "embedding", "out");
    check_d(a.table, D, "embedding", "table");
    check_d(a.pos, D, "embedding", "pos");
    dispatch(D, [&]<class T>(T) {
        cuda::embedding_forward(a.out.as<T>(), a.tokens.i32(), a.table.as<T>(), opt<T>(a.pos),
                                to_int(N, "embedding", "N"), to_int(C, "embedding", "C"),
                                to_int(a.table.numel() / C, "embedding", "V_local"), a.vocab_start,
                                to_int(a.T, "embedding", "T"), stream_);
    });
    MS_CUDA_LAUNCH_CHECK();
}

void CudaBackend::embedding_backward(const EmbeddingBackwardArgs& a) {
    const int64_t C = a.dtable.dim(-1), N = a.tokens.numel();
    MS_CHECK(C > 0, "embedding: dtable has no columns");
    check_numel(a.dout, N * C, "embedding", "dout (N * C)");
    MS_CHECK(a.T > 0 && N % a.T == 0, "embedding: N({}) is not a multiple of T({})", N, a.T);
    if (a.dpos.defined()) check_numel(a.dpos, a.T * C, "embedding", "dpos (T * C)");
    const DType D = activation_dtype(a.dout, "embedding", "dout");
    const DType G = grad_dtype(a.dtable, D, "embedding", "dtable");
    check_grad(a.dpos, G, "embedding", "dpos", "dtable");
    dispatch_grad(D, G, [&]<class T, class Grad>(T, Grad) {
        cuda::embedding_backward(a.dtable.as<Grad>(), opt<Grad>(a.dpos), a.tokens.i32(), a.dout.as<T>(),
                                 to_int(N, "embedding", "N"), to_int(C, "embedding", "C"),
                                 to_int(a.dtable.numel() / C, "embedding", "V_local"), a.vocab_start,
                                 to_int(a.T, "embedding", "T"), stream_);
    });
    MS_CUDA_LAUNCH_CHECK();
}

void CudaBackend::layernorm_forward(const LayerNormForwardArgs& a) {
    const bool fused = a.residual_out.defined();  // the residual add in front (backend.h)
    MS_CHECK(fused != a.inp.defined(), "layernorm: exactly one of inp and residual_out (its sum the input) is defined");
    const Tensor& inp = fused ? a.residual_out : a.inp;
    const int64_t C = inp.dim(-1);
    MS_CHECK(C > 0, "layernorm: inp has no columns");
    const int64_t N = inp.numel() / C;
    check_numel(a.out, N * C, "layernorm", "out (N * C)");
    check_numel(a.weight, C, "layernorm", "weight (C)");
    check_numel(a.bias, C, "layernorm", "bias (C)");
    check_numel(a.mean, N, "layernorm", "mean (N)");
    check_numel(a.rstd, N, "layernorm", "rstd (N)");
    const DType D = activation_dtype(inp, "layernorm", "inp");
    check_d(a.out, D, "layernorm", "out");
    check_d(a.weight, D, "layernorm", "weight");
    check_d(a.bias, D, "layernorm", "bias");
    check_fp32(a.mean, "layernorm", "mean", "statistic");
    check_fp32(a.rstd, "layernorm", "rstd", "statistic");
    const int n = to_int(N, "layernorm", "N"), c = to_int(C, "layernorm", "C");
    if (fused) {
        check_numel(a.residual_a, N * C, "layernorm", "residual_a (N * C)");
        check_numel(a.residual_b, N * C, "layernorm", "residual_b (N * C)");
        if (a.residual_bias.defined()) check_numel(a.residual_bias, C, "layernorm", "residual_bias (C)");
        check_d(a.residual_a, D, "layernorm", "residual_a");
        check_d(a.residual_b, D, "layernorm", "residual_b");
        check_d(a.residual_bias, D, "layernorm", "residual_bias");
        dispatch(D, [&]<class T>(T) {
            cuda::layernorm_residual_forward(a.out.as<T>(), a.mean.f32(), a.rstd.f32(), a.residual_out.as<T>(),
                                             a.residual_a.as<T>(), a.residual_b.as<T>(), opt<T>(a.residual_bias),
                                             a.weight.as<T>(), a.bias.as<T>(), n, c, a.eps, stream_);
        });
    } else {
        dispatch(D, [&]<class T>(T) {
            cuda::layernorm_forward(a.out.as<T>(), a.mean.f32(), a.rstd.f32(), a.inp.as<T>(), a.weight.as<T>(),
                                    a.bias.as<T>(), n, c, a.eps, stream_);
        });
    }
    MS_CUDA_LAUNCH_CHECK();
}

void CudaBackend::layernorm_backward(const LayerNormBackwardArgs& a) {
    const int64_t C = a.inp.dim(-1);
    MS_CHECK(C > 0, "layernorm: inp has no columns");
    const int64_t N = a.inp.numel() / C;
    check_numel(a.dout, N * C, "layernorm", "dout (N * C)");
    check_numel(a.dinp, N * C, "layernorm", "dinp (N * C)");
    check_numel(a.weight, C, "layernorm", "weight (C)");
    check_numel(a.dweight, C, "layernorm", "dweight (C)");
    check_numel(a.dbias, C, "layernorm", "dbias (C)");
    check_numel(a.mean, N, "layernorm", "mean (N)");
    check_numel(a.rstd, N, "layernorm", "rstd (N)");
    const DType D = activation_dtype(a.dout, "layernorm", "dout");
    check_d(a.inp, D, "layernorm", "inp");
    check_d(a.dinp, D, "layernorm", "dinp");
    check_d(a.weight, D, "layernorm", "weight");
    check_fp32(a.mean, "layernorm", "mean", "statistic");
    check_fp32(a.rstd, "layernorm", "rstd", "statistic");
    const DType G = grad_dtype(a.dweight, D, "layernorm", "dweight");
    check_grad(a.dbias, G, "layernorm", "dbias", "dweight");
    const int n = to_int(N, "layernorm", "N"), c = to_int(C, "layernorm", "C");
    float* scratch =
        static_cast<float*>(layernorm_scratch_.reserve(cuda::layernorm_backward_scratch_floats(n, c) * sizeof(float)));
    dispatch_grad(D, G, [&]<class T, class Grad>(T, Grad) {
        cuda::layernorm_backward(a.dinp.as<T>(), a.dweight.as<Grad>(), a.dbias.as<Grad>(), scratch, a.dout.as<T>(),
                                 a.inp.as<T>(), a.weight.as<T>(), a.mean.f32(), a.rstd.f32(), n, c,
                                 dinp_write(a.accumulate), stream_);
    });
    MS_CUDA_LAUNCH_CHECK();
}

void CudaBackend::matmul_forward(const MatmulForwardArgs& a) {
    const int64_t K = a.inp.dim(-1);
    MS_CHECK(K > 0, "matmul: inp has no columns");
    MS_CHECK(a.weight.dim(-1) == K, "matmul: weight is (.., {}) but inp is (.., {})", a.weight.dim(-1), K);
    const int64_t N = a.inp.numel() / K, M = a.weight.numel() / K;
    check_numel(a.out, N * M, "matmul", "out (N * M)");
    if (a.bias.defined()) check_numel(a.bias, M, "matmul", "bias (M)");
    const DType D = activation_dtype(a.inp, "matmul", "inp");
    check_d(a.weight, D, "matmul", "weight");
    check_d(a.bias, D, "matmul", "bias");
    check_d(a.out, D, "matmul", "out");
    if (a.gelu_out.defined()) {
        check_numel(a.gelu_out, N * M, "matmul", "gelu_out (N * M)");
        check_d(a.gelu_out, D, "matmul", "gelu_out");
        MS_CHECK(a.gelu_out.data != a.out.data, "matmul: gelu_out must not alias out (the backward reads out)");
    }
    const int n = to_int(N, "matmul", "N"), k = to_int(K, "matmul", "K"), m = to_int(M, "matmul", "M");
#if defined(MS_CUDA_RUNTIME)
    // cuBLASLt: the bias and the GELU in the GEMM's epilogue (cublas_gemm.h)
    dispatch(D, [&]<class T>(T) {
        gemm_->forward(a.out.as<T>(), opt<T>(a.gelu_out), a.inp.as<T>(), a.weight.as<T>(), opt<T>(a.bias), n, k, m,
                       stream_);
    });
    MS_CUDA_LAUNCH_CHECK();
#else
    dispatch(D, [&]<class T>(T) {
        cuda::matmul_forward(a.out.as<T>(), a.inp.as<T>(), a.weight.as<T>(), opt<T>(a.bias), n, k, m, stream_);
    });
    MS_CUDA_LAUNCH_CHECK();
    // unfused, as the CPU backend: GELU of the rounded pre-activation (backend.h)
    if (a.gelu_out.defined()) gelu_forward({.inp = a.out, .out = a.gelu_out});
#endif
}

void CudaBackend::matmul_backward(const MatmulBackwardArgs& a) {
    const int64_t K = a.inp.dim(-1);
    MS_CHECK(K > 0, "matmul: inp has no columns");
    MS_CHECK(a.weight.dim(-1) == K, "matmul: weight is (.., {}) but inp is (.., {})", a.weight.dim(-1), K);
    const int64_t N = a.inp.numel() / K, M = a.weight.numel() / K;
    check_numel(a.dout, N * M, "matmul", "dout (N * M)");
    check_numel(a.dweight, M * K, "matmul", "dweight (M * K)");
    if (a.dinp.defined()) check_numel(a.dinp, N * K, "matmul", "dinp (N * K)");
    if (a.dbias.defined()) check_numel(a.dbias, M, "matmul", "dbias (M)");
    const DType D = activation_dtype(a.dout, "matmul", "dout");
    check_d(a.inp, D, "matmul", "inp");
    check_d(a.weight, D, "matmul", "weight");
    check_d(a.dinp, D, "matmul", "dinp");
    const DType G = grad_dtype(a.dweight, D, "matmul", "dweight");
    check_grad(a.dbias, G, "matmul", "dbias", "dweight");
    if (a.gelu_inp.defined()) {
        MS_CHECK(a.dinp.defined() && a.accumulate == Accumulate::kOverwrite,
                 "matmul: gelu_inp needs dinp with accumulate = kOverwrite (dinp = gelu'(gelu_inp) * (dout @ weight))");
        check_numel(a.gelu_inp, N * K, "matmul", "gelu_inp (N * K)");
        check_d(a.gelu_inp, D, "matmul", "gelu_inp");
    }
    const int n = to_int(N, "matmul", "N"), k = to_int(K, "matmul", "K"), m = to_int(M, "matmul", "M");
#if defined(MS_CUDA_RUNTIME)
    // cuBLASLt: gelu' in the dinp product's epilogue, dbias in the dweight product's (cublas_gemm.h)
    dispatch_grad(D, G, [&]<class T, class Grad>(T, Grad) {
        gemm_->backward(opt<T>(a.dinp), a.dweight.as<Grad>(), opt<Grad>(a.dbias), a.dout.as<T>(), a.inp.as<T>(),
                        a.weight.as<T>(), opt<T>(a.gelu_inp), n, k, m, dinp_write(a.accumulate), stream_);
    });
    MS_CUDA_LAUNCH_CHECK();
#else
    dispatch_grad(D, G, [&]<class T, class Grad>(T, Grad) {
        cuda::matmul_backward<T, Grad>(opt<T>(a.dinp), a.dweight.as<Grad>(), opt<Grad>(a.dbias), a.dout.as<T>(),
                                       a.inp.as<T>(), a.weight.as<T>(), n, k, m, dinp_write(a.accumulate), stream_);
    });
    MS_CUDA_LAUNCH_CHECK();
    // unfused, as the CPU backend: gelu' applied to the rounded product (backend.h)
    if (a.gelu_inp.defined()) gelu_backward({.inp = a.gelu_inp, .dout = a.dinp, .dinp = a.dinp});
#endif
}

namespace {

struct AttentionDims {
    int B, T, NH, NKV, HS;
};

AttentionDims check_attention(const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t NH, int64_t NKV) {
    const int64_t kv = attention_kv_heads(NH, NKV);
    MS_CHECK(qkv.ndim == 3, "attention: qkv must be (B, T, (NH + 2*NKV)*HS), got {} dims", qkv.ndim);
    MS_CHECK(qkv.dim(2) % (NH + 2 * kv) == 0, "attention: qkv width {} is not a multiple of NH({}) + 2 * NKV({})",
             qkv.dim(2), NH, kv);
    const int64_t B = qkv.dim(0), T = qkv.dim(1), HS = qkv.dim(2) / (NH + 2 * kv);
    MS_CHECK(HS <= cuda::kAttentionMaxHS, "attention: head size {} exceeds the CUDA kernels' maximum of {}", HS,
             cuda::kAttentionMaxHS);
    check_numel(out, B * T * NH * HS, "attention", "out/dout (B * T * C)");
    check_numel(lse, B * NH * T, "attention", "lse (B * NH * T)");
    check_fp32(lse, "attention", "lse", "statistic");
    return {to_int(B, "attention", "B"), to_int(T, "attention", "T"), to_int(NH, "attention", "NH"),
            static_cast<int>(kv), static_cast<int>(HS)};
}

// The launchers' kernels for the config's debug.cuda_attention and debug.cuda_attention_bwd.
cuda::AttentionKernels attention_kernels(const CudaDebugOptions& o) {
    if (o.attention == CudaAttention::kScalar) return cuda::AttentionKernels::kScalar;
    return o.attention_backward == CudaAttentionBackward::kSplit ? cuda::AttentionKernels::kTensorCoresSplitBackward
                                                                 : cuda::AttentionKernels::kTensorCores;
}

}  // namespace

void CudaBackend::attention_forward(const AttentionForwardArgs& a) {
    const AttentionDims d = check_attention(a.qkv, a.out, a.lse, a.NH, a.NKV);
    const DType D = activation_dtype(a.qkv, "attention", "qkv");
    check_d(a.out, D, "attention", "out");
    dispatch(D, [&]<class T>(T) {
        cuda::attention_forward(a.out.as<T>(), a.lse.f32(), a.qkv.as<T>(), d.B, d.T, d.NH, d.NKV, d.HS, stream_,
                                attention_kernels(debug_));
    });
    MS_CUDA_LAUNCH_CHECK();
}

void CudaBackend::attention_backward(const AttentionBackwardArgs& a) {
    const AttentionDims d = check_attention(a.qkv, a.dout, a.lse, a.NH, a.NKV);
    check_numel(a.out, a.dout.numel(), "attention", "out (B * T * C)");
    check_numel(a.dqkv, a.qkv.numel(), "attention", "dqkv (B * T * (NH + 2*NKV)*HS)");
    const DType D = activation_dtype(a.qkv, "attention", "qkv");
    check_d(a.dout, D, "attention", "dout");
    check_d(a.out, D, "attention", "out");
    check_d(a.dqkv, D, "attention", "dqkv");
    dispatch(D, [&]<class T>(T) {
        const cuda::AttentionKernels kernels = attention_kernels(debug_);
        const size_t bytes = cuda::attention_backward_scratch_bytes<T>(d.B, d.T, d.NH, d.HS, kernels);
        void* scratch = bytes > 0 ? attention_scratch_.reserve(bytes) : nullptr;
        cuda::attention_backward(a.dqkv.as<T>(), a.dout.as<T>(), a.qkv.as<T>(), a.out.as<T>(), a.lse.f32(), scratch,
                                 d.B, d.T, d.NH, d.NKV, d.HS, stream_, kernels);
    });
    MS_CUDA_LAUNCH_CHECK();
}

void CudaBackend::gelu_forward(const GeluForwardArgs& a) {
    const int64_t n = a.inp.numel();
    check_numel(a.out, n, "gelu", "out (n = inp's)");
    MS_CHECK(a.out.data != a.inp.data, "gelu: out must not alias inp (the backward reads inp)");
    const DType D = activation_dtype(a.inp, "gelu", "inp");
    check_d(a.out, D, "gelu", "out");
    dispatch(D, [&]<class T>(T) { cuda::gelu_forward(a.out.as<T>(), a.inp.as<T>(), n, stream_); });
    MS_CUDA_LAUNCH_CHECK();
}

void CudaBackend::gelu_backward(const GeluBackwardArgs& a) {
    const int64_t n = a.inp.numel();
    check_numel(a.dout, n, "gelu", "dout (n = inp's)");
    check_numel(a.dinp, n, "gelu", "dinp (n = inp's)");
    const DType D = activation_dtype(a.inp, "gelu", "inp");
    check_d(a.dout, D, "gelu", "dout");
    check_d(a.dinp, D, "gelu", "dinp");
    dispatch(D, [&]<class T>(T) { cuda::gelu_backward(a.dinp.as<T>(), a.inp.as<T>(), a.dout.as<T>(), n, stream_); });
    MS_CUDA_LAUNCH_CHECK();
}

void CudaBackend::residual_forward(const ResidualForwardArgs& a) {
    const int64_t n = a.a.numel();
    check_numel(a.b, n, "residual", "b (n = a's)");
    check_numel(a.out, n, "residual", "out (n = a's)");
    int64_t M = 0;
    if (a.bias.defined()) {
        M = a.bias.numel();
        MS_CHECK(M > 0 && n % M == 0, "residual: bias has {} elements, which does not divide n = {}", M, n);
    }
    const DType D = activation_dtype(a.a, "residual", "a");
    check_d(a.b, D, "residual", "b");
    check_d(a.out, D, "residual", "out");
    check_d(a.bias, D, "residual", "bias");
    dispatch(D, [&]<class T>(T) {
        cuda::residual_forward(a.out.as<T>(), a.a.as<T>(), a.b.as<T>(), opt<T>(a.bias), n, M, stream_);
    });
    MS_CUDA_LAUNCH_CHECK();
}

// (N, Vp_local) of the logits, with the masked-vocabulary bound checked (both cross-entropy ops).
static std::pair<int64_t, int64_t> cross_entropy_shape(const Tensor& logits, int64_t vocab_valid_local) {
    const int64_t Vp = logits.dim(-1);
    MS_CHECK(Vp > 0, "cross_entropy: logits have no columns");
    MS_CHECK(vocab_valid_local >= 0 && vocab_valid_local <= Vp,
             "cross_entropy: vocab_valid_local({}) is outside [0, Vp_local({})]", vocab_valid_local, Vp);
    return {logits.numel() / Vp, Vp};
}

void CudaBackend::cross_entropy_forward(const CrossEntropyForwardArgs& a) {
    // plain variables, not a structured binding: clang before 16 cannot capture one in the dispatch lambda
    const std::pair<int64_t, int64_t> shape = cross_entropy_shape(a.logits, a.vocab_valid_local);
    const int64_t N = shape.first, Vp = shape.second;
    check_numel(a.row_max, N, "cross_entropy", "row_max (N)");
    const bool sum_phase = a.phase != CrossEntropyPhase::kMax;  // kSumExp and kMaxSumExp write the sums
    const cuda::CrossEntropyPhase phase = a.phase == CrossEntropyPhase::kMax      ? cuda::CrossEntropyPhase::kMax
                                          : a.phase == CrossEntropyPhase::kSumExp ? cuda::CrossEntropyPhase::kSumExp
                                                                                  : cuda::CrossEntropyPhase::kMaxSumExp;
    if (sum_phase) {
        check_numel(a.targets, N, "cross_entropy", "targets (N)");
        check_numel(a.sum_exp, N, "cross_entropy", "sum_exp (N)");
        check_numel(a.target_logit, N, "cross_entropy", "target_logit (N)");
        check_fp32(a.sum_exp, "cross_entropy", "sum_exp", "statistic");
        check_fp32(a.target_logit, "cross_entropy", "target_logit", "statistic");
    }
    check_fp32(a.row_max, "cross_entropy", "row_max", "statistic");
    const DType D = activation_dtype(a.logits, "cross_entropy", "logits");
    dispatch(D, [&]<class T>(T) {
        cuda::cross_entropy_forward(a.row_max.f32(), sum_phase ? a.sum_exp.f32() : nullptr,
                                    sum_phase ? a.target_logit.f32() : nullptr, a.logits.as<T>(),
                                    sum_phase ? a.targets.i32() : nullptr, to_int(N, "cross_entropy", "N"),
                                    to_int(Vp, "cross_entropy", "Vp_local"), a.vocab_start,
                                    static_cast<int>(a.vocab_valid_local), phase, stream_);
    });
    MS_CUDA_LAUNCH_CHECK();
}

void CudaBackend::cross_entropy_backward(const CrossEntropyBackwardArgs& a) {
    // plain variables, not a structured binding: clang before 16 cannot capture one in the dispatch lambda
    const std::pair<int64_t, int64_t> shape = cross_entropy_shape(a.logits, a.vocab_valid_local);
    const int64_t N = shape.first, Vp = shape.second;
    check_numel(a.targets, N, "cross_entropy", "targets (N)");
    check_numel(a.row_max, N, "cross_entropy", "row_max (N)");
    check_numel(a.sum_exp, N, "cross_entropy", "sum_exp (N)");
    check_numel(a.dloss, N, "cross_entropy", "dloss (N)");
    check_fp32(a.row_max, "cross_entropy", "row_max", "statistic");
    check_fp32(a.sum_exp, "cross_entropy", "sum_exp", "statistic");
    check_fp32(a.dloss, "cross_entropy", "dloss", "statistic");
    const DType D = activation_dtype(a.logits, "cross_entropy", "logits");
    dispatch(D, [&]<class T>(T) {
        cuda::cross_entropy_backward(a.logits.as<T>(), a.targets.i32(), a.row_max.f32(), a.sum_exp.f32(), a.dloss.f32(),
                                     to_int(N, "cross_entropy", "N"), to_int(Vp, "cross_entropy", "Vp_local"),
                                     a.vocab_start, static_cast<int>(a.vocab_valid_local), stream_);
    });
    MS_CUDA_LAUNCH_CHECK();
}

// Chunk by chunk over the rows (backend.h, kernels/lm_head_loss.cu): the chunk's logits by one GEMM into the scratch,
// cross_entropy.cu's kMaxSumExp, the losses, then with dloss the cross-entropy backward in place and the matmul
// backward (dlnf rows overwritten, dwte +=). Scratch: row_max, sum_exp, target_logit (3R fp32) padded to 256 bytes,
// then the (R, Vp) logits in D (lm_head_loss_scratch_elems).
void CudaBackend::lm_head_loss(const LmHeadLossArgs& a) {
    const char* op = "lm_head_loss";
    const DType D = activation_dtype(a.lnf, op, "lnf");
    const int64_t C = a.lnf.dim(-1);
    MS_CHECK(C > 0 && a.wte.dim(-1) == C, "{}: wte is (.., {}) but lnf is (.., {})", op, a.wte.dim(-1), C);
    const int64_t N = a.lnf.numel() / C, Vp = a.wte.numel() / C;
    MS_CHECK(a.vocab_valid_local >= 0 && a.vocab_valid_local <= Vp,
             "{}: vocab_valid_local({}) is outside [0, Vp_local({})]", op, a.vocab_valid_local, Vp);
    MS_CHECK(a.vocab_start == 0,
             "{}: vocab_start = {}: the fused head is for a tensor-parallel group of one (vocab_start 0); a "
             "vocab-parallel head runs the unfused ops, which all-reduce between the cross-entropy phases",
             op, a.vocab_start);
    MS_CHECK(a.chunk_rows >= 0, "{}: chunk_rows = {} is negative", op, a.chunk_rows);
    check_numel(a.targets, N, op, "targets (N)");
    check_numel(a.losses, N, op, "losses (N)");
    check_d(a.wte, D, op, "wte");
    check_fp32(a.losses, op, "losses", "statistic");
    const bool backward = a.dloss.defined();
    if (backward) {
        check_numel(a.dloss, N, op, "dloss (N)");
        MS_CHECK(a.dlnf.defined() && a.dwte.defined(), "{}: with dloss, dlnf and dwte are required", op);
        check_numel(a.dlnf, N * C, op, "dlnf (N * C)");
        check_numel(a.dwte, Vp * C, op, "dwte (Vp_local * C)");
        check_fp32(a.dloss, op, "dloss", "statistic");
        check_d(a.dlnf, D, op, "dlnf");
    }
    // the gradients' dtype (fp32 when there is no backward: dwte unused)
    const DType G = backward ? grad_dtype(a.dwte, D, op, "dwte") : DType::kF32;
    const int64_t R = a.chunk_rows > 0 ? std::min(a.chunk_rows, std::max<int64_t>(N, 1))
                                       : lm_head_loss_chunk_rows(BackendKind::kCUDA, D, N, Vp);
    const int64_t need = lm_head_loss_scratch_elems(BackendKind::kCUDA, D, N, Vp, R);
    MS_CHECK(a.scratch.numel() >= need && a.scratch.dtype == DType::kF32,
             "{}: scratch is {} {} elements, but chunks of {} rows need {} fp32 (lm_head_loss_scratch_elems)", op,
             a.scratch.numel(), dtype_name(a.scratch.dtype), R, need);
    const int c = to_int(C, op, "C"), vp = to_int(Vp, op, "Vp_local");
    to_int(N, op, "N");
    to_int(R * Vp, op, "chunk rows * Vp_local");
    const int valid = static_cast<int>(a.vocab_valid_local);
    float* row_max = a.scratch.f32();
    float* sum_exp = row_max + R;
    float* target_logit = sum_exp + R;
    void* logits_mem = a.scratch.f32() + (3 * R + 63) / 64 * 64;
    dispatch_grad(D, G, [&]<class T, class Grad>(T, Grad) {
        T* logits = static_cast<T*>(logits_mem);
        const T* wte = a.wte.as<T>();
        for (int64_t r0 = 0; r0 < N; r0 += R) {
            const int rows = static_cast<int>(std::min(R, N - r0));
            const T* x = a.lnf.as<T>() + r0 * C;
#if defined(MS_CUDA_RUNTIME)
            gemm_->forward(logits, static_cast<T*>(nullptr), x, wte, static_cast<const T*>(nullptr), rows, c, vp,
                           stream_);
#else
            cuda::matmul_forward(logits, x, wte, nullptr, rows, c, vp, stream_);
#endif
            cuda::cross_entropy_forward(row_max, sum_exp, target_logit, static_cast<const T*>(logits),
                                        a.targets.i32() + r0, rows, vp, 0, valid, cuda::CrossEntropyPhase::kMaxSumExp,
                                        stream_);
            cuda::lm_head_loss_forward(a.losses.f32() + r0, row_max, sum_exp, target_logit, rows, stream_);
            if (!backward) continue;
            cuda::cross_entropy_backward(logits, a.targets.i32() + r0, row_max, sum_exp, a.dloss.f32() + r0, rows, vp,
                                         0, valid, stream_);
            T* dx = a.dlnf.as<T>() + r0 * C;
#if defined(MS_CUDA_RUNTIME)
            gemm_->backward(dx, a.dwte.as<Grad>(), nullptr, static_cast<const T*>(logits), x, wte,
                            static_cast<const T*>(nullptr), rows, c, vp, cuda::DinpWrite::kOverwrite, stream_);
#else
            cuda::matmul_backward<T, Grad>(dx, a.dwte.as<Grad>(), nullptr, logits, x, wte, rows, c, vp,
                                           cuda::DinpWrite::kOverwrite, stream_);
#endif
        }
    });
    MS_CUDA_LAUNCH_CHECK();
}

void CudaBackend::adamw(const AdamWArgs& a) {
    const int64_t n = a.param.numel();
    check_numel(a.grad, n, "adamw", "grad (n = param's)");
    check_numel(a.m, n, "adamw", "m (n = param's)");
    check_numel(a.v, n, "adamw", "v (n = param's)");
    MS_CHECK(a.step >= 1, "adamw: step is {}, must be >= 1 (bias corrections divide by 1 - beta^step)", a.step);
    check_fp32(a.param, "adamw", "param", "master weight");
    check_fp32(a.m, "adamw", "m", "optimizer state");
    check_fp32(a.v, "adamw", "v", "optimizer state");
    const cuda::AdamWHyper h{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_scale, a.step};
    // grad: fp32, bf16 or fp16 (16-bit gradients), widened on load
    dispatch(activation_dtype(a.grad, "adamw", "grad"), [&]<class G>(G) {
        if (!a.param_copy.defined()) {
            cuda::adamw<float, G>(a.param.f32(), a.m.f32(), a.v.f32(), a.grad.as<G>(), nullptr, n, h, stream_);
        } else {
            check_numel(a.param_copy, n, "adamw", "param_copy (n = param's)");
            dispatch(activation_dtype(a.param_copy, "adamw", "param_copy"), [&]<class T>(T) {
                cuda::adamw(a.param.f32(), a.m.f32(), a.v.f32(), a.grad.as<G>(), a.param_copy.as<T>(), n, h, stream_);
            });
        }
    });
    MS_CUDA_LAUNCH_CHECK();
}

// ---- the Llama ops: RMSNorm, rotary embeddings, SwiGLU ----

void CudaBackend::rmsnorm_forward(const RmsNormForwardArgs& a) {
    const int64_t C = a.inp.dim(-1);
    MS_CHECK(C > 0, "rmsnorm: inp has no columns");
    const int64_t N = a.inp.numel() / C;
    check_numel(a.out, N * C, "rmsnorm", "out (N * C)");
    check_numel(a.weight, C, "rmsnorm", "weight (C)");
    check_numel(a.rstd, N, "rmsnorm", "rstd (N)");
    const DType D = activation_dtype(a.inp, "rmsnorm", "inp");
    check_d(a.out, D, "rmsnorm", "out");
    check_d(a.weight, D, "rmsnorm", "weight");
    check_fp32(a.rstd, "rmsnorm", "rstd", "statistic");
    dispatch(D, [&]<class T>(T) {
        cuda::rmsnorm_forward(a.out.as<T>(), a.rstd.f32(), a.inp.as<T>(), a.weight.as<T>(), to_int(N, "rmsnorm", "N"),
                              to_int(C, "rmsnorm", "C"), a.eps, stream_);
    });
    MS_CUDA_LAUNCH_CHECK();
}

void CudaBackend::rmsnorm_backward(const RmsNormBackwardArgs& a) {
    const int64_t C = a.inp.dim(-1);
    MS_CHECK(C > 0, "rmsnorm: inp has no columns");
    const int64_t N = a.inp.numel() / C;
    check_numel(a.dout, N * C, "rmsnorm", "dout (N * C)");
    check_numel(a.dinp, N * C, "rmsnorm", "dinp (N * C)");
    check_numel(a.weight, C, "rmsnorm", "weight (C)");
    check_numel(a.dweight, C, "rmsnorm", "dweight (C)");
    check_numel(a.rstd, N, "rmsnorm", "rstd (N)");
    const DType D = activation_dtype(a.inp, "rmsnorm", "inp");
    check_d(a.dout, D, "rmsnorm", "dout");
    check_d(a.dinp, D, "rmsnorm", "dinp");
    check_d(a.weight, D, "rmsnorm", "weight");
    check_fp32(a.rstd, "rmsnorm", "rstd", "statistic");
    const DType G = grad_dtype(a.dweight, D, "rmsnorm", "dweight");
    const int n = to_int(N, "rmsnorm", "N"), c = to_int(C, "rmsnorm", "C");
    float* scratch =
        static_cast<float*>(rmsnorm_scratch_.reserve(cuda::rmsnorm_backward_scratch_floats(n, c) * sizeof(float)));
    dispatch_grad(D, G, [&]<class T, class Grad>(T, Grad) {
        cuda::rmsnorm_backward<T, Grad>(a.dinp.as<T>(), a.dweight.as<Grad>(), scratch, a.dout.as<T>(), a.inp.as<T>(),
                                        a.weight.as<T>(), a.rstd.f32(), n, c, dinp_write(a.accumulate), stream_);
    });
    MS_CUDA_LAUNCH_CHECK();
}

void CudaBackend::rope(const RopeArgs& a) {
    const RopeDims d = rope_dims(a);
    const DType D = activation_dtype(a.qkv, "rope", "qkv");
    const cuda::RopeRotation rotation =
        a.direction == RopeDirection::kInverse ? cuda::RopeRotation::kInverse : cuda::RopeRotation::kForward;
    dispatch(D, [&]<class T>(T) {
        cuda::rope(a.qkv.as<T>(), a.table.f32(), opt<int32_t>(a.positions), d.N, to_int(d.row, "rope", "qkv row"),
                   to_int(d.rotated, "rope", "(NH + NKV) * HS"), to_int(d.HS, "rope", "HS"),
                   a.positions.defined() ? 0 : to_int(a.T, "rope", "T"), rotation, stream_);
    });
    MS_CUDA_LAUNCH_CHECK();
}

namespace {

// F of a SwiGLU call: inp (N, 2F), `other` (N, F).
int64_t swiglu_width(const Tensor& inp, const Tensor& other, const char* what) {
    const int64_t width = inp.dim(-1);
    MS_CHECK(width > 0 && width % 2 == 0,
             "swiglu: inp rows have {} columns; a row is [gate (F) | up (F)], so the width must be even and positive",
             width);
    check_numel(other, inp.numel() / 2, "swiglu", what);
    return width / 2;
}

}  // namespace

void CudaBackend::swiglu_forward(const SwiGluForwardArgs& a) {
    const int64_t F = swiglu_width(a.inp, a.out, "out (N * F)");
    const DType D = activation_dtype(a.inp, "swiglu", "inp");
    check_d(a.out, D, "swiglu", "out");
    dispatch(D, [&]<class T>(T) {
        cuda::swiglu_forward(a.out.as<T>(), a.inp.as<T>(), a.out.numel() / F, to_int(F, "swiglu", "F"), stream_);
    });
    MS_CUDA_LAUNCH_CHECK();
}

void CudaBackend::swiglu_backward(const SwiGluBackwardArgs& a) {
    const int64_t F = swiglu_width(a.inp, a.dout, "dout (N * F)");
    check_numel(a.dinp, a.inp.numel(), "swiglu", "dinp (N * 2F)");
    const DType D = activation_dtype(a.inp, "swiglu", "inp");
    check_d(a.dout, D, "swiglu", "dout");
    check_d(a.dinp, D, "swiglu", "dinp");
    dispatch(D, [&]<class T>(T) {
        cuda::swiglu_backward(a.dinp.as<T>(), a.inp.as<T>(), a.dout.as<T>(), a.dout.numel() / F,
                              to_int(F, "swiglu", "F"), stream_);
    });
    MS_CUDA_LAUNCH_CHECK();
}

namespace {

// The shape of one ring-attention block (backend.h, AttentionBlockForwardArgs), checked against qkv, kv and the
// (B, T, C) tensor `out` (acc or dout) and lse.
cuda::AttentionBlockShape check_attention_block(const char* op, const Tensor& qkv, const Tensor& kv, const Tensor& out,
                                                const Tensor& lse, int64_t kv_column, int64_t q_begin, int64_t q_rows,
                                                int64_t kv_rows, bool causal, int64_t NH, int64_t NKV) {
    const int64_t nkv = attention_kv_heads(NH, NKV);
    MS_CHECK(qkv.ndim == 3 && kv.ndim == 3, "{}: qkv and kv must be 3-D (B, T, width), got {} and {} dims", op,
             qkv.ndim, kv.ndim);
    MS_CHECK(qkv.dim(2) % (NH + 2 * nkv) == 0, "{}: qkv width {} is not a multiple of NH({}) + 2 * NKV({})", op,
             qkv.dim(2), NH, nkv);
    const int64_t B = qkv.dim(0), T = qkv.dim(1), Tk = kv.dim(1), HS = qkv.dim(2) / (NH + 2 * nkv), Wkv = kv.dim(2);
    MS_CHECK(HS <= cuda::kAttentionMaxHS, "{}: head size {} exceeds the CUDA kernels' maximum of {}", op, HS,
             cuda::kAttentionMaxHS);
    MS_CHECK(kv.dim(0) == B, "{}: kv has batch {}, qkv {}", op, kv.dim(0), B);
    MS_CHECK(kv_column >= 0 && kv_column + 2 * nkv * HS <= Wkv,
             "{}: keys and values at column {} need {} columns of kv's {}", op, kv_column, 2 * nkv * HS, Wkv);
    MS_CHECK(q_begin >= 0 && q_rows >= 0 && q_begin + q_rows <= T && kv_rows >= 1 && kv_rows <= Tk,
             "{}: query rows [{}, {}) of {} and key rows [0, {}) of {}", op, q_begin, q_begin + q_rows, T, kv_rows, Tk);
    MS_CHECK(!causal || (q_begin == 0 && kv_rows == q_rows),
             "{}: a causal block is the rank's own: q_begin {} must be 0 and kv_rows {} equal q_rows {}", op, q_begin,
             kv_rows, q_rows);
    check_numel(out, B * T * NH * HS, op, "acc/out/dout (B * T * C)");
    check_numel(lse, B * NH * T, op, "lse (B * NH * T)");
    check_fp32(lse, op, "lse", "statistic");
    return {.B = to_int(B, op, "B"),
            .T = to_int(T, op, "T"),
            .Tk = to_int(Tk, op, "Tk"),
            .Wkv = to_int(Wkv, op, "kv width"),
            .kv_column = to_int(kv_column, op, "kv_column"),
            .q_begin = to_int(q_begin, op, "q_begin"),
            .q_rows = to_int(q_rows, op, "q_rows"),
            .kv_rows = to_int(kv_rows, op, "kv_rows"),
            .NH = to_int(NH, op, "NH"),
            .NKV = static_cast<int>(nkv),
            .HS = static_cast<int>(HS),
            .causal = causal};
}

}  // namespace

void CudaBackend::attention_block_forward(const AttentionBlockForwardArgs& a) {
    const char* op = "attention_block_forward";
    const cuda::AttentionBlockShape s = check_attention_block(op, a.qkv, a.kv, a.acc, a.lse, a.kv_column, a.q_begin,
                                                              a.q_rows, a.kv_rows, a.causal, a.NH, a.NKV);
    const DType D = activation_dtype(a.qkv, op, "qkv");
    check_d(a.kv, D, op, "kv");
    check_fp32(a.acc, op, "acc", "running output");
    dispatch(D, [&]<class T>(T) {
        cuda::attention_block_forward(a.acc.f32(), a.lse.f32(), a.qkv.as<T>(), a.kv.as<T>(), s, a.merge, stream_);
    });
    MS_CUDA_LAUNCH_CHECK();
}

void CudaBackend::attention_block_backward(const AttentionBlockBackwardArgs& a) {
    const char* op = "attention_block_backward";
    const cuda::AttentionBlockShape s = check_attention_block(op, a.qkv, a.kv, a.dout, a.lse, a.kv_column, a.q_begin,
                                                              a.q_rows, a.kv_rows, a.causal, a.NH, a.NKV);
    check_numel(a.out, a.dout.numel(), op, "out (B * T * C)");
    check_numel(a.dq, a.dout.numel(), op, "dq (B * T * C)");
    check_numel(a.dkv, int64_t{s.B} * s.Tk * 2 * s.NKV * s.HS, op, "dkv (B * Tk * 2*NKV*HS)");
    const DType D = activation_dtype(a.qkv, op, "qkv");
    check_d(a.kv, D, op, "kv");
    check_d(a.dout, D, op, "dout");
    check_d(a.out, D, op, "out");
    check_fp32(a.dq, op, "dq", "fp32 accumulator");
    check_fp32(a.dkv, op, "dkv", "fp32 accumulator");
    dispatch(D, [&]<class T>(T) {
        cuda::attention_block_backward(a.dq.f32(), a.dkv.f32(), a.dout.as<T>(), a.qkv.as<T>(), a.out.as<T>(),
                                       a.lse.f32(), a.kv.as<T>(), s, stream_);
    });
    MS_CUDA_LAUNCH_CHECK();
}

void CudaBackend::copy_columns(const CopyColumnsArgs& a) {
    const char* op = "copy_columns";
    check_copy_columns(a);
    dispatch(activation_dtype(a.src, op, "src"), [&]<class S>(S) {
        dispatch(activation_dtype(a.dst, op, "dst"), [&]<class D>(D) {
            cuda::copy_columns(a.dst.as<D>(), a.src.as<S>(), a.src.dim(0), a.src.dim(1), a.dst.dim(1), a.src_column,
                               a.dst_column, a.cols, stream_);
        });
    });
    MS_CUDA_LAUNCH_CHECK();
}

std::unique_ptr<Backend> make_backend_with_cuda(const BackendOptions& options) {
    if (options.kind == BackendKind::kCUDA) return std::make_unique<CudaBackend>(options);
    return make_backend(options);
}

void install_cuda_backend() {
    register_cuda_backend(CudaBackend::emulated() ? "cuda-emulated" : "cuda",
                          [](const BackendOptions& options) -> std::unique_ptr<Backend> {
                              return std::make_unique<CudaBackend>(options);
                          });
}

}  // namespace ms
