// test_topology.cpp: Topology (engine/parallel/topology.h) for every factorisation (tp, dp, pp) of every world size
// 1..64 and every axis mask, against a brute-force enumeration written here independently: the coordinates come
// from three nested loops in rank order (TP innermost), and two ranks share a group exactly when their coordinates
// agree on every axis outside the mask. Plus Megatron's documented example and the make_topology errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "engine/parallel/topology.h"

namespace ms {
// Readable failure messages for coordinates.
void PrintTo(const Coord& c, std::ostream* os) { *os << "(tp " << c.tp << ", dp " << c.dp << ", pp " << c.pp << ")"; }
}  // namespace ms

namespace {

using ms::Axis;
using ms::Coord;
using ms::Topology;
using Groups = std::vector<std::vector<int>>;

constexpr Axis kSingleAxes[3] = {Axis::kTP, Axis::kDP, Axis::kPP};

// Every mask: empty, the three single axes, the three pairs, all three.
std::vector<Axis> all_masks() {
    std::vector<Axis> masks;
    for (int bits = 0; bits < 8; ++bits) masks.push_back(static_cast<Axis>(bits));
    return masks;
}

// Every (tp, dp, pp) with tp * dp * pp <= max_world.
std::vector<Topology> all_topologies(int max_world) {
    std::vector<Topology> out;
    for (int world = 1; world <= max_world; ++world) {
        for (int tp = 1; tp <= world; ++tp) {
            for (int pp = 1; tp * pp <= world; ++pp) {
                if (world % (tp * pp) == 0) out.push_back(Topology{tp, world / (tp * pp), pp});
            }
        }
    }
    return out;
}

// Coordinates of every rank, by enumeration: the rank is the position in the loop nest, TP innermost.
std::vector<Coord> enumerate_coords(const Topology& t) {
    std::vector<Coord> coords;
    for (int p = 0; p < t.pp; ++p) {
        for (int d = 0; d < t.dp; ++d) {
            for (int x = 0; x < t.tp; ++x) coords.push_back(Coord{x, d, p});
        }
    }
    return coords;
}

bool in_mask(Axis mask, Axis a) { return (static_cast<int>(mask) & static_cast<int>(a)) != 0; }

// Groups of `mask` by brute force: ranks are grouped by their coordinates on the axes outside the mask; groups are
// listed by first rank (which the header documents to be the group_index order).
Groups brute_force_groups(const std::vector<Coord>& coords, Axis mask) {
    std::map<std::vector<int>, std::vector<int>> by_key;
    std::vector<std::vector<int>> key_order;
    for (int r = 0; r < static_cast<int>(coords.size()); ++r) {
        const Coord& c = coords[r];
        std::vector<int> key = {in_mask(mask, Axis::kTP) ? -1 : c.tp, in_mask(mask, Axis::kDP) ? -1 : c.dp,
                                in_mask(mask, Axis::kPP) ? -1 : c.pp};
        if (!by_key.count(key)) key_order.push_back(key);
        by_key[key].push_back(r);
    }
    Groups out;
    for (const auto& key : key_order) out.push_back(by_key[key]);
    return out;
}

std::string describe(const Topology& t) {
    return "tp " + std::to_string(t.tp) + " dp " + std::to_string(t.dp) + " pp " + std::to_string(t.pp);
}

TEST(TopologyTest, CoordinatesMatchEnumerationAndInvert) {
    for (const Topology& t : all_topologies(64)) {
        const std::vector<Coord> coords = enumerate_coords(t);
        ASSERT_EQ(t.world(), static_cast<int>(coords.size())) << describe(t);
        for (int r = 0; r < t.world(); ++r) {
            ASSERT_EQ(t.coord_of(r), coords[r]) << describe(t) << " rank " << r;
            ASSERT_EQ(t.rank_of(coords[r]), r) << describe(t);
            ASSERT_EQ(r, coords[r].tp + t.tp * (coords[r].dp + t.dp * coords[r].pp)) << describe(t);
        }
    }
}

TEST(TopologyTest, GroupsMatchBruteForceAndPartitionTheWorld) {
    for (const Topology& t : all_topologies(64)) {
        const std::vector<Coord> coords = enumerate_coords(t);
        for (Axis mask : all_masks()) {
            const Groups groups = t.groups(mask);
            ASSERT_EQ(groups, brute_force_groups(coords, mask)) << describe(t) << " mask " << static_cast<int>(mask);

            int expected_size = 1;
            for (Axis a : kSingleAxes) {
                if (in_mask(mask, a)) expected_size *= a == Axis::kTP ? t.tp : a == Axis::kDP ? t.dp : t.pp;
            }
            ASSERT_EQ(t.group_size(mask), expected_size);
            ASSERT_EQ(static_cast<int>(groups.size()) * expected_size, t.world());

            // A partition: every rank exactly once, each group sorted; group_index and group_of agree with it.
            std::vector<int> seen(t.world(), 0);
            for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
                ASSERT_EQ(static_cast<int>(groups[g].size()), expected_size) << describe(t);
                ASSERT_TRUE(std::is_sorted(groups[g].begin(), groups[g].end()));
                for (int r : groups[g]) {
                    ++seen[r];
                    ASSERT_EQ(t.group_index(r, mask), g) << describe(t) << " rank " << r;
                    ASSERT_EQ(t.group_of(r, mask), groups[g]);
                }
            }
            ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; })) << describe(t);
        }
    }
}

TEST(TopologyTest, SingleAxisGroupsMeetInExactlyOneRank) {
    for (const Topology& t : all_topologies(64)) {
        for (int r = 0; r < t.world(); ++r) {
            for (Axis a : kSingleAxes) {
                for (Axis b : kSingleAxes) {
                    if (a == b) continue;
                    const std::vector<int> ga = t.group_of(r, a), gb = t.group_of(r, b);
                    std::vector<int> both;
                    std::set_intersection(ga.begin(), ga.end(), gb.begin(), gb.end(), std::back_inserter(both));
                    ASSERT_EQ(both, std::vector<int>{r}) << describe(t);
                    // The pair's group is exactly the ranks reachable by moving along a, then along b.
                    std::vector<int> span;
                    for (int x : ga) {
                        for (int y : t.group_of(x, b)) span.push_back(y);
                    }
                    std::sort(span.begin(), span.end());
                    ASSERT_EQ(span, t.group_of(r, a | b)) << describe(t);
                }
            }
        }
    }
}

TEST(TopologyTest, TensorParallelGroupsAreContiguousRankRanges) {
    for (const Topology& t : all_topologies(64)) {
        for (const std::vector<int>& g : t.groups(Axis::kTP)) {
            ASSERT_EQ(g.front() % t.tp, 0) << describe(t);
            for (int i = 0; i < static_cast<int>(g.size()); ++i) ASSERT_EQ(g[i], g.front() + i) << describe(t);
        }
    }
}

TEST(TopologyTest, EmbeddingGroupIsFirstAndLastStage) {
    for (const Topology& t : all_topologies(64)) {
        for (int r = 0; r < t.world(); ++r) {
            const Coord c = t.coord_of(r);
            const std::vector<int> embd = t.embedding_group(r);
            if (t.pp == 1) {
                ASSERT_EQ(embd, std::vector<int>{r});
                continue;
            }
            // Megatron's embedding group: only the stages that hold a copy of the word embedding are in it.
            if (c.pp != 0 && c.pp != t.pp - 1) {
                ASSERT_TRUE(embd.empty()) << describe(t) << " rank " << r;
                continue;
            }
            ASSERT_EQ(embd.size(), 2u) << describe(t);
            ASSERT_EQ(t.coord_of(embd[0]), (Coord{c.tp, c.dp, 0})) << describe(t);
            ASSERT_EQ(t.coord_of(embd[1]), (Coord{c.tp, c.dp, t.pp - 1})) << describe(t);
            ASSERT_EQ(std::count(embd.begin(), embd.end(), r), 1);
            // A subset of the rank's pipeline group, shared by both of its members.
            const std::vector<int> pipe = t.group_of(r, Axis::kPP);
            ASSERT_TRUE(std::includes(pipe.begin(), pipe.end(), embd.begin(), embd.end()));
            for (int q : embd) ASSERT_EQ(t.embedding_group(q), embd);
        }
    }
}

// Megatron's docstring example (initialize_model_parallel): 16 GPUs, tp 2, pp 4 -> dp 2.
TEST(TopologyTest, MegatronDocstringExample) {
    const Topology t = ms::make_topology(16, 2, 4);
    EXPECT_EQ(t.dp, 2);
    EXPECT_EQ(t.groups(Axis::kTP), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
    EXPECT_EQ(t.groups(Axis::kDP), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
    EXPECT_EQ(t.groups(Axis::kPP), (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
    EXPECT_EQ(t.groups(Axis::kTP | Axis::kPP), (Groups{{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}}));
    EXPECT_EQ(t.embedding_group(13), (std::vector<int>{1, 13}));
    EXPECT_EQ(t.embedding_group(1), (std::vector<int>{1, 13}));
    EXPECT_TRUE(t.embedding_group(5).empty());  // stage 1 of 4: no word embedding
    EXPECT_EQ(t.group_index(7, Axis::kTP), 3);
    EXPECT_EQ(t.group_index(7, Axis::kDP), 3);  // fixed (tp 1, pp 1) -> 1 + 2 * 1
}

// Megatron's order tp-cp-dp-pp with 16 ranks, tp 2, cp 2, pp 2: dp 4 = 2 replicas x cp 2. The context groups are
// pairs tp apart inside the data-parallel group, which spans them (gradients are averaged over both).
TEST(TopologyTest, ContextGroupsAreTheFastestRanksOfTheDataParallelAxis) {
    const Topology t = ms::make_topology(16, 2, 2, 2);
    EXPECT_EQ(t.dp, 4);
    EXPECT_EQ(t.replicas(), 2);
    EXPECT_EQ(t.context_groups(), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
    EXPECT_EQ(t.groups(Axis::kDP), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
    for (int rank = 0; rank < t.world(); ++rank) {
        const std::vector<int> g = t.context_group(rank);
        EXPECT_EQ(g[static_cast<size_t>(t.cp_rank(rank))], rank);
        EXPECT_EQ(t.replica(rank), t.coord_of(rank).dp / 2);
    }
    EXPECT_EQ(t.cp_rank(6), 1);
    EXPECT_EQ(t.replica(6), 1);
    try {
        ms::make_topology(8, 2, 1, 3);
        FAIL() << "expected a UserError";
    } catch (const ms::UserError& e) {
        EXPECT_NE(std::string(e.what()).find("context_parallel_size(3) = 6 does not divide the world size 8"),
                  std::string::npos)
            << e.what();
    }
}

TEST(TopologyTest, MakeTopologyRejectsSizesThatDoNotDivideTheWorld) {
    try {
        ms::make_topology(6, 2, 2);
        FAIL() << "expected a UserError";
    } catch (const ms::UserError& e) {
        const std::string msg = e.what();
        EXPECT_EQ(e.exit_code(), ms::kExitConfigError);
        EXPECT_NE(msg.find("config error: parallel.tensor_model_parallel_size(2) * pipeline_model_parallel_size(2) = 4 "
                           "does not divide the world size 6"),
                  std::string::npos)
            << msg;
        EXPECT_NE(msg.find("; hint: launch a multiple of 4 ranks"), std::string::npos) << msg;
    }
    EXPECT_THROW(ms::make_topology(4, 0, 1), ms::UserError);
    EXPECT_THROW(ms::make_topology(4, 1, -1), ms::UserError);
    EXPECT_THROW(ms::make_topology(0, 1, 1), ms::UserError);
    // tp * pp past INT_MAX is an error, not an overflow
    try {
        ms::make_topology(8, 65536, 65536);
        FAIL() << "expected a UserError";
    } catch (const ms::UserError& e) {
        EXPECT_NE(std::string(e.what()).find("= 4294967296 does not divide the world size 8"), std::string::npos);
    }
    const Topology t = ms::make_topology(12, 2, 3);
    EXPECT_EQ((Coord{t.tp, t.dp, t.pp}), (Coord{2, 2, 3}));
}

}  // namespace
