// test_sharded_grads.cpp: zero_stage 2's gradient memory (engine/optim/sharded_grads.h): the placement of a flat
// gradient range over several buffers (engine/graph/grad_placement.h), which gradients a GPT chunk's backward writes
// once and which it keeps (graph::grad_writes), where the buckets are cut and how many slots they rotate through, and
// the slots' life over micro-batches: readied before the first write, reduced once written, added into the shard.
// One rank (a SelfCommunicator): the reduction is the identity, the bookkeeping and the sums are what is tested.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/graph/grad_placement.h"
#include "engine/model/gpt_graph.h"
#include "engine/optim/sharded_grads.h"

namespace {

using ms::ChunkGradWrites;
using ms::ShardedGradLayout;
using ms::graph::GradPlacement;
using ms::graph::GradRange;
using ms::graph::GradWrites;

TEST(GradPlacement, AddressesEachSegmentFromItsOwnMemory) {
    std::vector<float> a(10), b(6);
    const GradPlacement one(a.data(), ms::DType::kF32, 10);
    EXPECT_EQ(one.tensor(3, 4).data, a.data() + 3);
    // [0, 10) in a, [20, 26) in b; a chunk starting at 20 sees b from its own 0
    const GradPlacement two(
        {{20, 26, reinterpret_cast<std::byte*>(b.data())}, {0, 10, reinterpret_cast<std::byte*>(a.data())}},
        ms::DType::kF32);
    EXPECT_EQ(two.at(20, 6), reinterpret_cast<std::byte*>(b.data()));
    EXPECT_EQ(two.at(9, 1), reinterpret_cast<std::byte*>(a.data() + 9));
    EXPECT_EQ(two.from(20).at(2, 3), reinterpret_cast<std::byte*>(b.data() + 2));
    EXPECT_DEATH((void)two.at(8, 3), "\\[8, 11\\) are not in one segment");    // past a's end
    EXPECT_DEATH((void)two.at(12, 1), "\\[12, 13\\) are not in one segment");  // between the two
    EXPECT_DEATH(
        GradPlacement({{0, 10, reinterpret_cast<std::byte*>(a.data())}, {5, 8, reinterpret_cast<std::byte*>(b.data())}},
                      ms::DType::kF32),
        "overlap");
}

// Every gradient of a GPT chunk is either written once by one backward op or kept; what is kept is what a
// micro-batch's backward does not finish alone: the tied embedding (the head and the lookup both write it), the
// fused head's output layer (written in the forward), sequence parallelism's LayerNorms (summed over tp per step).
TEST(GradWrites, KeepWhatOneBackwardOpDoesNotFinish) {
    const ms::GptShape shape{.L = 2, .C = 32, .NH = 4, .T = 16, .V = 64, .Vp = 64, .F = 128};
    const auto ranges_of = [](const std::vector<ms::ParamInfo>& table, auto pred) {
        std::vector<GradRange> out;
        for (const ms::ParamInfo& p : table)
            if (pred(p.name)) out.push_back({p.offset, p.offset + p.numel});
        return out;
    };
    const auto sorted = [](std::vector<GradRange> v) {
        std::sort(v.begin(), v.end(), [](const GradRange& a, const GradRange& b) { return a.begin < b.begin; });
        return v;
    };
    const ms::GptPart whole{0, 2, true, true};
    const std::vector<ms::ParamInfo> table = ms::gpt_param_table(shape, 1, whole);
    const GradWrites tied = ms::gpt_grad_writes(shape, whole, 1, false, ms::DType::kF32);
    EXPECT_EQ(tied.kept, ranges_of(table, [](const std::string& n) { return n == "wte.weight"; }));
    std::vector<GradRange> all = tied.kept;
    for (const auto& group : tied.once) all.insert(all.end(), group.begin(), group.end());
    EXPECT_EQ(sorted(all), ranges_of(table, [](const std::string&) { return true; }));
    // the backward's order: the final LayerNorm first, the position embedding last
    EXPECT_EQ(tied.once.front(), ranges_of(table, [](const std::string& n) { return n.starts_with("ln_f."); }));
    EXPECT_EQ(tied.once.back(), ranges_of(table, [](const std::string& n) { return n == "wpe.weight"; }));

    ms::GptShape untied = shape;
    untied.untied = true;
    const std::vector<ms::ParamInfo> untied_table = ms::gpt_param_table(untied, 1, whole);
    ms::GptGraphOptions fused;
    fused.lm_head_loss_fusion = true;
    const GradWrites head = ms::gpt_grad_writes(untied, whole, 1, false, ms::DType::kF32, fused);
    EXPECT_EQ(head.kept, ranges_of(untied_table, [](const std::string& n) { return n == "lm_head.weight"; }));

    const ms::GptPart middle{0, 2, false, false};
    const std::vector<ms::ParamInfo> tp_table = ms::gpt_param_table(shape, 2, middle);
    const GradWrites sp = ms::gpt_grad_writes(shape, middle, 2, true, ms::DType::kF32);
    EXPECT_EQ(sorted(sp.kept),
              ranges_of(tp_table, [](const std::string& n) { return n.find(".ln_") != std::string::npos; }));
}

// Two chunks (the second from element 100): the kept gradient [0, 10) and the pipeline's extra [100, 110) stay out of
// the buckets, which are cut per chunk and start and end at their gradients; written in order, one bucket is open at
// a time, so two slots, of the longest bucket.
TEST(ShardedGradLayout, CutsBucketsPerChunkAndCountsTheOpenOnes) {
    ChunkGradWrites a{0, GradWrites{{{{60, 90}}, {{30, 60}}, {{10, 30}}}, {{0, 10}}}};
    ChunkGradWrites b{100, GradWrites{{{{40, 60}}, {{10, 40}}, {{0, 10}}}, {}}};
    const GradRange extra{100, 110};
    const std::vector<ChunkGradWrites> chunks{a, b};
    const ShardedGradLayout l = ms::sharded_grad_layout(chunks, std::span<const GradRange>(&extra, 1), 176, 30, 2);
    // the second chunk's [140, 160) holds 20 < 30 elements: one bucket with [110, 140)
    EXPECT_EQ(l.buckets, (std::vector<std::pair<int64_t, int64_t>>{{60, 90}, {30, 60}, {10, 30}, {110, 160}}));
    EXPECT_EQ(l.kept, (std::vector<GradRange>{{0, 10}, {100, 110}}));
    EXPECT_EQ(l.kept_elems, 20);
    EXPECT_EQ(l.slot_elems, 50);
    EXPECT_EQ(l.slots, 2);
    EXPECT_EQ(l.shard_elems, 88);
    EXPECT_EQ(l.buffer_elems(), 2 * 50 + 20);
    // written interleaved -- [60, 90) and [10, 30) open together with [30, 60) between them -- three buckets are
    // open at once: four slots, capped at the chunk's three buckets
    ChunkGradWrites mixed{0, GradWrites{{{{60, 90}, {10, 30}}, {{30, 60}}}, {}}};
    EXPECT_EQ(ms::sharded_grad_layout(std::vector<ChunkGradWrites>{mixed}, {}, 96, 30, 2).slots, 3);
}

// Over two micro-batches of two chunk-ordered buckets in two slots and a kept gradient, the shard ends as the sum
// of what each micro-batch wrote (one rank: the average over dp is the identity); the sums of squares are taken
// before the reduction.
TEST(ShardedGrads, SlotsRotateAndTheShardSumsTheMicroBatches) {
    ms::SelfCommunicator dp{"dp"};
    const std::unique_ptr<ms::Backend> backend = ms::make_backend({});
    ChunkGradWrites c{0, GradWrites{{{{40, 60}}, {{20, 40}}, {{8, 20}}}, {{0, 8}}}};
    ShardedGradLayout l = ms::sharded_grad_layout(std::vector<ChunkGradWrites>{c}, {}, 64, 20, 1);
    ASSERT_EQ(l.buckets.size(), 3u);
    ASSERT_EQ(l.slots, 2);
    std::vector<float> buffer(static_cast<size_t>(l.buffer_elems()), -1.0f), shard(64, -1.0f);
    ms::ShardedGrads g(std::move(l), buffer.data(), shard.data(), ms::DType::kF32, dp, *backend);
    for (int step = 0; step < 2; ++step) {
        g.begin_step();
        for (int mb = 1; mb <= 2; ++mb) {
            for (const auto& group : c.writes.once) {
                g.writing(group, 0);
                for (const GradRange& r : group) {  // what a backward op adds: mb * (element + 1)
                    const ms::Tensor t = g.placement().tensor(r.begin, r.end - r.begin);
                    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] += static_cast<float>(mb * (r.begin + i + 1));
                }
                g.final(group, 0);
            }
            const ms::Tensor kept = g.placement().tensor(0, 8);
            for (int64_t i = 0; i < 8; ++i) kept.f32()[i] += static_cast<float>(mb * (i + 1));
        }
        g.finish();
        double squares = 0;
        for (int64_t i = 0; i < 64; ++i) {
            const float want = i < 60 ? 3.0f * static_cast<float>(i + 1) : 0.0f;  // 1 + 2 micro-batches
            EXPECT_EQ(shard[static_cast<size_t>(i)], want) << "element " << i << " step " << step;
            if (i >= 8 && i < 60) squares += (i + 1.0) * (i + 1.0) * (1 + 4);  // each micro-batch's own
        }
        for (int64_t i = 0; i < 8; ++i) squares += 9.0 * (i + 1.0) * (i + 1.0);  // the kept: once, summed
        EXPECT_EQ(g.squares_before_reduction(), squares);
    }
    // A bucket's slot cannot be readied while the bucket before in it is still being written.
    g.begin_step();
    const GradRange first{40, 60}, third{8, 20};
    g.writing(std::span<const GradRange>(&first, 1), 0);
    EXPECT_DEATH(g.writing(std::span<const GradRange>(&third, 1), 0), "still being written");
}

}  // namespace
