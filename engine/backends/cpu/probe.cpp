#include "engine/backends/cpu/probe.h"

#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <vector>

#include "engine/backends/cpu/ops.h"
#include "engine/core/timer.h"

extern "C" char* openblas_get_corename(void);

namespace ms::cpu {

double sgemm_peak_flops(int repeats) {
    repeats = std::max(repeats, 1);
    constexpr int kN = 1024;  // large enough for the kernels' steady state (2 GFLOP a run)
    std::vector<float> a(static_cast<size_t>(kN) * kN, 0.5f), b(a.size(), 0.25f), c(a.size(), 0.0f);
    const double flops = 2.0 * kN * kN * kN;
    double best = 0;
    // The backend's split, exactly as the model's GEMMs run. First: OpenBLAS's own pool threads keep spinning for
    // a while after a call and would steal the cores from this measurement.
    const Tensor A = Tensor::f32(a.data(), {kN, kN}), B = Tensor::f32(b.data(), {kN, kN}),
                 Cm = Tensor::f32(c.data(), {kN, kN});
    for (int r = 0; r <= repeats; ++r) {
        const double t0 = now_seconds();
        matmul_forward({A, B, Tensor(), Cm}, OpMode::kFast);
        if (r > 0) best = std::max(best, flops / (now_seconds() - t0));
    }
    // OpenBLAS's own threads (the backend otherwise keeps OpenBLAS single-threaded; see ops/matmul.cpp)
    openblas_set_num_threads(omp_get_max_threads());
    for (int r = 0; r <= repeats; ++r) {  // run 0 warms caches and threads
        const double t0 = now_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kN, kN, kN, 1.0f, a.data(), kN, b.data(), kN, 0.0f,
                    c.data(), kN);
        if (r > 0) best = std::max(best, flops / (now_seconds() - t0));
    }
    openblas_set_num_threads(1);
    return best;
}

std::string blas_kernel_name() { return openblas_get_corename(); }

std::string blas_kernel_warning() {
    const std::string core = blas_kernel_name();
    static constexpr std::array<const char*, 8> kGeneric = {"Prescott", "Core2",  "Penryn", "Dunnington",
                                                            "Nehalem",  "Katmai", "Atom",   "Banias"};
    const bool generic = std::find(kGeneric.begin(), kGeneric.end(), core) != kGeneric.end();
    if (!generic) return "";
    const char* better = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                         : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                           : "";
    if (!*better) return "";
    return fmt::format(
        "OpenBLAS chose its '{}' kernel but this CPU supports {}: GEMMs run several times slower than they can.\n"
        "---> HINT: export OPENBLAS_CORETYPE={} before starting mindspeed-train (OpenBLAS reads it at load time)",
        core, __builtin_cpu_supports("avx512f") ? "AVX-512" : "AVX2", better);
}

}  // namespace ms::cpu
