// process_groups.h: the tp/pp/dp/mp/embd communicators of one rank, split from world (DESIGN.md §4, anchors 9.7).
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
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace ms {

struct ProcessGroups {
    Communicator* world = nullptr;  // not owned
    std::unique_ptr<Communicator> tp, pp, dp, mp, embd;  // embd: nullptr on middle pipeline stages
    int tp_size = 1, pp_size = 1, dp_size = 1;
    int tp_rank = 0, pp_rank = 0, dp_rank = 0;

    bool is_first_stage() const { return pp_rank == 0; }
    bool is_last_stage() const { return pp_rank == pp_size - 1; }
    bool in_embd_group() const { return embd != nullptr; }
    // Ranks within the pp group (== pipeline stage), wrapping around as Megatron's next/prev rank do.
    int next_stage_rank() const { return (pp_rank + 1) % pp_size; }
    int prev_stage_rank() const { return (pp_rank + pp_size - 1) % pp_size; }
};

// Throws ms::UserError unless tp, pp, dp >= 1 and tp * pp * dp == world.size() (checked identically on every rank
// before any split). Collective over world.
ProcessGroups make_process_groups(Communicator& world, int tp, int pp, int dp);

}  // namespace ms
