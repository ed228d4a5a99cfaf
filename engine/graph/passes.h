// passes.h: rewrites of a chunk's graph (graph.h), one file each, each reporting what it changed.
#pragma once

#include <string>
#include <vector>

#include "engine/graph/graph.h"
#include "engine/graph/recompute_options.h"

namespace ms::graph {

struct PassReport {
    std::string pass;  // "fusion", ...
    std::vector<std::string> steps =
        {};  // one line per rewrite: "h.0.ln_2: residual + layernorm -> residual+layernorm"
};

// fusion.cpp. Four patterns, each bit-identical to the ops it replaces on every backend but cuBLASLt's GELU
// epilogues (backend.h):
//   residual then layernorm of its sum              -> residual+layernorm (one pass over the rows)
//   matmul then gelu of its output                   -> matmul+gelu (a GEMM epilogue on the GPU)
//   matmul_backward then gelu_backward of its dx     -> matmul_backward through the GELU (dx never stored)
//   bias_gradient of dy, then the matmul_backward of the bias's row-parallel linear, whose dy is that dy or its
//   all-gather (sequence parallelism)                -> the matmul_backward's dbias (no extra pass over dy; under
//                                                       sequence parallelism the sum over all rows, so the bias
//                                                       needs no tp all-reduce after the step)
// The bias gradient has no Backend op of its own: a graph that keeps one does not compile (program.h).
//
// With lm_head_chunk_rows > 0, also the LM head with its loss (tensor parallelism of one: Backend::lm_head_loss):
//   matmul -> logits, cross_entropy, loss; and in the backward loss_gradient, cross_entropy_backward and the
//   matmul_backward of the logits                    -> loss_gradient and lm_head+cross_entropy in the forward,
//                                                       chunks of lm_head_chunk_rows rows: the (N, Vp) logits are
//                                                       never held, and the head's input gradient is kept for the
//                                                       backward instead. Not bit-identical: the head's weight
//                                                       gradient is summed chunk by chunk (backend.h).
struct FuseOptions {
    int64_t lm_head_chunk_rows = 0;     // 0: leave the LM head unfused
    int64_t lm_head_scratch_elems = 0;  // fp32 elements of the fused op's scratch
};
PassReport fuse(Graph& g, const FuseOptions& options = {});

// recompute.cpp: activation recomputation (Megatron's keys). A recomputed layer keeps less from its forward to its
// backward: right before the layer's backward, copies of (some of) its forward ops run again from what it did keep,
// writing fresh tensors ("<name>.recompute") that its backward ops read instead, so the forward's own outputs die
// inside the forward. The ops are deterministic, so the gradients are bit-identical to keeping everything.
//   kFull       every op of the layer: only its input (the previous layer's output) stays
//   kSelective  the cheap ops: LayerNorms (and the tensor-parallel copy or all-gather after them) and the GELU: the
//               layer keeps its GEMM outputs, the attention's output and statistics, and the LayerNorms' inputs
// Which layers: RecomputeOptions::recomputes() (recompute_options.h). Run it after derive_backward() and before
// fuse().
PassReport recompute(Graph& g, const RecomputeOptions& options, int first_layer);

}  // namespace ms::graph
