// test_tied_grad_buckets.cpp: the gradient buckets' tied embedding (engine/optim/grad_buckets.h, GradBuckets::tie)
// over a real dp group (all of world, 2, 4 or 8 ranks): the lookup's gradient goes as the rows some rank looked up,
// the output layer's kept apart as a whole, and finish() leaves their averages added -- the same numbers as
// averaging the whole gradient, with only the union's rows on the wire. Then a pipeline's two ends, each half the
// world, adding each other's averages.
//
// Every rank looks up other rows, some shared. Gradients are small integers and the averages are over a power of
// two, so every result is exact and compared with ==.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/optim/grad_buckets.h"
#include "tests/comm/comm_test.h"

namespace ms::test {
namespace {

using graph::GradRange;

// wte: 16 rows of 4 in [0, 64); wpe [64, 72); one more parameter [72, 92); padded to 96. Buckets of 20 elements:
// [72, 96) and [0, 72), the embedding inside the second.
constexpr int64_t kRows = 16, kC = 4, kWte = kRows * kC, kPadded = 96;

std::vector<ParamInfo> table() {
    std::vector<ParamInfo> t(3);  // the buckets read offsets and sizes only
    t[0].offset = 0, t[0].numel = kWte;
    t[1].offset = kWte, t[1].numel = 8;
    t[2].offset = kWte + 8, t[2].numel = 20;
    return t;
}

// The rows rank r looks up (its tokens: repeats, and one outside the shard of first_row 0 .. 15 when shifted).
std::vector<int32_t> tokens_of(int r) { return {r % 16, (3 * r + 5) % 16, 15, r % 16, 100}; }

void check(GradReduction reduction) {
    Communicator& dp = world();
    const int n = dp.size(), me = dp.rank();
    std::unique_ptr<Backend> backend = make_backend({});
    std::vector<float> grads(kPadded, 0.0f), head(kWte);
    GradBuckets b(table(), kPadded, 20, grads.data(), dp, *backend, reduction);
    ASSERT_EQ(b.num_buckets(), 2);
    b.tie({.range = {0, kWte},
           .row_elems = kC,
           .first_row = 0,
           .max_tokens = 5,
           .head = Tensor::f32(head.data(), {kWte})});
    for (int step = 0; step < 2; ++step) {  // the second step starts from nothing again
        // this rank's gradients: the lookup's in its rows only, the head's everywhere, the rest everywhere
        std::fill(grads.begin(), grads.end(), 0.0f);
        const std::vector<int32_t> tokens = tokens_of(me);
        for (const int32_t t : tokens)
            if (t < kRows)
                for (int64_t j = 0; j < kC; ++j)
                    grads[static_cast<size_t>(t * kC + j)] = float(pattern(me, size_t(t * kC + j)));
        for (int64_t i = kWte; i < kWte + 28; ++i) grads[static_cast<size_t>(i)] = float(pattern(me, size_t(i)));
        for (int64_t i = 0; i < kWte; ++i) head[static_cast<size_t>(i)] = float(2 * (me + 1) + step);
        const CommStats before = dp.stats();
        b.begin_step();
        b.look_up(std::span<const int32_t>(tokens.data(), 2));  // as two micro-batches
        b.look_up(std::span<const int32_t>(tokens.data() + 2, 3));
        const GradRange h{kWte + 8, kWte + 28}, head_range{0, kWte, true}, wte{0, kWte}, wpe{kWte, kWte + 8};
        b.final(std::span<const GradRange>(&h, 1), 0);
        EXPECT_EQ(b.issued(), std::vector<int>({0}));
        b.final(std::span<const GradRange>(&head_range, 1), 0);
        b.final(std::span<const GradRange>(&wte, 1), 0);
        EXPECT_EQ(b.issued(), std::vector<int>({0}));  // wpe is still to come
        b.final(std::span<const GradRange>(&wpe, 1), 0);
        EXPECT_EQ(b.issued(), std::vector<int>({0, 1}));
        b.finish();
        // the union of every rank's rows
        std::set<int32_t> rows;
        for (int r = 0; r < n; ++r)
            for (const int32_t t : tokens_of(r))
                if (t < kRows) rows.insert(t);
        EXPECT_EQ(b.tied_rows(), static_cast<int64_t>(rows.size()));
        int64_t head_sum = 0;
        for (int r = 0; r < n; ++r) head_sum += 2 * (r + 1) + step;
        const float head_avg = float(head_sum) / float(n);
        // zero_stage 1: each shard's part is reduced into its owner, the only rank that reads it
        const int64_t shard = kPadded / n;
        const bool all = reduction == GradReduction::kAllReduce;
        for (int64_t row = 0; row < kRows; ++row) {
            for (int64_t j = 0; j < kC; ++j) {
                const size_t i = static_cast<size_t>(row * kC + j);
                if (!all && (int64_t(i) < me * shard || int64_t(i) >= (me + 1) * shard)) continue;
                int64_t lookup = 0;
                for (int r = 0; r < n; ++r) {
                    const std::vector<int32_t> t = tokens_of(r);
                    if (std::find(t.begin(), t.end(), row) != t.end()) lookup += pattern(r, i);
                }
                EXPECT_EQ(grads[i], float(lookup) / float(n) + head_avg) << "row " << row << " column " << j;
            }
        }
        if (all) {
            for (int64_t i = kWte; i < kWte + 28; ++i)
                EXPECT_EQ(grads[static_cast<size_t>(i)], float(pattern_sum(n, size_t(i))) / float(n)) << i;
            // on the wire: the buckets around the embedding, the union's rows and the head; not the lookup's rows
            const CommStats after = dp.stats();
            const auto ar = static_cast<size_t>(CommOp::kAllReduce);
            EXPECT_EQ(after.bytes[ar] - before.bytes[ar],
                      static_cast<int64_t>((kPadded - kWte + static_cast<int64_t>(rows.size()) * kC + kWte) * 4));
        }
        EXPECT_EQ(head, std::vector<float>(kWte, 0.0f));  // zeroed for the next step
    }
}

TEST(TiedGradBuckets, AllReducedRowsAndHeadAddUpToTheAverage) { check(GradReduction::kAllReduce); }
TEST(TiedGradBuckets, ToShardOwnersRowsAndHeadAddUpToTheAverage) { check(GradReduction::kToShardOwners); }

// A pipeline's last stage holds the output layer's gradient in the embedding's place (lookup false): it is
// all-reduced whole as soon as it is reported final, before the bucket it lies in, and every element is averaged
// once.
TEST(TiedGradBuckets, ALastStageReducesTheOutputLayerAsSoonAsItIsFinal) {
    Communicator& dp = world();
    const int n = dp.size(), me = dp.rank();
    std::unique_ptr<Backend> backend = make_backend({});
    std::vector<float> grads(kPadded, 0.0f);
    GradBuckets b(table(), kPadded, 20, grads.data(), dp, *backend);
    b.tie({.range = {0, kWte}, .row_elems = kC, .lookup = false});
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = float(pattern(me, i));
    const CommStats before = dp.stats();
    b.begin_step();
    b.look_up(std::vector<int32_t>{1, 2});  // nothing to do: no lookup here
    const GradRange wte{0, kWte}, h{kWte + 8, kWte + 28}, wpe{kWte, kWte + 8};
    b.final(std::span<const GradRange>(&wte, 1), 0);
    const auto ar = static_cast<size_t>(CommOp::kAllReduce);
    EXPECT_EQ(dp.stats().bytes[ar] - before.bytes[ar], kWte * 4);  // issued, ahead of both buckets
    EXPECT_TRUE(b.issued().empty());
    b.final(std::span<const GradRange>(&h, 1), 0);
    b.final(std::span<const GradRange>(&wpe, 1), 0);
    b.finish();
    EXPECT_EQ(b.issued(), std::vector<int>({0, 1}));
    EXPECT_EQ(b.tied_rows(), 0);
    for (size_t i = 0; i < static_cast<size_t>(kWte + 28); ++i)
        EXPECT_EQ(grads[i], float(pattern_sum(n, i)) / float(n)) << i;
    EXPECT_EQ(dp.stats().bytes[ar] - before.bytes[ar], kPadded * 4);
}

// A pipeline of two stages, each a dp group of half the world (1, 2 or 4 ranks), the embedding group pairing dp rank d
// of the first stage with dp rank d of the last. The first stage holds the lookup (the table above); the last stage
// the output layer in the embedding's place and one more parameter: wte [0, 64), [64, 84), padded to 88. With
// zero_stage 1 the shards cut the embedding at different elements on the two stages (48 and 44 at dp 2, 24 and 22 at
// dp 4): the last stage all-reduces the output layer's gradient and sends each first-stage rank the part its shard
// holds; the first stage sends the union's row ids and rows. Both stages end with the averages added.
void check_stages(GradReduction reduction) {
    Communicator& w = world();
    const int half = w.size() / 2, last = w.rank() >= half ? 1 : 0, me = w.rank() % half;
    auto dp = w.split(last, w.rank(), "dp");
    auto embd = w.split(me, w.rank(), "embd");  // the first stage's rank first
    std::unique_ptr<Backend> backend = make_backend({});
    constexpr int64_t kLastPadded = 88;
    std::vector<ParamInfo> last_table(2);
    last_table[0].offset = 0, last_table[0].numel = kWte;
    last_table[1].offset = kWte, last_table[1].numel = 20;
    const int64_t padded = last ? kLastPadded : kPadded;
    std::vector<float> grads(static_cast<size_t>(padded), 0.0f), received(kWte, -1.0f);
    GradBuckets b(last ? last_table : table(), padded, 20, grads.data(), *dp, *backend, reduction);
    b.tie({.range = {0, kWte},
           .row_elems = kC,
           .lookup = !last,
           .first_row = 0,
           .max_tokens = 5,
           .head = last ? Tensor{} : Tensor::f32(received.data(), {kWte}),
           .stages = embd.get(),
           .first_stage_range = {0, kWte},
           .first_stage_padded = kPadded});
    const bool all = reduction == GradReduction::kAllReduce;
    // the elements of the embedding the first stage's rank reads: its shard's (zero_stage 1), or all
    const int64_t shard = kPadded / half, part_begin = all ? 0 : std::min(kWte, me * shard),
                  part_end = all ? kWte : std::min(kWte, (me + 1) * shard);
    for (int step = 0; step < 2; ++step) {
        std::fill(grads.begin(), grads.end(), 0.0f);
        const std::vector<int32_t> tokens = tokens_of(me);
        if (last) {
            for (int64_t i = 0; i < kWte; ++i) grads[static_cast<size_t>(i)] = float(2 * (me + 1) + step);
            for (int64_t i = kWte; i < kWte + 20; ++i) grads[static_cast<size_t>(i)] = float(pattern(me, size_t(i)));
        } else {
            for (const int32_t t : tokens)
                if (t < kRows)
                    for (int64_t j = 0; j < kC; ++j)
                        grads[static_cast<size_t>(t * kC + j)] = float(pattern(me, size_t(t * kC + j)));
            for (int64_t i = kWte; i < kWte + 28; ++i) grads[static_cast<size_t>(i)] = float(pattern(me, size_t(i)));
        }
        const CommStats before = embd->stats();
        b.begin_step();
        const GradRange wte{0, kWte};
        if (last) {
            const GradRange other{kWte, kWte + 20};
            b.final(std::span<const GradRange>(&wte, 1), 0);  // the output layer's gradient, first
            b.final(std::span<const GradRange>(&other, 1), 0);
        } else {
            b.look_up(tokens);
            const GradRange h{kWte + 8, kWte + 28}, wpe{kWte, kWte + 8};
            b.final(std::span<const GradRange>(&h, 1), 0);
            b.final(std::span<const GradRange>(&wte, 1), 0);
            b.final(std::span<const GradRange>(&wpe, 1), 0);
        }
        b.finish();
        std::set<int32_t> rows;
        for (int r = 0; r < half; ++r)
            for (const int32_t t : tokens_of(r))
                if (t < kRows) rows.insert(t);
        int64_t head_sum = 0;
        for (int r = 0; r < half; ++r) head_sum += 2 * (r + 1) + step;
        const float head_avg = float(head_sum) / float(half);
        for (int64_t row = 0; row < kRows; ++row) {
            for (int64_t j = 0; j < kC; ++j) {
                const size_t i = static_cast<size_t>(row * kC + j);
                // the last stage holds the sum everywhere; the first stage where its optimizer reads it
                if (!last && (int64_t(i) < part_begin || int64_t(i) >= part_end)) continue;
                int64_t lookup = 0;
                for (int r = 0; r < half; ++r) {
                    const std::vector<int32_t> t = tokens_of(r);
                    if (std::find(t.begin(), t.end(), row) != t.end()) lookup += pattern(r, i);
                }
                EXPECT_EQ(grads[i], float(lookup) / float(half) + head_avg)
                    << (last ? "last" : "first") << " stage, row " << row << " column " << j << ", step " << step;
            }
        }
        // across the stages: the last stage's average of the first stage's part one way; the union's row ids
        // (padded to every rank's tokens) and its rows the other
        const CommStats after = embd->stats();
        const auto send = static_cast<size_t>(CommOp::kSend);
        const int64_t ids = std::min<int64_t>(kRows, 5 * half);
        EXPECT_EQ(after.bytes[send] - before.bytes[send],
                  last ? (part_end - part_begin) * 4 : (ids + static_cast<int64_t>(rows.size()) * kC) * 4)
            << (last ? "last" : "first") << " stage";
    }
}

TEST(TiedGradBuckets, PipelineStagesAddEachOthersAverages) { check_stages(GradReduction::kAllReduce); }
TEST(TiedGradBuckets, PipelineStagesAddEachOthersAveragesInTheirShards) { check_stages(GradReduction::kToShardOwners); }

}  // namespace
}  // namespace ms::test
