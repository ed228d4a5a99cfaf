// gpt.h: GPT-2, exactly (token + learned position embeddings, pre-LayerNorm blocks, causal multi-head attention,
// GELU-tanh MLP, biases everywhere, final LayerNorm, output head tied to the token embedding, vocabulary padded
// to Vp with the padded logits masked), forward and backward over a Backend.
//
// Parameters live in one contiguous fp32 buffer in the order of param_table(); gradients mirror it. Mixed precision
// (Options::dtype bf16 or fp16, docs/design.md §6): the fp32 buffer holds the master weights the optimizer updates, a
// second flat buffer of the same layout holds the 16-bit weights the ops read (refresh_weights() rounds the master
// into it), activations and their gradients are 16-bit, and gradients, statistics and the loss stay fp32
// (backends/backend.h's precision contract). With fp32 the two buffers are one. Names are
// Hugging Face GPT-2's (`wte.weight`, `h.3.attn.c_attn.weight`, ...) but weights are stored in Linear
// orientation (out_features, in_features); HF's Conv1D stores the transpose. c_attn's rows are [Q | K | V],
// each block head-major. forward() and backward() run the chunk's op graph (engine/model/gpt_graph.h: built,
// differentiated, fused and compiled once per batch shape); activations for up to `max_batch` sequences are
// allocated once at construction, laid out by the graph's memory plan: one block per activation slot and one scratch
// block shared by the slots; tensors whose lifetimes do not overlap share memory. With Options::arena every block
// (and owned parameters and gradients) is a named allocation of that arena; without one, each is its own HostBuffer.
//
// Tensor parallelism (Megatron, docs/design.md §5) over the `tp` communicator (size 1: every collective is a no-op):
//   wte                      vocab-parallel rows (Vp/tp each); embedding and cross-entropy reduce over tp
//   c_attn (weight, bias)    column-parallel, split per head: rank r holds [Q_heads(r) | K_heads(r) | V_heads(r)]
//   mlp.c_fc (weight, bias)  column-parallel rows (F/tp each)
//   attn.c_proj, mlp.c_proj  row-parallel: weight columns split (in_features/tp); the bias is replicated and added
//                            after the all-reduce
//   wpe, LayerNorms          replicated (identical on every TP rank)
// The gradients of column-parallel inputs are all-reduced over tp before the LayerNorm backward (the "copy"
// primitive's backward); row-parallel outputs are all-reduced in the forward (the "reduce" primitive).
//
// Asynchronous backends (CUDA): the host touches activation memory in a few places -- the token and target
// copies, the loss from the cross-entropy statistics, dloss, the pipeline hand-off copies of parts without the
// embedding or the head -- and each follows Backend::synchronize(); collectives are synchronized by the
// communicator the trainer wraps (comm/synchronizing_communicator.h). Callers that read logits(), losses(),
// output() or grad_input() on the host synchronize the backend first.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "engine/backends/backend.h"
#include "engine/backends/rope_table.h"
#include "engine/graph/program.h"
#include "engine/graph/recompute_options.h"
#include "memory/memory_block.h"

namespace ms {

class GptProgram;  // engine/model/gpt_graph.h

// Choices that change which ops the graph runs, not what the model is.
struct GptGraphOptions {
    BackendKind backend = BackendKind::kCPU;  // picks the fused LM head's chunk size (lm_head_loss_chunk_rows)
    // model.cross_entropy_loss_fusion: the LM head, its loss and their backward as one chunked op in the forward
    // (engine/graph/passes.h), where tp is 1 and the chunk computes the loss; otherwise the ops as written.
    bool lm_head_loss_fusion = false;
    // model.recompute_granularity / recompute_method / recompute_num_layers (engine/graph/passes.h)
    graph::RecomputeOptions recompute = {};
    // The parameter gradients' dtype (mixed_precision.grad_reduce_in_fp32: fp32, else the activation dtype): the
    // graph's gradient tensors, the flat gradient buffer and every reduction of it.
    DType grads = DType::kF32;
    // parallel.context_parallel_size: each sequence split over this many ranks (engine/parallel/context_split.h),
    // whose attention is a ring (engine/graph/ring_attention.h); the graph holds the local rows. Llama only.
    int context_parallel = 1;
    // A chunk with both the embedding and the tied output layer (one pipeline stage) accumulates the output layer's
    // gradient in a Vp/tp x C buffer of its own (graph::Role::kHeadGradient, head_grad_bytes()), which
    // finish_gradients() adds to the embedding's once per step, after the last micro-batch: the sum of the
    // embedding's gradients plus the sum of the head's, as a pipeline's first and last stage form it and the
    // embedding group adds it, so one stage and several give the same bits (the head's and the lookup's
    // contributions otherwise alternate in one buffer, micro-batch by micro-batch). Off: both accumulate into
    // grads() directly, complete after each backward(). make_run_layout sets it where a run is layout-exact: fp32
    // on the CPU backend, and onebit_adam.
    bool tied_grads_apart = false;
    // With tied_grads_apart on a pipeline whose buckets reduce the tied embedding's two parts apart
    // (parallel.overlap_grad_reduce, grad_buckets.h): the first stage's embedding chunk keeps a buffer of the same
    // Vp/tp x C, into which the last stage's averaged output-layer gradient arrives during the backward.
    bool tied_head_received = false;
    auto operator<=>(const GptGraphOptions&) const = default;
};

// The model family (model.arch): GPT-2 as described above, or Llama (Megatron's / Hugging Face's): token embedding
// without positions, pre-RMSNorm blocks, rotary position embeddings on Q and K, causal grouped-query attention
// (num_query_groups key/value heads), a SwiGLU MLP, no biases, a final RMSNorm and an untied output layer
// (llama_graph.cpp). Both run through the same table, chunk runner, pipeline and plan.
//
// CLIP's two towers (engine/model/clip_tower.cpp; the model that pairs them is engine/clip/clip_model.h) are chunks of
// this shape too: GPT-2's pre-LayerNorm block under Hugging Face's CLIP names, the image tower's attention
// bidirectional, each tower's output one pooled row per sample, normed and projected to `proj` columns. So are CLIP's
// optional cross-modal layers (kClipFusion): text rows attending to themselves and to their image's rows, ending in
// the image-text matching head's `proj` = 2 logits per pair.
//
// The self-play network (kPolicyValue, engine/model/policy_value.h) is one too: a bidirectional encoder over a game
// board's cells plus a summary row, with a policy logit per cell and a value head on the summary row.
enum class ModelArch : uint8_t { kGpt, kLlama, kClipVision, kClipText, kClipFusion, kPolicyValue };
inline bool is_clip_tower(ModelArch a) {
    return a == ModelArch::kClipVision || a == ModelArch::kClipText || a == ModelArch::kClipFusion;
}

struct GptShape {
    ModelArch arch = ModelArch::kGpt;
    int L = 12;         // layers
    int C = 768;        // hidden
    int NH = 12;        // heads
    int T = 1024;       // max sequence length (= number of position embeddings)
    int S = 0;          // sequence length the activations are sized for, at most T (0: T); see seq()
    int V = 50257;      // real vocabulary
    int Vp = 50304;     // padded vocabulary (multiple of make_vocab_size_divisible_by)
    int F = 3072;       // ffn hidden
    float eps = 1e-5f;  // LayerNorm's epsilon, RMSNorm's for Llama (model.layernorm_epsilon)
    // model.untie_embeddings_and_output_weights: the output layer is a weight of its own (lm_head.weight) rather than
    // the token embedding read transposed
    bool untied = false;
    // Llama only:
    int NKV = 0;                    // key/value heads (model.num_query_groups); 0: NH
    double rope_theta = 10000.0;    // model.rotary_base
    RopeScaling rope_scaling = {};  // model.rope_scaling_factor and the Llama 3 keys beside it
    // CLIP towers only: the projection's width (the shared embedding); the image tower's image and patch sides in
    // pixels, its rows T = (image / patch)^2 + 1 (the class token first) and its "vocabulary" V = 2 (clip_tower.cpp)
    int proj = 0;
    int image = 0, patch = 0;
    // CLIP towers: also output every row normed ("states", the cross-modal layers' input), pooling from them
    bool states = false;
    // CLIP's cross-modal layers (kClipFusion): the width of the image rows their keys and values are made from; the
    // image rows per pair are (image / patch)^2 + 1
    int cross_C = 0;
    // The policy-value network (kPolicyValue): the largest board it embeds (rows x cols cells; T = rows * cols + 1)
    int board_rows = 0, board_cols = 0;
    bool threat_features = false;  // and its cells' playable and threat input features (policy_value.h)
    int kv_heads() const { return NKV > 0 ? NKV : NH; }
    // Rows per sequence that activation buffers, pipeline sends and plans hold: model.seq_length, which may be shorter
    // than the position table (max_position_embeddings), so a model with more positions than it trains on does not
    // pay for the difference in activation memory.
    int seq() const { return S > 0 ? S : T; }
    auto operator<=>(const GptShape&) const = default;
};

// The token embedding's parameter (GPT's "wte.weight", Llama's "model.embed_tokens.weight"), and the output layer's:
// the same one when tied, "lm_head.weight" when untied.
std::string embedding_weight_name(const GptShape& s);
std::string output_weight_name(const GptShape& s);

// How a parameter is cut across tensor-parallel ranks.
enum class ShardKind : uint8_t {
    kReplicated,  // every TP rank holds the whole tensor
    kRows,        // dim 0 split in tp equal blocks (vocab-parallel wte, column-parallel c_fc, Llama's q/k/v, gate, up)
    kCols,        // dim 1 split (row-parallel c_proj weights)
    kQkvRows,     // dim 0 = [Q | K | V] blocks, each split per head (column-parallel c_attn)
};

// The part of the model one Gpt object holds: a pipeline model chunk (docs/design.md §5). The default is the whole
// model.
struct GptPart {
    int first_layer = 0;
    int num_layers = -1;    // -1: every layer from first_layer on
    bool embedding = true;  // token (+ position) embeddings (the first chunk)
    bool head = true;       // final norm, the output head (tied to wte for GPT) and the loss (the last chunk)
    auto operator<=>(const GptPart&) const = default;
};

// How a parameter's elements start. The table holds the rule, not the numbers: the model's init std (the config's
// model.init_method_std) is init_weights()'s argument.
enum class InitKind : uint8_t {
    kConstant,  // every element init_value (biases 0, LayerNorm weights 1)
    kNormal,    // N(0, (init_std / init_divisor)^2)
};

// GPT-2's init std, the default of model.init_method_std (engine/config/config.h) and of init_weights().
inline constexpr float kGpt2InitStd = 0.02f;

struct ParamInfo {
    std::string name;                   // canonical, e.g. "h.3.mlp.c_fc.weight"
    std::vector<int64_t> shape;         // this rank's shard, e.g. (4C/tp, C)
    std::vector<int64_t> global_shape;  // the whole tensor, e.g. (4C, C)
    ShardKind shard = ShardKind::kReplicated;
    int64_t offset = 0;         // element offset in the flat parameter buffer
    int64_t numel = 0;          // elements of the shard
    bool weight_decay = false;  // true for >= 2-D weights; false for biases, LayerNorm and other 1-D params
    InitKind init = InitKind::kConstant;
    float init_divisor = 1.0f;  // kNormal: sqrt(2 L) for the residual output projections (attn.c_proj, mlp.c_proj)
    float init_value = 0.0f;    // kConstant
    // Rows past the real vocabulary V are padding (wte, Llama's embedding and output layer): initialised to 0.
    bool vocab_rows = false;
    // The next parameter follows this one with no alignment gap, in the flat buffers of every tp rank, so the graph
    // can read both as one tensor (Llama's q_proj, k_proj, v_proj as one [Q | K | V] weight; gate_proj, up_proj as
    // one [gate | up] weight).
    bool packed_with_next = false;

    // The std of this parameter's elements when the model's init std is `init_std` (0 for kConstant).
    float std_for(float init_std) const { return init == InitKind::kNormal ? init_std / init_divisor : 0.0f; }

    // Row-major index in the global tensor of element `i` of tensor-parallel rank `tp_rank`'s shard.
    int64_t global_index(int64_t i, int tp_rank, int tp_size) const;
    // Replicated on every TP rank: counted only once (tp rank 0) in the global gradient norm.
    bool tp_duplicate() const { return shard == ShardKind::kReplicated; }
    // The last pipeline stage's copy of the tied wte (the first stage holds the counted one): never counted in the
    // norm; its gradient is summed with the first stage's over the embd group before the optimizer step.
    bool pp_duplicate = false;
};

// The parameter table of `part` of a model of this shape (GPT-2 or Llama, shape.arch) as held by one of tp_size
// tensor-parallel ranks (pure function; used by the model, the optimizer, checkpoints and tests). Requires NH, F and
// Vp (and Llama's key/value heads) divisible by tp_size. Offsets start at 0 and are 16-element aligned, except after a
// parameter packed_with_next.
std::vector<ParamInfo> gpt_param_table(const GptShape& s, int tp_size = 1, const GptPart& part = {});
// Layout-invariant init of the parameters of `table` (tensor-parallel rank tp_rank of tp_size) in `params`: global
// element i of parameter p is p.std_for(init_std) * philox_normal(seed, name_hash(p), i), so each rank draws exactly
// its shard's elements; kConstant ones init_value; rows of a vocab_rows parameter past live_vocab_elems elements 0.
void init_params(const std::vector<ParamInfo>& table, float* params, uint64_t seed, float init_std, int tp_rank,
                 int tp_size, int64_t live_vocab_elems);
// A CLIP tower's table (clip_tower.cpp), which gpt_param_table gives for those arches.
std::vector<ParamInfo> clip_tower_param_table(const GptShape& s, int tp_size);
// The policy-value network's table (policy_value.cpp), likewise.
std::vector<ParamInfo> policy_value_param_table(const GptShape& s, int tp_size);
int64_t gpt_num_params(const GptShape& s);
// Forward+backward FLOPs per token of a training step at sequence length T (Megatron's formula), for MFU.
double gpt_train_flops_per_token(const GptShape& s, int T);
// The elements of one pipeline hand-off (an activation or its gradient) of B sequences of T rows: B*T*C, or 1/tp of
// the rows with sequence parallelism. The pipeline's buffers and the step simulator's messages.
int64_t pipeline_message_elems(const GptShape& s, int B, int T, int tp, bool sequence_parallel);

class Gpt {
  public:
    struct Options {
        int max_batch = 1;
        int64_t flat_capacity = 0;  // own flat buffers of at least this many elements (e.g. padded_flat_size())
        GptPart part;
        int num_slots = 1;           // micro-batches whose activations are kept at once (pipeline schedules)
        float* params = nullptr;     // external flat storage of >= flat_size() elements (both or neither);
        graph::GradPlacement grads;  //   several pipeline chunks of one rank share one flat buffer this way (grads
                                     //   in graph.grads, placed by their flat offsets: zero_stage 2 places them apart)
        // Megatron's sequence parallelism: outside the tensor-parallel regions (LayerNorms, residual stream)
        // each TP rank keeps only its block of B*T/tp rows; all-gathers feed the column-parallel layers and
        // reduce-scatters replace the row-parallel all-reduces. LayerNorm gradients are summed over tp.
        bool sequence_parallel = false;
        Arena* arena = nullptr;      // where activations (and owned params/grads) come from; nullptr: HostBuffers
        DType dtype = DType::kF32;   // activations and the weights the ops read: fp32, bf16 or fp16
        GptGraphOptions graph = {};  // the fused LM head (model.cross_entropy_loss_fusion) and the backend it is for
        void* weights = nullptr;     // external storage of the 16-bit weights (>= flat_size() elements of dtype), with
                                     //   external params when dtype is not fp32; unused for fp32
        Communicator* cp = nullptr;  // the context group, of graph.context_parallel ranks (required when that is > 1)
    };
    // tp: the tensor-parallel group (a SelfCommunicator or any size-1 group for no tensor parallelism).
    Gpt(const GptShape& shape, Backend& backend, Communicator& tp, const Options& options);
    Gpt(const GptShape& shape, Backend& backend, Communicator& tp, int max_batch, int64_t flat_capacity = 0)
        : Gpt(shape, backend, tp, options(max_batch, flat_capacity)) {}
    ~Gpt();

    const GptShape& shape() const { return shape_; }
    const std::vector<ParamInfo>& params_info() const { return table_; }
    int64_t num_params() const { return num_params_; }
    // elements from the first parameter to the end of the last (alignment gaps included)
    int64_t flat_size() const { return table_.back().offset + table_.back().numel; }
    float* params() { return params_ptr_; }
    // The flat gradients (flat_size() elements of grad_dtype()); null when they are placed apart (zero_stage 2).
    void* grads() { return grads_ptr_; }
    DType grad_dtype() const { return grad_dtype_; }
    // grads() of a model with fp32 gradients (fatal otherwise): for code that only runs such models.
    float* grads_f32() {
        MS_CHECK(grad_dtype_ == DType::kF32, "Gpt::grads_f32: the gradients are {}", dtype_name(grad_dtype_));
        return static_cast<float*>(grads_ptr_);
    }
    DType dtype() const { return dtype_; }
    // The weights the ops read: params() itself in fp32, else the 16-bit copy (flat, params()'s layout).
    void* weights() { return weights_ptr_; }
    // weights = params rounded to dtype(), over this chunk's flat range (a no-op in fp32). init_weights() calls it;
    // whoever else writes params() (an optimizer step, a checkpoint load) calls it, or casts the whole flat buffer.
    void refresh_weights();
    const GptPart& part() const { return part_; }
    const ParamInfo& param(const std::string& name) const;

    // Layout-invariant init: global element i of parameter p is p.std_for(init_std) * philox_normal(seed,
    // name_hash(p), i) (each TP rank draws exactly its shard's elements): init_std for the weights, init_std /
    // sqrt(2 L) for the residual output projections (attn.c_proj, mlp.c_proj); biases 0; LayerNorm weights 1;
    // padded vocabulary rows of wte 0. init_std is the config's model.init_method_std.
    void init_weights(uint64_t seed, float init_std = kGpt2InitStd);

    // tokens, targets: (B, T) int32 with B <= max_batch, T <= shape.T. Returns the mean loss over B*T.
    // With targets == nullptr only the logits are computed (returns NaN). Keeps activations in `slot` for backward().
    // A part without the embedding reads its input from input(slot) instead of tokens (which may be null); a part
    // without the head leaves its output in output(slot) and returns NaN (targets may be null).
    // loss_scale: what the slot's backward() starts from, d(loss_scale * mean loss) (fp16's loss scaling over the
    // micro-batches' count), given here because the fused LM head computes its gradients in the forward; 0: no
    // backward follows (evaluation), which lets the fused head skip them.
    float forward(const int32_t* tokens, const int32_t* targets, int B, int T, int slot = 0, float loss_scale = 1.0f);
    // Accumulates d(loss_scale * mean loss)/d(params) into grads() (+=), loss_scale being the slot's forward()'s.
    // Must follow forward() on the slot (with targets for the head). A part without the head starts from
    // grad_output(slot); a part without the embedding leaves the gradient of its input in grad_input(slot).
    // on_grads_final: told during the backward which gradients are final, for the data-parallel buckets
    // (engine/optim/grad_buckets.h: the step's last micro-batch; sharded_grads.h: every micro-batch);
    // on_grads_writing: told before a step first writes gradients (sharded_grads.h readies their bucket slot).
    void backward(int slot = 0, const graph::GradsFinalFn* on_grads_final = nullptr,
                  const graph::GradsFinalFn* on_grads_writing = nullptr);
    // Called by every later forward() and backward() before a step first reads parameters, with their ranges in
    // this chunk's flat buffers (parallel.overlap_param_gather waits for their gather there). Not owned; null: none.
    void set_params_needed(const graph::ParamsNeededFn* on_params_needed);
    // Once per step, after the last backward(): completes gradients that are reduced per step, not per micro-batch
    // (sequence parallelism's LayerNorm gradients; the tied output layer's kept apart, GptGraphOptions::
    // tied_grads_apart, added to the embedding's unless add_head_apart is false: the data-parallel buckets then
    // reduce the two apart and add them, engine/optim/grad_buckets.h). A no-op otherwise.
    void finish_gradients(bool add_head_apart = true);
    // The gradients finish_gradients() completes: final only after it, whatever the backward said.
    std::vector<graph::GradRange> gradients_finished_per_step() const;
    // The tied output layer's gradient kept apart (the size of the embedding's) -- on a pipeline's first stage the
    // buffer the last stage's average arrives in (GptGraphOptions::tied_head_received) -- or an empty tensor.
    Tensor head_gradients_apart() const;
    // Pipeline hand-offs: activation_elems() elements of dtype() each (pipeline_message_elems).
    int64_t activation_elems(int B, int T) const;
    void* input(int slot);                   // (B, T, C) the activation entering the first layer
    const void* output(int slot) const;      // (B, T, C) the last layer's output
    void* grad_output(int slot);             // (B, T, C)
    const void* grad_input(int slot) const;  // (B, T, C)
    void zero_grads();
    // (B, T, Vp/tp) this rank's vocabulary shard of the logits of the last forward(), in dtype() (valid until
    // backward(), which overwrites them with dlogits). Columns from tp_rank * Vp/tp.
    Tensor logits_tensor() const;
    const float* logits() const { return logits_tensor().f32(); }  // fp32 models only
    // per-position losses (B*T) of the last forward()
    const float* losses() const;

  private:
    static Options options(int max_batch, int64_t flat_capacity) {
        Options o;
        o.max_batch = max_batch;
        o.flat_capacity = flat_capacity;
        return o;
    }
    GptShape shape_;
    Backend& backend_;
    Communicator& tp_;
    GptPart part_;
    std::vector<ParamInfo> table_;
    bool sp_ = false;  // sequence parallelism (with tp > 1)
    int64_t num_params_ = 0;
    DType dtype_ = DType::kF32;
    DType grad_dtype_ = DType::kF32;  // the Options' graph.grads
    MemoryBlock params_;              // (flat) when owned
    MemoryBlock weights_;             // (flat, dtype_) when owned and dtype_ is not fp32
    MemoryBlock grads_;               // (flat) when owned
    float* params_ptr_ = nullptr;
    void* grads_ptr_ = nullptr;
    graph::GradPlacement grad_placement_;
    void* weights_ptr_ = nullptr;
    std::unique_ptr<GptProgram> program_;  // the activations and the compiled forward and backward
};

}  // namespace ms
