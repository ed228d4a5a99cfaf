// step_inputs.cpp: step_inputs() (simulator.h) -- a run's layout timed by a CostModel on the links of its nodes.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "comm/hierarchical_communicator.h"
#include "comm/nccl/comm_choice.h"
#include "engine/core/check.h"
#include "engine/graph/graph.h"
#include "engine/model/gpt_graph.h"
#include "engine/optim/distributed_optimizer.h"
#include "engine/sim/simulator.h"
#include "engine/train/pipeline.h"
#include "engine/train/plan.h"

namespace ms::sim {
namespace {

using graph::Node;
using graph::OpCode;
using graph::Phase;
using graph::Role;

// A collective over p ranks of one ring class as fixed + bytes * per_byte: collective_seconds is affine in its bytes,
// so its time at 0 bytes and its slope to a large size give it back.
Affine collective_affine(const LinkModel& links, CommOp op, int p, LinkClass ring) {
    constexpr double kBytes = 0x1p30;
    const double fixed = collective_seconds(links, op, 0.0, p, ring);
    return {fixed, (collective_seconds(links, op, kBytes, p, ring) - fixed) / kBytes};
}

// The groups and links one stage's representative rank talks over.
struct RankLinks {
    LinkModel links;
    int tp = 1, cp = 1;
    LinkClass tp_ring = LinkClass::kIntraNode, cp_ring = LinkClass::kIntraNode;
};

// The seconds of node n's communication on the critical path: tp collectives whole; the cp ring's exchanges as far
// as they outlast the compute they run behind (ring_attention.h: cp - 1 key/value blocks forward, each behind a
// step's compute; backward the blocks with their fp32 [dK | dV] accumulators, and the last accumulators alone).
double comm_seconds(const graph::Graph& g, const Node& n, double op_seconds, const RankLinks& r) {
    const auto bytes = [&](graph::TensorId t) { return static_cast<double>(g.info(t).bytes()); };
    switch (n.op) {
        case OpCode::kAllReduce:
            return collective_seconds(r.links, CommOp::kAllReduce, bytes(n.in[0]), r.tp, r.tp_ring);
        case OpCode::kAllGather:
            return collective_seconds(r.links, CommOp::kAllGather, bytes(n.out[0]), r.tp, r.tp_ring);
        case OpCode::kReduceScatter:
            return collective_seconds(r.links, CommOp::kReduceScatter, bytes(n.in[0]), r.tp, r.tp_ring);
        case OpCode::kRingAttention:
        case OpCode::kRingAttentionBackward: {
            if (r.cp <= 1) return 0;
            const graph::RingAttentionShape s = graph::ring_attention_shape(g, n);
            const double kv = static_cast<double>(s.B * s.T * 2 * s.NKV * s.HS);
            const LinkParams& link = r.links.of(r.cp_ring);
            const double step = op_seconds / r.cp;
            if (n.op == OpCode::kRingAttention)
                return (r.cp - 1) * std::max(0.0, link.seconds(kv * dtype_size(s.act)) - step);
            const double acc = kv * 4;
            return (r.cp - 1) * std::max(0.0, link.seconds(kv * dtype_size(s.act) + acc) - step) + link.seconds(acc);
        }
        default:
            return 0;
    }
}

// One chunk's graph timed: forward and backward seconds, first parameter reads and final gradients (as
// compile_program reports them: after a gradient's last backward writer, or after the backward's first op for one
// only the forward writes). `base`: where the chunk's parameters start in the stage's flat buffer.
ChunkCost chunk_cost(const graph::Graph& g, const CostModel& cost, const RankLinks& links, int64_t base) {
    ChunkCost c;
    std::vector<char> read(g.tensors.size(), 0);
    std::map<graph::TensorId, double> final_at;  // gradient tensor -> seconds into the backward (-1: forward only)
    double first_backward_end = -1;
    for (const Node& n : g.nodes) {
        // a ring-attention op's cost is one step of its ring (cost_model.h): cp steps make the op
        const bool ring = n.op == OpCode::kRingAttention || n.op == OpCode::kRingAttentionBackward;
        const double op = cost.op_seconds(g, n) * (ring ? links.cp : 1);
        const double comm = comm_seconds(g, n, op, links);
        if (n.phase == Phase::kForward) {
            for (graph::TensorId t : n.in) {
                if (t == graph::kNoTensor || read[t] || g.info(t).role != Role::kParameter) continue;
                read[t] = 1;
                const graph::TensorInfo& info = g.info(t);
                c.params_read.push_back({c.forward, base + info.param_offset, base + info.param_offset + info.numel()});
            }
            c.forward += op + comm;
            c.forward_comm += comm;
        } else {
            c.backward += op + comm;
            c.backward_comm += comm;
            if (first_backward_end < 0) first_backward_end = c.backward;
        }
        for (graph::TensorId t : n.out) {
            if (t == graph::kNoTensor || g.info(t).role != Role::kGradient) continue;
            if (n.phase == Phase::kBackward)
                final_at[t] = c.backward;
            else
                final_at.emplace(t, -1.0);
        }
    }
    for (const auto& [t, at] : final_at) {
        const graph::TensorInfo& info = g.info(t);
        c.grads_final.push_back({at < 0 ? std::max(0.0, first_backward_end) : at, base + info.param_offset,
                                 base + info.param_offset + info.numel()});
    }
    return c;
}

// Whether the dp gradient all-reduce runs in the three phases of hierarchical_communicator.h, decided as
// use_hierarchical_dp does, for run.comm as it resolves on the machines planned for (NCCL in the binary, a GPU per
// rank). A layout `on` cannot honour is refused before it runs; simulated, it is flat.
bool hierarchical(const RunLayout& layout, const NodeLayout& nodes) {
    const CommKind comm = resolve_comm(layout.comm, backend_kind_name(layout.backend), /*nccl_in_binary=*/true,
                                       /*device_per_rank=*/true)
                              .kind;
    return layout.hierarchical_dp != HierarchicalDp::kOff && why_not_hierarchical(layout.topology, nodes, comm).empty();
}

DpCosts dp_costs(const RunLayout& layout, const LinkModel& links, const NodeLayout& nodes) {
    const Topology& t = layout.topology;
    DpCosts dp;
    dp.size = t.dp;
    dp.zero_stage = layout.zero_stage;
    dp.grad_bytes_per_elem = static_cast<double>(dtype_size(layout.graph.grads));
    dp.param_bytes_per_elem =
        shards_master_weights(layout.zero_stage, layout.dtype) ? static_cast<double>(dtype_size(layout.dtype)) : 4.0;
    dp.bucket_elems = layout.grad_bucket_elems;
    dp.param_gather_overlap = layout.param_gather_overlap;
    const std::vector<int> group = t.group_of(0, Axis::kDP);
    const LinkClass ring = ring_class(nodes, group);
    if (layout.zero_stage == 0 && hierarchical(layout, nodes)) {
        const DpNodeSplit split = dp_node_split(t, nodes, 0);
        const Affine rs = collective_affine(links, CommOp::kReduceScatter, split.local_size, LinkClass::kIntraNode);
        const Affine ar = collective_affine(links, CommOp::kAllReduce, split.nodes, LinkClass::kInterNode);
        const Affine ag = collective_affine(links, CommOp::kAllGather, split.local_size, LinkClass::kIntraNode);
        dp.reduce_whole = {rs.fixed + ar.fixed + ag.fixed, rs.per_byte + ar.per_byte / split.local_size + ag.per_byte};
    } else {
        dp.reduce_whole = collective_affine(links, layout.zero_stage == 0 ? CommOp::kAllReduce : CommOp::kReduceScatter,
                                            dp.size, ring);
    }
    dp.reduce_bucket =
        layout.zero_stage == 0 ? dp.reduce_whole : collective_affine(links, CommOp::kReduce, dp.size, ring);
    dp.gather_whole = collective_affine(links, CommOp::kAllGather, dp.size, ring);
    dp.gather_part = collective_affine(links, CommOp::kBroadcast, dp.size, ring);
    return dp;
}

// The scalar all-reduces of every step: the step boundary's agreement over world, the loss over pp and dp, the
// gradient norm over dp and mp (trainer.cpp, pipeline.cpp, distributed_optimizer.cpp).
double scalar_seconds(const Topology& t, const LinkModel& links, const NodeLayout& nodes) {
    const auto one = [&](const std::vector<int>& group) {
        return collective_seconds(links, CommOp::kAllReduce, 4, static_cast<int>(group.size()),
                                  ring_class(nodes, group));
    };
    std::vector<int> world(static_cast<size_t>(t.world()));
    std::iota(world.begin(), world.end(), 0);
    return one(world) + one(t.group_of(0, Axis::kPP)) + 2 * one(t.group_of(0, Axis::kDP)) +
           one(t.group_of(0, Axis::kTP | Axis::kPP));
}

// One chunk's cost with chunk-local offsets, from the cache when it holds it.
ChunkCostCache::Entry timed_chunk(const RunLayout& layout, const GptPart& part, const CostModel& cost,
                                  const RankLinks& r, ChunkCostCache* cache) {
    // A chunk's costs do not depend on where its layers sit in the model: every chunk is built as if it began at
    // layer 0, so the middle chunks of a pipeline share one entry.
    ChunkCostCache::Key key{.spec = {.shape = layout.shape,
                                     .part = part,
                                     .tp_size = r.tp,
                                     .sequence_parallel = layout.sequence_parallel,
                                     .act = layout.dtype,
                                     .B = layout.micro_batch,
                                     .T = layout.seq_length() / r.cp,
                                     .options = layout.graph},
                            .cp = r.cp,
                            .tp_ring = r.tp_ring,
                            .cp_ring = r.cp_ring};
    key.spec.part.first_layer = 0;
    if (cache != nullptr) {
        const auto it = cache->entries.find(key);
        if (it != cache->entries.end()) return it->second;
    }
    const std::vector<ParamInfo> table = gpt_param_table(layout.shape, r.tp, key.spec.part);
    const GptGraph gg = build_gpt_graph(key.spec, table);
    ChunkCostCache::Entry e{chunk_cost(gg.g, cost, r, 0), {}};
    for (int i : gg.g.tp_partial_grad_params) {
        const ParamInfo& p = table[static_cast<size_t>(i)];
        e.deferred.emplace_back(p.offset, p.offset + p.numel);
    }
    if (cache != nullptr) cache->entries.emplace(key, e);
    return e;
}

}  // namespace

StepInputs step_inputs(const RunLayout& layout, const CostModel& cost, const NodeLayout& nodes, ChunkCostCache* cache,
                       const std::vector<StagePlan>* plan_in) {
    const Topology& t = layout.topology;
    MS_CHECK(nodes.world_size() == t.world(), "simulator: a node layout of {} ranks for a world of {}",
             nodes.world_size(), t.world());
    const int pp = t.pp, v = layout.virtual_stages, T = layout.seq_length() / t.cp;
    StepInputs in;
    in.schedule = layout.schedule;
    in.microbatches = layout.num_microbatches;
    in.virtual_stages = v;
    in.world_size = t.world();
    in.tokens_per_step = static_cast<double>(layout.tokens_per_step());
    in.flops_per_token = gpt_train_flops_per_token(layout.shape, layout.seq_length());
    in.peak_flops = cost.peak_flops(layout.dtype);
    LinkModel links = cost.links();
    links.occupancy = nullptr;  // the simulator orders the transfers itself
    in.dp = dp_costs(layout, links, nodes);
    in.scalar_seconds = scalar_seconds(t, links, nodes);
    std::vector<int> on_node(static_cast<size_t>(nodes.num_nodes), 0);
    for (int r = 0; r < t.world(); ++r) ++on_node[static_cast<size_t>(nodes.node(r))];
    in.oversubscription = cost.oversubscription(*std::max_element(on_node.begin(), on_node.end()));

    const std::vector<StagePlan> plan = plan_in != nullptr ? *plan_in : plan_stages(layout.shape, plan_shape(layout));
    std::vector<int> rep(static_cast<size_t>(pp));
    for (int s = 0; s < pp; ++s) rep[s] = t.rank_of(Coord{0, 0, s});
    // one activation (or its gradient) between stages, of the rows of this rank's T / cp
    const double message = static_cast<double>(pipeline_message_elems(layout.shape, layout.micro_batch, T, t.tp,
                                                                      layout.sequence_parallel)) *
                           static_cast<double>(dtype_size(layout.dtype));
    in.p2p_seconds.assign(pp, std::vector<double>(pp, 0.0));
    for (int a = 0; a < pp; ++a)
        for (int b = 0; b < pp; ++b)
            if (a != b) in.p2p_seconds[a][b] = links.of(pair_class(nodes, rep[a], rep[b])).seconds(message);

    const std::string wte = embedding_weight_name(layout.shape);
    const bool embd = pp > 1 && !layout.shape.untied;
    for (int s = 0; s < pp; ++s) {
        RankLinks r{links, t.tp, t.cp, ring_class(nodes, t.group_of(rep[s], Axis::kTP)),
                    ring_class(nodes, t.context_group(rep[s]))};
        const StageParams sp = stage_params(layout.shape, t.tp, pp, s, v);
        StageInput st;
        for (const ParamInfo& p : sp.table) {
            st.params.emplace_back(p.offset, p.offset + p.numel);
            if (embd && p.name == wte) {
                st.deferred.emplace_back(p.offset, p.offset + p.numel);
                st.embd_seconds = collective_seconds(links, CommOp::kAllReduce,
                                                     static_cast<double>(p.numel) * in.dp.grad_bytes_per_elem, 2,
                                                     pair_class(nodes, rep[0], rep[pp - 1]));
            }
        }
        std::sort(st.params.begin(), st.params.end());
        for (int c = 0; c < v; ++c) {
            const ChunkCostCache::Entry e = timed_chunk(layout, sp.parts[c], cost, r, cache);
            const int64_t base = sp.bases[c];
            ChunkCost cc = e.cost;
            for (auto* ranges : {&cc.params_read, &cc.grads_final}) {
                for (RangeAt& x : *ranges) {
                    x.begin += base;
                    x.end += base;
                }
            }
            st.chunks.push_back(std::move(cc));
            for (const auto& [b, en] : e.deferred) st.deferred.emplace_back(base + b, base + en);
        }
        const StagePlan& sp_plan = plan[static_cast<size_t>(s)];
        st.padded = sp_plan.padded;
        st.memory_bytes = sp_plan.total_bytes();
        st.zero_seconds = cost.memory_seconds(sp_plan.grad_bytes);
        st.optimizer_seconds =
            cost.optimizer_seconds(layout.zero_stage >= 1 ? st.padded / t.dp : st.padded, layout.dtype);
        in.stages.push_back(std::move(st));
    }
    return in;
}

}  // namespace ms::sim
