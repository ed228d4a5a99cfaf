// sum_squares.cpp: sum of x[i]^2 in double, for the global gradient norm.
//
// The fast path cuts x into fixed blocks of kBlock elements (independent of the thread count), sums each block in
// double with a vectorised loop, and adds the block sums in block order on the calling thread. The result is
// therefore bit-identical for any number of threads, and the clip factor (and every later step) with it.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/backends/cpu/ops.h"

namespace ms::cpu {
namespace {

constexpr int64_t kBlock = 1 << 16;

}  // namespace

double sum_squares(const Tensor& x, OpMode mode) {
    const int64_t n = x.numel();
    MS_CHECK(x.dtype == DType::kF32,
             "sum_squares: x is {}, but it takes parameter gradients, which are always fp32 (precision contract, "
             "backend.h)",
             dtype_name(x.dtype));
    const float* data = x.f32();
    if (mode == OpMode::kReference) {
        double sum = 0.0;
        for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(data[i]) * data[i];
        return sum;
    }
    const int64_t num_blocks = (n + kBlock - 1) / kBlock;
    // One double per 64K elements: grows to the largest tensor seen, then no allocation.
    static thread_local std::vector<double> block_sums;
    if (block_sums.size() < static_cast<size_t>(num_blocks)) block_sums.resize(static_cast<size_t>(num_blocks));
    double* sums = block_sums.data();
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < num_blocks; ++blk) {
        const int64_t i0 = blk * kBlock, i1 = std::min(n, i0 + kBlock);
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = i0; i < i1; ++i) sum += static_cast<double>(data[i]) * data[i];
        sums[blk] = sum;
    }
    double total = 0.0;
    for (int64_t blk = 0; blk < num_blocks; ++blk) total += sums[blk];
    return total;
}

}  // namespace ms::cpu
