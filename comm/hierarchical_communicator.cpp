// hierarchical_communicator.cpp: see hierarchical_communicator.h.
#include "comm/hierarchical_communicator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <type_traits>
#include <utility>

#include "comm/typed_dispatch.h"
#include "engine/core/check.h"

namespace ms {
namespace {

constexpr int kDone = 4;  // Op::phase once the result is in the caller's buffer

// The reduction each phase runs: kAvg sums, and divides once at the end.
ReduceOp phase_op(ReduceOp op) { return op == ReduceOp::kAvg ? ReduceOp::kSum : op; }

// The nodes of `members` (world ranks) in order of first appearance, and how many members each holds.
std::vector<std::pair<int, int>> members_per_node(const NodeLayout& nodes, const std::vector<int>& members) {
    std::vector<std::pair<int, int>> per_node;
    for (int m : members) {
        const int n = nodes.node(m);
        auto at = std::find_if(per_node.begin(), per_node.end(), [&](const auto& p) { return p.first == n; });
        if (at == per_node.end())
            per_node.emplace_back(n, 1);
        else
            ++at->second;
    }
    return per_node;
}

}  // namespace

HierarchicalDp parse_hierarchical_dp(std::string_view value) {
    if (value == "on") return HierarchicalDp::kOn;
    if (value == "off") return HierarchicalDp::kOff;
    MS_CHECK(value == "auto", "parallel.hierarchical_dp '{}' is not auto, on or off (the schema checks it)", value);
    return HierarchicalDp::kAuto;
}

std::string why_not_hierarchical(const Topology& topology, const NodeLayout& nodes, CommKind comm) {
    MS_CHECK(topology.world() == nodes.world_size(), "the topology has {} ranks, the node layout {}", topology.world(),
             nodes.world_size());
    if (topology.dp == 1) return "dp is 1";
    for (const std::vector<int>& members : topology.groups(Axis::kDP)) {
        const std::vector<std::pair<int, int>> per_node = members_per_node(nodes, members);
        const auto uneven = [&] {
            return std::any_of(per_node.begin(), per_node.end(),
                               [&](const auto& p) { return p.second != per_node.front().second; });
        };
        if (per_node.size() == 1) return fmt::format("the dp group {} lies within one node", members);
        if (uneven()) return fmt::format("the nodes hold unequally many ranks of the dp group {}", members);
        if (per_node.front().second == 1) {
            return fmt::format("each node holds one rank of the dp group {}: nothing to reduce inside a node", members);
        }
    }
    if (comm != CommKind::kMpi)
        return "the dp groups are NCCL communicators, which build their own rings and trees across nodes";
    return {};
}

DpNodeSplit dp_node_split(const Topology& topology, const NodeLayout& nodes, int rank) {
    const std::vector<int> members = topology.group_of(rank, Axis::kDP);
    const std::vector<std::pair<int, int>> per_node = members_per_node(nodes, members);
    DpNodeSplit s;
    s.nodes = static_cast<int>(per_node.size());
    s.local_size = per_node.front().second;
    const int mine = nodes.node(rank);
    s.node = static_cast<int>(
        std::find_if(per_node.begin(), per_node.end(), [&](const auto& p) { return p.first == mine; }) -
        per_node.begin());
    s.local_rank = static_cast<int>(
        std::count_if(members.begin(), members.end(), [&](int m) { return m < rank && nodes.node(m) == mine; }));
    return s;
}

// One all_reduce: phase 1 (reduce_scatter on intra_) in flight at the call, then 2 (all_reduce on inter_), 3
// (all_gather on gather_), then kDone.
struct HierarchicalCommunicator::Op final : Handle::State {
    HierarchicalCommunicator* owner = nullptr;
    void* buf = nullptr;  // the caller's (count)
    size_t count = 0;
    DType dtype = DType::kF32;
    ReduceOp op = ReduceOp::kSum;
    Priority priority = Priority::kNormal;
    size_t chunk = 0;              // elements per local rank: count / local_size (rounded down)
    std::vector<std::byte> shard;  // (chunk) elements: this rank's part, reduced over the node, then over the nodes
    int phase = 0;
    Handle h;     // the phase in flight
    Handle tail;  // the flat all-reduce of the last count % local_size elements, issued with phase 1

    // Issues the phase after the one whose handle has completed (or, after phase 3, finishes locally).
    void next() {
        ++phase;
        with_comm_type(dtype, [&](auto* type) {
            using T = std::remove_pointer_t<decltype(type)>;
            const std::span<T> all(static_cast<T*>(buf), chunk * static_cast<size_t>(owner->split_.local_size));
            const std::span<T> part(reinterpret_cast<T*>(shard.data()), chunk);
            HierarchicalCommunicator& c = *owner;
            if (phase == 1) {
                h = c.forward(*c.intra_, [&] {
                    return c.intra_->reduce_scatter(std::span<const T>(all), part, phase_op(op), priority);
                });
            } else if (phase == 2) {
                h = c.forward(*c.inter_, [&] { return c.inter_->all_reduce(part, phase_op(op), priority); });
            } else if (phase == 3) {
                h = c.forward(*c.gather_,
                              [&] { return c.gather_->all_gather(std::span<const T>(part), all, priority); });
            } else {
                if (op == ReduceOp::kAvg) divide_elements(all, c.size());
                tail.wait();  // issued by every rank at the call, long done
            }
            return Handle();
        });
    }
    void wait() override {
        while (phase != kDone) {
            owner->advance();
            if (phase == kDone) break;
            // Blocks on this op's phase, or, when it is complete but an earlier call's must be issued first, on the
            // oldest call's (which nothing holds back).
            if (!h.test())
                h.wait();
            else
                owner->in_flight_.front()->h.wait();
        }
    }
    bool test() override {
        owner->advance();
        return phase == kDone;
    }
    void recycle() override {
        shard.reserve(owner->max_shard_bytes_);
        owner->free_.push_back(this);
    }
};

HierarchicalCommunicator::HierarchicalCommunicator(std::unique_ptr<Communicator> flat, const DpNodeSplit& split)
    : flat_(std::move(flat)), split_(split) {
    MS_CHECK(flat_ != nullptr && split_.nodes > 1 && split_.local_size > 1 &&
                 split_.nodes * split_.local_size == flat_->size(),
             "a hierarchical {} group needs more than one node of more than one rank: {} nodes of {} ranks for {}",
             flat_ ? flat_->name() : "?", split_.nodes, split_.local_size, flat_ ? flat_->size() : 0);
    const std::string n(flat_->name());
    intra_ = flat_->split(split_.node, split_.local_rank, n + ".intra");
    gather_ = flat_->split(split_.node, split_.local_rank, n + ".gather");
    inter_ = flat_->split(split_.local_rank, split_.node, n + ".inter");
    MS_CHECK(intra_->size() == split_.local_size && intra_->rank() == split_.local_rank &&
                 inter_->size() == split_.nodes && inter_->rank() == split_.node,
             "the {} sub-groups have sizes {} and {}, ranks {} and {}; the node split says {} nodes of {}, node {} "
             "local rank {}",
             n, intra_->size(), inter_->size(), intra_->rank(), inter_->rank(), split_.nodes, split_.local_size,
             split_.node, split_.local_rank);
    // States made up front: a step with more all-reduces in flight at once than any step before (overlapped
    // buckets: the count depends on timing) takes one of them, already grown to the largest shard (below), instead
    // of allocating (memory/alloc_guard.h).
    for (size_t i = 0; i < kPooledOps; ++i) {
        ops_.push_back(std::make_unique<Op>());
        free_.push_back(ops_.back().get());
    }
}

HierarchicalCommunicator::~HierarchicalCommunicator() = default;

template <class Call>
Handle HierarchicalCommunicator::forward(Communicator& inner, Call&& call) {
    return count_through(inner, std::forward<Call>(call));
}

void HierarchicalCommunicator::advance() {
    // An op may issue phase j + 1 (on inter_ or gather_) only once every earlier op has issued it: cap is the lowest
    // phase of the ops before it. Finishing after phase 3 is local and never held back.
    int cap = kDone;
    for (Op* o : in_flight_) {
        while (o->phase != kDone && (o->phase == 3 || o->phase + 1 <= cap) && o->h.test()) o->next();
        cap = std::min(cap, o->phase);
    }
    std::erase_if(in_flight_, [](const Op* o) { return o->phase == kDone; });
}

Handle HierarchicalCommunicator::all_reduce_impl(void* buf, size_t count, DType t, ReduceOp op, Priority p) {
    advance();
    const size_t L = static_cast<size_t>(split_.local_size), es = dtype_size(t), chunk = count / L;
    // Fewer elements than ranks on a node (a loss, a norm): flat, as latency-bound as it gets either way.
    if (chunk == 0) {
        return with_comm_type(t, [&](auto* type) {
            using T = std::remove_pointer_t<decltype(type)>;
            return forward(*flat_, [&] { return flat_->all_reduce(std::span<T>(static_cast<T*>(buf), count), op, p); });
        });
    }
    if (free_.empty()) {
        ops_.push_back(std::make_unique<Op>());
        free_.push_back(ops_.back().get());
    }
    Op& o = *free_.back();
    free_.pop_back();
    o.owner = this;
    o.buf = buf;
    o.count = count;
    o.dtype = t;
    o.op = op;
    o.priority = p;
    o.chunk = chunk;
    // Every pooled op's shard holds the largest seen, so which op a call takes never makes it allocate: a larger one
    // grows the free ones now (the first steps), and those in flight when they come back (recycle).
    if (chunk * es > max_shard_bytes_) {
        max_shard_bytes_ = chunk * es;
        for (Op* f : free_) f->shard.reserve(max_shard_bytes_);
    }
    o.shard.reserve(max_shard_bytes_);
    o.shard.resize(chunk * es);
    o.phase = 0;
    o.next();
    if (const size_t body = chunk * L; body < count) {
        o.tail = with_comm_type(t, [&](auto* type) {
            using T = std::remove_pointer_t<decltype(type)>;
            return forward(*flat_, [&] {
                return flat_->all_reduce(std::span<T>(static_cast<T*>(buf) + body, count - body), op, p);
            });
        });
    }
    in_flight_.push_back(&o);
    return Handle(Handle::StatePtr(&o));
}

void HierarchicalCommunicator::barrier() {
    advance();
    flat_->barrier();
}

std::unique_ptr<Communicator> HierarchicalCommunicator::split(int color, int key, std::string name) {
    advance();
    return flat_->split(color, key, std::move(name));
}

Handle HierarchicalCommunicator::batch_send_recv_impl(std::span<const P2POp> ops, Priority p) {
    advance();
    return forward(*flat_, [&] { return flat_->batch_send_recv(ops, p); });
}

Handle HierarchicalCommunicator::reduce_scatter_impl(const void* in, void* out, size_t out_count, size_t in_count,
                                                     DType t, ReduceOp op, Priority p) {
    advance();
    return with_comm_type(t, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        return forward(*flat_, [&] {
            return flat_->reduce_scatter(std::span<const T>(static_cast<const T*>(in), in_count),
                                         std::span<T>(static_cast<T*>(out), out_count), op, p);
        });
    });
}

Handle HierarchicalCommunicator::all_gather_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t,
                                                 Priority p) {
    advance();
    return with_comm_type(t, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        return forward(*flat_, [&] {
            return flat_->all_gather(std::span<const T>(static_cast<const T*>(in), in_count),
                                     std::span<T>(static_cast<T*>(out), out_count), p);
        });
    });
}

Handle HierarchicalCommunicator::broadcast_impl(void* buf, size_t count, DType t, int root, Priority p) {
    advance();
    return with_comm_type(t, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        return forward(*flat_, [&] { return flat_->broadcast(std::span<T>(static_cast<T*>(buf), count), root, p); });
    });
}

Handle HierarchicalCommunicator::reduce_impl(void* buf, size_t count, DType t, int root, ReduceOp op, Priority p) {
    advance();
    return with_comm_type(t, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        return forward(*flat_, [&] { return flat_->reduce(std::span<T>(static_cast<T*>(buf), count), root, op, p); });
    });
}

Handle HierarchicalCommunicator::all_to_all_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t,
                                                 Priority p) {
    advance();
    return with_comm_type(t, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        return forward(*flat_, [&] {
            return flat_->all_to_all(std::span<const T>(static_cast<const T*>(in), in_count),
                                     std::span<T>(static_cast<T*>(out), out_count), p);
        });
    });
}

std::string use_hierarchical_dp(ProcessGroups& groups, const NodeLayout& nodes, HierarchicalDp mode) {
    if (mode == HierarchicalDp::kOff) return "dp: flat (parallel.hierarchical_dp: off)";
    const std::string why = why_not_hierarchical(groups.topology, nodes, groups.comm);
    if (!why.empty()) {
        if (mode == HierarchicalDp::kOn) {
            throw UserError(fmt::format(
                "config error: parallel.hierarchical_dp is on, but {} ({})\n---> HINT: set parallel.hierarchical_dp: "
                "auto, which reduces hierarchically only where dp spans several nodes with more than one of its ranks "
                "on each (run.ranks_per_node simulates nodes), or off",
                why, nodes.describe()));
        }
        return fmt::format("dp: flat (parallel.hierarchical_dp: auto; {})", why);
    }
    const DpNodeSplit s = dp_node_split(groups.topology, nodes, groups.world->rank());
    groups.dp = std::make_unique<HierarchicalCommunicator>(std::move(groups.dp), s);
    return fmt::format(
        "dp: hierarchical (parallel.hierarchical_dp: {}): all-reduce = reduce-scatter inside the node over {} ranks, "
        "all-reduce across {} nodes on 1/{} of the data, all-gather inside the node",
        mode == HierarchicalDp::kOn ? "on" : "auto", s.local_size, s.nodes, s.local_size);
}

}  // namespace ms
