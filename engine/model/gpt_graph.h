// gpt_graph.h: GPT-2 as an op graph (engine/graph/graph.h): the builder of one pipeline chunk's forward under a
// tensor-parallel layout, and GptProgram, which runs the chunk from the compiled programs.
//
// The builder writes the forward unfused, in the order of Megatron's GPT (gpt.h describes the model and its
// tensor-parallel split); derive_backward() adds the backward and fuse() the fusions (engine/graph/passes.h). Tensor
// names are stable across batch sizes: "tokens", "encoded", "h.3.ln1", "h.3.qkv", ..., "logits", "losses", and
// "d.<name>" for gradients, so a graph for a smaller batch finds its tensors in the plan made for the largest.
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/graph/graph.h"
#include "engine/graph/memory_plan.h"
#include "engine/graph/passes.h"
#include "engine/graph/program.h"
#include "engine/model/gpt.h"
#include "memory/memory_block.h"

namespace ms {

struct GptGraphSpec {
    GptShape shape = {};
    GptPart part = {};
    int tp_size = 1, tp_rank = 0;
    int cp_rank = 0;                 // in the context group of options.context_parallel ranks
    bool sequence_parallel = false;  // with tp_size > 1
    DType act = DType::kF32;
    int B = 1, T = 1;       // the micro-batch
    bool with_loss = true;  // the head computes the loss (and the graph its backward); false: logits only
    bool fuse = true;       // run the fusion pass (false: the graph as derived, for plan --graph's comparison)
    GptGraphOptions options = {};
    // Everything the builder reads: equal specs build the same graph (a cache key).
    auto operator<=>(const GptGraphSpec&) const = default;
};

// The chunk's graph: forward, backward (unless the head is built without the loss) and the fusion pass's report.
struct GptGraph {
    graph::Graph g;
    graph::PassReport recompute, fusion;
};
// Dispatches on spec.shape.arch: GPT-2's builder here, Llama's in llama_graph.cpp (build_llama_graph), CLIP's towers
// in clip_tower.cpp (build_clip_tower_graph), the self-play network in policy_value.cpp (build_policy_value_graph).
GptGraph build_gpt_graph(const GptGraphSpec& spec, const std::vector<ParamInfo>& table);
GptGraph build_llama_graph(const GptGraphSpec& spec, const std::vector<ParamInfo>& table);
GptGraph build_clip_tower_graph(const GptGraphSpec& spec, const std::vector<ParamInfo>& table);
GptGraph build_policy_value_graph(const GptGraphSpec& spec, const std::vector<ParamInfo>& table);

// Where a chunk's activations live, for micro-batches of up to max_batch sequences of shape.seq(): what GptProgram
// allocates and `plan` reports. Its cost does not grow with the layer count (memory_plan.h).
graph::MemoryPlan plan_gpt_memory(const GptShape& shape, const GptPart& part, int tp_size, int max_batch,
                                  bool sequence_parallel, DType act, const GptGraphOptions& options = {});

// The chunk's gradients as its backward writes them (graph::grad_writes of its whole graph): what zero_stage 2's
// gradient memory is laid out from (engine/optim/sharded_grads.h), by PipelineModel and by `plan`.
graph::GradWrites gpt_grad_writes(const GptShape& shape, const GptPart& part, int tp_size, bool sequence_parallel,
                                  DType act, const GptGraphOptions& options = {});

// Bytes of the buffer where the chunk keeps its tied output layer's gradient apart (GptGraphOptions::tied_grads_apart):
// Vp/tp x C of the gradient dtype on a chunk with both the embedding and the tied head, or on the embedding's chunk
// where the last stage's average arrives (GptGraphOptions::tied_head_received), else 0. GptProgram allocates it,
// `plan` counts it.
int64_t head_grad_bytes(const GptShape& shape, const GptPart& part, int tp_size, const GptGraphOptions& options);

// One chunk run from compiled programs: Gpt's forward/backward contract (gpt.h) over external parameters,
// weights and gradients, with activations in `num_slots` slot blocks and one scratch block laid out by the graph's
// memory plan (made for max_batch rows of shape.seq()).
class GptProgram {
  public:
    struct Options {
        int max_batch = 1;
        int num_slots = 1;
        GptPart part;
        bool sequence_parallel = false;
        DType dtype = DType::kF32;
        GptGraphOptions graph = {};
        float* params = nullptr;     // fp32 master weights (flat, gpt_param_table layout)
        void* weights = nullptr;     // what the ops read: params itself in fp32, else the 16-bit copy
        graph::GradPlacement grads;  // where each gradient lives (dtype graph.grads), by the chunk's flat offsets
        Arena* arena = nullptr;
        Communicator* cp = nullptr;  // the context group (graph.context_parallel > 1)
    };
    GptProgram(const GptShape& shape, Backend& backend, Communicator& tp, const Options& options);

    // rows: a CLIP tower's pooled rows (kLoadRows), one per sequence
    float forward(const int32_t* tokens, const int32_t* targets, int B, int T, int slot, float loss_scale,
                  const int32_t* rows = nullptr);
    void backward(int slot, const graph::GradsFinalFn* on_grads_final = nullptr,
                  const graph::GradsFinalFn* on_grads_writing = nullptr);
    void set_params_needed(const graph::ParamsNeededFn* on_params_needed) { params_needed_ = on_params_needed; }
    void finish_gradients(bool add_head_apart = true);
    Tensor head_gradients_apart() const;  // Gpt::head_gradients_apart()
    std::vector<graph::GradRange> gradients_finished_per_step() const;
    void* input(int slot);
    // The slot's memory of the full micro-batch's tensor `name` (fatal when there is none): a CLIP image tower's
    // "patches", which the host writes before the forward.
    void* tensor(const std::string& name, int slot) const;
    // The slot's memory of the gradient of tensor `name` (whatever the backward named it): a CLIP chunk's input
    // gradients and the states' gradient the host writes.
    void* gradient(const std::string& name, int slot) const;
    const void* output(int slot) const;
    void* grad_output(int slot);
    const void* grad_input(int slot) const;
    Tensor logits_tensor() const;
    const float* losses() const;
    const graph::MemoryPlan& memory_plan() const { return plan_; }

  private:
    struct Compiled {
        GptGraph graph;
        const graph::MemoryPlan* plan = nullptr;        // plan_, or its logits_only
        std::vector<graph::Program> forward, backward;  // per slot
    };
    const Compiled& compiled(int B, int T, bool with_loss);
    void* address(graph::TensorId t, int slot) const;  // of a tensor of the full micro-batch's graph
    Tensor head_grads_tensor() const;                  // head_grads_ as (numel) of the gradient dtype

    GptShape shape_;
    Backend& backend_;
    Communicator& tp_;
    Options o_;
    std::vector<ParamInfo> table_;
    graph::MemoryPlan plan_;
    std::vector<MemoryBlock> slot_blocks_;
    MemoryBlock scratch_block_;
    MemoryBlock head_grads_;         // head_grad_bytes(): the tied output layer's gradient kept apart (or received),
                                     // else empty
    int head_param_ = -1;            // that parameter's index in table_ (-1: none kept apart)
    std::vector<double> loss_sum_;   // per slot
    std::vector<float> loss_scale_;  // per slot: its forward's, for its backward (0: none may follow)
    std::map<std::tuple<int, int, bool>, std::unique_ptr<Compiled>> programs_;
    const Compiled* full_ = nullptr;             // the graph of a full micro-batch with the loss
    graph::TensorId output_ = graph::kNoTensor;  // without the head: the last layer's output
    int B_ = 0, T_ = 0;
    const Compiled* last_ = nullptr;
    const graph::ParamsNeededFn* params_needed_ = nullptr;
};

}  // namespace ms
