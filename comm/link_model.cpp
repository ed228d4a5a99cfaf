// link_model.cpp: see link_model.h.
#include "comm/link_model.h"

#include <algorithm>

#include "engine/core/check.h"

namespace ms {

const char* link_class_name(LinkClass c) { return c == LinkClass::kInterNode ? "inter_node" : "intra_node"; }

double LinkOccupancy::occupy(LinkClass c, double issued, double seconds) {
    const std::lock_guard<std::mutex> lock(mu_);
    double& busy = busy_until_[static_cast<size_t>(c)];
    busy = std::max(busy, issued) + seconds;
    return busy;
}

RingSchedule ring_schedule(CommOp op, double bytes, int p) {
    if (p <= 1) return {};
    const int hops = p - 1;
    switch (op) {
        case CommOp::kAllReduce:
            return {2 * hops, 2 * hops * bytes / p, hops * bytes / p};
        case CommOp::kReduceScatter:
            return {hops, hops * bytes / p, hops * bytes / p};
        case CommOp::kAllGather:
        case CommOp::kAllToAll:
            return {hops, hops * bytes / p};
        case CommOp::kBroadcast:
            return {hops, bytes};
        case CommOp::kReduce:
            return {hops, bytes, bytes};
        default:
            return {};
    }
}

double collective_seconds(const LinkModel& m, CommOp op, double bytes, int p, LinkClass ring) {
    const RingSchedule s = ring_schedule(op, bytes, p);
    if (s.steps == 0) return 0;
    const LinkParams& link = m.of(ring);
    const double reduce = link.reduce_bytes_per_s > 0 ? s.reduced_bytes / link.reduce_bytes_per_s : 0.0;
    return s.steps * link.alpha_s + s.link_bytes / link.bytes_per_s + reduce;
}

LinkClass pair_class(const NodeLayout& nodes, int world_a, int world_b) {
    return nodes.same_node(world_a, world_b) ? LinkClass::kIntraNode : LinkClass::kInterNode;
}

LinkClass ring_class(const NodeLayout& nodes, std::span<const int> members) {
    const size_t p = members.size();
    for (size_t i = 0; i < p; ++i) {
        if (pair_class(nodes, members[i], members[(i + 1) % p]) == LinkClass::kInterNode) return LinkClass::kInterNode;
    }
    return LinkClass::kIntraNode;
}

void ring_sends(CommOp op, int64_t bytes, int p, int me, int root, std::vector<RingSend>& out) {
    MS_CHECK(me >= 0 && me < p, "rank {} outside a group of {}", me, p);
    if (p <= 1) return;
    const int next = (me + 1) % p;
    const int64_t hops = p - 1;
    switch (op) {
        case CommOp::kAllReduce:
            out.push_back({next, 2 * hops * bytes / p});
            break;
        case CommOp::kReduceScatter:
        case CommOp::kAllGather:
            out.push_back({next, hops * bytes / p});
            break;
        case CommOp::kBroadcast:
            if (next != root) out.push_back({next, bytes});
            break;
        case CommOp::kReduce:  // the chain toward the root: root + 1 -> ... -> root
            if (me != root) out.push_back({next, bytes});
            break;
        case CommOp::kAllToAll:
            for (int r = 0; r < p; ++r) {
                if (r != me) out.push_back({r, bytes / p});
            }
            break;
        default:
            break;
    }
}

}  // namespace ms
