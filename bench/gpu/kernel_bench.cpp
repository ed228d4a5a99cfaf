// kernel_bench.cpp: GPU numbers for the hand-written kernels through CudaBackend (the Backend API, so whatever kernel
// the backend dispatches to is what is measured), in fp32 and in bf16 (mixed precision: 16-bit activations, fp32
// statistics, master weights and optimizer state):
//   - achieved bandwidth of the memory-bound kernels (LayerNorm forward and backward, GELU forward and backward, the
//     residual add, the residual add fused into the LayerNorm beside the two ops, AdamW, the fp32 -> bf16 cast) as a
//     percentage of a device-to-device copy's measured bandwidth, at two sizes: GPT-2 124M's step at micro-batch 4 (N =
//     B*T = 4096 rows of C = 768: 6-25 MB tensors, where launch latency still shows) and N = 65536 rows (100-800 MB
//     tensors: the bandwidth goal's size, >= 64 MB); bytes are the least each op must move (every input read once,
//     every output written once), so 100% would be a copy's speed;
//   - causal attention forward + backward TFLOP/s at B=4, T=1024, NH=12, HS=64 in fp32 and bf16 (bf16: the shipped
//     mma.sync kernels of attention_tc.cu), and in bf16 the nvcuda::wmma alternative (bench/gpu/attention_wmma.cu)
//     launched directly, for comparison; and the tensor-core backward's two forms side by side, launched directly
//     (attention_tc.cuh) at B = 4, 8, 16 (NH=12, T=1024, HS=64, bf16): split (a dQ kernel and a dK/dV kernel, 7
//     products) and fused (one kernel, dQ added across key tiles in a fixed order through fp32 scratch, 5 products),
//     both with the same FLOP count (5 products), so the TFLOP/s compare times; and at T = 1024 and 4096 (B * T =
//     16384) the mma.sync forward beside the Hopper wgmma forward in its two schedules (attention_tc_forward_wgmma;
//     sm_90a builds on compute capability 9.0 only) and the fused backward, with forward + backward for each wgmma
//     one;
//   - the Llama ops at the same sizes (RMSNorm forward and backward, RoPE on Q and K with NKV = 4, SwiGLU over
//     F = 2048 forward and backward), as bandwidth;
//   - at GPT-2 124M's micro-batch 16 in bf16: the cross-entropy forward as two pieces beside its one-read form
//     (kMaxSumExp) and its backward, as bandwidth; the embedding's table gradient with uniform and with skewed tokens.
// Times are medians of cudaEvent-timed repeats after a warm-up; each repeat times `inner` back-to-back launches on
// the stream (10 for the memory-bound rows, as in a training step, where nothing waits between kernels) and divides.
// One line per row, "name | dtype | ms | GB/s | % of copy" (or TFLOP/s), parsed by nothing: gpu-check.sh copies the
// output into its summary.
//   build-gpu/gpu_kernel_bench        (built only with MS_ENABLE_CUDA and a toolkit)
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/gpu/attention_wmma.h"
#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/cuda_backend.h"
#include "engine/backends/cuda/kernels/attention_tc.cuh"
#include "engine/backends/rope_table.h"

namespace {

using ms::DType;
using ms::Tensor;

float* device_floats(size_t n, float value) {
    float* p = nullptr;
    MS_CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = value * (1.0f + static_cast<float>(i % 97) / 97.0f);
    MS_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    return p;
}

// n values near `value` in `dtype` on the device (16-bit ones through the backend's cast).
void* device_values(ms::Backend& be, DType dtype, int64_t n, float value) {
    float* f = device_floats(static_cast<size_t>(n), value);
    if (dtype == DType::kF32) return f;
    void* p = nullptr;
    MS_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(n) * ms::dtype_size(dtype)));
    be.cast({Tensor(f, DType::kF32, {n}), Tensor(p, dtype, {n})});
    be.synchronize();
    MS_CUDA_CHECK(cudaFree(f));
    return p;
}

// median milliseconds of one fn() over `repeats` timings of `inner` back-to-back calls (after 3 warm-ups),
// synchronising the backend around each timing
double time_ms(ms::Backend& be, const std::function<void()>& fn, int repeats = 20, int inner = 1) {
    cudaEvent_t a, b;
    MS_CUDA_CHECK(cudaEventCreate(&a));
    MS_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 3; ++i) fn();
    be.synchronize();
    std::vector<float> t;
    for (int i = 0; i < repeats; ++i) {
        MS_CUDA_CHECK(cudaDeviceSynchronize());
        MS_CUDA_CHECK(cudaEventRecord(a));
        for (int j = 0; j < inner; ++j) fn();
        be.synchronize();
        MS_CUDA_CHECK(cudaEventRecord(b));
        MS_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        MS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms / static_cast<float>(inner));
    }
    MS_CUDA_CHECK(cudaEventDestroy(a));
    MS_CUDA_CHECK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

const char* name_of(DType d) { return d == DType::kF32 ? "fp32" : d == DType::kBF16 ? "bf16" : "fp16"; }

}  // namespace

int main() {
    cudaDeviceProp prop{};
    MS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s\n", prop.name);
    ms::BackendOptions o;
    o.kind = ms::BackendKind::kCUDA;
    auto be = ms::make_backend_with_cuda(o);

    const int64_t B = 4, T = 1024, C = 768, NH = 12, N = B * T, H = 4 * C;
    // copy reference: a device-to-device copy of 64 MiB
    constexpr int kInner = 10;  // back-to-back launches per timing of a memory-bound row
    const size_t copy_n = 16u << 20;
    float* src = device_floats(copy_n, 1.0f);
    float* dst = device_floats(copy_n, 0.0f);
    const double copy_ms = time_ms(
        *be, [&] { MS_CUDA_CHECK(cudaMemcpy(dst, src, copy_n * 4, cudaMemcpyDeviceToDevice)); }, 20, kInner);
    const double copy_gbs = 2.0 * copy_n * 4 / (copy_ms * 1e6);
    std::printf("%-46s | %-4s | %8.3f ms | %7.1f GB/s | (the 100%% of the rows below)\n", "copy (d2d, 64 MiB)", "-",
                copy_ms, copy_gbs);
    MS_CUDA_CHECK(cudaFree(src));
    MS_CUDA_CHECK(cudaFree(dst));

    auto report = [&](const std::string& name, DType d, double ms, double bytes) {
        const double gbs = bytes / (ms * 1e6);
        std::printf("%-46s | %-4s | %8.3f ms | %7.1f GB/s | %5.1f%% of copy\n", name.c_str(), name_of(d), ms, gbs,
                    100.0 * gbs / copy_gbs);
        std::fflush(stdout);
    };

    // The memory-bound kernels at the 124M step's rows and at 16x as many (tensors past the goal's 64 MB)
    for (const int64_t R : {N, 16 * N}) {
        const std::string at = fmt::format(" N={} C={}", R, C);
        for (DType d : {DType::kF32, DType::kBF16}) {
            if (!be->supports(ms::OpKind::kLayerNormForward, d)) {
                std::printf("(the backend does not support %s)\n", name_of(d));
                continue;
            }
            const double s = static_cast<double>(ms::dtype_size(d));  // bytes of an activation
            // LayerNorm: x, y, dy, dx (R, C) in d; weight, bias (C) in d; mean, rstd (R) and dweight, dbias (C) fp32.
            void* x = device_values(*be, d, R * C, 0.5f);
            void* y = device_values(*be, d, R * C, 0.0f);
            void* dy = device_values(*be, d, R * C, 0.01f);
            void* dx = device_values(*be, d, R * C, 0.0f);
            void* w = device_values(*be, d, C, 1.0f);
            void* bias = device_values(*be, d, C, 0.1f);
            float* mean = device_floats(R, 0.0f);
            float* rstd = device_floats(R, 0.0f);
            float* dw = device_floats(C, 0.0f);
            float* db = device_floats(C, 0.0f);
            const ms::LayerNormForwardArgs ln{Tensor(x, d, {R, C}),
                                              Tensor(w, d, {C}),
                                              Tensor(bias, d, {C}),
                                              Tensor(y, d, {R, C}),
                                              Tensor::f32(mean, {R}),
                                              Tensor::f32(rstd, {R}),
                                              1e-5f};
            report("layernorm forward," + at, d,
                   time_ms(
                       *be, [&] { be->layernorm_forward(ln); }, 20, kInner),
                   2.0 * R * C * s + 2.0 * R * 4);
            const ms::LayerNormBackwardArgs lnb{Tensor(dy, d, {R, C}),  Tensor(x, d, {R, C}),   Tensor(w, d, {C}),
                                                Tensor::f32(mean, {R}), Tensor::f32(rstd, {R}), Tensor(dx, d, {R, C}),
                                                Tensor::f32(dw, {C}),   Tensor::f32(db, {C}),   ms::Accumulate::kAdd};
            // reads dy, x, dx; writes dx (kAdd: the residual stream's gradient)
            report("layernorm backward (dinp +=)," + at, d,
                   time_ms(
                       *be, [&] { be->layernorm_backward(lnb); }, 20, kInner),
                   4.0 * R * C * s + 2.0 * R * 4);
            // residual: out = a + (b + bias), the attention / MLP projection's bias added after its all-reduce
            report("residual a + (b + bias)," + at, d,
                   time_ms(
                       *be,
                       [&] {
                           be->residual_forward({Tensor(x, d, {R * C}), Tensor(dy, d, {R * C}), Tensor(y, d, {R * C}),
                                                 Tensor(bias, d, {C})});
                       },
                       20, kInner),
                   3.0 * R * C * s);
            // the same add fused into the LayerNorm that reads it (how the model runs ln_2 / ln_1 / ln_f): reads a, b;
            // writes the sum and its normalisation, against the two ops above one after the other
            ms::LayerNormForwardArgs lnr = ln;
            lnr.inp = Tensor();
            lnr.residual_a = Tensor(x, d, {R, C});
            lnr.residual_b = Tensor(dy, d, {R, C});
            lnr.residual_bias = Tensor(bias, d, {C});
            lnr.residual_out = Tensor(dx, d, {R, C});
            report("layernorm forward + residual (fused)," + at, d,
                   time_ms(
                       *be, [&] { be->layernorm_forward(lnr); }, 20, kInner),
                   4.0 * R * C * s + 2.0 * R * 4);
            report("residual, then layernorm forward (two ops)," + at, d,
                   time_ms(
                       *be,
                       [&] {
                           be->residual_forward({Tensor(x, d, {R * C}), Tensor(dy, d, {R * C}), Tensor(dx, d, {R * C}),
                                                 Tensor(bias, d, {C})});
                           be->layernorm_forward(
                               {Tensor(dx, d, {R, C}), ln.weight, ln.bias, ln.out, ln.mean, ln.rstd, ln.eps});
                       },
                       20, kInner),
                   4.0 * R * C * s + 2.0 * R * 4);
            for (void* p : {x, y, dy, dx, w, bias}) MS_CUDA_CHECK(cudaFree(p));
            for (float* p : {mean, rstd, dw, db}) MS_CUDA_CHECK(cudaFree(p));

            // GELU over the MLP's (R, 4C)
            void* h = device_values(*be, d, R * H, 0.5f);
            void* hg = device_values(*be, d, R * H, 0.0f);
            void* dh = device_values(*be, d, R * H, 0.01f);
            report("gelu forward over (N, 4C)," + at, d,
                   time_ms(
                       *be,
                       [&] {
                           be->gelu_forward({Tensor(h, d, {R * H}), Tensor(hg, d, {R * H})});
                       },
                       20, kInner),
                   2.0 * R * H * s);
            report("gelu backward in place, (N, 4C)," + at, d,
                   time_ms(
                       *be,
                       [&] {
                           be->gelu_backward({Tensor(h, d, {R * H}), Tensor(dh, d, {R * H}), Tensor(dh, d, {R * H})});
                       },
                       20, kInner),
                   3.0 * R * H * s);
            for (void* p : {h, hg, dh}) MS_CUDA_CHECK(cudaFree(p));

            // The Llama ops: RMSNorm (R, C); RoPE on Q and K of a (R, (NH + 2 NKV) HS) qkv with NKV = 4; SwiGLU over
            // (R, 2F) with F = 2048.
            {
                const int64_t NKV = 4, HS = C / NH, F = 2048, row = (NH + 2 * NKV) * HS;
                void* rx = device_values(*be, d, R * C, 0.5f);
                void* ry = device_values(*be, d, R * C, 0.0f);
                void* rdy = device_values(*be, d, R * C, 0.01f);
                void* rdx = device_values(*be, d, R * C, 0.0f);
                void* rw = device_values(*be, d, C, 1.0f);
                float* rrstd = device_floats(R, 0.0f);
                float* rdw = device_floats(C, 0.0f);
                const ms::RmsNormForwardArgs rn{Tensor(rx, d, {R, C}), Tensor(rw, d, {C}), Tensor(ry, d, {R, C}),
                                                Tensor::f32(rrstd, {R}), 1e-5f};
                report("rmsnorm forward," + at, d,
                       time_ms(
                           *be, [&] { be->rmsnorm_forward(rn); }, 20, kInner),
                       2.0 * R * C * s + R * 4);
                const ms::RmsNormBackwardArgs rnb{
                    Tensor(rdy, d, {R, C}), Tensor(rx, d, {R, C}), Tensor(rw, d, {C}),  Tensor::f32(rrstd, {R}),
                    Tensor(rdx, d, {R, C}), Tensor::f32(rdw, {C}), ms::Accumulate::kAdd};
                report("rmsnorm backward (dinp +=)," + at, d,
                       time_ms(
                           *be, [&] { be->rmsnorm_backward(rnb); }, 20, kInner),
                       4.0 * R * C * s + R * 4);
                for (void* p : {rx, ry, rdy, rdx, rw}) MS_CUDA_CHECK(cudaFree(p));
                for (float* p : {rrstd, rdw}) MS_CUDA_CHECK(cudaFree(p));
                void* qkv = device_values(*be, d, R * row, 0.5f);
                const std::vector<float> table_host = ms::rope_table(T, HS, 500000.0, {});
                float* table = device_floats(table_host.size(), 0.0f);
                MS_CUDA_CHECK(
                    cudaMemcpy(table, table_host.data(), table_host.size() * sizeof(float), cudaMemcpyHostToDevice));
                const ms::RopeArgs rope{Tensor(qkv, d, {R, row}),   Tensor::f32(table, {T, HS}), Tensor(), T, NH, NKV,
                                        ms::RopeDirection::kForward};
                report("rope in place, Q and K of NH=12 NKV=4," + at, d,
                       time_ms(
                           *be, [&] { be->rope(rope); }, 20, kInner),
                       2.0 * R * (NH + NKV) * HS * s);
                MS_CUDA_CHECK(cudaFree(qkv));
                MS_CUDA_CHECK(cudaFree(table));
                void* gu = device_values(*be, d, R * 2 * F, 0.5f);
                void* act = device_values(*be, d, R * F, 0.0f);
                void* dgu = device_values(*be, d, R * 2 * F, 0.0f);
                report("swiglu forward, F=2048," + at, d,
                       time_ms(
                           *be,
                           [&] {
                               be->swiglu_forward({Tensor(gu, d, {R, 2 * F}), Tensor(act, d, {R, F})});
                           },
                           20, kInner),
                       3.0 * R * F * s);
                report("swiglu backward, F=2048," + at, d,
                       time_ms(
                           *be,
                           [&] {
                               be->swiglu_backward(
                                   {Tensor(act, d, {R, F}), Tensor(gu, d, {R, 2 * F}), Tensor(dgu, d, {R, 2 * F})});
                           },
                           20, kInner),
                       5.0 * R * F * s);
                for (void* p : {gu, act, dgu}) MS_CUDA_CHECK(cudaFree(p));
            }
        }
    }

    // AdamW on GPT-2 124M's fp32 master weights; in mixed precision with the fused bf16 param_copy (the model's
    // 16-bit weights), and the separate cast that param_copy replaces.
    {
        const int64_t P = 124475904;
        float* p = device_floats(P, 0.01f);
        float* g = device_floats(P, 0.001f);
        float* m = device_floats(P, 0.0f);
        float* v = device_floats(P, 0.0f);
        void* p16 = device_values(*be, DType::kBF16, P, 0.0f);
        int64_t step = 0;
        report("adamw (124M params)", DType::kF32,
               time_ms(*be,
                       [&] {
                           be->adamw({Tensor::f32(p, {P}), Tensor::f32(g, {P}), Tensor::f32(m, {P}),
                                      Tensor::f32(v, {P}), 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, ++step, Tensor{}});
                       }),
               7.0 * P * 4);  // read p, g, m, v; write p, m, v
        report(
            "adamw + bf16 param_copy (124M)", DType::kBF16,
            time_ms(*be,
                    [&] {
                        be->adamw({Tensor::f32(p, {P}), Tensor::f32(g, {P}), Tensor::f32(m, {P}), Tensor::f32(v, {P}),
                                   1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, ++step, Tensor(p16, DType::kBF16, {P})});
                    }),
            7.0 * P * 4 + 2.0 * P);
        report("cast fp32 -> bf16 (124M)", DType::kBF16,
               time_ms(*be,
                       [&] {
                           be->cast({Tensor::f32(p, {P}), Tensor(p16, DType::kBF16, {P})});
                       }),
               6.0 * P);
        for (void* q :
             {static_cast<void*>(p), static_cast<void*>(g), static_cast<void*>(m), static_cast<void*>(v), p16})
            MS_CUDA_CHECK(cudaFree(q));
    }

    // attention: qkv (B, T, 3C), out (B, T, C), lse (B, NH, T) fp32
    const double HS = static_cast<double>(C) / NH, full = 2.0 * B * NH * double(T) * T * HS;
    // causal FLOPs (half of the full T x T): forward 2 GEMMs, backward 5 (recompute S, dP, dV, dQ, dK)
    const double fwd_flops = 2 * full / 2, bwd_flops = 5 * full / 2;
    for (DType d : {DType::kF32, DType::kBF16}) {
        if (!be->supports(ms::OpKind::kAttentionForward, d) || !be->supports(ms::OpKind::kAttentionBackward, d)) {
            std::printf("attention (%s): not supported by the backend\n", name_of(d));
            continue;
        }
        void* qkv = device_values(*be, d, N * 3 * C, 0.1f);
        void* out = device_values(*be, d, N * C, 0.0f);
        float* lse = device_floats(B * NH * T, 0.0f);
        void* dout = device_values(*be, d, N * C, 0.01f);
        void* dqkv = device_values(*be, d, N * 3 * C, 0.0f);
        const double fwd_ms = time_ms(*be, [&] {
            be->attention_forward(
                {Tensor(qkv, d, {B, T, 3 * C}), Tensor(out, d, {B, T, C}), Tensor::f32(lse, {B, NH, T}), NH});
        });
        const double bwd_ms = time_ms(*be, [&] {
            be->attention_backward({Tensor(dout, d, {B, T, C}), Tensor(qkv, d, {B, T, 3 * C}),
                                    Tensor(out, d, {B, T, C}), Tensor::f32(lse, {B, NH, T}),
                                    Tensor(dqkv, d, {B, T, 3 * C}), NH});
        });
        const char* dn = name_of(d);
        std::printf("%-40s | %-4s | %8.3f ms | %7.2f TFLOP/s (causal FLOPs)\n", "attention forward (B4 T1024 HS64)", dn,
                    fwd_ms, fwd_flops / (fwd_ms * 1e9));
        std::printf("%-40s | %-4s | %8.3f ms | %7.2f TFLOP/s\n", "attention backward", dn, bwd_ms,
                    bwd_flops / (bwd_ms * 1e9));
        std::printf("%-40s | %-4s | %8.3f ms | %7.2f TFLOP/s\n", "attention forward+backward", dn, fwd_ms + bwd_ms,
                    (fwd_flops + bwd_flops) / ((fwd_ms + bwd_ms) * 1e9));
        if (d == DType::kBF16) {  // the wmma alternative on the same tensors, on the default stream
            auto* qkv16 = static_cast<ms::bf16*>(qkv);
            auto* out16 = static_cast<ms::bf16*>(out);
            const int b4 = static_cast<int>(B), t = static_cast<int>(T), nh = static_cast<int>(NH);
            const int hs = static_cast<int>(HS);
            const double wfwd_ms =
                time_ms(*be, [&] { ms::bench::attention_wmma_forward(out16, lse, qkv16, b4, t, nh, hs, nullptr); });
            const double wbwd_ms = time_ms(*be, [&] {
                ms::bench::attention_wmma_backward(static_cast<ms::bf16*>(dqkv), static_cast<const ms::bf16*>(dout),
                                                   qkv16, out16, lse, b4, t, nh, hs, nullptr);
            });
            MS_CUDA_CHECK(cudaGetLastError());
            std::printf("%-40s | %-4s | %8.3f ms | %7.2f TFLOP/s (causal FLOPs)\n", "attention wmma forward (bench)",
                        dn, wfwd_ms, fwd_flops / (wfwd_ms * 1e9));
            std::printf("%-40s | %-4s | %8.3f ms | %7.2f TFLOP/s\n", "attention wmma backward (bench)", dn, wbwd_ms,
                        bwd_flops / (wbwd_ms * 1e9));
            std::printf("%-40s | %-4s | %8.3f ms | %7.2f TFLOP/s\n", "attention wmma forward+backward (bench)", dn,
                        wfwd_ms + wbwd_ms, (fwd_flops + bwd_flops) / ((wfwd_ms + wbwd_ms) * 1e9));
        }
        std::fflush(stdout);
        for (void* p : {qkv, out, dout, dqkv}) MS_CUDA_CHECK(cudaFree(p));
        MS_CUDA_CHECK(cudaFree(lse));
    }

    // the tensor-core backward, split vs fused, on the default stream; tensors sized for the largest B, the smaller
    // ones using their first rows
    {
        const int nh = static_cast<int>(NH), t = static_cast<int>(T), hs = static_cast<int>(C / NH), b_max = 16;
        const int64_t n_max = int64_t{b_max} * T;
        auto* qkv = static_cast<ms::bf16*>(device_values(*be, DType::kBF16, n_max * 3 * C, 0.1f));
        auto* out = static_cast<ms::bf16*>(device_values(*be, DType::kBF16, n_max * C, 0.05f));
        auto* dout = static_cast<ms::bf16*>(device_values(*be, DType::kBF16, n_max * C, 0.01f));
        auto* dqkv = static_cast<ms::bf16*>(device_values(*be, DType::kBF16, n_max * 3 * C, 0.0f));
        float* lse = device_floats(static_cast<size_t>(b_max * NH * T), 1.0f);
        void* scratch = nullptr;
        MS_CUDA_CHECK(cudaMalloc(&scratch, ms::cuda::attention_tc_backward_scratch_bytes(b_max, t, nh, hs)));
        for (const int b : {4, 8, 16}) {
            const double flops = 5 * (2.0 * b * NH * double(T) * T * hs) / 2;  // causal, 5 products
            const std::string at = fmt::format(" (B{} T{} HS{})", b, t, hs);
            for (const auto kind : {ms::cuda::AttentionTcBackward::kSplit, ms::cuda::AttentionTcBackward::kFused}) {
                const bool fused = kind == ms::cuda::AttentionTcBackward::kFused;
                const double ms = time_ms(*be, [&] {
                    ms::cuda::attention_tc_backward(dqkv, dout, qkv, out, lse, fused ? scratch : nullptr, b, t, nh, hs,
                                                    kind, nullptr);
                });
                MS_CUDA_CHECK(cudaGetLastError());
                std::printf("%-40s | %-4s | %8.3f ms | %7.2f TFLOP/s\n",
                            ((fused ? "attention tc backward fused" : "attention tc backward split") + at).c_str(),
                            "bf16", ms, flops / (ms * 1e9));
            }
            std::fflush(stdout);
        }
        for (void* p : {static_cast<void*>(qkv), static_cast<void*>(out), static_cast<void*>(dout),
                        static_cast<void*>(dqkv), scratch}) {
            MS_CUDA_CHECK(cudaFree(p));
        }
        MS_CUDA_CHECK(cudaFree(lse));
    }

    // causal attention forward at T = 1024 and 4096 (HS 64, NH 12, B * T = 16384 rows): the shipped mma.sync kernel
    // beside the Hopper wgmma one (attention_tc_forward_wgmma, where the GPU and build have it), and the fused
    // backward, launched directly on the default stream
    {
        const int nh = static_cast<int>(NH), hs = 64;
        for (const int t : {1024, 4096}) {
            const int b = 16384 / t;
            const int64_t rows = int64_t{b} * t, c = int64_t{nh} * hs;
            auto* qkv = static_cast<ms::bf16*>(device_values(*be, DType::kBF16, rows * 3 * c, 0.1f));
            auto* out = static_cast<ms::bf16*>(device_values(*be, DType::kBF16, rows * c, 0.0f));
            auto* dout = static_cast<ms::bf16*>(device_values(*be, DType::kBF16, rows * c, 0.01f));
            auto* dqkv = static_cast<ms::bf16*>(device_values(*be, DType::kBF16, rows * 3 * c, 0.0f));
            float* lse = device_floats(static_cast<size_t>(b * nh * t), 1.0f);
            void* scratch = nullptr;
            MS_CUDA_CHECK(cudaMalloc(&scratch, ms::cuda::attention_tc_backward_scratch_bytes(b, t, nh, hs)));
            const double full = 2.0 * b * nh * double(t) * t * hs;  // causal: half of it per product
            const std::string at = fmt::format(" (B{} T{} HS{})", b, t, hs);
            const double mma_ms =
                time_ms(*be, [&] { ms::cuda::attention_tc_forward(out, lse, qkv, b, t, nh, hs, nullptr); });
            const double bwd_ms = time_ms(*be, [&] {
                ms::cuda::attention_tc_backward(dqkv, dout, qkv, out, lse, scratch, b, t, nh, hs,
                                                ms::cuda::AttentionTcBackward::kFused, nullptr);
            });
            MS_CUDA_CHECK(cudaGetLastError());
            std::printf("%-40s | %-4s | %8.3f ms | %7.2f TFLOP/s\n", ("attention mma.sync forward" + at).c_str(),
                        "bf16", mma_ms, full / (mma_ms * 1e9));
            std::printf("%-40s | %-4s | %8.3f ms | %7.2f TFLOP/s\n", ("attention fused backward" + at).c_str(), "bf16",
                        bwd_ms, 2.5 * full / (bwd_ms * 1e9));
            if (ms::cuda::attention_wgmma_supported()) {
                for (const auto schedule : {ms::cuda::WgmmaSchedule::kSerial, ms::cuda::WgmmaSchedule::kOverlapped}) {
                    const std::string name =
                        std::string(schedule == ms::cuda::WgmmaSchedule::kSerial ? "serial" : "overlapped") + at;
                    const double wg_ms = time_ms(*be, [&] {
                        ms::cuda::attention_tc_forward_wgmma(out, lse, qkv, b, t, nh, nh, hs, schedule, nullptr);
                    });
                    MS_CUDA_CHECK(cudaGetLastError());
                    std::printf("%-40s | %-4s | %8.3f ms | %7.2f TFLOP/s\n", ("attention wgmma fwd " + name).c_str(),
                                "bf16", wg_ms, full / (wg_ms * 1e9));
                    std::printf("%-40s | %-4s | %8.3f ms | %7.2f TFLOP/s\n", ("wgmma fwd + fused bwd " + name).c_str(),
                                "bf16", wg_ms + bwd_ms, 3.5 * full / ((wg_ms + bwd_ms) * 1e9));
                }
            } else {
                std::printf(
                    "attention wgmma forward%s: not run (needs compute capability 9.0 and a build for "
                    "CMAKE_CUDA_ARCHITECTURES=90a)\n",
                    at.c_str());
            }
            std::fflush(stdout);
            for (void* p : {static_cast<void*>(qkv), static_cast<void*>(out), static_cast<void*>(dout),
                            static_cast<void*>(dqkv), scratch}) {
                MS_CUDA_CHECK(cudaFree(p));
            }
            MS_CUDA_CHECK(cudaFree(lse));
        }
    }

    // The loss and the embedding at GPT-2 124M's micro-batch 16 (N = 16384 rows, padded vocabulary 50304, bf16).
    // Cross-entropy forward as the two tensor-parallel pieces (kMax, kSumExp: two reads of the logits) beside
    // kMaxSumExp (one read; what a tensor-parallel group of one runs), and the backward (one read and one write, in
    // place); bytes are the logits those move. The embedding's table gradient with uniform tokens beside skewed ones
    // (half of them on 8 low ids, as text's frequent tokens are in GPT-2's vocabulary): by design they cost the same.
    {
        const int64_t n = 16384, vp = 50304, v = 50257;
        const DType d = DType::kBF16;
        void* logits = nullptr;  // 1.6 GB: filled on the device (bytes 0x3f: every bf16 logit 0.746)
        MS_CUDA_CHECK(cudaMalloc(&logits, static_cast<size_t>(n * vp) * 2));
        MS_CUDA_CHECK(cudaMemset(logits, 0x3f, static_cast<size_t>(n * vp) * 2));
        float* stats = device_floats(static_cast<size_t>(4 * n), 1.0f);  // row_max, sum_exp, target_logit, dloss
        std::vector<int32_t> ids(static_cast<size_t>(n)), skewed(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
            ids[i] = static_cast<int32_t>((i * 7919) % v);
            skewed[i] = i % 2 == 0 ? static_cast<int32_t>(i % 8) : ids[i];
        }
        int32_t* targets = nullptr;
        MS_CUDA_CHECK(cudaMalloc(&targets, static_cast<size_t>(n) * 4));
        MS_CUDA_CHECK(cudaMemcpy(targets, ids.data(), static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice));
        ms::CrossEntropyForwardArgs ce{Tensor(logits, d, {n, vp}),
                                       Tensor::i32(targets, {n}),
                                       Tensor::f32(stats, {n}),
                                       Tensor::f32(stats + n, {n}),
                                       Tensor::f32(stats + 2 * n, {n}),
                                       0,
                                       v,
                                       ms::CrossEntropyPhase::kMax};
        const double two_ms = time_ms(*be, [&] {
            ce.phase = ms::CrossEntropyPhase::kMax;
            be->cross_entropy_forward(ce);
            ce.phase = ms::CrossEntropyPhase::kSumExp;
            be->cross_entropy_forward(ce);
        });
        const double one_ms = time_ms(*be, [&] {
            ce.phase = ms::CrossEntropyPhase::kMaxSumExp;
            be->cross_entropy_forward(ce);
        });
        const double logit_bytes = static_cast<double>(n) * vp * 2;
        report("cross-entropy fwd kMax + kSumExp N=16384 V=50304", d, two_ms, 2 * logit_bytes);
        report("cross-entropy fwd kMaxSumExp (one read)", d, one_ms, logit_bytes);
        const ms::CrossEntropyBackwardArgs cb{Tensor(logits, d, {n, vp}),
                                              Tensor::i32(targets, {n}),
                                              Tensor::f32(stats, {n}),
                                              Tensor::f32(stats + n, {n}),
                                              Tensor::f32(stats + 3 * n, {n}),
                                              0,
                                              v};
        // in place: later repeats see dlogits as logits, which costs the same
        report("cross-entropy backward (in place)", d, time_ms(*be, [&] { be->cross_entropy_backward(cb); }),
               2 * logit_bytes);

        void* dout = device_values(*be, d, n * C, 0.01f);
        float* dtable = device_floats(static_cast<size_t>(vp * C), 0.0f);
        for (const auto* tokens : {&ids, &skewed}) {
            MS_CUDA_CHECK(cudaMemcpy(targets, tokens->data(), static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice));
            const ms::EmbeddingBackwardArgs eb{
                Tensor::i32(targets, {n}), Tensor(dout, d, {n, C}), Tensor::f32(dtable, {vp, C}), Tensor(), 0, T};
            const double ms = time_ms(*be, [&] { be->embedding_backward(eb); });
            std::printf("%-46s | %-4s | %8.3f ms\n",
                        tokens == &ids ? "embedding backward, table N=16384 uniform ids"
                                       : "embedding backward, table, half on 8 low ids",
                        name_of(d), ms);
        }
        std::fflush(stdout);
        for (void* p :
             {logits, static_cast<void*>(stats), static_cast<void*>(targets), dout, static_cast<void*>(dtable)}) {
            MS_CUDA_CHECK(cudaFree(p));
        }
    }
    return 0;
}
