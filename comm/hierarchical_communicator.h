// hierarchical_communicator.h: node-aware data parallelism -- a Communicator decorator over the dp group whose
// all_reduce goes reduce-scatter inside the node, all-reduce across the nodes on 1/L of the data, all-gather inside
// the node (L: the group's ranks per node), so that each rank sends only its 1/L shard over the links between nodes
// (docs/communication.md, "Hierarchical data parallelism").
//
// Sub-groups, split from the flat dp communicator (so a link model decorator and the communication matrix treat them
// as any split; CommMatrix counts "dp.*" as dp):
//   dp.intra     the group's ranks on this node, in flat order             phase 1: reduce_scatter
//   dp.gather    the same ranks again                                     phase 3: all_gather
//   dp.inter     the ranks of the same local index on every node          phase 2: all_reduce
// Phases 1 and 3 use communicators of their own because phase 3 is issued later than the call, when phase 2 is done:
// on one communicator, the ranks of a node would interleave it with later calls' phase 1 in different orders, and
// collectives must be issued in the same order on every member.
//
// all_reduce of n elements: the first L * floor(n / L) in the three phases, floor(n / L) per local rank; the last
// n mod L on the flat group, issued with phase 1 (so n < L, a loss or a norm, is flat altogether). kSum and kAvg sum
// in every phase, and kAvg then divides by the flat size as the MPI communicator does (so integers average exactly as
// there); kMax takes the max in every phase. Sums of floating-point values are reassociated (within the node first),
// so they agree with the flat group's to rounding.
//
// Asynchronous: the call issues phase 1 and returns. Phases 2 and 3 are issued when the previous phase is complete,
// as seen by test() or wait() of any handle of this communicator, or by any later call on it; they are issued in the
// order of the calls (a call's phase 2 never overtakes an earlier call's), which keeps the order every member issues
// dp.inter and dp.gather collectives in the same. A caller that tests its handles while it computes (the gradient
// buckets do) overlaps all three phases; one that only waits at the end overlaps phase 1.
//
// Passed through to the flat group, unchanged: reduce_scatter and all_gather (ZeRO-1 shards are flat ranges of the
// flat group's order; a hierarchical version would need the buffer permuted through a copy of its full size), and
// broadcast, reduce, all_to_all, point-to-point, barrier and split. Stats: the sub-groups' and the flat group's op and
// byte counters; the wait time is this decorator's. Handles must complete before the communicator is destroyed (their
// states are pooled here: a warm step allocates nothing).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "comm/nodes.h"
#include "comm/process_groups.h"
#include "engine/parallel/topology.h"

namespace ms {

// parallel.hierarchical_dp
enum class HierarchicalDp : uint8_t { kAuto, kOn, kOff };
HierarchicalDp parse_hierarchical_dp(std::string_view value);  // "auto" | "on" | "off" (the schema's choices)

// How one rank's dp group lies over the nodes.
struct DpNodeSplit {
    int nodes = 1;       // nodes the group spans
    int local_size = 1;  // group ranks on each node (equal on every node, else the split is not hierarchical)
    int node = 0;        // this rank's node, numbered 0 .. nodes - 1 by the group's order
    int local_rank = 0;  // this rank's position among the group's ranks on its node
};

// Whether the dp reduction can run in three phases: every dp group of `topology` spans more than one node with
// equally many (more than one) ranks on each, and the groups are MPI ones (`comm`, resolved: NCCL builds its own
// rings and trees across nodes). Empty when it can, else the sentence why not. Pure (the same answer on every rank);
// the run (use_hierarchical_dp) and the step simulator decide with it.
std::string why_not_hierarchical(const Topology& topology, const NodeLayout& nodes, CommKind comm);
// The split of the dp group holding world rank `rank` (meaningful when why_not_hierarchical is empty).
DpNodeSplit dp_node_split(const Topology& topology, const NodeLayout& nodes, int rank);

class HierarchicalCommunicator final : public Communicator {
  public:
    // Collective over `flat` (the sub-groups' splits).
    HierarchicalCommunicator(std::unique_ptr<Communicator> flat, const DpNodeSplit& split);
    ~HierarchicalCommunicator() override;

    int rank() const override { return flat_->rank(); }
    int size() const override { return flat_->size(); }
    std::string_view name() const override { return flat_->name(); }
    void barrier() override;
    std::unique_ptr<Communicator> split(int color, int key, std::string name) override;
    const DpNodeSplit& node_split() const { return split_; }

    struct Op;  // one all_reduce in flight (hierarchical_communicator.cpp)

  protected:
    Handle batch_send_recv_impl(std::span<const P2POp> ops, Priority p) override;
    Handle all_reduce_impl(void* buf, size_t count, DType t, ReduceOp op, Priority p) override;
    Handle reduce_scatter_impl(const void* in, void* out, size_t out_count, size_t in_count, DType t, ReduceOp op,
                               Priority p) override;
    Handle all_gather_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t, Priority p) override;
    Handle broadcast_impl(void* buf, size_t count, DType t, int root, Priority p) override;
    Handle reduce_impl(void* buf, size_t count, DType t, int root, ReduceOp op, Priority p) override;
    Handle all_to_all_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t, Priority p) override;

  private:
    friend struct Op;
    void advance();  // issues every phase that may be issued now, in call order
    template <class Call>
    Handle forward(Communicator& inner, Call&& call);  // runs the call and mirrors inner's counter increase

    std::unique_ptr<Communicator> flat_;
    std::unique_ptr<Communicator> intra_, gather_, inter_;
    DpNodeSplit split_;
    static constexpr size_t kPooledOps = 32;  // states made at construction
    std::vector<std::unique_ptr<Op>> ops_;    // every state made; the free ones are in free_
    std::vector<Op*> free_;
    std::vector<Op*> in_flight_;  // in call order
    size_t max_shard_bytes_ = 0;  // the largest Op::shard so far
};

// Replaces groups.dp by a HierarchicalCommunicator over it when parallel.hierarchical_dp says so: auto when
// why_not_hierarchical is empty; on
// likewise, else ms::UserError with the reason (the same on every rank); off never. Call it after model_links, so that
// the sub-groups are split from the metered dp. Collective over world. Returns the start-up log line.
std::string use_hierarchical_dp(ProcessGroups& groups, const NodeLayout& nodes, HierarchicalDp mode);

}  // namespace ms
