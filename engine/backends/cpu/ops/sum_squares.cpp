// sum_squares.cpp: sum of x[i]^2 in double, for the global gradient norm. x is fp32, bf16 or fp16 (a gradient
// buffer's dtype); each element is widened to fp32, then to double.
//
// The fast path cuts x into fixed blocks of kBlock elements (independent of the thread count), sums each block in
// double with a vectorised loop, and adds the block sums in block order on the calling thread. The result is
// therefore bit-identical for any number of threads, and the clip factor (and every later step) with it. A bf16 /
// fp16 block is first widened into the thread's fp32 scratch and summed by the same function as an fp32 block, so a
// 16-bit x gives the bits of its fp32 widening.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/backends/cpu/ops.h"
#include "engine/backends/cpu/ops/precision.h"

namespace ms::cpu {
namespace {

constexpr int64_t kBlock = 1 << 16;

// One block's sum of squares. Not inlined: fp32 and widened 16-bit blocks run the same vectorised code, whose
// summation order is the compiler's choice.
[[gnu::noinline]] double block_sum_squares(const float* x, int64_t n) {
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
    return sum;
}

template <class T>
double sum_squares_reference(const T* x, int64_t n) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const float f = to_float(x[i]);
        sum += static_cast<double>(f) * f;
    }
    return sum;
}

template <class T>
double sum_squares_fast(const T* x, int64_t n) {
    const int64_t num_blocks = (n + kBlock - 1) / kBlock;
    // One double per 64K elements: grows to the largest tensor seen, then no allocation.
    static thread_local std::vector<double> block_sums;
    if (block_sums.size() < static_cast<size_t>(num_blocks)) block_sums.resize(static_cast<size_t>(num_blocks));
    double* sums = block_sums.data();
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < num_blocks; ++blk) {
        const int64_t i0 = blk * kBlock, i1 = std::min(n, i0 + kBlock);
        if constexpr (kIsF32<T>) {
            sums[blk] = block_sum_squares(x + i0, i1 - i0);
        } else {
            float* widened = scratch_f32(Scratch::kA, kBlock);  // this OpenMP thread's own
            for (int64_t i = i0; i < i1; ++i) widened[i - i0] = to_float(x[i]);
            sums[blk] = block_sum_squares(widened, i1 - i0);
        }
    }
    double total = 0.0;
    for (int64_t blk = 0; blk < num_blocks; ++blk) total += sums[blk];
    return total;
}

}  // namespace

double sum_squares(const Tensor& x, OpMode mode) {
    MS_CHECK(is_float(x.dtype),
             "sum_squares: x is {}, but it takes gradients, which are fp32, bf16 or fp16 (precision contract, "
             "backend.h)",
             dtype_name(x.dtype));
    return dispatch_float(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* data = x.as<T>();
        return mode == OpMode::kReference ? sum_squares_reference(data, x.numel()) : sum_squares_fast(data, x.numel());
    });
}

}  // namespace ms::cpu
