// graph.h: the op graph of one pipeline chunk for one micro-batch (docs/design.md §4): tensors and the ops that read
// and write them, in execution order.
//
// A model builder (engine/model/gpt_graph.h) writes the forward: every op a Backend op, a tensor-parallel
// collective or a host step (loading tokens, the loss from the cross-entropy statistics), unfused. A tensor is
// written by one forward op, except in place: an all-reduce sums its tensor where it is, and the tensor-parallel
// copy's output is its input. derive_backward() (autodiff.cpp) appends the
// backward by walking the forward in reverse and applying each op's gradient rule. Passes (fusion.cpp, ...) rewrite
// the graph; plan_graph_memory() (memory_plan.cpp) lays its tensors out; compile_program() (program.h) turns the
// final graph into a flat list of backend calls.
//
// Gradients are not single-assignment: a tensor that feeds two consumers (the residual stream) gets the gradient
// contributions of both into one tensor, the first overwriting and the rest accumulating (Accumulate::kAdd), and the
// identity gradients of a residual add and of a tensor-parallel "reduce" alias the incoming gradient instead of
// copying it. So one gradient tensor may be written by several backward ops; its lifetime runs from the first write
// to the last read. Parameter gradients live in the flat gradient buffer (the tied output layer's may be kept apart:
// Role::kHeadGradient) and are always accumulated (+=).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/communicator.h"
#include "engine/backends/backend.h"
#include "engine/core/dtype.h"
#include "engine/graph/cross_attention.h"
#include "engine/graph/ring_attention.h"

namespace ms::graph {

using TensorId = int;
inline constexpr TensorId kNoTensor = -1;

enum class Role : uint8_t {
    kParameter,     // the 16-bit (or fp32) weights the ops read: flat weights buffer at `param_offset`
    kGradient,      // a parameter's gradient (fp32, or 16-bit: GptGraphOptions::grads): flat gradient buffer
    kHeadGradient,  // the tied output layer's gradient kept apart on a chunk that also holds the embedding
                    // (GptGraphOptions::tied_grads_apart): a buffer of its own (Bindings::head_grads) at
                    // `param_offset`, added to the embedding's gradient once per step (Gpt::finish_gradients())
    kInput,         // written by the host before the forward (tokens, targets, a pipeline stage's input activation)
    kOutput,        // read by the host or the pipeline after the forward (losses, logits, a stage's output)
    kActivation,    // written and read by ops; planned (memory_plan.cpp)
    kGradInput,     // a stage's output gradient (written by the pipeline before backward) or input gradient (read
                    // after backward); planned like activations but live across the whole call
};

// Parameters and their gradients live in buffers of their own, outside the memory plan.
inline bool is_parameter_memory(Role r) {
    return r == Role::kParameter || r == Role::kGradient || r == Role::kHeadGradient;
}

struct TensorInfo {
    std::string name = {};       // "h.3.qkv", "d.h.3.ln2", "wte.weight", ...
    std::vector<int64_t> shape;  // elements per dim; rows first
    DType dtype = DType::kF32;
    Role role = Role::kActivation;
    int64_t param_offset = -1;         // kParameter / kGradient / kHeadGradient: element offset in its buffer
    int param = -1;                    // kParameter / kGradient / kHeadGradient: index in the parameter table
    bool read_after_backward = false;  // kOutput the host still reads after the backward (the losses)
    int layer = -1;              // the model layer whose ops make it (-1: the chunk's own: embedding, head, hand-offs)
    std::string grad_name = {};  // its gradient's name when not "d.<name>"
    bool no_grad = false;        // kInput whose gradient nobody reads (the image tower's pixels): none is made

    int64_t numel() const {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        return n;
    }
    int64_t bytes() const { return numel() * static_cast<int64_t>(dtype_size(dtype)); }
};

enum class Phase : uint8_t { kForward, kBackward };

enum class OpCode : uint8_t {
    // forward
    kEmbedding,       // in: tokens, table, pos (optional)          out: x                 attr: vocab_start, T
    kLayerNorm,       // in: x, weight, bias                        out: y, mean, rstd     attr: eps
    kMatmul,          // in: x, weight, bias (optional)             out: y
    kGelu,            // in: x                                      out: y
    kAttention,       // in: qkv                                    out: y, lse            attr: B, T, NH
    kResidual,        // in: a, b, bias (optional)                  out: y = a + (b + bias)
    kCrossEntropy,    // in: logits, targets, [row_max]             out: [row_max], [sums]  attr: ce_phase
                      //   sums is (2, N): sum_exp then target_logit, so one all-reduce sums both
    kLoss,            // in: row_max, sums                          out: losses = log(sum_exp) + max - target (host)
    kLoadTokens,      //                                            out: tokens (host: the caller's ids, checked
                      //                                              against vocab_valid, the real vocabulary)
    kLoadTargets,     //                                            out: targets (host)
    kLoadConstant,    //                                            out: the node's `constant` values (host, fp32)
    kRmsNorm,         // in: x, weight                              out: y, rstd           attr: eps
    kRope,            // in: qkv, table                             out: qkv (in place)    attr: T, NH, NKV
    kSwiGlu,          // in: x (N, 2F) rows [gate | up]             out: y (N, F)
    kRingAttention,   // in: qkv                                   out: y, lse, scratch   attr: B, T, NH, NKV,
                      //   causal: attention through the block ops (ring_attention.h): context parallelism's ring
                      //   over the context group (T local rows), or on one rank the bidirectional attention of the
                      //   image tower (causal false: every row sees every key of its sequence)
    kLoadRows,        //                                            out: rows (host: the caller's row indices,
                      //                                              checked against vocab_valid, the rows there are)
    kGatherRows,      // in: x (N, C), rows (B)                     out: y (B, C) = x[rows]: a tower's pooled rows
    kCrossAttention,  // in: q (B*T, NH*HS), kv (B*S, 2*NH*HS)    out: y, lse, scratch   attr: B, T, S, NH
                      //   every query row of a sequence sees every key row of the same sequence of kv ([K | V]
                      //   per row): CLIP's cross-modal layers, text rows attending to image rows (cross_attention.h)
    // fused forward (fusion.cpp)
    kResidualLayerNorm,  // in: a, b, bias, weight, ln_bias       out: sum, y, mean, rstd
    kMatmulGelu,         // in: x, weight, bias                   out: pre, y = gelu(pre)
    kLmHeadLoss,  // in: x, weight, targets, [dloss]   out: losses, [dx], [dweight (+=)], scratch   attr: chunk_rows
                  //   the head's matmul, cross-entropy and (with dloss) their backward, chunk by chunk over the rows
                  //   (Backend::lm_head_loss); runs in the forward, so dloss is made there too
    // backward
    kEmbeddingBackward,       // in: tokens, dx                     out: dtable, dpos (optional)
    kLayerNormBackward,       // in: dy, x, weight, mean, rstd      out: dx (accumulate), dweight, dbias
    kMatmulBackward,          // in: dy, x, weight, [gelu_pre]      out: dx (accumulate; optional), dweight, dbias
    kGeluBackward,            // in: x, dy                          out: dx
    kAttentionBackward,       // in: dy, qkv, y, lse                out: dqkv
    kRmsNormBackward,         // in: dy, x, weight, rstd            out: dx (accumulate), dweight
    kRopeBackward,            // in: dqkv, table                    out: dqkv (in place: the inverse rotation)
    kSwiGluBackward,          // in: dy, x                          out: dx
    kRingAttentionBackward,   // in: dy, qkv, y, lse                out: dqkv, scratch
    kCrossAttentionBackward,  // in: dy, q, kv, y, lse             out: dq, dkv, scratch
    kBiasGradient,            // in: dy                             out: dbias (+= column sums of dy)
    kGatherRowsBackward,      // in: rows, dy                       out: dx (accumulate): dy's rows at `rows`, 0 else
    kLossGradient,            //                                    out: dloss = loss_scale / N (host, run-time scale)
    kCrossEntropyBackward,    // in: logits, targets, row_max, sums, dloss   out: logits (dlogits, in place)
    // tensor-parallel collectives (group tp); in-place ones write their input
    // Megatron's conjugate pair: kTpCopy is the identity forward whose backward all-reduces the gradient;
    // kAllReduce sums forward (in place) and is the identity backward.
    kTpCopy,         // in: x        out: x (the same tensor: no work forward)
    kAllReduce,      // in: x        out: x (in place)                   attr: reduce
    kAllGather,      // in: local    out: full (tp x the rows)
    kReduceScatter,  // in: partial  out: local (rows / tp)
};
const char* op_name(OpCode op);

struct Node {
    OpCode op;
    Phase phase = Phase::kForward;
    std::vector<TensorId> in;                        // kNoTensor for an absent optional input
    std::vector<TensorId> out;                       // kNoTensor for an absent optional output
    int layer = -1;                                  // the model layer it belongs to (-1: embedding or head)
    Accumulate accumulate = Accumulate::kOverwrite;  // the activation gradient output (dx), backward ops
    // attributes (those the op uses)
    float eps = 0.0f;
    int64_t B = 0, T = 0, NH = 0;                                // attention: batch, sequence, heads held; embedding: T
    int64_t S = 0;                                               // cross-attention: key rows per sequence
    int64_t NKV = 0;                                             // attention, rope: key/value heads held (0: NH)
    int64_t vocab_start = 0, vocab_valid = 0;                    // embedding, cross-entropy
    int64_t chunk_rows = 0;                                      // kLmHeadLoss: rows per chunk
    ReduceOp reduce = ReduceOp::kSum;                            // all-reduce
    CrossEntropyPhase ce_phase = CrossEntropyPhase::kMaxSumExp;  // cross-entropy forward
    std::string label = {};            // what the builder called it ("h.3.mlp.c_fc"), for plan --graph and errors
    std::vector<float> constant = {};  // kLoadConstant: the values (a rope table), computed once by the builder
    // Embedding: this tensor-parallel rank adds the position rows (tp rank 0), so the sum over tp adds them once;
    // every rank takes the whole position gradient, as the table is replicated.
    bool pos_on_this_rank = true;
    // The op sees only this rank's rows of a sequence-parallel tensor: its parameter gradients are partial sums
    // over tp (LayerNorms, the residual add's bias).
    bool tp_rows = false;
    // Attention: the causal mask (a language model's); false lets every row see every key of its sequence.
    bool causal = true;
};

// One chunk's graph. Tensor ids index `tensors`; ops run in `nodes` order.
struct Graph {
    std::vector<TensorInfo> tensors;
    std::vector<Node> nodes;
    DType act = DType::kF32;  // the activation dtype
    // Parameters whose gradient each tensor-parallel rank computes over only its rows (sequence parallelism's
    // LayerNorms): summed over tp once per step, after the last micro-batch (Gpt::finish_gradients()).
    std::vector<int> tp_partial_grad_params;
    std::vector<TensorId> grad_of;  // gradient tensor of each tensor (kNoTensor: none); filled by derive_backward()
    std::unordered_map<std::string, TensorId> by_name;

    TensorId add_tensor(TensorInfo info);
    TensorId find(const std::string& name) const;  // kNoTensor when absent
    const TensorInfo& info(TensorId t) const { return tensors.at(static_cast<size_t>(t)); }
    int num_forward() const;  // the forward ops come first
};

// Appends the backward of g's forward ops, walking them in reverse and applying each op's gradient rule; creates
// the activation gradients ("d.<name>") and records them in grad_of. Seeds, set by the builder in grad_of before:
// each parameter's gradient tensor (kGradient), and for a chunk without the loss the output's gradient (kGradInput,
// written by the pipeline). A chunk with the loss starts from its kLoss op (dloss = loss_scale / N at run time).
void derive_backward(Graph& g);

// The shape of a kRingAttention op or its backward: its attributes, and the head size and dtype of its qkv.
RingAttentionShape ring_attention_shape(const Graph& g, const Node& n);
// The shape of a kCrossAttention op or its backward: its attributes, and the head size and dtype of its q.
CrossAttentionShape cross_attention_shape(const Graph& g, const Node& n);

// One line per op: "[fwd] h.0.c_attn  matmul  in: h.0.ln1 (256x64 fp32), ...  out: ..."; for plan --graph and tests.
std::string describe(const Graph& g);

}  // namespace ms::graph
