// cost_model.h: what the step simulator (engine/sim/simulator.h) asks of a device and its network: the seconds of
// one op of a chunk's graph, of the optimizer step over a shard, and the links between ranks. A profile made by
// `mindspeed-train calibrate` (measured on the backend at hand) or a device estimate from published peaks
// (engine/sim/profile.h) answers it; tests answer it with hand-set numbers.
#pragma once

#include <cstdint>
#include <string>

#include "comm/link_model.h"
#include "engine/core/dtype.h"
#include "engine/graph/graph.h"

namespace ms::sim {

class CostModel {
  public:
    virtual ~CostModel() = default;
    // One line: what was measured or assumed ("cpu (AMD EPYC, 2 threads), measured 2026-12-02", "a100-80g: estimate
    // from published peaks").
    virtual std::string describe() const = 0;
    // The seconds of node n of g on one rank. Communication nodes (kTpCopy, kAllReduce, kAllGather, kReduceScatter
    // and the ring attention's exchanges) count only their local work here: the simulator times their transfers on
    // the links. A ring-attention node (kRingAttention and its backward) costs one step of its ring: the graph does
    // not hold the context-parallel size, and the simulator multiplies by it.
    virtual double op_seconds(const graph::Graph& g, const graph::Node& n) const = 0;
    // The optimizer's step over `elements` parameters of one rank (AdamW: read weight, gradient and both moments,
    // write weight and moments; `weights` is the dtype of the weights the ops read, whose copy it also writes).
    virtual double optimizer_seconds(int64_t elements, DType weights) const = 0;
    // Zeroing (or casting) `bytes` of memory: the gradient buffer before a step.
    virtual double memory_seconds(int64_t bytes) const = 0;
    // The dense matmul peak in FLOP/s for an activation dtype: the MFU denominator.
    virtual double peak_flops(DType act) const = 0;
    // The links: inside a node and between nodes.
    virtual LinkModel links() const = 0;
    // How many times over `ranks_per_host` ranks want the host's cores: max(1, ranks x threads per rank / cores).
    // Above 1 the simulator bounds the step by the host's compute over its cores (simulator.h, "Oversubscribed
    // hosts"). 1 where each rank owns its device.
    virtual double oversubscription(int /*ranks_per_host*/) const { return 1; }
};

}  // namespace ms::sim
