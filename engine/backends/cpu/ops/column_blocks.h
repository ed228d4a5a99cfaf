// column_blocks.h: how the fast CPU GEMM ops (matmul.cpp, lm_head_loss.cpp) share out a product's columns over the
// OpenMP team without the bits depending on the thread count.
//
// The output columns are cut into blocks whose width is a function of the column count alone (block_width), each
// block is one single-threaded OpenBLAS sgemm call, and each OpenMP thread takes a contiguous run of whole blocks.
// Why not OpenBLAS's own threads: its pthread pool and OpenMP's idle-spinning workers fight over the cores.
// Why blocks fixed by the shape and not one call per thread: OpenBLAS's sgemm kernels give a column bits that
// depend on the width of the call it is in and on its place there (the AVX2 Haswell/Zen and the Cooperlake
// kernels cover a call with micro-tiles of several widths, each accumulating in its own order), so a split that
// follows the thread count changes the result with the thread count. With the blocks fixed, every output element
// comes from the same sgemm call, of the same shape, at the same place, whatever the thread count and whichever
// kernel OpenBLAS picked.
#pragma once

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace ms::cpu {

// OpenBLAS is told once to run single-threaded: the parallelism comes from the OpenMP slices (and, in attention.cpp,
// from the heads).
inline void use_single_threaded_blas() {
    static const bool done = [] {
        openblas_set_num_threads(1);
        return true;
    }();
    (void)done;
}

// A range [begin, end) of columns.
struct Slice {
    int64_t begin, end;
    int size() const { return static_cast<int>(end - begin); }
};

// The width of the blocks n columns are cut into: a multiple of 16 (whole sgemm panels), at least kMinWidth so that
// the operand every block's call packs again (the one spanning all the columns) is packed few times, and wide
// enough that there are at most kMaxBlocks blocks. 24 blocks divide evenly over 1, 2, 3, 4, 6, 8, 12 and 24 threads.
inline int64_t block_width(int64_t n) {
    constexpr int64_t kPanel = 16, kMinWidth = 128, kMaxBlocks = 24;
    const int64_t even = ((n + kMaxBlocks - 1) / kMaxBlocks + kPanel - 1) / kPanel * kPanel;
    return std::max(kMinWidth, even);
}

// The calling OpenMP thread's columns of n: a contiguous run of whole blocks (possibly none), the blocks shared out
// as evenly as their count allows.
inline Slice thread_columns(int64_t n) {
    const int64_t width = block_width(n);
    const int64_t blocks = (n + width - 1) / width;
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    return {std::min(n, blocks * t / threads * width), std::min(n, blocks * (t + 1) / threads * width)};
}

// f(block) for each block of n columns inside `cols` (a thread_columns(n) range).
template <class F>
void for_each_block(int64_t n, const Slice& cols, F&& f) {
    const int64_t width = block_width(n);
    for (int64_t b = cols.begin; b < cols.end; b += width) f(Slice{b, std::min(cols.end, b + width)});
}

}  // namespace ms::cpu
