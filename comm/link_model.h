// link_model.h: the modelled time of a transfer over the links of a cluster, for running communication on one
// machine as if it crossed NVLink inside a node and InfiniBand between nodes (docs/communication.md).
//
// Two link classes, chosen per rank pair by the NodeLayout (comm/nodes.h): same node or other node. A link moves a
// message of b bytes in alpha + b / beta seconds. Collectives are modelled as rings over the group's ranks in group
// order (rank i sends to rank (i + 1) % p), each step paced by the slowest link class in the ring -- one hop between
// nodes makes every step an inter-node step:
//   all_reduce      2 (p - 1) steps of n / p bytes   (reduce-scatter, then all-gather; n = the buffer)
//   reduce_scatter  (p - 1) steps of n / p bytes     (n = the input, p blocks)
//   all_gather      (p - 1) steps of n / p bytes     (n = the output, p blocks)
//   all_to_all      (p - 1) steps of n / p bytes     (pairwise exchange; n = the input, p blocks)
//   broadcast       (p - 1) steps, n bytes per link  (a pipelined chain from the root: (p - 1) alpha + n / beta)
//   reduce          (p - 1) steps, n bytes per link  (the same chain run toward the root)
// A point-to-point message takes alpha + b / beta of its pair's class. A group of one moves nothing: 0 s.
// The same rings say who sends what to whom (ring_sends): what the communication matrix (comm/comm_matrix.h) counts.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "comm/nodes.h"

namespace ms {

enum class LinkClass : uint8_t { kIntraNode, kInterNode, kCount };
const char* link_class_name(LinkClass c);  // "intra_node", "inter_node"

struct LinkParams {
    double alpha_s = 0;      // latency per message (or ring step), seconds
    double bytes_per_s = 1;  // bandwidth
    // How fast a rank adds what it receives in a reducing collective (RingSchedule::reduced_bytes); 0: free. The link
    // emulation leaves it 0 (the real collective underneath does the sums); a calibrated profile measures it.
    double reduce_bytes_per_s = 0;
    double seconds(double bytes) const { return alpha_s + bytes / bytes_per_s; }
};

// Contention (link_model.contention): a rank's link of each class carries one transfer at a time, so a transfer
// starts when the link is free -- max(issue, the end of the transfer before it) -- and a message queued behind a
// large one waits for it, as on a real NIC. Without it every transfer has its links to itself.
class LinkOccupancy {
  public:
    // The end of a transfer of `seconds` on this rank's link of class c, issued at `issued`; the link is then busy
    // until that end.
    double occupy(LinkClass c, double issued, double seconds);

  private:
    std::mutex mu_;  // the communication engine's thread and the main thread both issue
    std::array<double, 2> busy_until_{};
};

struct LinkModel {
    LinkParams intra, inter;
    std::shared_ptr<LinkOccupancy> occupancy;  // contention on; null: every transfer has its links to itself
    const LinkParams& of(LinkClass c) const { return c == LinkClass::kInterNode ? inter : intra; }
    // When a transfer of `seconds` issued at `issued` ends: issued + seconds, later under contention.
    double end_of(LinkClass c, double issued, double seconds) const {
        return occupancy ? occupancy->occupy(c, issued, seconds) : issued + seconds;
    }
};

// A collective as a ring: `steps` latencies, `link_bytes` through each link (the busiest) over the whole op, and
// `reduced_bytes` that each rank adds into its buffer: (p - 1) n / p for an all-reduce and a reduce-scatter, n for a
// reduce's chain, 0 for the collectives that only move data.
struct RingSchedule {
    int steps = 0;
    double link_bytes = 0;
    double reduced_bytes = 0;
};
// `bytes` is the op's size as the table above counts it (n).
RingSchedule ring_schedule(CommOp op, double bytes, int p);
// steps * alpha + link_bytes / beta (+ reduced_bytes / the reduction rate, when it is not free) of the ring's class.
double collective_seconds(const LinkModel& m, CommOp op, double bytes, int p, LinkClass ring);

LinkClass pair_class(const NodeLayout& nodes, int world_a, int world_b);
// kInterNode when any hop of the ring over `members` (world ranks, in group order) leaves its node.
LinkClass ring_class(const NodeLayout& nodes, std::span<const int> members);

// What group rank `me` sends in one collective of `bytes` (as ring_schedule counts them), by ring attribution:
//   all_reduce      2 (p - 1) n / p to me + 1      reduce_scatter, all_gather   (p - 1) n / p to me + 1
//   broadcast       n to me + 1, except the rank before the root (the chain's end)
//   reduce          n to me + 1, except the root (the chain's end)
//   all_to_all      n / p to every other rank
// Integer bytes, rounded down (exact when p divides the buffer, as every caller's padded buffers do). `to` is a
// group rank. Appends to `out` (reused between calls: no allocation once it has grown).
struct RingSend {
    int to;
    int64_t bytes;
};
void ring_sends(CommOp op, int64_t bytes, int p, int me, int root, std::vector<RingSend>& out);

}  // namespace ms
