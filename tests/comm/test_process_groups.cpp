// test_process_groups.cpp: make_process_groups for every (tp, pp, dp) whose product is the world size -- at
// world 2, 4 and 8 that covers (2,1,1) (1,2,1) (1,1,2); (2,2,1) (2,1,2) (1,2,2); (2,2,2) (4,1,2) (2,4,1) (1,1,8)
// and the rest. The expected members of each group come from the formula
//     global rank = tp_rank + tp * (dp_rank + dp * pp_rank)
// written out here independently of the Topology the groups are split by; each group's all_reduce of the global
// rank must equal the closed-form sum of its members, and an all_gather must list them in the documented order.
// The embedding group is Megatron's: the first and last stage of each pipeline, none on a middle stage.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/process_groups.h"
#include "engine/core/check.h"
#include "tests/comm/comm_test.h"

namespace ms::test {
namespace {

struct Layout {
    int tp, pp, dp;
};

std::vector<Layout> layouts_of(int world) {
    std::vector<Layout> out;
    for (int tp = 1; tp <= world; ++tp)
        for (int pp = 1; pp <= world; ++pp)
            if (world % (tp * pp) == 0) out.push_back({tp, pp, world / (tp * pp)});
    return out;
}

// The global ranks `g` holds, in group-rank order.
std::vector<int32_t> members(Communicator& g) {
    std::vector<int32_t> out(g.size(), -1);
    const int32_t mine[] = {world().rank()};
    g.all_gather<int32_t>(mine, out).wait();
    return out;
}

int32_t sum_of_ranks(Communicator& g) {
    std::vector<int32_t> v = {world().rank()};
    g.all_reduce(std::span(v), ReduceOp::kSum).wait();
    return v[0];
}

void check_layout(const Layout& L) {
    SCOPED_TRACE("tp=" + std::to_string(L.tp) + " pp=" + std::to_string(L.pp) + " dp=" + std::to_string(L.dp));
    const int tp = L.tp, pp = L.pp, dp = L.dp;
    const auto global = [&](int t, int d, int p) { return t + tp * (d + dp * p); };
    ProcessGroups g = make_process_groups(world(), make_topology(world().size(), tp, pp));
    EXPECT_EQ(g.dp_size, dp);
    EXPECT_EQ((Coord{g.topology.tp, g.topology.dp, g.topology.pp}), (Coord{tp, dp, pp}));
    const int t = g.tp_rank, d = g.dp_rank, p = g.pp_rank;
    EXPECT_EQ(global(t, d, p), world().rank());
    EXPECT_EQ(g.world, &world());
    EXPECT_EQ(g.tp->name(), "tp");
    EXPECT_EQ(g.mp->name(), "mp");

    // tp: (*, d, p); sum = tp * base + tp (tp - 1) / 2 with base = global(0, d, p)
    EXPECT_EQ(g.tp->size(), tp);
    EXPECT_EQ(g.tp->rank(), t);
    EXPECT_EQ(sum_of_ranks(*g.tp), tp * global(0, d, p) + tp * (tp - 1) / 2);
    std::vector<int32_t> want;
    for (int k = 0; k < tp; ++k) want.push_back(global(k, d, p));
    EXPECT_EQ(members(*g.tp), want);

    // dp: (t, *, p); sum = dp * global(t, 0, p) + tp * dp (dp - 1) / 2
    EXPECT_EQ(g.dp->size(), dp);
    EXPECT_EQ(g.dp->rank(), d);
    EXPECT_EQ(sum_of_ranks(*g.dp), dp * global(t, 0, p) + tp * dp * (dp - 1) / 2);
    want.clear();
    for (int k = 0; k < dp; ++k) want.push_back(global(t, k, p));
    EXPECT_EQ(members(*g.dp), want);

    // pp: (t, d, *); sum = pp * global(t, d, 0) + tp dp pp (pp - 1) / 2
    EXPECT_EQ(g.pp->size(), pp);
    EXPECT_EQ(g.pp->rank(), p);
    EXPECT_EQ(sum_of_ranks(*g.pp), pp * global(t, d, 0) + tp * dp * pp * (pp - 1) / 2);
    want.clear();
    for (int k = 0; k < pp; ++k) want.push_back(global(t, d, k));
    EXPECT_EQ(members(*g.pp), want);

    // mp: (*, d, *), tp x pp ranks ordered by global rank, i.e. mp rank = t + tp * p;
    // sum = tp pp (tp d) + pp tp (tp - 1) / 2 + tp (tp dp) pp (pp - 1) / 2
    EXPECT_EQ(g.mp->size(), tp * pp);
    EXPECT_EQ(g.mp->rank(), t + tp * p);
    EXPECT_EQ(sum_of_ranks(*g.mp), tp * pp * tp * d + pp * tp * (tp - 1) / 2 + tp * tp * dp * pp * (pp - 1) / 2);
    want.clear();
    for (int k = 0; k < pp; ++k)
        for (int j = 0; j < tp; ++j) want.push_back(global(j, d, k));
    EXPECT_EQ(members(*g.mp), want);

    // embd: {first, last} stage of (t, d); the rank alone when pp == 1; none on middle stages
    EXPECT_EQ(g.is_first_stage(), p == 0);
    EXPECT_EQ(g.is_last_stage(), p == pp - 1);
    EXPECT_EQ(g.next_stage_rank(), (p + 1) % pp);
    EXPECT_EQ(g.prev_stage_rank(), (p + pp - 1) % pp);
    const bool has_embedding = p == 0 || p == pp - 1;
    EXPECT_EQ(g.in_embd_group(), has_embedding);
    if (g.embd) {
        const int first = global(t, d, 0), last = global(t, d, pp - 1);
        if (pp == 1) {
            EXPECT_EQ(g.embd->size(), 1);
            EXPECT_EQ(sum_of_ranks(*g.embd), world().rank());
        } else {
            EXPECT_EQ(g.embd->size(), 2);
            EXPECT_EQ(g.embd->rank(), p == 0 ? 0 : 1);
            EXPECT_EQ(sum_of_ranks(*g.embd), first + last);
            EXPECT_EQ(members(*g.embd), (std::vector<int32_t>{first, last}));
        }
    }

    // The pipeline ring: send to the next stage, receive from the previous one, over the pp group.
    std::vector<int32_t> out = {world().rank()}, in = {-1};
    const P2POp ops[] = {P2POp::send<int32_t>(out, g.next_stage_rank()), P2POp::recv<int32_t>(in, g.prev_stage_rank())};
    g.pp->batch_send_recv(ops).wait();
    EXPECT_EQ(in[0], global(t, d, (p + pp - 1) % pp));
}

TEST(ProcessGroups, EveryLayoutOfTheWorld) {
    for (const Layout& L : layouts_of(world().size())) check_layout(L);
}

TEST(ProcessGroups, ListedLayoutsAreCovered) {
    const Layout listed[] = {{2, 1, 1}, {1, 2, 1}, {1, 1, 2}, {2, 2, 1}, {2, 1, 2},
                             {1, 2, 2}, {2, 2, 2}, {4, 1, 2}, {2, 4, 1}, {1, 1, 8}};
    int fitting = 0;
    for (const Layout& L : listed) {
        if (L.tp * L.pp * L.dp != world().size()) continue;
        ++fitting;
        bool found = false;
        for (const Layout& M : layouts_of(world().size())) found |= M.tp == L.tp && M.pp == L.pp && M.dp == L.dp;
        EXPECT_TRUE(found);
    }
    const int expected = world().size() == 2 || world().size() == 4 ? 3 : world().size() == 8 ? 4 : fitting;
    EXPECT_EQ(fitting, expected);
}

}  // namespace
}  // namespace ms::test
