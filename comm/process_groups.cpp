#include "comm/process_groups.h"

#include <fmt/format.h>

#include "engine/core/check.h"

namespace ms {
namespace {

// global rank = tp_rank + tp * (dp_rank + dp * pp_rank)
struct GridCoord {
    int tp, dp, pp;
};
GridCoord coord_of(int rank, int tp, int dp) { return {rank % tp, (rank / tp) % dp, rank / (tp * dp)}; }

}  // namespace

ProcessGroups make_process_groups(Communicator& world, int tp, int pp, int dp) {
    if (tp < 1 || pp < 1 || dp < 1)
        throw UserError(fmt::format("config error: parallel sizes must be at least 1, got tp({}) pp({}) dp({})", tp,
                                    pp, dp));
    if (static_cast<long>(tp) * pp * dp != world.size())
        throw UserError(fmt::format(
            "config error: tensor_model_parallel_size({}) * pipeline_model_parallel_size({}) * data parallel "
            "size({}) = {} != world size {}\n---> HINT: launch tp * pp * dp ranks (mpirun -n), or leave dp out to "
            "derive it as world / (tp * pp)",
            tp, pp, dp, static_cast<long>(tp) * pp * dp, world.size()));

    const int rank = world.rank();
    const GridCoord c = coord_of(rank, tp, dp);
    ProcessGroups g;
    g.world = &world;
    g.tp_size = tp;
    g.pp_size = pp;
    g.dp_size = dp;
    g.tp_rank = c.tp;
    g.pp_rank = c.pp;
    g.dp_rank = c.dp;
    // color = index of the coordinates the group holds fixed; key = position inside the group.
    g.tp = world.split(c.dp + dp * c.pp, c.tp, "tp");
    g.dp = world.split(c.tp + tp * c.pp, c.dp, "dp");
    g.pp = world.split(c.tp + tp * c.dp, c.pp, "pp");
    g.mp = world.split(c.dp, rank, "mp");
    const bool has_embedding = g.is_first_stage() || g.is_last_stage();
    g.embd = world.split(has_embedding ? c.tp + tp * c.dp : -1, c.pp, "embd");
    MS_CHECK(g.tp->size() == tp && g.dp->size() == dp && g.pp->size() == pp && g.mp->size() == tp * pp,
             "process groups have sizes tp {} dp {} pp {} mp {}, expected {} {} {} {}", g.tp->size(), g.dp->size(),
             g.pp->size(), g.mp->size(), tp, dp, pp, tp * pp);
    MS_CHECK(g.tp->rank() == c.tp && g.dp->rank() == c.dp && g.pp->rank() == c.pp,
             "group ranks tp {} dp {} pp {} differ from the coordinates {} {} {}", g.tp->rank(), g.dp->rank(),
             g.pp->rank(), c.tp, c.dp, c.pp);
    return g;
}

}  // namespace ms
