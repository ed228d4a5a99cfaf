// gpt_graph.cpp: GPT-2's graph builder and the chunk runner over compiled programs (gpt_graph.h).
#include "engine/model/gpt_graph.h"

#include <fmt/format.h>

#include <limits>
#include <string>

#include "engine/core/check.h"

namespace ms {
namespace {

using graph::kNoTensor;
using graph::Node;
using graph::OpCode;
using graph::Role;
using graph::TensorId;
using graph::TensorInfo;

class GptBuilder {
  public:
    GptBuilder(const GptGraphSpec& s, const std::vector<ParamInfo>& table) : s_(s) {
        g_.act = s.act;
        N_ = static_cast<int64_t>(s.B) * s.T;
        sp_ = s.sequence_parallel && s.tp_size > 1;
        Nl_ = sp_ ? N_ / s.tp_size : N_;
        for (size_t i = 0; i < table.size(); ++i) {
            const ParamInfo& p = table[i];
            const TensorId w = g_.add_tensor({.name = p.name,
                                              .shape = p.shape,
                                              .dtype = s.act,
                                              .role = Role::kParameter,
                                              .param_offset = p.offset,
                                              .param = static_cast<int>(i)});
            const TensorId d = g_.add_tensor({.name = "grad." + p.name,
                                              .shape = p.shape,
                                              .dtype = s.options.grads,
                                              .role = Role::kGradient,
                                              .param_offset = p.offset,
                                              .param = static_cast<int>(i)});
            g_.grad_of[static_cast<size_t>(w)] = d;
        }
    }

    GptGraph build();

  private:
    TensorId param(const std::string& name) const {
        const TensorId t = g_.find(name);
        MS_CHECK(t != kNoTensor && g_.info(t).role == Role::kParameter, "gpt graph: no parameter '{}'", name);
        return t;
    }
    TensorId act(const std::string& name, int64_t rows, int64_t cols, Role role = Role::kActivation) {
        return g_.add_tensor({.name = name, .shape = {rows, cols}, .dtype = s_.act, .role = role, .layer = layer_});
    }
    TensorId stat(const std::string& name, int64_t n, DType t = DType::kF32) {
        return g_.add_tensor({.name = name, .shape = {n}, .dtype = t, .layer = layer_});
    }
    Node& op(OpCode code, std::string label, std::vector<TensorId> in, std::vector<TensorId> out, int layer) {
        Node n;
        n.op = code;
        n.in = std::move(in);
        n.out = std::move(out);
        n.layer = layer;
        n.label = std::move(label);
        g_.nodes.push_back(std::move(n));
        return g_.nodes.back();
    }
    // LayerNorm of the residual stream x (this rank's rows), then the input of a column-parallel layer: all rows
    // (all-gathered under sequence parallelism; Megatron's "copy" otherwise).
    TensorId layernorm_to_columns(TensorId x, const std::string& prefix, const std::string& ln, int layer) {
        const std::string name = prefix + ln;
        const TensorId y = act(sp_ ? name + ".local" : name, Nl_, s_.shape.C);
        const TensorId mean = stat(name + "_mean", Nl_), rstd = stat(name + "_rstd", Nl_);
        op(OpCode::kLayerNorm, name, {x, param(name + ".weight"), param(name + ".bias")}, {y, mean, rstd}, layer).eps =
            s_.shape.eps;
        g_.nodes.back().tp_rows = sp_;
        if (sp_) {
            const TensorId full = act(name, N_, s_.shape.C);
            op(OpCode::kAllGather, name, {y}, {full}, layer);
            return full;
        }
        if (s_.tp_size > 1) op(OpCode::kTpCopy, name, {y}, {y}, layer);
        return y;
    }
    // A row-parallel layer's partial sums -> this rank's rows of the sum.
    TensorId reduce_rows(TensorId partial, const std::string& name, int layer) {
        if (sp_) {
            const TensorId local = act(name, Nl_, s_.shape.C);
            op(OpCode::kReduceScatter, name, {partial}, {local}, layer);
            return local;
        }
        if (s_.tp_size > 1) op(OpCode::kAllReduce, name, {partial}, {partial}, layer);
        return partial;
    }
    TensorId layer(TensorId res, int l, bool last);
    void head(TensorId res);

    const GptGraphSpec& s_;
    graph::Graph g_;
    int64_t N_ = 0, Nl_ = 0;
    bool sp_ = false;
    int layer_ = -1;  // the layer whose tensors are being made (-1: the chunk's own)
};

// Layer l's ops; its tensors are "h.<l>.<what>" and belong to layer l. The last layer's output is the chunk's
// (role kOutput without the head); the gradient of the stream, which the backward of the chunk's head or the next
// stage starts, is named "d.output" whatever the layer count.
TensorId GptBuilder::layer(TensorId res, int l, bool last) {
    layer_ = l;
    const GptShape& s = s_.shape;
    const int64_t tp = s_.tp_size, C = s.C, NH_local = s.NH / tp, C_local = NH_local * (s.C / s.NH), F = s.F / tp;
    const std::string h = fmt::format("h.{}.", l);
    // attention: res2 = res + c_proj(attention(c_attn(ln_1(res)))) + bias
    TensorId x = layernorm_to_columns(res, h, "ln_1", l);
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
    x = layernorm_to_columns(res2, h, "ln_2", l);
    const TensorId fch = act(h + "fch", N_, F);
    op(OpCode::kMatmul, h + "mlp.c_fc", {x, param(h + "mlp.c_fc.weight"), param(h + "mlp.c_fc.bias")}, {fch}, l);
    const TensorId fch_gelu = act(h + "fch_gelu", N_, F);
    op(OpCode::kGelu, h + "mlp.gelu", {fch}, {fch_gelu}, l);
    const TensorId mlp_partial = act(h + "mlp.c_proj", N_, C);
    op(OpCode::kMatmul, h + "mlp.c_proj", {fch_gelu, param(h + "mlp.c_proj.weight"), kNoTensor}, {mlp_partial}, l);
    const TensorId mlp_out = reduce_rows(mlp_partial, h + "mlp.out", l);
    const TensorId res3 = act(h + "res3", Nl_, C);
    if (last) g_.tensors[static_cast<size_t>(res3)].grad_name = "d.output";
    op(OpCode::kResidual, h + "mlp.residual", {res2, mlp_out, param(h + "mlp.c_proj.bias")}, {res3}, l).tp_rows = sp_;
    layer_ = -1;
    return res3;
}

void GptBuilder::head(TensorId res) {
    const GptShape& s = s_.shape;
    const int64_t Vl = s.Vp / s_.tp_size, vocab_start = s_.tp_rank * Vl;
    const TensorId x = layernorm_to_columns(res, "", "ln_f", -1);
    const TensorId logits = act("logits", N_, Vl, Role::kOutput);
    op(OpCode::kMatmul, "lm_head", {x, param("wte.weight"), kNoTensor}, {logits}, -1);
    if (!s_.with_loss) return;
    const TensorId targets = stat("targets", N_, DType::kI32);
    op(OpCode::kLoadTargets, "targets", {}, {targets}, -1).vocab_valid = s.V;
    const TensorId row_max = stat("row_max", N_);
    const TensorId sums = g_.add_tensor({.name = "ce_sums", .shape = {2, N_}, .dtype = DType::kF32});
    const int64_t valid = std::clamp<int64_t>(s.V - vocab_start, 0, Vl);
    auto cross_entropy = [&](CrossEntropyPhase phase, std::vector<TensorId> in, std::vector<TensorId> out) {
        Node& n = op(OpCode::kCrossEntropy, "cross_entropy", std::move(in), std::move(out), -1);
        n.ce_phase = phase;
        n.vocab_start = vocab_start;
        n.vocab_valid = valid;
    };
    if (s_.tp_size == 1) {
        cross_entropy(CrossEntropyPhase::kMaxSumExp, {logits, targets}, {row_max, sums});
    } else {  // vocab-parallel: the global row max, then the global sums (one all-reduce for both rows of sums)
        cross_entropy(CrossEntropyPhase::kMax, {logits, targets}, {row_max});
        op(OpCode::kAllReduce, "cross_entropy.max", {row_max}, {row_max}, -1).reduce = ReduceOp::kMax;
        cross_entropy(CrossEntropyPhase::kSumExp, {logits, targets, row_max}, {kNoTensor, sums});
        op(OpCode::kAllReduce, "cross_entropy.sums", {sums}, {sums}, -1);
    }
    const TensorId losses = g_.add_tensor(
        {.name = "losses", .shape = {N_}, .dtype = DType::kF32, .role = Role::kOutput, .read_after_backward = true});
    Node& loss = op(OpCode::kLoss, "loss", {logits, targets, row_max, sums}, {losses}, -1);
    loss.vocab_start = vocab_start;
    loss.vocab_valid = valid;
}

GptGraph GptBuilder::build() {
    const GptShape& s = s_.shape;
    const GptPart& part = s_.part;
    const int64_t C = s.C;
    TensorId res;
    if (part.embedding) {
        const int64_t Vl = s.Vp / s_.tp_size;
        const TensorId tokens = stat("tokens", N_, DType::kI32);
        op(OpCode::kLoadTokens, "tokens", {}, {tokens}, -1).vocab_valid = s.V;
        const TensorId partial = act(sp_ ? "embedding" : "encoded", N_, C);
        Node& e =
            op(OpCode::kEmbedding, "embedding", {tokens, param("wte.weight"), param("wpe.weight")}, {partial}, -1);
        e.vocab_start = s_.tp_rank * Vl;
        e.T = s_.T;
        e.pos_on_this_rank = s_.tp_rank == 0;
        res = reduce_rows(partial, "encoded", -1);
    } else {
        res = act("input", Nl_, C, Role::kInput);
    }
    const TensorId input = res;
    graph::PassReport recompute{.pass = "recompute", .steps = {}};
    const int num_layers = part.num_layers < 0 ? s.L - part.first_layer : part.num_layers;
    const int end = part.first_layer + num_layers;
    for (int l = part.first_layer; l < end; ++l) res = layer(res, l, l == end - 1);
    if (part.head) {
        head(res);
    } else {
        g_.tensors[static_cast<size_t>(res)].role = Role::kOutput;
        const TensorId dout = act("dout", Nl_, C, Role::kGradInput);
        g_.grad_of[static_cast<size_t>(res)] = dout;
    }
    if (!part.head || s_.with_loss) {
        graph::derive_backward(g_);
        recompute = graph::recompute(g_, s_.options.recompute, part.first_layer);
        if (!part.embedding)
            g_.tensors[static_cast<size_t>(g_.grad_of[static_cast<size_t>(input)])].role = Role::kGradInput;
    }
    GptGraph out{.g = std::move(g_), .recompute = std::move(recompute), .fusion = {}};
    if (!s_.fuse) return out;
    graph::FuseOptions fo;
    const int64_t Vl = s.Vp / s_.tp_size;
    if (s_.options.lm_head_loss_fusion && s_.tp_size == 1 && part.head && s_.with_loss) {
        fo.lm_head_chunk_rows = lm_head_loss_chunk_rows(s_.options.backend, s_.act, N_, Vl);
        fo.lm_head_scratch_elems =
            lm_head_loss_scratch_elems(s_.options.backend, s_.act, N_, Vl, fo.lm_head_chunk_rows);
    }
    out.fusion = graph::fuse(out.g, fo);
    return out;
}

}  // namespace

GptGraph build_gpt_graph(const GptGraphSpec& spec, const std::vector<ParamInfo>& table) {
    MS_CHECK(spec.B >= 1 && spec.T >= 1, "gpt graph: batch {} x sequence {}", spec.B, spec.T);
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
                            .T = shape.seq(),
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

GptProgram::GptProgram(const GptShape& shape, Backend& backend, Communicator& tp, const Options& o)
    : shape_(shape), backend_(backend), tp_(tp), o_(o) {
    MS_CHECK(o.params != nullptr && o.grads != nullptr && o.weights != nullptr,
             "GptProgram: parameters, weights and gradients are external");
    table_ = gpt_param_table(shape, tp.size(), o.part);
    plan_ = plan_gpt_memory(shape, o.part, tp.size(), o.max_batch, o.sequence_parallel, o.dtype, o.graph);
    const int num_layers = plan_.num_layers;
    const std::string what = fmt::format("layers {}-{}", o.part.first_layer, o.part.first_layer + num_layers - 1);
    scratch_block_ = MemoryBlock(plan_.scratch_bytes(), o.arena, MemCategory::kWorkspace, what + " scratch");
    for (int i = 0; i < o.num_slots; ++i)
        slot_blocks_.emplace_back(plan_.slot_bytes(), o.arena, MemCategory::kActivation,
                                  fmt::format("{} slot {}", what, i));
    loss_sum_.assign(static_cast<size_t>(o.num_slots), 0.0);
    loss_scale_.assign(static_cast<size_t>(o.num_slots), 0.0f);
    // the graph of a full micro-batch: names the hand-off tensors, and the step-end tp gradient sums
    full_ = &compiled(o.max_batch, shape.seq(), true);
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
                      .sequence_parallel = o_.sequence_parallel,
                      .act = o_.dtype,
                      .B = B,
                      .T = T,
                      .with_loss = with_loss,
                      .options = o_.graph};
    entry->graph = build_gpt_graph(spec, table_);
    entry->plan = !with_loss && plan_.logits_only ? plan_.logits_only.get() : &plan_;
    for (int i = 0; i < o_.num_slots; ++i) {
        const graph::Bindings at{static_cast<std::byte*>(o_.weights), static_cast<std::byte*>(o_.grads),
                                 slot_blocks_[static_cast<size_t>(i)].as<std::byte>(), scratch_block_.as<std::byte>()};
        double* loss = &loss_sum_[static_cast<size_t>(i)];
        entry->forward.push_back(
            compile_program(entry->graph.g, graph::Phase::kForward, *entry->plan, at, backend_, tp_, loss));
        entry->backward.push_back(
            compile_program(entry->graph.g, graph::Phase::kBackward, *entry->plan, at, backend_, tp_, loss));
    }
    return *entry;
}

float GptProgram::forward(const int32_t* tokens, const int32_t* targets, int B, int T, int slot, float loss_scale) {
    const bool with_loss = o_.part.head && targets != nullptr;
    const Compiled& c = compiled(B, T, with_loss || !o_.part.head);
    B_ = B;
    T_ = T;
    last_ = &c;
    loss_scale_.at(static_cast<size_t>(slot)) = with_loss || !o_.part.head ? loss_scale : 0.0f;
    c.forward.at(static_cast<size_t>(slot)).run({tokens, targets, loss_scale, nullptr, params_needed_});
    if (!with_loss) return std::numeric_limits<float>::quiet_NaN();
    return static_cast<float>(loss_sum_[static_cast<size_t>(slot)] / (static_cast<double>(B) * T));
}

void GptProgram::backward(int slot, const graph::GradsFinalFn* on_grads_final) {
    const float loss_scale = loss_scale_.at(static_cast<size_t>(slot));
    MS_CHECK(last_ != nullptr && loss_scale != 0.0f,
             "backward() of slot {} without a forward() that prepared it (targets on the head, a loss scale)", slot);
    const Compiled& c = compiled(B_, T_, true);
    c.backward.at(static_cast<size_t>(slot)).run({nullptr, nullptr, loss_scale, on_grads_final, params_needed_});
}

std::vector<graph::GradRange> GptProgram::gradients_finished_per_step() const {
    std::vector<graph::GradRange> out;
    for (int i : full_->graph.g.tp_partial_grad_params) {
        const ParamInfo& p = table_[static_cast<size_t>(i)];
        out.push_back({p.offset, p.offset + p.numel});
    }
    return out;
}

void GptProgram::finish_gradients() {
    for (int i : full_->graph.g.tp_partial_grad_params) {
        const ParamInfo& p = table_[static_cast<size_t>(i)];
        const DType t = o_.graph.grads;
        tp_.all_reduce(static_cast<std::byte*>(o_.grads) + static_cast<size_t>(p.offset) * dtype_size(t),
                       static_cast<size_t>(p.numel), t, ReduceOp::kSum, Priority::kHigh)
            .wait();
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

void* GptProgram::input(int slot) { return tensor(o_.part.embedding ? "encoded" : "input", slot); }
const void* GptProgram::output(int slot) const { return address(output_, slot); }
void* GptProgram::grad_output(int slot) { return tensor("dout", slot); }
const void* GptProgram::grad_input(int slot) const {
    const graph::Graph& g = full_->graph.g;
    return address(g.grad_of[static_cast<size_t>(g.find("input"))], slot);
}
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
