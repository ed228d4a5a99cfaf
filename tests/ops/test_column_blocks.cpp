// test_column_blocks.cpp: the tile grids the CPU GEMM ops cut their products into (column_blocks.h). The bits of a
// product do not depend on the thread count because every tile is fixed by the output's shape alone; here: the tiles
// of a grid cover the output exactly once, their sizes are whole sgemm panels (multiples of 16, the last ones
// clipped), a small output is still cut into at least 4 tiles while its tiles' larger side is 64 or more, and the runs
// the threads take cover every tile once, in order, for 1 to 3 threads (as many as the other thread-count tests
// use: LLVM's libomp under LeakSanitizer reports the thread structures of larger teams).
#include <gtest/gtest.h>
#include <omp.h>

#include <vector>

#include "engine/backends/cpu/ops/column_blocks.h"

namespace ms::cpu {
namespace {

struct Shape {
    int64_t rows, cols;
};
constexpr Shape kShapes[] = {{1, 1},      {37, 53},     {64, 480},    {256, 768},  {256, 3072},
                             {4096, 768}, {4096, 3072}, {4096, 2304}, {3072, 768}, {50304, 768}};

TEST(TileGrid, TilesCoverTheOutputOnceInWholePanels) {
    for (const Shape& s : kShapes) {
        for (const TileGrid& g : {output_tiles(s.rows, s.cols), weight_tiles(s.rows, s.cols)}) {
            SCOPED_TRACE(testing::Message()
                         << s.rows << " x " << s.cols << ": tiles " << g.tile_rows << " x " << g.tile_cols);
            EXPECT_EQ(g.tile_rows % 16, 0);
            EXPECT_EQ(g.tile_cols % 16, 0);
            std::vector<int> hits(static_cast<size_t>(s.rows * s.cols), 0);
            for (int64_t i = 0; i < g.count(); ++i) {
                const Slice r = g.row_slice(i), c = g.col_slice(i);
                ASSERT_GT(r.size(), 0);
                ASSERT_GT(c.size(), 0);
                EXPECT_TRUE(r.size() == g.tile_rows || r.end == s.rows);
                EXPECT_TRUE(c.size() == g.tile_cols || c.end == s.cols);
                for (int64_t y = r.begin; y < r.end; ++y) {
                    for (int64_t x = c.begin; x < c.end; ++x) ++hits[static_cast<size_t>(y * s.cols + x)];
                }
            }
            for (int h : hits) ASSERT_EQ(h, 1);
        }
    }
}

TEST(TileGrid, SmallOutputsAreCutIntoAtLeastFourTiles) {
    EXPECT_EQ(output_tiles(256, 3072).count(), 4);  // 256 x 768
    EXPECT_EQ(output_tiles(64, 480).count(), 4);    // 64 x 128, the last 96 wide
    EXPECT_EQ(output_tiles(4096, 768).count(), 4);  // 1024 x 768
    EXPECT_EQ(output_tiles(4096, 3072).count(), 16);
    EXPECT_EQ(output_tiles(37, 53).count(), 2);  // 48 x 32: a larger side under 64 is not cut again
}

TEST(TileGrid, TheThreadsTakeEveryTileOnceInOrder) {
    const TileGrid g = output_tiles(4096, 2304);
    const int saved = omp_get_max_threads();
    for (int threads = 1; threads <= 3; ++threads) {
        omp_set_num_threads(threads);
        std::vector<std::vector<int64_t>> taken(static_cast<size_t>(threads));
#pragma omp parallel
        for_each_thread_tile(g, [&](const Slice& r, const Slice& c) {
            taken[static_cast<size_t>(omp_get_thread_num())].push_back(r.begin / g.tile_rows * g.across() +
                                                                       c.begin / g.tile_cols);
        });
        std::vector<int64_t> all;
        for (const auto& t : taken) all.insert(all.end(), t.begin(), t.end());
        ASSERT_EQ(static_cast<int64_t>(all.size()), g.count()) << threads << " threads";
        for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], static_cast<int64_t>(i)) << threads << " threads";
    }
    omp_set_num_threads(saved);
}

}  // namespace
}  // namespace ms::cpu
