// gemm_bench.cpp: the Linear layer's GEMMs on a GPU, cuBLASLt with epilogues (CublasGemm's default path) next to the
// cuBLAS v2 path it replaced (GemmEx, the bias as a rank-1 product, dbias as a GEMV: GemmPath::kCublas), in bf16 at
// the GPT-2 124M shapes of one micro-batch (N = B*T = 4096 rows):
//   c_attn (K 768 -> M 2304, bias), attn.c_proj (768 -> 768), mlp.c_fc (768 -> 3072, bias, GELU fused),
//   mlp.c_proj (3072 -> 768, its backward through the GELU), lm head (768 -> 50304, no bias).
// forward: out = inp @ W^T + bias (and gelu_out for c_fc); backward: dinp, dweight += and dbias += (dinp through
// gelu' for mlp.c_proj). TFLOP/s count the GEMMs only (2 N K M forward, 4 N K M backward); the epilogues' and the
// cuBLAS path's extra passes (bias broadcast, GEMV, gelu.cu kernels) are what the comparison is about. Times are
// medians of cudaEvent-timed repeats after warm-ups; the cuBLASLt rows end with the number of plans and fallbacks
// (a fallback row measured cuBLAS, not cuBLASLt: its key printed a line on stderr). Not run by CI (no GPU there).
//   build-gpu/gpu_gemm_bench
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/cublas_gemm.h"
#include "engine/core/half.h"

namespace {

using ms::bf16;
using ms::cuda::CublasGemm;
using ms::cuda::DinpWrite;
using ms::cuda::GemmPath;

// n device values of T, small and varied (products of these stay far from overflow in bf16)
template <class T>
T* device_values(size_t n, float scale) {
    std::vector<T> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = ms::from_float<T>(scale * (static_cast<float>(i % 97) / 97.0f - 0.5f));
    T* p = nullptr;
    MS_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
    MS_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}

// median milliseconds of fn on `stream` over `repeats` runs, after 3 warm-ups (the first builds the plans)
double time_ms(cudaStream_t stream, const std::function<void()>& fn, int repeats = 20) {
    cudaEvent_t a, b;
    MS_CUDA_CHECK(cudaEventCreate(&a));
    MS_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 3; ++i) fn();
    MS_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> ms_each;
    for (int i = 0; i < repeats; ++i) {
        MS_CUDA_CHECK(cudaEventRecord(a, stream));
        fn();
        MS_CUDA_CHECK(cudaEventRecord(b, stream));
        MS_CUDA_CHECK(cudaEventSynchronize(b));
        float t = 0;
        MS_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
        ms_each.push_back(t);
    }
    MS_CUDA_CHECK(cudaEventDestroy(a));
    MS_CUDA_CHECK(cudaEventDestroy(b));
    std::sort(ms_each.begin(), ms_each.end());
    return ms_each[ms_each.size() / 2];
}

struct Shape {
    const char* name;
    int K, M;
    bool bias;
    enum Gelu { kNone, kForward, kBackward } gelu;  // c_fc's forward / c_proj's backward fused with the GELU
};

}  // namespace

int main() {
    constexpr int N = 4096;
    const Shape shapes[] = {{"c_attn", 768, 2304, true, Shape::kNone},
                            {"attn.c_proj", 768, 768, true, Shape::kNone},
                            {"mlp.c_fc + gelu", 768, 3072, true, Shape::kForward},
                            {"mlp.c_proj (gelu')", 3072, 768, true, Shape::kBackward},
                            {"lm head", 768, 50304, false, Shape::kNone}};
    cudaStream_t stream;
    MS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaDeviceProp prop{};
    MS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("gemm_bench on %s, bf16, N = %d: name | K x M | path | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s\n",
                prop.name, N);
    for (GemmPath path : {GemmPath::kLt, GemmPath::kCublas}) {
        CublasGemm gemm(ms::CudaDebugOptions{}, path);  // fp32 products in fp32, GELU in the epilogues
        for (const Shape& s : shapes) {
            const size_t NK = static_cast<size_t>(N) * s.K, NM = static_cast<size_t>(N) * s.M;
            const size_t MK = static_cast<size_t>(s.M) * s.K;
            bf16 *inp = device_values<bf16>(NK, 1.0f), *weight = device_values<bf16>(MK, 0.1f);
            bf16* bias = s.bias ? device_values<bf16>(s.M, 0.1f) : nullptr;
            bf16 *out = device_values<bf16>(NM, 0.0f), *dout = device_values<bf16>(NM, 0.01f);
            bf16* gelu_out = s.gelu == Shape::kForward ? device_values<bf16>(NM, 0.0f) : nullptr;
            bf16* gelu_inp = s.gelu == Shape::kBackward ? device_values<bf16>(NK, 2.0f) : nullptr;
            bf16* dinp = device_values<bf16>(NK, 0.0f);
            float *dweight = device_values<float>(MK, 0.0f),
                  *dbias = s.bias ? device_values<float>(s.M, 0.0f) : nullptr;
            const double fwd =
                time_ms(stream, [&] { gemm.forward(out, gelu_out, inp, weight, bias, N, s.K, s.M, stream); });
            const double bwd = time_ms(stream, [&] {
                gemm.backward(dinp, dweight, dbias, dout, inp, weight, gelu_inp, N, s.K, s.M, DinpWrite::kOverwrite,
                              stream);
            });
            const double flop = 2.0 * N * s.K * s.M;
            std::printf("%-20s | %4d x %5d | %-7s | %7.3f | %6.1f | %7.3f | %6.1f", s.name, s.K, s.M,
                        path == GemmPath::kLt ? "cublasLt" : "cublas", fwd, flop / (fwd * 1e9), bwd,
                        2 * flop / (bwd * 1e9));
            if (path == GemmPath::kLt) std::printf(" | plans %zu, fallbacks %zu", gemm.plans(), gemm.fallbacks());
            std::printf("\n");
            for (void* p : {static_cast<void*>(inp), static_cast<void*>(weight), static_cast<void*>(bias),
                            static_cast<void*>(out), static_cast<void*>(dout), static_cast<void*>(gelu_out),
                            static_cast<void*>(gelu_inp), static_cast<void*>(dinp), static_cast<void*>(dweight),
                            static_cast<void*>(dbias)}) {
                if (p) MS_CUDA_CHECK(cudaFree(p));
            }
        }
        MS_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    MS_CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}
