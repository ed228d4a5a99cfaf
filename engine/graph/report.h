// report.h: what a chunk's graph does, in words and bytes: the op list with the bytes each op reads and writes, the
// totals per phase, per layer and for the head, and a Graphviz drawing. Behind `mindspeed-train plan --graph`.
//
// Byte accounting (the graph's own, not a hardware counter): an op reads every input tensor and writes every output
// tensor once; an output it accumulates into (+=: parameter gradients, kAdd activation gradients) is read and
// written; collectives read and write their buffers; host steps count what they touch. So a fusion's saving is the
// intermediate tensor it no longer writes and reads back.
#pragma once

#include <cstdint>
#include <string>

#include "engine/graph/graph.h"

namespace ms::graph {

struct Bytes {
    int64_t read = 0, written = 0;
    int64_t moved() const { return read + written; }
    Bytes& operator+=(const Bytes& o) {
        read += o.read;
        written += o.written;
        return *this;
    }
};

Bytes op_bytes(const Graph& g, const Node& n);

struct GraphTotals {
    Bytes forward, backward;
    Bytes layer;  // one layer's forward and backward ops (the chunk's first layer)
    Bytes head;   // the ops outside the layers after them: final LayerNorm, output head, loss, and their backward
    int ops = 0;
};
GraphTotals graph_totals(const Graph& g);

// One line per op: phase, op, label, bytes read and written, and its tensors.
std::string op_table(const Graph& g);
// Graphviz: ops as boxes (forward blue, backward orange), tensors as edges from the op that writes them to the
// ops that read them.
std::string to_dot(const Graph& g, const std::string& title);

}  // namespace ms::graph
