// column_blocks.h: how the fast CPU GEMM ops (matmul.cpp, lm_head_loss.cpp) share out a product over the OpenMP team
// without the bits depending on the thread count.
//
// The output is cut into tiles whose sizes are a function of its shape alone (tile_grid), each tile is one
// single-threaded OpenBLAS sgemm call, and each OpenMP thread takes a contiguous run of whole tiles; column blocks
// (thread_columns) share out the column-wise work beside them (matmul's dbias).
// Why not OpenBLAS's own threads: its pthread pool and OpenMP's idle-spinning workers fight over the cores.
// Why tiles fixed by the shape and not one call per thread: OpenBLAS's sgemm kernels give a column bits that
// depend on the width of the call it is in and on its place there (the AVX2 Haswell/Zen and the Cooperlake
// kernels cover a call with micro-tiles of several widths, each accumulating in its own order), so a split that
// follows the thread count changes the result with the thread count. With the tiles fixed, every output element
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

// The calling OpenMP thread's columns of n for column-wise work beside the GEMMs (matmul's dbias, where each column's
// sum is one thread's, in a fixed order, whatever the split): a contiguous run of whole blocks (possibly none), the
// blocks a multiple of 16 wide (whole vector panels), at least 128 and at most 24 of them (24 divide evenly over 1,
// 2, 3, 4, 6, 8, 12 and 24 threads), shared out as evenly as their count allows.
inline Slice thread_columns(int64_t n) {
    constexpr int64_t kPanel = 16, kMinWidth = 128, kMaxBlocks = 24;
    const int64_t width = std::max(kMinWidth, ((n + kMaxBlocks - 1) / kMaxBlocks + kPanel - 1) / kPanel * kPanel);
    const int64_t blocks = (n + width - 1) / width;
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    return {std::min(n, blocks * t / threads * width), std::min(n, blocks * (t + 1) / threads * width)};
}

// The tiles matmul.cpp cuts an output into: a grid of tiles whose sizes are a function of the output's shape alone
// (near target_rows x target_cols, multiples of 16, at least kMinTiles of them unless the tiles' larger side is under
// 4 panels), each tile one single-threaded sgemm call, each OpenMP thread a contiguous run of whole tiles (row by
// row). Why tiles and not
// column blocks: a call packs its two operands' tiles again, (tile_rows + tile_cols) x inner floats for 2 x
// tile_rows x tile_cols x inner flops, so near-square tiles of several hundred rows waste the least; a block of all
// the rows packs the operand spanning them once per block.
struct TileGrid {
    int64_t rows, cols, tile_rows, tile_cols;
    int64_t across() const { return (cols + tile_cols - 1) / tile_cols; }
    int64_t count() const { return (rows + tile_rows - 1) / tile_rows * across(); }
    Slice row_slice(int64_t i) const {
        return {i / across() * tile_rows, std::min(rows, (i / across() + 1) * tile_rows)};
    }
    Slice col_slice(int64_t i) const {
        return {i % across() * tile_cols, std::min(cols, (i % across() + 1) * tile_cols)};
    }
};

inline TileGrid tile_grid(int64_t rows, int64_t cols, int64_t target_rows, int64_t target_cols) {
    constexpr int64_t kPanel = 16, kMinTiles = 4;
    const auto size = [](int64_t n, int64_t parts) { return ((n + parts - 1) / parts + kPanel - 1) / kPanel * kPanel; };
    int64_t down = std::max<int64_t>(1, (rows + target_rows / 2) / target_rows);
    int64_t across = std::max<int64_t>(1, (cols + target_cols / 2) / target_cols);
    // more tiles for small outputs: halve the tiles' larger side while it is 4 panels or more
    while (down * across < kMinTiles) {
        const int64_t r = size(rows, down), c = size(cols, across);
        if (std::max(r, c) < 4 * kPanel) break;
        (r >= c ? down : across) *= 2;
    }
    return {rows, cols, std::max<int64_t>(1, size(rows, down)), std::max<int64_t>(1, size(cols, across))};
}

// f(rows, cols) for the calling OpenMP thread's tiles of g: a contiguous run, shared out as evenly as the count allows.
template <class F>
void for_each_thread_tile(const TileGrid& g, F&& f) {
    const int64_t n = g.count(), threads = omp_get_num_threads(), t = omp_get_thread_num();
    for (int64_t i = n * t / threads; i < n * (t + 1) / threads; ++i) f(g.row_slice(i), g.col_slice(i));
}

// The two grids of the GEMM ops (matmul.cpp; lm_head_loss.cpp's three products, so that one chunk of it makes the
// unfused ops' calls): a product's output (N, M) or dinp (N, K), and a weight gradient (M, K).
inline TileGrid output_tiles(int64_t rows, int64_t cols) { return tile_grid(rows, cols, 1024, 768); }
inline TileGrid weight_tiles(int64_t rows, int64_t cols) { return tile_grid(rows, cols, 768, 384); }

}  // namespace ms::cpu
