// topology.h: the rank <-> (tp, dp, pp) coordinate map and the process groups it implies (Megatron's
// RankGenerator, made explicit). Pure: no MPI, no NCCL, no threads; comm/ turns groups into communicators with a
// split whose colour is group_index().
//
// Order "tp-dp-pp", TP fastest (with context parallelism "tp-cp-dp-pp": below):
//     rank = tp_rank + tp * (dp_rank + dp * pp_rank)
// so a tensor-parallel group is a run of adjacent ranks (same node, NVLink) and PP is the slowest axis.
//
// A group along a set of axes (the mask) holds the ranks that differ only in those axes. The groups of one mask
// partition the world; they are numbered by group_index(), the mixed-radix number formed by the coordinates of
// the axes NOT in the mask, in the same tp-dp-pp order (TP fastest). Every group is sorted by rank, and groups()
// lists them in group_index order (which is also the order of their first ranks). Megatron names:
//     tp = groups(Axis::kTP), dp = groups(Axis::kDP), pp = groups(Axis::kPP), mp = groups(Axis::kTP | Axis::kPP)
// and embd = embedding_group(rank): the first and last pipeline stage, for the tied word embedding's gradient.
// comm/process_groups.cpp splits the communicators from these lists (docs/design.md §4): this file is the one
// place the rank order is decided.
//
// Context parallelism (Megatron's context_parallel_size, cp) splits each sample's sequence over cp ranks that hold
// the same model shard. Those ranks are part of the data-parallel axis: dp counts every rank that holds the same
// shard (Megatron's "dp x cp" group, over which gradients are reduced and ZeRO-1 shards the optimizer), and its cp
// fastest coordinates are one sample's context-parallel ranks, so Megatron's order "tp-cp-dp-pp" is
//     rank = tp_rank + tp * (cp_rank + cp * replica + dp * pp_rank),   dp coordinate = cp_rank + cp * replica
// with dp / cp data-parallel replicas reading different samples (replicas()). A context group is a run of cp ranks
// tp apart.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ms {

// A parallel axis; values are bits so that axes combine into a mask (Axis::kTP | Axis::kPP).
enum class Axis : uint8_t { kTP = 1, kDP = 2, kPP = 4 };

constexpr Axis operator|(Axis a, Axis b) {
    return static_cast<Axis>(static_cast<uint8_t>(a) | static_cast<uint8_t>(b));
}
// True when `mask` contains every axis of `axis`.
constexpr bool has_axis(Axis mask, Axis axis) {
    return (static_cast<uint8_t>(mask) & static_cast<uint8_t>(axis)) == static_cast<uint8_t>(axis);
}

// A rank's position along each axis: tp in [0, Topology::tp), and so on.
struct Coord {
    int tp = 0, dp = 0, pp = 0;
    bool operator==(const Coord&) const = default;
};

struct Topology {
    int tp = 1, dp = 1, pp = 1;  // axis sizes; world = tp * dp * pp
    int cp = 1;                  // context-parallel ranks among the dp coordinate's (dividing dp)

    int world() const { return tp * dp * pp; }
    // rank in [0, world) -> coordinates; rank_of is its inverse.
    Coord coord_of(int rank) const;
    int rank_of(Coord c) const;

    // All groups of ranks that vary along the axes in `mask` with the other coordinates fixed; each sorted by
    // rank, listed by group_index. An empty mask (Axis{}) gives one group per rank.
    std::vector<std::vector<int>> groups(Axis mask) const;
    // Index of the group of `mask` that holds `rank` (the colour for a communicator split); in [0, world / size).
    int group_index(int rank, Axis mask) const;
    // Number of ranks in one group of `mask`: the product of the sizes of its axes.
    int group_size(Axis mask) const;
    // The ranks of one group: the one of `mask` that holds `rank`, sorted.
    std::vector<int> group_of(int rank, Axis mask) const;

    // The tied-embedding group of `rank` (Megatron's embedding group): the first and the last pipeline stage with
    // the same (tp, dp) coordinates, sorted, when `rank` is one of them; just {rank} when pp == 1; empty on a middle
    // stage, which holds no copy of the word embedding and so has no gradient to sum (it takes part in the
    // communicator split without a colour). Its index among the embedding groups is group_index(rank, Axis::kPP).
    std::vector<int> embedding_group(int rank) const;

    // The data-parallel replicas, which read different samples: dp / cp.
    int replicas() const { return dp / cp; }
    // A rank's place in its context group (cp_rank, in [0, cp)) and its replica (in [0, replicas())).
    int cp_rank(int rank) const { return coord_of(rank).dp % cp; }
    int replica(int rank) const { return coord_of(rank).dp / cp; }
    // The context groups: the cp ranks of each (tp, replica, pp), sorted, listed in the order of their first ranks;
    // context_group_index(rank) is the index of rank's group there (the colour for a communicator split).
    std::vector<std::vector<int>> context_groups() const;
    int context_group_index(int rank) const;
    std::vector<int> context_group(int rank) const {
        return context_groups()[static_cast<size_t>(context_group_index(rank))];
    }
};

// Validates the layout of `world` ranks into tp x dp x pp (dp derived, cp of its ranks one sample's context group)
// and returns it: the one check of the split (validate_config calls it). Throws ms::UserError with the numbers and a
// hint when a size is < 1 or tp * pp * cp does not divide world (computed in 64 bits: each may be as large as
// INT_MAX).
Topology make_topology(int world, int tp, int pp, int cp = 1);

}  // namespace ms
