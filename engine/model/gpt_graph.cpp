// gpt_graph.cpp: GPT-2's graph builder (on chunk_builder.h) and the chunk runner over compiled programs (gpt_graph.h).
#include "engine/model/gpt_graph.h"

#include <fmt/format.h>

#include <limits>
#include <string>

#include "engine/core/check.h"
#include "engine/model/chunk_builder.h"

namespace ms {
namespace {

using graph::kNoTensor;
using graph::Node;
using graph::OpCode;
using graph::Role;
using graph::TensorId;
using graph::TensorInfo;

// GPT-2's embedding (token + position rows) and block (gpt.h).
class GptBuilder : public ChunkBuilder {
  public:
    using ChunkBuilder::ChunkBuilder;

  private:
    void embedding(TensorId tokens, TensorId out) override;
    TensorId layer(TensorId res, int l, bool last) override;
    std::string final_norm() const override { return "ln_f"; }
};

void GptBuilder::embedding(TensorId tokens, TensorId out) {
    Node& e = op(OpCode::kEmbedding, "embedding", {tokens, param("wte.weight"), param("wpe.weight")}, {out}, -1);
    e.vocab_start = s_.tp_rank * (s_.shape.Vp / s_.tp_size);
    e.T = s_.T;
    e.pos_on_this_rank = s_.tp_rank == 0;
}

// Layer l's ops; its tensors are "h.<l>.<what>" and belong to layer l. The last layer's output is the chunk's
// (role kOutput without the head); the gradient of the stream, which the backward of the chunk's head or the next
// stage starts, is named "d.output" whatever the layer count.
TensorId GptBuilder::layer(TensorId res, int l, bool last) {
    layer_ = l;
    const GptShape& s = s_.shape;
    const int64_t tp = s_.tp_size, C = s.C, NH_local = s.NH / tp, C_local = NH_local * (s.C / s.NH);
    const std::string h = fmt::format("h.{}.", l);
    // attention: res2 = res + c_proj(attention(c_attn(ln_1(res)))) + bias
    const TensorId x = norm_to_columns(res, h + "ln_1", h + "ln_1", l);
    const TensorId qkv = act(h + "qkv", N_, 3 * C_local);
    op(OpCode::kMatmul, h + "attn.c_attn", {x, param(h + "attn.c_attn.weight"), param(h + "attn.c_attn.bias")}, {qkv},
       l);
    const TensorId atty = act(h + "atty", N_, C_local);
    const TensorId lse = stat(h + "lse", static_cast<int64_t>(s_.B) * NH_local * s_.T);
    Node& attn = op(OpCode::kAttention, h + "attn", {qkv}, {atty, lse}, l);
    attn.B = s_.B;
    attn.T = s_.T;
    attn.NH = NH_local;
    const TensorId attn_partial = act(h + "attn.c_proj", N_, C);
    op(OpCode::kMatmul, h + "attn.c_proj", {atty, param(h + "attn.c_proj.weight"), kNoTensor}, {attn_partial}, l);
    const TensorId attn_out = reduce_rows(attn_partial, h + "attn.out", l);
    const TensorId res2 = act(h + "res2", Nl_, C);
    op(OpCode::kResidual, h + "attn.residual", {res, attn_out, param(h + "attn.c_proj.bias")}, {res2}, l).tp_rows = sp_;
    // MLP: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))) + bias
    const TensorId res3 = gelu_mlp(res2, l, h, "ln_2", "mlp.c_fc", "mlp.c_proj");
    if (last) g_.tensors[static_cast<size_t>(res3)].grad_name = "d.output";
    layer_ = -1;
    return res3;
}

}  // namespace

GptGraph build_gpt_graph(const GptGraphSpec& spec, const std::vector<ParamInfo>& table) {
    MS_CHECK(spec.B >= 1 && spec.T >= 1, "gpt graph: batch {} x sequence {}", spec.B, spec.T);
    if (spec.shape.arch == ModelArch::kLlama) return build_llama_graph(spec, table);
    if (is_clip_tower(spec.shape.arch)) return build_clip_tower_graph(spec, table);
    if (spec.shape.arch == ModelArch::kPolicyValue) return build_policy_value_graph(spec, table);
    MS_CHECK(spec.options.context_parallel == 1,
             "gpt graph: context parallelism ({} ranks) is built for Llama's rotary positions, not GPT's table",
             spec.options.context_parallel);
    return GptBuilder(spec, table).build();
}

graph::MemoryPlan plan_gpt_memory(const GptShape& shape, const GptPart& part, int tp_size, int max_batch,
                                  bool sequence_parallel, DType act, const GptGraphOptions& options) {
    const int num_layers = part.num_layers < 0 ? shape.L - part.first_layer : part.num_layers;
    GptPart first = part;  // the representative graph: the chunk with its first layers (memory_plan.h)
    first.num_layers = std::min(num_layers, 2);
    // with a recomputed block of leading layers and others after it, the representative's first layer stands for
    // the block and its second for the rest
    GptGraphOptions rep_options = options;
    int leading = num_layers;
    const graph::RecomputeOptions& rc = options.recompute;
    if (rc.granularity == graph::RecomputeGranularity::kFull && rc.method == graph::RecomputeMethod::kBlock &&
        rc.num_layers < num_layers) {
        leading = rc.num_layers;
        rep_options.recompute.num_layers = std::min(leading, 1);
    }
    const GptGraphSpec spec{.shape = shape,
                            .part = first,
                            .tp_size = tp_size,
                            .tp_rank = 0,
                            .sequence_parallel = sequence_parallel,
                            .act = act,
                            .B = max_batch,
                            .T = shape.seq() / options.context_parallel,
                            .options = rep_options};
    const std::vector<ParamInfo> table = gpt_param_table(shape, tp_size, first);
    graph::MemoryPlan plan =
        graph::plan_graph_memory(build_gpt_graph(spec, table).g, part.first_layer, num_layers, leading);
    if (options.lm_head_loss_fusion && tp_size == 1 && part.head) {
        // the fused head holds no logits; a forward for the logits (generation) does: it gets its own plan over the
        // same blocks, sized for both
        GptGraphSpec logits = spec;
        logits.with_loss = false;
        auto other = std::make_shared<graph::MemoryPlan>(
            graph::plan_graph_memory(build_gpt_graph(logits, table).g, part.first_layer, num_layers, leading, true));
        const size_t slot = std::max(plan.slot.total_bytes, other->slot.total_bytes);
        const size_t scratch = std::max(plan.scratch.total_bytes, other->scratch.total_bytes);
        plan.slot.total_bytes = other->slot.total_bytes = slot;
        plan.scratch.total_bytes = other->scratch.total_bytes = scratch;
        plan.logits_only = std::move(other);
    }
    return plan;
}

graph::GradWrites gpt_grad_writes(const GptShape& shape, const GptPart& part, int tp_size, bool sequence_parallel,
                                  DType act, const GptGraphOptions& options) {
    const GptGraphSpec spec{.shape = shape,
                            .part = part,
                            .tp_size = tp_size,
                            .sequence_parallel = sequence_parallel && tp_size > 1,
                            .act = act,
                            .B = 1,
                            .T = shape.seq() / options.context_parallel,
                            .options = options};
    const std::vector<ParamInfo> table = gpt_param_table(shape, tp_size, part);
    const GptGraph built = build_gpt_graph(spec, table);
    graph::GradWrites writes = graph::grad_writes(built.g);
    // what finish_gradients() completes once per step is kept too: the gradients summed over tp, and the
    // embedding's that the output layer's kept apart is added to
    std::vector<int> per_step = built.g.tp_partial_grad_params;
    if (part.head && head_grad_bytes(shape, part, tp_size, options) > 0)
        for (size_t i = 0; i < table.size(); ++i)
            if (table[i].name == output_weight_name(shape)) per_step.push_back(static_cast<int>(i));
    for (int i : per_step) {
        const ParamInfo& p = table[static_cast<size_t>(i)];
        const graph::GradRange r{p.offset, p.offset + p.numel};
        for (auto& group : writes.once) std::erase(group, r);
        writes.kept.push_back(r);
    }
    std::erase_if(writes.once, [](const auto& group) { return group.empty(); });
    return writes;
}

int64_t head_grad_bytes(const GptShape& shape, const GptPart& part, int tp_size, const GptGraphOptions& options) {
    if (!options.tied_grads_apart || !part.embedding || !(part.head || options.tied_head_received) || shape.untied)
        return 0;
    return int64_t{shape.Vp} / tp_size * shape.C * static_cast<int64_t>(dtype_size(options.grads));
}

GptProgram::GptProgram(const GptShape& shape, Backend& backend, Communicator& tp, const Options& o)
    : shape_(shape), backend_(backend), tp_(tp), o_(o) {
    MS_CHECK(o.params != nullptr && !o.grads.empty() && o.weights != nullptr,
             "GptProgram: parameters, weights and gradients are external");
    table_ = gpt_param_table(shape, tp.size(), o.part);
    plan_ = plan_gpt_memory(shape, o.part, tp.size(), o.max_batch, o.sequence_parallel, o.dtype, o.graph);
    const int num_layers = plan_.num_layers;
    const std::string what = fmt::format("layers {}-{}", o.part.first_layer, o.part.first_layer + num_layers - 1);
    scratch_block_ = MemoryBlock(plan_.scratch_bytes(), o.arena, MemCategory::kWorkspace, what + " scratch");
    for (int i = 0; i < o.num_slots; ++i)
        slot_blocks_.emplace_back(plan_.slot_bytes(), o.arena, MemCategory::kActivation,
                                  fmt::format("{} slot {}", what, i));
    if (const int64_t bytes = head_grad_bytes(shape, o.part, tp.size(), o.graph); bytes > 0) {
        head_grads_ =
            MemoryBlock(static_cast<size_t>(bytes), o.arena, MemCategory::kGradient, what + " tied head grads");
        for (size_t i = 0; i < table_.size() && o.part.head; ++i)
            if (table_[i].name == output_weight_name(shape)) head_param_ = static_cast<int>(i);
        backend_.zero(head_gradients_apart());
    }
    loss_sum_.assign(static_cast<size_t>(o.num_slots), 0.0);
    loss_scale_.assign(static_cast<size_t>(o.num_slots), 0.0f);
    // the graph of a full micro-batch: names the hand-off tensors, and the step-end tp gradient sums
    MS_CHECK((o.graph.context_parallel > 1) == (o.cp != nullptr && o.cp->size() > 1) &&
                 (o.cp == nullptr || o.cp->size() == o.graph.context_parallel),
             "GptProgram: context parallelism of {} with a context group of {}", o.graph.context_parallel,
             o.cp ? o.cp->size() : 0);
    full_ = &compiled(o.max_batch, shape.seq() / o.graph.context_parallel, true);
    if (!o.part.head) {
        const graph::Graph& g = full_->graph.g;
        for (size_t t = 0; t < g.tensors.size(); ++t)
            if (g.tensors[t].role == Role::kOutput) output_ = static_cast<TensorId>(t);
    }
}

const GptProgram::Compiled& GptProgram::compiled(int B, int T, bool with_loss) {
    auto& entry = programs_[{B, T, with_loss}];
    if (entry) return *entry;
    MS_CHECK(B >= 1 && B <= o_.max_batch, "batch {} outside [1, {}]", B, o_.max_batch);
    MS_CHECK(T >= 1 && T <= shape_.seq(), "sequence length {} outside [1, {}]", T, shape_.seq());
    entry = std::make_unique<Compiled>();
    GptGraphSpec spec{.shape = shape_,
                      .part = o_.part,
                      .tp_size = tp_.size(),
                      .tp_rank = tp_.rank(),
                      .cp_rank = o_.cp ? o_.cp->rank() : 0,
                      .sequence_parallel = o_.sequence_parallel,
                      .act = o_.dtype,
                      .B = B,
                      .T = T,
                      .with_loss = with_loss,
                      .options = o_.graph};
    entry->graph = build_gpt_graph(spec, table_);
    entry->plan = !with_loss && plan_.logits_only ? plan_.logits_only.get() : &plan_;
    for (int i = 0; i < o_.num_slots; ++i) {
        const graph::Bindings at{static_cast<std::byte*>(o_.weights), &o_.grads,
                                 slot_blocks_[static_cast<size_t>(i)].as<std::byte>(), scratch_block_.as<std::byte>(),
                                 head_grads_.as<std::byte>()};
        double* loss = &loss_sum_[static_cast<size_t>(i)];
        entry->forward.push_back(
            compile_program(entry->graph.g, graph::Phase::kForward, *entry->plan, at, backend_, tp_, loss, o_.cp));
        entry->backward.push_back(
            compile_program(entry->graph.g, graph::Phase::kBackward, *entry->plan, at, backend_, tp_, loss, o_.cp));
    }
    return *entry;
}

float GptProgram::forward(const int32_t* tokens, const int32_t* targets, int B, int T, int slot, float loss_scale,
                          const int32_t* rows) {
    const bool with_loss = o_.part.head && targets != nullptr;
    const Compiled& c = compiled(B, T, with_loss || !o_.part.head);
    B_ = B;
    T_ = T;
    last_ = &c;
    loss_scale_.at(static_cast<size_t>(slot)) = with_loss || !o_.part.head ? loss_scale : 0.0f;
    c.forward.at(static_cast<size_t>(slot)).run({tokens, targets, loss_scale, nullptr, params_needed_, nullptr, rows});
    if (!with_loss) return std::numeric_limits<float>::quiet_NaN();
    return static_cast<float>(loss_sum_[static_cast<size_t>(slot)] / (static_cast<double>(B) * T));
}

void GptProgram::backward(int slot, const graph::GradsFinalFn* on_grads_final,
                          const graph::GradsFinalFn* on_grads_writing) {
    const float loss_scale = loss_scale_.at(static_cast<size_t>(slot));
    MS_CHECK(last_ != nullptr && loss_scale != 0.0f,
             "backward() of slot {} without a forward() that prepared it (targets on the head, a loss scale)", slot);
    const Compiled& c = compiled(B_, T_, true);
    c.backward.at(static_cast<size_t>(slot))
        .run({nullptr, nullptr, loss_scale, on_grads_final, params_needed_, on_grads_writing});
}

std::vector<graph::GradRange> GptProgram::gradients_finished_per_step() const {
    std::vector<graph::GradRange> out;
    for (int i : full_->graph.g.tp_partial_grad_params) {
        const ParamInfo& p = table_[static_cast<size_t>(i)];
        out.push_back({p.offset, p.offset + p.numel});
    }
    if (head_param_ >= 0) {
        const ParamInfo& p = table_[static_cast<size_t>(head_param_)];
        out.push_back({p.offset, p.offset + p.numel});
    }
    return out;
}

Tensor GptProgram::head_grads_tensor() const {
    const ParamInfo& p = table_[static_cast<size_t>(head_param_)];
    return Tensor(head_grads_.data(), o_.graph.grads, {p.numel});
}

Tensor GptProgram::head_gradients_apart() const {
    if (head_grads_.data() == nullptr) return {};
    return Tensor(head_grads_.data(), o_.graph.grads,
                  {static_cast<int64_t>(head_grads_.size() / dtype_size(o_.graph.grads))});
}

void GptProgram::finish_gradients(bool add_head_apart) {
    const DType t = o_.graph.grads;
    for (int i : full_->graph.g.tp_partial_grad_params) {
        const ParamInfo& p = table_[static_cast<size_t>(i)];
        tp_.all_reduce(o_.grads.at(p.offset, p.numel), static_cast<size_t>(p.numel), t, ReduceOp::kSum, Priority::kHigh)
            .wait();
    }
    if (head_param_ >= 0 && add_head_apart) {
        // the embedding's gradient plus the head's, each summed over the micro-batches: one rounded add, what the
        // embedding group's all-reduce makes of a first and a last stage's (commutative, so the same bits)
        const ParamInfo& p = table_[static_cast<size_t>(head_param_)];
        const Tensor embedding = o_.grads.tensor(p.offset, p.numel);
        const Tensor head = head_grads_tensor();
        backend_.residual_forward({.a = embedding, .b = head, .out = embedding, .bias = {}});
        backend_.zero(head);  // for the next step
    }
}

void* GptProgram::address(graph::TensorId t, int slot) const {
    const graph::MemoryPlan::Place p = plan_.place(full_->graph.g, t);
    MS_CHECK(p.group != graph::MemGroup::kNone, "GptProgram: '{}' has no memory", full_->graph.g.info(t).name);
    const MemoryBlock& block =
        p.group == graph::MemGroup::kSlot ? slot_blocks_.at(static_cast<size_t>(slot)) : scratch_block_;
    return block.as<std::byte>() + p.offset;
}
void* GptProgram::tensor(const std::string& name, int slot) const {
    const graph::TensorId t = full_->graph.g.find(name);
    MS_CHECK(t != kNoTensor, "GptProgram: this chunk has no tensor '{}'", name);
    return address(t, slot);
}

void* GptProgram::gradient(const std::string& name, int slot) const {
    const graph::Graph& g = full_->graph.g;
    const graph::TensorId t = g.find(name);
    MS_CHECK(t != kNoTensor && g.grad_of[static_cast<size_t>(t)] != kNoTensor,
             "GptProgram: this chunk has no gradient of '{}'", name);
    return address(g.grad_of[static_cast<size_t>(t)], slot);
}

void* GptProgram::input(int slot) { return tensor(o_.part.embedding ? "encoded" : "input", slot); }
const void* GptProgram::output(int slot) const { return address(output_, slot); }
void* GptProgram::grad_output(int slot) { return tensor("dout", slot); }
const void* GptProgram::grad_input(int slot) const { return gradient("input", slot); }
Tensor GptProgram::logits_tensor() const {
    const Compiled& c = last_ != nullptr ? *last_ : *full_;
    const graph::TensorId t = c.graph.g.find("logits");
    MS_CHECK(t != kNoTensor && c.plan->place(c.graph.g, t).group != graph::MemGroup::kNone,
             "logits_tensor(): the last forward held no logits (the fused LM head computes the loss without them: "
             "call forward() without targets for the logits)");
    const graph::MemoryPlan::Place p = c.plan->place(c.graph.g, t);
    const MemoryBlock& block = p.group == graph::MemGroup::kSlot ? slot_blocks_.at(0) : scratch_block_;
    const int64_t N = static_cast<int64_t>(B_ > 0 ? B_ : o_.max_batch) * (T_ > 0 ? T_ : shape_.seq());
    return Tensor(block.as<std::byte>() + p.offset, o_.dtype, {N, shape_.Vp / tp_.size()});
}
const float* GptProgram::losses() const { return static_cast<const float*>(tensor("losses", 0)); }

}  // namespace ms
