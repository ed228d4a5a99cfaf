// process_groups.h: the tp/pp/dp/mp/embd/cp communicators of one rank, split from world (docs/design.md §4).
//
// The members of every group come from the Topology (engine/parallel/topology.h, the one place the rank order
// "tp-dp-pp" is decided): each rank splits with colour Topology::group_index and key its position in
// Topology::group_of, so a communicator holds exactly the listed ranks in the listed (ascending) order:
//   tp   groups(Axis::kTP)               size tp
//   dp   groups(Axis::kDP)               size dp (the replicas x cp: topology.h)
//   pp   groups(Axis::kPP)               size pp
//   mp   groups(Axis::kTP | Axis::kPP)   size tp * pp (model parallel), mp rank = tp_rank + tp * pp_rank
//   cp   context_groups()                size cp: one sample's context-parallel ranks (ring attention), within dp
//   embd embedding_group(rank): {first, last} pp stage of each (tp, dp), for the tied word embedding's gradient;
//        the rank alone when pp == 1; middle stages hold no word embedding and get nullptr (Megatron's group).
// Every rank takes part in every split (splits are collective). Size-1 groups are real communicators whose
// collectives are no-ops, so tp = 1 and pp = 1 run the same code as any other layout.
//
// Which communicator (CommOptions, run.comm; comm/nccl/comm_choice.h): with MPI every group is an MpiCommunicator
// split from world. With NCCL, tp, pp, dp, mp and embd are NcclCommunicators split (ncclCommSplit, same color and
// key) from an NCCL communicator over world that lives only while the groups are made; collectives on host memory
// (the pipeline's loss) still go through MPI inside them (comm/nccl/nccl_communicator.h). world stays MPI (the
// trainer's host-side collectives, checkpoints). pp can be NCCL, which matches point-to-point messages in issue
// order without tags and may hold a send until its receive is posted, because the pipeline issues each run of
// sends and receives as one batch (Megatron's send_forward_recv_backward and its siblings) whose sequence
// engine/parallel/schedule.h's check_in_order_p2p proves free of deadlock under exactly those semantics.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/nccl/comm_choice.h"
#include "engine/backends/backend.h"
#include "engine/parallel/topology.h"

namespace ms {

struct ProcessGroups {
    Topology topology;                                   // the layout the groups were split by
    Communicator* world = nullptr;                       // not owned, unless it is own_world
    std::unique_ptr<Communicator> tp, pp, dp, mp, embd;  // embd: nullptr on middle pipeline stages
    std::unique_ptr<Communicator> cp;                    // the context group (part of dp: topology.h)
    std::unique_ptr<Communicator> own_world;  // a decorated world that world points to (link_model_communicator.h)
    int tp_size = 1, pp_size = 1, dp_size = 1;
    int tp_rank = 0, pp_rank = 0, dp_rank = 0;
    int cp_size = 1, cp_rank = 0;  // dp_rank % cp_size; the replica reading this rank's samples is dp_rank / cp_size

    // The data-parallel replicas (dp_size / cp_size) and this rank's: the sampler's micro-batch index arithmetic.
    int replicas() const { return dp_size / cp_size; }
    int replica() const { return dp_rank / cp_size; }
    CommKind comm = CommKind::kMpi;  // of tp, pp, dp, mp, embd: kMpi or kNccl (world is MPI either way)

    // Every group but world (each may be null: embd on a middle stage), for decorating them all alike.
    std::vector<std::unique_ptr<Communicator>*> groups() { return {&tp, &pp, &dp, &mp, &embd, &cp}; }

    bool is_first_stage() const { return pp_rank == 0; }
    bool is_last_stage() const { return pp_rank == pp_size - 1; }
    bool in_embd_group() const { return embd != nullptr; }
    // Ranks within the pp group (== pipeline stage), wrapping around as Megatron's next/prev rank do.
    int next_stage_rank() const { return (pp_rank + 1) % pp_size; }
    int prev_stage_rank() const { return (pp_rank + pp_size - 1) % pp_size; }
};

// What the groups are made of (the trainer passes run.comm, run.backend and MpiRuntime's node layout).
struct CommOptions {
    CommKind comm = CommKind::kMpi;           // run.comm; kAuto and kNccl resolve through resolve_comm (comm_choice.h)
    BackendKind backend = BackendKind::kCPU;  // run.backend, parsed (RunLayout): NCCL needs device memory
    int local_rank = 0;  // among the ranks of this node: NCCL runs on device local_rank % devices, as CudaBackend
    int local_size = 1;  // ranks on this node: more than its devices means ranks share a GPU (no NCCL)
};

// The coordinates of a world rank: rank = tp_rank + tp * (dp_rank + dp * pp_rank), for comm/'s messages (the
// collective watch naming a lost rank) where only tp and dp are at hand; Topology::coord_of with any pp.
struct GridCoord {
    int tp, dp, pp;
};
GridCoord coord_of(int rank, int tp, int dp);

// The groups of `topology` (validated once, by make_topology), which must span world. Throws ms::UserError when
// run.comm: nccl cannot run here (resolve_comm). Collective over world (an MpiCommunicator when options.comm is not
// kMpi). Logs the communicator it chose.
ProcessGroups make_process_groups(Communicator& world, const Topology& topology, const CommOptions& options = {});

}  // namespace ms
