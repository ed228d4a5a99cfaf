// process_groups.cpp: the communicators of the Topology's groups (see process_groups.h).
#include "comm/process_groups.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "engine/core/check.h"
#include "engine/core/log.h"

namespace ms {
namespace {

// The communicator of the device groups, agreed by every rank. Collective over world unless run.comm is mpi (or no
// NCCL could run anyway): each rank says whether it has a device of its own, and one rank without makes it no.
CommResolution choose_comm(Communicator& world, const CommOptions& o) {
    const NcclRegistration* nccl = nccl_registration();
    bool device_per_rank = false;
    if (o.comm != CommKind::kMpi && o.backend == BackendKind::kCUDA && nccl != nullptr) {
        int32_t shared = o.local_size > nccl->device_count() ? 1 : 0;
        world.all_reduce(std::span<int32_t>(&shared, 1), ReduceOp::kMax).wait();
        device_per_rank = shared == 0;
    }
    return resolve_comm(o.comm, backend_kind_name(o.backend), nccl != nullptr, device_per_rank);
}

// The communicator of `members` (sorted global ranks holding `rank`, or empty: no group), split from `from` with
// colour `color` and key the rank's position in the list; checked against the list it was made from.
std::unique_ptr<Communicator> split_group(Communicator& from, int rank, const std::vector<int>& members, int color,
                                          const char* name) {
    const auto at = std::find(members.begin(), members.end(), rank);
    MS_CHECK(members.empty() || at != members.end(), "rank {} is not in its own {} group", rank, name);
    const int key = members.empty() ? 0 : static_cast<int>(at - members.begin());
    std::unique_ptr<Communicator> g = from.split(members.empty() ? -1 : color, key, name);
    MS_CHECK(members.empty() || (g != nullptr && g->size() == static_cast<int>(members.size()) && g->rank() == key),
             "the {} communicator of rank {} has size {} and rank {}, its topology group {} ranks with it at {}", name,
             rank, g ? g->size() : 0, g ? g->rank() : -1, members.size(), key);
    return g;
}

}  // namespace

GridCoord coord_of(int rank, int tp, int dp) { return {rank % tp, (rank / tp) % dp, rank / (tp * dp)}; }

ProcessGroups make_process_groups(Communicator& world, const Topology& topology, const CommOptions& options) {
    MS_CHECK(topology.world() == world.size(), "the topology tp {} dp {} pp {} has {} ranks, the world {}", topology.tp,
             topology.dp, topology.pp, topology.world(), world.size());
    const CommResolution choice = choose_comm(world, options);
    const int rank = world.rank();
    const Coord c = topology.coord_of(rank);
    ProcessGroups g;
    g.topology = topology;
    g.comm = choice.kind;
    g.world = &world;
    g.tp_size = topology.tp;
    g.pp_size = topology.pp;
    g.dp_size = topology.dp;
    g.tp_rank = c.tp;
    g.pp_rank = c.pp;
    g.dp_rank = c.dp;
    g.cp_size = topology.cp;
    g.cp_rank = topology.cp_rank(rank);
    // The device groups split from an NCCL communicator over world (destroyed once they are made: its children are
    // communicators of their own), or from world itself.
    std::unique_ptr<Communicator> nccl_world;
    if (choice.kind == CommKind::kNccl) {
        const NcclRegistration& nccl = *nccl_registration();
        const int device = options.local_rank % nccl.device_count();
        nccl_world = nccl.make_world(world, device);
        log_info(
            "comm: NCCL {} for the tp, pp, dp, mp, embd and cp groups, on device local rank % {} ({}); world and "
            "collectives on host memory on MPI",
            nccl.version, nccl.device_count(), choice.reason);
    } else {
        log_info("comm: MPI for every group ({})", choice.reason);
    }
    Communicator& device_world = nccl_world ? *nccl_world : world;
    const auto axis_group = [&](Communicator& from, Axis mask, const char* name) {
        return split_group(from, rank, topology.group_of(rank, mask), topology.group_index(rank, mask), name);
    };
    g.tp = axis_group(device_world, Axis::kTP, "tp");
    g.dp = axis_group(device_world, Axis::kDP, "dp");
    g.pp = axis_group(device_world, Axis::kPP, "pp");
    g.cp = split_group(device_world, rank, topology.context_group(rank), topology.context_group_index(rank), "cp");
    g.mp = axis_group(device_world, Axis::kTP | Axis::kPP, "mp");
    // One embedding group per pipeline group: its colour is the pipeline group's index.
    g.embd =
        split_group(device_world, rank, topology.embedding_group(rank), topology.group_index(rank, Axis::kPP), "embd");
    return g;
}

}  // namespace ms
