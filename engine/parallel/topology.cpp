// topology.cpp: see topology.h for the rank order and the group numbering.
#include "engine/parallel/topology.h"

#include <fmt/format.h>

#include <utility>

#include "engine/core/check.h"

namespace ms {

namespace {

// The axes in rank order (fastest first) with their sizes and a rank's coordinate on each.
constexpr Axis kAxesInOrder[3] = {Axis::kTP, Axis::kDP, Axis::kPP};

int axis_size(const Topology& t, Axis a) { return a == Axis::kTP ? t.tp : a == Axis::kDP ? t.dp : t.pp; }
int axis_coord(const Coord& c, Axis a) { return a == Axis::kTP ? c.tp : a == Axis::kDP ? c.dp : c.pp; }

}  // namespace

Coord Topology::coord_of(int rank) const {
    MS_CHECK(rank >= 0 && rank < world(), "rank {} outside the world of {} (tp {} dp {} pp {})", rank, world(), tp, dp,
             pp);
    return Coord{rank % tp, rank / tp % dp, rank / (tp * dp)};
}

int Topology::rank_of(Coord c) const {
    MS_CHECK(c.tp >= 0 && c.tp < tp && c.dp >= 0 && c.dp < dp && c.pp >= 0 && c.pp < pp,
             "coordinates (tp {}, dp {}, pp {}) outside the topology tp {} dp {} pp {}", c.tp, c.dp, c.pp, tp, dp, pp);
    return c.tp + tp * (c.dp + dp * c.pp);
}

int Topology::group_size(Axis mask) const {
    int size = 1;
    for (Axis a : kAxesInOrder) {
        if (has_axis(mask, a)) size *= axis_size(*this, a);
    }
    return size;
}

int Topology::group_index(int rank, Axis mask) const {
    // Mixed-radix number of the fixed coordinates, TP fastest: removing the varying axes keeps the rank order, so
    // the first ranks of the groups increase with the index.
    const Coord c = coord_of(rank);
    int index = 0, radix = 1;
    for (Axis a : kAxesInOrder) {
        if (has_axis(mask, a)) continue;
        index += axis_coord(c, a) * radix;
        radix *= axis_size(*this, a);
    }
    return index;
}

std::vector<std::vector<int>> Topology::groups(Axis mask) const {
    std::vector<std::vector<int>> out(world() / group_size(mask));
    for (int rank = 0; rank < world(); ++rank) out[group_index(rank, mask)].push_back(rank);  // ascending per group
    return out;
}

std::vector<int> Topology::group_of(int rank, Axis mask) const {
    // Walk the varying coordinates in rank order (PP outermost, TP innermost), holding the others at rank's.
    const Coord c = coord_of(rank);
    const auto range = [&](Axis a, int own, int size) {
        return has_axis(mask, a) ? std::pair{0, size} : std::pair{own, own + 1};
    };
    const auto [p0, p1] = range(Axis::kPP, c.pp, pp);
    const auto [d0, d1] = range(Axis::kDP, c.dp, dp);
    const auto [t0, t1] = range(Axis::kTP, c.tp, tp);
    std::vector<int> out;
    out.reserve(group_size(mask));
    for (int p = p0; p < p1; ++p) {
        for (int d = d0; d < d1; ++d) {
            for (int t = t0; t < t1; ++t) out.push_back(rank_of(Coord{t, d, p}));
        }
    }
    return out;
}

std::vector<int> Topology::embedding_group(int rank) const {
    Coord c = coord_of(rank);
    if (pp == 1) return {rank};
    if (c.pp != 0 && c.pp != pp - 1) return {};  // a middle stage: no word embedding
    c.pp = 0;
    const int first = rank_of(c);
    c.pp = pp - 1;
    return {first, rank_of(c)};
}

std::vector<std::vector<int>> Topology::context_groups() const {
    std::vector<std::vector<int>> out(static_cast<size_t>(world() / cp));
    for (int rank = 0; rank < world(); ++rank) out[static_cast<size_t>(context_group_index(rank))].push_back(rank);
    return out;
}

int Topology::context_group_index(int rank) const {
    // the coordinates other than cp_rank, TP fastest: (tp, replica, pp)
    const Coord c = coord_of(rank);
    return c.tp + tp * (c.dp / cp + replicas() * c.pp);
}

Topology make_topology(int world, int tp, int pp, int cp) {
    if (world < 1) throw UserError(fmt::format("config error: the world size must be >= 1, got {}", world));
    if (tp < 1 || pp < 1 || cp < 1) {
        throw UserError(
            fmt::format("config error: parallel.tensor_model_parallel_size({}), pipeline_model_parallel_size({}) and "
                        "context_parallel_size({}) must all be >= 1; hint: use 1 to switch an axis off",
                        tp, pp, cp));
    }
    const int64_t model_parallel = int64_t{tp} * pp;
    if (world % model_parallel != 0) {
        throw UserError(fmt::format(
            "config error: parallel.tensor_model_parallel_size({}) * pipeline_model_parallel_size({}) = {} does not "
            "divide the world size {}; hint: launch a multiple of {} ranks, or change tp / pp so that their product "
            "divides {} (the data-parallel size is derived as world / (tp * pp))",
            tp, pp, model_parallel, world, model_parallel, world));
    }
    const int dp = static_cast<int>(world / model_parallel);
    if (dp % cp != 0) {
        throw UserError(fmt::format(
            "config error: parallel.tensor_model_parallel_size({}) * pipeline_model_parallel_size({}) * "
            "context_parallel_size({}) = {} does not divide the world size {}; hint: launch a multiple of {} ranks, "
            "or change tp / pp / cp (the data-parallel size is derived as world / (tp * pp * cp))",
            tp, pp, cp, model_parallel * cp, world, model_parallel * cp));
    }
    return Topology{tp, dp, pp, cp};
}

}  // namespace ms
