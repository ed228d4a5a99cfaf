// topology.h: the rank <-> (tp, dp, pp) coordinate map and the process groups it implies (Megatron's
// RankGenerator, made explicit). Pure: no MPI, no NCCL, no threads; comm/ turns groups into communicators with a
// split whose colour is group_index().
//
// Order "tp-dp-pp", TP fastest:
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
#pragma once

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
};

// Validates the layout of `world` ranks into tp x dp x pp (dp derived) and returns it: the one check of the split
// (validate_config calls it). Throws ms::UserError with the numbers and a hint when a size is < 1 or tp * pp does not
// divide world (tp * pp computed in 64 bits: each may be as large as INT_MAX).
Topology make_topology(int world, int tp, int pp);

}  // namespace ms
