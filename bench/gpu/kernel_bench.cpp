// kernel_bench.cpp: first GPU numbers for the hand-written kernels through CudaBackend (issue #4's bench/gpu, part):
// achieved bandwidth of the memory-bound kernels (LayerNorm forward, GELU forward, AdamW) against a device-to-device
// copy of the same bytes, and causal attention forward + backward TFLOP/s at GPT-2 124M shapes (B=4, T=1024,
// NH=12, HS=64). Times are medians of cudaEvent-timed repeats after a warm-up. The kernels are the emulation-first
// versions (correct, not tuned), so these numbers are a baseline, not the goals.
//   build-gpu/gpu_kernel_bench        (built only with MS_ENABLE_CUDA and a toolkit)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "engine/backends/cuda/cuda_backend.h"

namespace {

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));                   \
            std::exit(1);                                                                          \
        }                                                                                          \
    } while (0)

float* device_floats(size_t n, float value) {
    float* p = nullptr;
    CHECK(cudaMalloc(&p, n * sizeof(float)));
    std::vector<float> h(n, value);
    for (size_t i = 0; i < n; ++i) h[i] = value * (1.0f + static_cast<float>(i % 97) / 97.0f);
    CHECK(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    return p;
}

// median milliseconds of fn over `repeats` runs (after 3 warm-ups), synchronising the backend around each run
double time_ms(ms::Backend& be, const std::function<void()>& fn, int repeats = 20) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 3; ++i) fn();
    be.synchronize();
    std::vector<float> t;
    for (int i = 0; i < repeats; ++i) {
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaEventRecord(a));
        fn();
        be.synchronize();
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

}  // namespace

int main() {
    using ms::Tensor;
    cudaDeviceProp prop{};
    CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s\n", prop.name);
    ms::BackendOptions o;
    o.kind = ms::BackendKind::kCUDA;
    auto be = ms::make_backend_with_cuda(o);

    const int64_t B = 4, T = 1024, C = 768, NH = 12, N = B * T;
    // copy reference: a device-to-device copy of 64 MiB
    const size_t copy_n = 16u << 20;
    float* src = device_floats(copy_n, 1.0f);
    float* dst = device_floats(copy_n, 0.0f);
    const double copy_ms = time_ms(*be, [&] { CHECK(cudaMemcpy(dst, src, copy_n * 4, cudaMemcpyDeviceToDevice)); });
    const double copy_gbs = 2.0 * copy_n * 4 / (copy_ms * 1e6);
    std::printf("%-28s %9.3f ms %8.1f GB/s\n", "copy (d2d, 64 MiB)", copy_ms, copy_gbs);

    auto report = [&](const char* name, double ms, double bytes) {
        const double gbs = bytes / (ms * 1e6);
        std::printf("%-28s %9.3f ms %8.1f GB/s  %5.1f%% of copy\n", name, ms, gbs, 100.0 * gbs / copy_gbs);
    };
    float* x = device_floats(N * C, 0.5f);
    float* y = device_floats(N * C, 0.0f);
    float* w = device_floats(C, 1.0f);
    float* bias = device_floats(C, 0.0f);
    float* mean = device_floats(N, 0.0f);
    float* rstd = device_floats(N, 0.0f);
    report("layernorm forward (N=4096,C=768)",
           time_ms(*be, [&] {
               be->layernorm_forward({Tensor::f32(x, {N, C}), Tensor::f32(w, {C}), Tensor::f32(bias, {C}),
                                      Tensor::f32(y, {N, C}), Tensor::f32(mean, {N}), Tensor::f32(rstd, {N}), 1e-5f});
           }),
           2.0 * N * C * 4);
    float* h = device_floats(N * 4 * C, 0.5f);
    float* hg = device_floats(N * 4 * C, 0.0f);
    report("gelu forward (N*4C)", time_ms(*be, [&] {
               be->gelu_forward({Tensor::f32(h, {N * 4 * C}), Tensor::f32(hg, {N * 4 * C})});
           }),
           2.0 * N * 4 * C * 4);
    const int64_t P = 124475904;
    float* p = device_floats(P, 0.01f);
    float* g = device_floats(P, 0.001f);
    float* m = device_floats(P, 0.0f);
    float* v = device_floats(P, 0.0f);
    int64_t step = 0;
    report("adamw (124M params)", time_ms(*be, [&] {
               be->adamw({Tensor::f32(p, {P}), Tensor::f32(g, {P}), Tensor::f32(m, {P}), Tensor::f32(v, {P}), 1e-4f,
                          0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, ++step});
           }),
           7.0 * P * 4);  // read p, g, m, v; write p, m, v

    // attention: qkv (B, T, 3C), out (B, T, C), lse (B, NH, T)
    float* qkv = device_floats(N * 3 * C, 0.1f);
    float* out = device_floats(N * C, 0.0f);
    float* lse = device_floats(B * NH * T, 0.0f);
    float* dout = device_floats(N * C, 0.01f);
    float* dqkv = device_floats(N * 3 * C, 0.0f);
    const double fwd_ms = time_ms(*be, [&] {
        be->attention_forward({Tensor::f32(qkv, {B, T, 3 * C}), Tensor::f32(out, {B, T, C}),
                               Tensor::f32(lse, {B, NH, T}), NH});
    });
    const double bwd_ms = time_ms(*be, [&] {
        be->attention_backward({Tensor::f32(dout, {B, T, C}), Tensor::f32(qkv, {B, T, 3 * C}),
                                Tensor::f32(out, {B, T, C}), Tensor::f32(lse, {B, NH, T}),
                                Tensor::f32(dqkv, {B, T, 3 * C}), NH});
    });
    // causal FLOPs (half of the full T x T): forward 2 GEMMs, backward 5 (recompute S, dP, dV, dQ, dK)
    const double HS = static_cast<double>(C) / NH, full = 2.0 * B * NH * double(T) * T * HS;
    const double fwd_flops = 2 * full / 2, bwd_flops = 5 * full / 2;
    std::printf("%-28s %9.3f ms %8.2f TFLOP/s (fp32, causal FLOPs)\n", "attention forward", fwd_ms,
                fwd_flops / (fwd_ms * 1e9));
    std::printf("%-28s %9.3f ms %8.2f TFLOP/s\n", "attention backward", bwd_ms, bwd_flops / (bwd_ms * 1e9));
    std::printf("%-28s %9.3f ms %8.2f TFLOP/s\n", "attention forward+backward", fwd_ms + bwd_ms,
                (fwd_flops + bwd_flops) / ((fwd_ms + bwd_ms) * 1e9));
    return 0;
}
