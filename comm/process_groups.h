// process_groups.h: the tp/pp/dp/mp/embd communicators of one rank, split from world (docs/design.md §4).
//
// Rank order "tp-dp-pp" (Megatron), TP fastest:  global rank = tp_rank + tp * (dp_rank + dp * pp_rank).
// So TP groups are adjacent ranks (one node), PP is the slowest axis.
//   tp   ranks with the same (dp, pp), ordered by tp_rank            size tp
//   dp   ranks with the same (tp, pp), ordered by dp_rank            size dp
//   pp   ranks with the same (tp, dp), ordered by pp_rank            size pp
//   mp   ranks with the same dp (model parallel: tp x pp), ordered by global rank, i.e. tp_rank + tp * pp_rank
//   embd the first and the last pp stage of each (tp, dp): {first, last} in that order, for the tied word
//        embedding's gradient. With pp == 1 it is the rank alone (size 1); middle stages get nullptr.
// Every rank takes part in every split (splits are collective). Size-1 groups are real communicators whose
// collectives are no-ops, so tp = 1 and pp = 1 run the same code as any other layout.
// The coordinate math repeats engine/parallel/topology's in a few lines so comm/ does not depend on it; the
// tests check both against the formula above.
//
// Which communicator (CommOptions, run.comm; comm/nccl/comm_choice.h): with MPI every group is an MpiCommunicator
// split from world. With NCCL, tp, dp, mp and embd are NcclCommunicators split (ncclCommSplit, same color and key)
// from an NCCL communicator over world that lives only while the groups are made; collectives on host memory
// still go through MPI inside them (comm/nccl/nccl_communicator.h). world stays MPI (the trainer's host-side
// collectives, checkpoints), and so does pp: the pipeline posts its sends without waiting and matches messages by
// tag, while NCCL matches point-to-point messages in issue order and a send may block until its receive is
// posted, so pp moves to NCCL only once the schedule batches each send with its receive (Megatron's
// send_forward_recv_backward).
#pragma once

#include <memory>
#include <string_view>

#include "comm/communicator.h"
#include "comm/nccl/comm_choice.h"

namespace ms {

struct ProcessGroups {
    Communicator* world = nullptr;                       // not owned
    std::unique_ptr<Communicator> tp, pp, dp, mp, embd;  // embd: nullptr on middle pipeline stages
    int tp_size = 1, pp_size = 1, dp_size = 1;
    int tp_rank = 0, pp_rank = 0, dp_rank = 0;
    CommKind comm = CommKind::kMpi;  // of tp, dp, mp, embd: kMpi or kNccl (world and pp are MPI either way)

    bool is_first_stage() const { return pp_rank == 0; }
    bool is_last_stage() const { return pp_rank == pp_size - 1; }
    bool in_embd_group() const { return embd != nullptr; }
    // Ranks within the pp group (== pipeline stage), wrapping around as Megatron's next/prev rank do.
    int next_stage_rank() const { return (pp_rank + 1) % pp_size; }
    int prev_stage_rank() const { return (pp_rank + pp_size - 1) % pp_size; }
};

// What the groups are made of (the trainer passes run.comm, run.backend and MpiRuntime's node layout).
struct CommOptions {
    CommKind comm = CommKind::kMpi;    // run.comm; kAuto and kNccl resolve through resolve_comm (comm_choice.h)
    std::string_view backend = "cpu";  // run.backend
    int local_rank = 0;  // among the ranks of this node: NCCL runs on device local_rank % devices, as CudaBackend
    int local_size = 1;  // ranks on this node: more than its devices means ranks share a GPU (no NCCL)
};

// The coordinates of a world rank: rank = tp_rank + tp * (dp_rank + dp * pp_rank). The one place the rank order
// is decoded in comm/ (the groups, and the collective watch naming a lost rank).
struct GridCoord {
    int tp, dp, pp;
};
GridCoord coord_of(int rank, int tp, int dp);

// Throws ms::UserError unless tp, pp, dp >= 1 and tp * pp * dp == world.size() (checked identically on every rank
// before any split), and when run.comm: nccl cannot run here (resolve_comm). Collective over world (an
// MpiCommunicator when options.comm is not kMpi). Logs the communicator it chose.
ProcessGroups make_process_groups(Communicator& world, int tp, int pp, int dp, const CommOptions& options = {});

}  // namespace ms
