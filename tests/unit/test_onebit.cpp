// test_onebit.cpp: the single-process parts of 1-bit Adam's compressed all-reduce (engine/optim/onebit.h): one
// chunk's compression and decompression with exact values, error feedback over repeated compressions, the canonical
// chunks and their servers, the buffers and the wire accounting, and dp == 1 as an exact no-op. The two phases over
// real ranks are tests/comm/test_onebit_comm.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "engine/model/gpt.h"
#include "engine/optim/onebit.h"

namespace ms {
namespace {

ParamInfo param(std::string name, int64_t offset, int64_t numel) {
    ParamInfo p;
    p.name = std::move(name);
    p.offset = offset;
    p.numel = numel;
    return p;
}

// The flat length of a table: the end of its last parameter.
int64_t flat_end(const std::vector<ParamInfo>& table) { return table.back().offset + table.back().numel; }

TEST(OneBitCompress, KnownChunkGivesExactScaleSignsAndResidual) {
    // ||(3, -4, 0, 0)|| = 5, k = 4: scale 5 / 2; sign(0) = +1
    std::vector<float> y = {3.0f, -4.0f, 0.0f, 0.0f};
    uint32_t bits[2] = {0xdeadbeef, 0xdeadbeef};  // the second word is a guard
    const float scale = compress_chunk(y, bits);
    EXPECT_EQ(scale, 2.5f);
    EXPECT_EQ(bits[0], 0b1101u);
    EXPECT_EQ(bits[1], 0xdeadbeefu);
    EXPECT_EQ(y, (std::vector<float>{0.5f, -1.5f, -2.5f, -2.5f}));
    std::vector<float> out(4);
    decompress_chunk(scale, bits, out);
    EXPECT_EQ(out, (std::vector<float>{2.5f, -2.5f, 2.5f, 2.5f}));
    // y == scale * sign + residual, exactly (every value here is a small dyadic rational)
    const std::vector<float> before = {3.0f, -4.0f, 0.0f, 0.0f};
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(out[i] + y[i], before[i]) << i;
    // -0.0 is +1 as well
    std::vector<float> z = {-0.0f};
    uint32_t zb = 0;
    EXPECT_EQ(compress_chunk(z, &zb), 0.0f);
    EXPECT_EQ(zb, 1u);
}

TEST(OneBitCompress, BitsPackAcrossWordsForChunkSizesNotMultiplesOf32) {
    for (size_t k : {1u, 31u, 32u, 33u, 37u, 64u, 70u, 100u}) {
        // +-1 with a minus at every i % 3 == 0: the norm is sqrt(k), so the scale is exactly 1 and the residual 0
        std::vector<float> y(k);
        for (size_t i = 0; i < k; ++i) y[i] = i % 3 == 0 ? -1.0f : 1.0f;
        const size_t words = static_cast<size_t>(sign_words(static_cast<int64_t>(k)));
        EXPECT_EQ(words, (k + 31) / 32);
        std::vector<uint32_t> bits(words + 1, 0xffffffffu);
        const float scale = compress_chunk(y, bits.data());
        EXPECT_EQ(scale, 1.0f) << k;
        for (size_t w = 0; w < words; ++w) {
            uint32_t expected = 0;
            for (size_t i = w * 32; i < std::min(k, w * 32 + 32); ++i)
                if (i % 3 != 0) expected |= 1u << (i - w * 32);
            EXPECT_EQ(bits[w], expected) << "k " << k << " word " << w;  // unused high bits are 0
        }
        EXPECT_EQ(bits[words], 0xffffffffu) << k;
        for (float r : y) EXPECT_EQ(r, 0.0f) << k;
        std::vector<float> out(k);
        decompress_chunk(scale, bits.data(), out);
        for (size_t i = 0; i < k; ++i) EXPECT_EQ(out[i], i % 3 == 0 ? -1.0f : 1.0f) << k << " " << i;
    }
}

TEST(OneBitCompress, ScaleIsTheNormOverSqrtKAndTheResidualIsYMinusTheDecompressed) {
    const size_t k = 1000;
    std::vector<float> y(k);
    for (size_t i = 0; i < k; ++i)
        y[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + 0.01f * static_cast<float>(i));
    const std::vector<float> before = y;
    std::vector<uint32_t> bits(static_cast<size_t>(sign_words(k)));
    const float scale = compress_chunk(y, bits.data());
    double squares = 0;
    for (float v : before) squares += static_cast<double>(v) * v;
    EXPECT_EQ(scale, static_cast<float>(std::sqrt(squares) / std::sqrt(1000.0)));
    std::vector<float> out(k);
    decompress_chunk(scale, bits.data(), out);
    for (size_t i = 0; i < k; ++i) {
        EXPECT_EQ(out[i], before[i] >= 0 ? scale : -scale) << i;
        EXPECT_EQ(y[i], before[i] - out[i]) << i;  // the residual as computed in fp32, bit for bit
    }
}

TEST(OneBitCompress, ErrorFeedbackMakesTheRunningMeanConvergeToAConstantInput) {
    // Compressing c + e repeatedly: the decompressed outputs sum to T c - e_T, so their mean is c - e_T / T.
    const size_t k = 100;
    std::vector<float> c(k), e(k, 0.0f), out(k);
    for (size_t i = 0; i < k; ++i) c[i] = std::cos(0.1f * static_cast<float>(i)) + 0.05f * static_cast<float>(i % 7);
    std::vector<double> sum(k, 0.0);
    std::vector<uint32_t> bits(static_cast<size_t>(sign_words(k)));
    // The residual stays bounded (measured: at most 6.95 over 20000 steps, already 6.4 at t = 100), so the mean
    // converges as 1 / T: 3.2e-3 at T = 2000. The fp32 rounding in e adds at most 3e-8 to |mean - c| (measured).
    for (int t = 1; t <= 2000; ++t) {
        for (size_t i = 0; i < k; ++i) e[i] += c[i];
        const float scale = compress_chunk(e, bits.data());
        decompress_chunk(scale, bits.data(), out);
        double worst = 0, worst_residual = 0;
        for (size_t i = 0; i < k; ++i) {
            sum[i] += out[i];
            worst = std::max(worst, std::abs(sum[i] / t - c[i]));
            worst_residual = std::max(worst_residual, static_cast<double>(std::abs(e[i])));
        }
        EXPECT_LE(worst_residual, 8.0) << "t " << t;
        EXPECT_LE(worst, worst_residual / t + 1e-7) << "t " << t;
        if (t == 2000) {
            EXPECT_LT(worst, 4e-3);
        }
    }
}

TEST(OneBitLayout, ChunksArePiecesOfEachParameterAndSkipThePadding) {
    // a: 5000 elements = 2048 + 2048 + 904; b: 10 after a gap of 8; c: 4096 = 2 x 2048 after a gap of 6
    const std::vector<ParamInfo> table = {param("a", 0, 5000), param("b", 5008, 10), param("c", 5024, 4096)};
    const OneBitLayout l = onebit_layout(table, 9136, 2048, 3);
    ASSERT_EQ(l.chunks.size(), 6u);
    const int64_t expect[6][4] = {// param, param_offset, flat_offset, elems
                                  {0, 0, 0, 2048},  {0, 2048, 2048, 2048}, {0, 4096, 4096, 904},
                                  {1, 0, 5008, 10}, {2, 0, 5024, 2048},    {2, 2048, 7072, 2048}};
    int64_t packed = 0;
    for (size_t i = 0; i < 6; ++i) {
        const OneBitChunk& c = l.chunks[i];
        EXPECT_EQ(c.param, expect[i][0]) << i;
        EXPECT_EQ(c.param_offset, expect[i][1]) << i;
        EXPECT_EQ(c.flat_offset, expect[i][2]) << i;
        EXPECT_EQ(c.elems, expect[i][3]) << i;
        EXPECT_EQ(c.error_offset, packed) << i;
        packed += c.elems;
    }
    EXPECT_EQ(l.elements, 9106);
    // servers by the chunk's midpoint in thirds of 9106 (3035.3, 6070.7): 1024 -> 0; 3072, 4548, 5005, 6034 -> 1;
    // 8082 -> 2 (chunks this large against a third leave server 1 a chunk more than its share)
    EXPECT_EQ(l.first_chunk, (std::vector<int64_t>{0, 1, 5, 6}));
    EXPECT_EQ(l.served_elements(0), 2048);
    EXPECT_EQ(l.served_elements(1), 5010);
    EXPECT_EQ(l.served_elements(2), 2048);
    // server 1's block: 4 scales, then 64 + 29 + 1 + 64 sign words; servers 0 and 2: 1 + 64
    const int64_t scale_sign[6][2] = {{0, 1}, {0, 4}, {1, 68}, {2, 97}, {3, 98}, {0, 1}};
    for (size_t i = 0; i < 6; ++i) {
        EXPECT_EQ(l.chunks[i].scale_word, scale_sign[i][0]) << i;
        EXPECT_EQ(l.chunks[i].sign_word, scale_sign[i][1]) << i;
    }
    EXPECT_EQ(l.block_words, 162);
    // both phases: 4 bytes x (dp + 1) x block_words
    EXPECT_EQ(l.wire_bytes(), 4 * 4 * 162);
    EXPECT_DOUBLE_EQ(l.ideal_wire_bytes(1), 9106 / 8.0 + 4 * 6 + 5010 / 8.0 + 4 * 4);
    // buffers, in allocation order
    // server_error: room for the largest share (server 1's) on every rank
    EXPECT_EQ(onebit_allocation_sizes(table, 9136, 2048, 3),
              (std::vector<size_t>{9106 * 4, 5010 * 4, 3 * 162 * 4, 3 * 162 * 4}));
    const std::vector<OneBitBuffer> b = onebit_buffers(l);
    ASSERT_EQ(b.size(), 4u);
    EXPECT_EQ(b[0].category, MemCategory::kOptimizer);
    EXPECT_EQ(b[1].category, MemCategory::kOptimizer);
    EXPECT_EQ(b[2].category, MemCategory::kComm);
    EXPECT_EQ(b[3].category, MemCategory::kComm);
    EXPECT_EQ(b[1].bytes, 5010u * 4);
}

TEST(OneBitLayout, ServersAreContiguousRunsWithinOneChunkOfAnEqualShare) {
    const std::vector<ParamInfo> table =
        gpt_param_table(GptShape{.L = 2, .C = 128, .NH = 4, .T = 64, .V = 1000, .Vp = 1024, .F = 512});
    for (int dp : {1, 2, 3, 4, 8}) {
        for (int64_t chunk : {37, 512, 2048}) {
            const OneBitLayout l = onebit_layout(table, flat_end(table), chunk, dp);
            ASSERT_EQ(l.first_chunk.size(), static_cast<size_t>(dp) + 1);
            EXPECT_EQ(l.first_chunk.front(), 0);
            EXPECT_EQ(l.first_chunk.back(), static_cast<int64_t>(l.chunks.size()));
            int64_t total = 0;
            for (int s = 0; s < dp; ++s) {
                EXPECT_LE(l.first_chunk[s], l.first_chunk[s + 1]);
                for (int64_t i = l.first_chunk[s]; i < l.first_chunk[s + 1]; ++i)
                    EXPECT_EQ(l.chunks[static_cast<size_t>(i)].server, s);
                const int64_t served = l.served_elements(s);
                EXPECT_LE(std::abs(served * dp - l.elements), chunk * dp) << dp << " " << chunk << " " << s;
                total += served;
            }
            EXPECT_EQ(total, l.elements);
        }
    }
}

TEST(OneBitLayout, APipelineStageHasTheWholeModelsChunksForItsParameters) {
    const GptShape shape{.L = 4, .C = 64, .NH = 4, .T = 32, .V = 500, .Vp = 512, .F = 256};
    const std::vector<ParamInfo> whole = gpt_param_table(shape);
    const std::vector<ParamInfo> stage =
        gpt_param_table(shape, 1, GptPart{.first_layer = 2, .num_layers = 1, .embedding = false, .head = false});
    const OneBitLayout lw = onebit_layout(whole, flat_end(whole), 100, 2);
    const OneBitLayout ls = onebit_layout(stage, flat_end(stage), 100, 2);
    size_t matched = 0;
    for (const OneBitChunk& c : ls.chunks) {
        const std::string& name = stage[static_cast<size_t>(c.param)].name;
        const auto same = std::find_if(lw.chunks.begin(), lw.chunks.end(), [&](const OneBitChunk& w) {
            return whole[static_cast<size_t>(w.param)].name == name && w.param_offset == c.param_offset;
        });
        ASSERT_NE(same, lw.chunks.end()) << name << " " << c.param_offset;
        EXPECT_EQ(same->elems, c.elems);
        ++matched;
    }
    EXPECT_GT(matched, 0u);
}

TEST(OneBitLayout, Gpt2WireBytesAreWithinTwoPercentOfTheIdeal) {
    // GPT-2 124M's parameter table in chunks of 2048: block padding and whole sign words per chunk cost little.
    const std::vector<ParamInfo> table = gpt_param_table(GptShape{});
    for (int dp : {2, 4, 8, 16}) {
        const OneBitLayout l = onebit_layout(table, flat_end(table), 2048, dp);
        for (int r = 0; r < dp; ++r) {
            const double overhead = static_cast<double>(l.wire_bytes()) / l.ideal_wire_bytes(r) - 1;
            EXPECT_GE(overhead, 0) << dp << " " << r;
            EXPECT_LT(overhead, 0.02) << dp << " " << r;
        }
        // against the fp32 all-reduce's 2 (dp - 1) / dp x 4 bytes per element of a ring
        const double ring = 8.0 * (dp - 1) / dp * static_cast<double>(l.elements);
        EXPECT_LT(static_cast<double>(l.wire_bytes()), ring / 10) << dp;
    }
}

TEST(OneBitAllReduce, OneRankIsAnExactNoOpThatAllocatesNothing) {
    const std::vector<ParamInfo> table = {param("a", 0, 70), param("b", 72, 33)};
    EXPECT_TRUE(onebit_allocation_sizes(table, 112, 32, 1).empty());
    SelfCommunicator dp("dp");
    OneBitAllReduce ar(table, 112, 32, dp);
    EXPECT_TRUE(ar.worker_error().empty());
    EXPECT_TRUE(ar.server_error().empty());
    EXPECT_TRUE(ar.served_chunks().empty());
    EXPECT_EQ(ar.wire_bytes(), 0);
    EXPECT_EQ(ar.ideal_wire_bytes(), 0);
    std::vector<float> m(112);
    for (size_t i = 0; i < m.size(); ++i) m[i] = std::sin(static_cast<float>(i)) - 0.25f;
    const std::vector<float> before = m;
    for (int step = 0; step < 3; ++step) ar.run(m.data());
    EXPECT_EQ(std::memcmp(m.data(), before.data(), m.size() * sizeof(float)), 0);
    EXPECT_EQ(dp.stats().total_bytes(), 0);
}

TEST(OneBitLayout, BadInputIsRefusedWithASentence) {
    const std::vector<ParamInfo> table = {param("h.0.mlp.c_fc.weight", 0, 100)};
    EXPECT_DEATH(onebit_layout(table, 99, 32, 2), "parameter 'h.0.mlp.c_fc.weight' \\[0, 100\\) lies outside");
    EXPECT_DEATH(onebit_layout(table, 100, 0, 2), "chunk_elems must be positive");
}

}  // namespace
}  // namespace ms
