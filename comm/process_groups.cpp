#include "comm/process_groups.h"

#include <fmt/format.h>

#include <cstdint>
#include <span>

#include "engine/core/check.h"
#include "engine/core/log.h"

namespace ms {
namespace {

// The communicator of the device groups, agreed by every rank. Collective over world unless run.comm is mpi (or no
// NCCL could run anyway): each rank says whether it has a device of its own, and one rank without makes it no.
CommResolution choose_comm(Communicator& world, const CommOptions& o) {
    const NcclRegistration* nccl = nccl_registration();
    bool device_per_rank = false;
    if (o.comm != CommKind::kMpi && o.backend == "cuda" && nccl != nullptr) {
        int32_t shared = o.local_size > nccl->device_count() ? 1 : 0;
        world.all_reduce(std::span<int32_t>(&shared, 1), ReduceOp::kMax).wait();
        device_per_rank = shared == 0;
    }
    return resolve_comm(o.comm, o.backend, nccl != nullptr, device_per_rank);
}

}  // namespace

GridCoord coord_of(int rank, int tp, int dp) { return {rank % tp, (rank / tp) % dp, rank / (tp * dp)}; }

ProcessGroups make_process_groups(Communicator& world, int tp, int pp, int dp, const CommOptions& options) {
    if (tp < 1 || pp < 1 || dp < 1)
        throw UserError(
            fmt::format("config error: parallel sizes must be at least 1, got tp({}) pp({}) dp({})", tp, pp, dp));
    if (static_cast<long>(tp) * pp * dp != world.size())
        throw UserError(fmt::format(
            "config error: tensor_model_parallel_size({}) * pipeline_model_parallel_size({}) * data parallel "
            "size({}) = {} != world size {}\n---> HINT: launch tp * pp * dp ranks (mpirun -n), or leave dp out to "
            "derive it as world / (tp * pp)",
            tp, pp, dp, static_cast<long>(tp) * pp * dp, world.size()));

    const CommResolution choice = choose_comm(world, options);
    const int rank = world.rank();
    const GridCoord c = coord_of(rank, tp, dp);
    ProcessGroups g;
    g.comm = choice.kind;
    g.world = &world;
    g.tp_size = tp;
    g.pp_size = pp;
    g.dp_size = dp;
    g.tp_rank = c.tp;
    g.pp_rank = c.pp;
    g.dp_rank = c.dp;
    // The device groups split from an NCCL communicator over world (destroyed once they are made: its children are
    // communicators of their own), or from world itself. pp always from world (process_groups.h).
    std::unique_ptr<Communicator> nccl_world;
    if (choice.kind == CommKind::kNccl) {
        const NcclRegistration& nccl = *nccl_registration();
        const int device = options.local_rank % nccl.device_count();
        nccl_world = nccl.make_world(world, device);
        log_info(
            "comm: NCCL {} for the tp, dp, mp and embd groups, on device local rank % {} ({}); world, pp and "
            "collectives on host memory on MPI",
            nccl.version, nccl.device_count(), choice.reason);
    } else {
        log_info("comm: MPI for every group ({})", choice.reason);
    }
    Communicator& device_world = nccl_world ? *nccl_world : world;
    // color = index of the coordinates the group holds fixed; key = position inside the group.
    g.tp = device_world.split(c.dp + dp * c.pp, c.tp, "tp");
    g.dp = device_world.split(c.tp + tp * c.pp, c.dp, "dp");
    g.pp = world.split(c.tp + tp * c.dp, c.pp, "pp");
    g.mp = device_world.split(c.dp, rank, "mp");
    const bool has_embedding = g.is_first_stage() || g.is_last_stage();
    g.embd = device_world.split(has_embedding ? c.tp + tp * c.dp : -1, c.pp, "embd");
    MS_CHECK(g.tp->size() == tp && g.dp->size() == dp && g.pp->size() == pp && g.mp->size() == tp * pp,
             "process groups have sizes tp {} dp {} pp {} mp {}, expected {} {} {} {}", g.tp->size(), g.dp->size(),
             g.pp->size(), g.mp->size(), tp, dp, pp, tp * pp);
    MS_CHECK(g.tp->rank() == c.tp && g.dp->rank() == c.dp && g.pp->rank() == c.pp,
             "group ranks tp {} dp {} pp {} differ from the coordinates {} {} {}", g.tp->rank(), g.dp->rank(),
             g.pp->rank(), c.tp, c.dp, c.pp);
    return g;
}

}  // namespace ms
