#include "engine/backends/cpu/probe.h"

#include <cblas.h>

#include <algorithm>
#include <vector>

#include "engine/core/timer.h"

namespace ms::cpu {

double sgemm_peak_flops(int repeats) {
    // Large enough to reach the kernel's steady state, small enough to stay in a fraction of a second.
    const int M = 768, N = 1024, K = 768;
    std::vector<float> a(static_cast<size_t>(M) * K, 0.5f), b(static_cast<size_t>(K) * N, 0.25f),
        c(static_cast<size_t>(M) * N, 0.0f);
    double best = 0;
    for (int r = 0; r < repeats + 1; ++r) {  // the first run warms caches and threads
        const double t0 = now_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f,
                    c.data(), N);
        const double dt = now_seconds() - t0;
        if (r > 0) best = std::max(best, 2.0 * M * N * K / dt);
    }
    return best;
}

}  // namespace ms::cpu
