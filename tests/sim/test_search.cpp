// test_search.cpp: plan --search's enumeration, pruning and ranking (engine/sim/search.h) on a small GPT over 4
// ranks of one node, with hand-set costs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/nodes.h"
#include "engine/config/config.h"
#include "engine/sim/search.h"
#include "engine/train/plan.h"
#include "engine/train/run_layout.h"
#include "tests/common/hand_cost_model.h"

namespace {

using ms::sim::PruneReason;

// 4 layers of C = 64, 4 heads, 32 tokens, vocabulary 128; 8 sequences per step.
ms::Config small() {
    return ms::load_config("", {"model.num_layers=4", "model.hidden_size=64", "model.num_attention_heads=4",
                                "model.seq_length=32", "model.max_position_embeddings=32", "model.vocab_size=128",
                                "training.global_batch_size=8", "training.train_iters=10"});
}

TEST(Search, EnumeratesEveryLayoutOfTheWorld) {
    // tp 1, 2 (with and without sp), 4 (both): 5; pp a divisor of 4 layers and of 4 / tp, vpp 2 where pp = 2;
    // micro-batches 1, 2, 4, 8 and recomputation none, selective, full: 12 each; zero 0/1 x overlap off/on when
    // dp > 1: 4, else 1.
    //   tp 1:          pp 1 (dp 4) 4, pp 2 vpp 1 (dp 2) 4, pp 2 vpp 2 (dp 2) 4, pp 4 (dp 1) 1      13
    //   tp 2, sp or not: pp 1 (dp 2) 4, pp 2 vpp 1 (dp 1) 1, pp 2 vpp 2 (dp 1) 1                 2 x 6
    //   tp 4, sp or not: pp 1 (dp 1) 1                                                            2 x 1
    const ms::sim::SearchOptions o{.world_size = 4, .gpus_per_node = 4, .memory_bytes = 1e12};
    EXPECT_EQ(ms::sim::enumerate_layouts(small(), o).size(), (13u + 12u + 2u) * 12u);
}

TEST(Search, PrunesForDivisibilityMemoryAndBubbleAndRanksTheRest) {
    ms::test::HandCostModel cost;
    cost.matmul_s = 1e-3;
    cost.intra = {1e-6, 1e9};
    ms::sim::SearchOptions o{.world_size = 4, .gpus_per_node = 4, .max_bubble = 0.25};
    // the budget: what the config's own layout (dp 4, micro-batch 1, no recomputation) needs, so larger micro-batches
    // without recomputation do not fit
    ms::Config one = small();
    one.training.micro_batch_size = 1;
    const ms::RunLayout l = ms::make_run_layout(one, 4);
    const auto stages = ms::plan_stages(l.shape, ms::plan_shape(l));
    o.memory_bytes = static_cast<double>(stages[ms::largest_stage(stages)].total_bytes());

    const ms::sim::SearchResult r = ms::sim::search_layouts(small(), cost, o);
    EXPECT_EQ(r.considered, static_cast<int>(ms::sim::enumerate_layouts(small(), o).size()));
    EXPECT_EQ(r.considered, static_cast<int>(r.ranked.size() + r.pruned.size()));
    int counts[3] = {};
    for (const ms::sim::Pruned& p : r.pruned) {
        ++counts[static_cast<int>(p.reason)];
        if (p.label.find("mb 8") != std::string::npos && p.label.find("dp 4") != std::string::npos) {
            // 8 sequences over 4 replicas cannot make micro-batches of 8
            EXPECT_EQ(p.reason, PruneReason::kDivisibility) << p.label << ": " << p.why;
        }
    }
    EXPECT_GT(counts[0], 0);
    EXPECT_GT(counts[1], 0);
    EXPECT_GT(counts[2], 0);
    ASSERT_FALSE(r.ranked.empty());
    for (size_t i = 0; i < r.ranked.size(); ++i) {
        EXPECT_LE(static_cast<double>(r.ranked[i].peak_bytes), o.memory_bytes) << r.ranked[i].label;
        if (i > 0) {
            EXPECT_GE(r.ranked[i - 1].step.tokens_per_s, r.ranked[i].step.tokens_per_s);
        }
    }
    // pp 4 with 8 sequences: 8 micro-batches of 1 idle 3 / 11 > 25% of the schedule
    bool pp4_bubble = false;
    for (const ms::sim::Pruned& p : r.pruned)
        pp4_bubble = pp4_bubble || (p.label.find("pp 4") != std::string::npos && p.reason == PruneReason::kBubble);
    EXPECT_TRUE(pp4_bubble);

    const std::vector<std::string> lines = ms::sim::search_report(r, o);
    ASSERT_GE(lines.size(), 3u);
    EXPECT_NE(lines[0].find(std::to_string(r.considered) + " layouts"), std::string::npos) << lines[0];
}

}  // namespace
