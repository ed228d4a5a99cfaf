// plan_graph.h: `mindspeed-train plan --graph [--dot FILE]`: each model chunk's op graph as the trainer builds it for
// a full micro-batch (engine/model/gpt_graph.h) -- the ops with the bytes each reads and writes, what each pass
// changed, and the bytes moved before and after the passes (forward, backward, one layer, the head) -- and optionally
// a Graphviz drawing of every chunk.
#pragma once

#include <string>

#include "engine/train/run_layout.h"

namespace ms {

// Logs the graphs of the model chunks of the run (chunk k = the layers of virtual stage k / pp of stage k % pp), as
// the tp rank 0 of a tensor-parallel group holds them. dot_path: also write their Graphviz digraphs there ("": no).
void log_chunk_graphs(const RunLayout& layout, const std::string& dot_path);

}  // namespace ms
