// gpt.cpp: GPT-2's parameters (the table, the layout-invariant init, the 16-bit copy) and its forward and backward,
// which run the chunk's compiled op graph (engine/model/gpt_graph.h).
#include "engine/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <utility>

#include "engine/core/philox.h"
#include "engine/model/gpt_graph.h"
#include "engine/model/param_table.h"

namespace ms {
namespace {

int part_layers(const GptShape& s, const GptPart& part) {
    return part.num_layers < 0 ? s.L - part.first_layer : part.num_layers;
}

// Llama (Hugging Face's LlamaForCausalLM names; Megatron's tensor-parallel split): the fused projections are
// separate parameters packed back to back, so each is a plain row split and a tp rank's flat buffer holds
// [Q_r | K_r | V_r] and [gate_r | up_r] as the graph reads them.
std::vector<ParamInfo> llama_param_table(const GptShape& s, int tp, const GptPart& part, int num_layers) {
    const int64_t HS = s.C / s.NH, KV = s.kv_heads();
    MS_CHECK(KV % tp == 0, "tensor-parallel size {} must divide the key/value heads {}", tp, KV);
    TableWriter w(tp);
    const float proj = std::sqrt(2.0f * static_cast<float>(s.L));  // the residual projections' init divisor
    const int64_t C = s.C, F = s.F;
    using K = ShardKind;
    if (part.embedding || (part.head && !s.untied)) {
        ParamInfo& e = w.add("model.embed_tokens.weight", {s.Vp, C}, K::kRows, 1, 0);
        e.vocab_rows = true;
        e.pp_duplicate = !part.embedding;
    }
    for (int l = part.first_layer; l < part.first_layer + num_layers; ++l) {
        const std::string h = "model.layers." + std::to_string(l) + ".";
        w.add(h + "input_layernorm.weight", {C}, K::kReplicated, 0, 1);
        w.add(h + "self_attn.q_proj.weight", {s.NH * HS, C}, K::kRows, 1, 0);
        w.pack();
        w.add(h + "self_attn.k_proj.weight", {KV * HS, C}, K::kRows, 1, 0);
        w.pack();
        w.add(h + "self_attn.v_proj.weight", {KV * HS, C}, K::kRows, 1, 0);
        w.add(h + "self_attn.o_proj.weight", {C, s.NH * HS}, K::kCols, proj, 0);
        w.add(h + "post_attention_layernorm.weight", {C}, K::kReplicated, 0, 1);
        w.add(h + "mlp.gate_proj.weight", {F, C}, K::kRows, 1, 0);
        w.pack();
        w.add(h + "mlp.up_proj.weight", {F, C}, K::kRows, 1, 0);
        w.add(h + "mlp.down_proj.weight", {C, F}, K::kCols, proj, 0);
    }
    if (part.head) {
        w.add("model.norm.weight", {C}, K::kReplicated, 0, 1);
        if (s.untied) w.add("lm_head.weight", {s.Vp, C}, K::kRows, 1, 0).vocab_rows = true;
    }
    return w.take();
}

}  // namespace

std::vector<ParamInfo> gpt_param_table(const GptShape& s, int tp, const GptPart& part) {
    if (is_clip_tower(s.arch)) {
        MS_CHECK(part.first_layer == 0 && part.embedding, "a CLIP tower is one chunk: it has no pipeline parts");
        return clip_tower_param_table(s, tp);
    }
    if (s.arch == ModelArch::kPolicyValue) {
        MS_CHECK(part.first_layer == 0 && part.embedding,
                 "the policy-value network is one chunk: it has no pipeline parts");
        return policy_value_param_table(s, tp);
    }
    MS_CHECK(tp >= 1 && s.NH % tp == 0 && s.F % tp == 0 && s.Vp % tp == 0,
             "tensor-parallel size {} must divide heads {}, ffn {} and padded vocab {}", tp, s.NH, s.F, s.Vp);
    const int num_layers = part_layers(s, part);
    MS_CHECK(part.first_layer >= 0 && num_layers >= 0 && part.first_layer + num_layers <= s.L,
             "model part: layers [{}, {}) outside [0, {})", part.first_layer, part.first_layer + num_layers, s.L);
    if (s.arch == ModelArch::kLlama) return llama_param_table(s, tp, part, num_layers);
    TableWriter w(tp);
    const float proj = std::sqrt(2.0f * static_cast<float>(s.L));  // the residual projections' init divisor
    auto add = [&](std::string name, std::vector<int64_t> global, ShardKind shard, float divisor, float value) {
        w.add(std::move(name), std::move(global), shard, divisor, value);
    };
    const int64_t C = s.C, F = s.F;
    using K = ShardKind;
    if (part.embedding || (part.head && !s.untied)) {
        ParamInfo& wte = w.add("wte.weight", {s.Vp, C}, K::kRows, 1, 0);
        wte.pp_duplicate = !part.embedding;
        wte.vocab_rows = true;
    }
    if (part.embedding) add("wpe.weight", {s.T, C}, K::kReplicated, 1, 0);
    for (int l = part.first_layer; l < part.first_layer + num_layers; ++l) {
        const std::string h = "h." + std::to_string(l) + ".";
        add(h + "ln_1.weight", {C}, K::kReplicated, 0, 1);
        add(h + "ln_1.bias", {C}, K::kReplicated, 0, 0);
        add(h + "attn.c_attn.weight", {3 * C, C}, K::kQkvRows, 1, 0);
        add(h + "attn.c_attn.bias", {3 * C}, K::kQkvRows, 0, 0);
        add(h + "attn.c_proj.weight", {C, C}, K::kCols, proj, 0);
        add(h + "attn.c_proj.bias", {C}, K::kReplicated, 0, 0);
        add(h + "ln_2.weight", {C}, K::kReplicated, 0, 1);
        add(h + "ln_2.bias", {C}, K::kReplicated, 0, 0);
        add(h + "mlp.c_fc.weight", {F, C}, K::kRows, 1, 0);
        add(h + "mlp.c_fc.bias", {F}, K::kRows, 0, 0);
        add(h + "mlp.c_proj.weight", {C, F}, K::kCols, proj, 0);
        add(h + "mlp.c_proj.bias", {C}, K::kReplicated, 0, 0);
    }
    if (part.head) {
        add("ln_f.weight", {C}, K::kReplicated, 0, 1);
        add("ln_f.bias", {C}, K::kReplicated, 0, 0);
        if (s.untied) w.add("lm_head.weight", {s.Vp, C}, K::kRows, 1, 0).vocab_rows = true;
    }
    return w.take();
}

int64_t ParamInfo::global_index(int64_t i, int tp_rank, int tp_size) const {
    const int64_t cols = shape.size() >= 2 ? shape[1] : 1;  // local row length
    const int64_t row = i / cols, col = i % cols;
    switch (shard) {
        case ShardKind::kReplicated:
            return i;
        case ShardKind::kRows:
            return (tp_rank * shape[0] + row) * cols + col;
        case ShardKind::kCols:
            return row * global_shape[1] + tp_rank * cols + col;
        case ShardKind::kQkvRows: {
            // local rows [Q_r | K_r | V_r], each global_shape[0] / 3 / tp rows; global rows [Q | K | V]
            const int64_t block_rows = global_shape[0] / 3, local_block = block_rows / tp_size;
            const int64_t block = row / local_block, within = row % local_block;
            return (block * block_rows + tp_rank * local_block + within) * cols + col;
        }
    }
    return i;
}

std::string embedding_weight_name(const GptShape& s) {
    return s.arch == ModelArch::kLlama ? "model.embed_tokens.weight" : "wte.weight";
}

std::string output_weight_name(const GptShape& s) { return s.untied ? "lm_head.weight" : embedding_weight_name(s); }

int64_t gpt_num_params(const GptShape& s) {
    int64_t n = 0;
    for (const ParamInfo& p : gpt_param_table(s)) n += p.numel;
    return n;
}

int64_t pipeline_message_elems(const GptShape& s, int B, int T, int tp, bool sequence_parallel) {
    return static_cast<int64_t>(B) * T * s.C / (sequence_parallel ? tp : 1);
}

double gpt_train_flops_per_token(const GptShape& s, int seq_length) {
    if (s.arch == ModelArch::kLlama) {
        // Megatron's num_floating_point_operations with group-query attention and SwiGLU (gate and up: 3 GEMMs of
        // C x F), per token, forward + backward = 3x forward; the output layer is one C x Vp GEMM.
        const double L = s.L, C = s.C, T = seq_length, F = s.F, Vp = s.Vp;
        const double kv = static_cast<double>(s.kv_heads()) / s.NH;
        const double per_layer = 2.0 * (C * C * (1 + 2 * kv) + C * C + 3 * C * F) + 2.0 * 2.0 * T * C;
        return 3.0 * (L * per_layer + 2.0 * C * Vp);
    }
    // Megatron's num_floating_point_operations for a dense GPT (forward + backward = 3x forward), per token:
    // 72 L C^2 (1 + T/(6C) + Vp/(12 L C)) with ffn = 4C; written out for a general ffn size.
    const double L = s.L, C = s.C, T = seq_length, F = s.F, Vp = s.Vp;
    const double per_layer = 2.0 * (3 * C * C + C * C + 2 * C * F) + 2.0 * 2.0 * T * C;  // GEMMs + QK^T, PV
    return 3.0 * (L * per_layer + 2.0 * C * Vp);
}

Gpt::Gpt(const GptShape& shape, Backend& backend, Communicator& tp, const Options& o)
    : shape_(shape), backend_(backend), tp_(tp), part_(o.part), dtype_(o.dtype), grad_dtype_(o.graph.grads) {
    MS_CHECK(is_float(dtype_), "model dtype {} is not fp32, bf16 or fp16", dtype_name(dtype_));
    MS_CHECK(grad_dtype_ == DType::kF32 || grad_dtype_ == dtype_,
             "gradients in {} on a {} model: they are fp32 or the model's dtype", dtype_name(grad_dtype_),
             dtype_name(dtype_));
    MS_CHECK(shape.C % shape.NH == 0, "hidden {} not divisible by heads {}", shape.C, shape.NH);
    MS_CHECK(shape.Vp >= shape.V, "padded vocab {} < vocab {}", shape.Vp, shape.V);
    MS_CHECK(o.num_slots >= 1, "num_slots {} < 1", o.num_slots);
    table_ = gpt_param_table(shape_, tp.size(), part_);
    const int num_layers = part_layers(shape_, part_);
    sp_ = o.sequence_parallel && tp.size() > 1;
    const int64_t rows = static_cast<int64_t>(o.max_batch) * (shape.seq() / o.graph.context_parallel);
    MS_CHECK(!sp_ || rows % tp.size() == 0, "sequence parallelism: B*T = {} rows do not split over tp = {}", rows,
             tp.size());
    num_params_ = 0;
    for (const ParamInfo& p : table_) num_params_ += p.numel;
    // allocation names: "layers 0-5 slot 1", ...
    const std::string what = fmt::format("layers {}-{}", part_.first_layer, part_.first_layer + num_layers - 1);
    MS_CHECK((o.params == nullptr) == o.grads.empty(), "external params and grads: both or neither");
    const bool mixed = dtype_ != DType::kF32;
    if (o.params) {
        MS_CHECK(!mixed || o.weights != nullptr, "external params in {} need external weights too", dtype_name(dtype_));
        params_ptr_ = o.params;
        grad_placement_ = o.grads;
        grads_ptr_ = o.grads.segments().size() == 1 ? o.grads.at(0, flat_size()) : nullptr;  // one flat buffer
        weights_ptr_ = mixed ? o.weights : o.params;
    } else {
        const size_t elems = static_cast<size_t>(std::max(flat_size(), o.flat_capacity));
        params_ = MemoryBlock(elems * sizeof(float), o.arena, MemCategory::kParameter, what + " params");
        grads_ = MemoryBlock(elems * dtype_size(grad_dtype_), o.arena, MemCategory::kGradient, what + " grads");
        params_ptr_ = params_.as<float>();
        grads_ptr_ = grads_.data();
        grad_placement_ = graph::GradPlacement(grads_ptr_, grad_dtype_, static_cast<int64_t>(elems));
        if (mixed) {
            weights_ = MemoryBlock(elems * dtype_size(dtype_), o.arena, MemCategory::kParameter,
                                   fmt::format("{} weights {}", what, dtype_name(dtype_)));
            weights_ptr_ = weights_.as<std::byte>();
        } else {
            weights_ptr_ = params_ptr_;
        }
    }

    // the activations and the programs that run the chunk (engine/model/gpt_graph.h)
    GptProgram::Options po;
    po.max_batch = o.max_batch;
    po.num_slots = o.num_slots;
    po.part = part_;
    po.sequence_parallel = sp_;
    po.dtype = dtype_;
    po.graph = o.graph;
    po.params = params_ptr_;
    po.weights = weights_ptr_;
    po.grads = grad_placement_;
    po.arena = o.arena;
    po.cp = o.cp;
    program_ = std::make_unique<GptProgram>(shape_, backend_, tp_, po);
}

Gpt::~Gpt() = default;

const ParamInfo& Gpt::param(const std::string& name) const {
    for (const ParamInfo& p : table_)
        if (p.name == name) return p;
    MS_UNREACHABLE("no parameter named '{}'", name);
}

void init_params(const std::vector<ParamInfo>& table, float* params, uint64_t seed, float init_std, int tp_rank,
                 int tp_size, int64_t live_vocab_elems) {
    MS_CHECK(init_std > 0.0f && std::isfinite(init_std), "init std {} is not a positive number", init_std);
    for (const ParamInfo& p : table) {
        float* dst = params + p.offset;
        if (p.init == InitKind::kConstant) {
            for (int64_t i = 0; i < p.numel; ++i) dst[i] = p.init_value;
            continue;
        }
        const uint64_t stream = name_hash(p.name);
        // Rows past the real vocabulary are never looked up and their logits are masked: keep them 0.
        const int64_t live = p.vocab_rows ? live_vocab_elems : INT64_MAX;
        const float std_p = p.std_for(init_std);
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < p.numel; ++i) {
            const int64_t g = p.global_index(i, tp_rank, tp_size);
            dst[i] = g < live ? std_p * philox_normal(seed, stream, static_cast<uint64_t>(g)) : 0.0f;
        }
    }
}

void Gpt::init_weights(uint64_t seed, float init_std) {
    backend_.synchronize();  // the host writes the parameters
    init_params(table_, params(), seed, init_std, tp_.rank(), tp_.size(), static_cast<int64_t>(shape_.V) * shape_.C);
    refresh_weights();
}

void Gpt::refresh_weights() {
    if (dtype_ == DType::kF32) return;
    backend_.cast({Tensor::f32(params(), {flat_size()}), Tensor(weights_ptr_, dtype_, {flat_size()})});
}

void Gpt::zero_grads() { backend_.zero(Tensor(grads(), grad_dtype_, {flat_size()})); }

Tensor Gpt::logits_tensor() const { return program_->logits_tensor(); }
const float* Gpt::losses() const { return program_->losses(); }
void* Gpt::input(int slot) { return program_->input(slot); }
const void* Gpt::output(int slot) const { return program_->output(slot); }
int64_t Gpt::activation_elems(int B, int T) const { return pipeline_message_elems(shape_, B, T, tp_.size(), sp_); }
void* Gpt::grad_output(int slot) { return program_->grad_output(slot); }
const void* Gpt::grad_input(int slot) const { return program_->grad_input(slot); }

float Gpt::forward(const int32_t* tokens, const int32_t* targets, int B, int T, int slot, float loss_scale) {
    return program_->forward(tokens, targets, B, T, slot, loss_scale);
}
void Gpt::backward(int slot, const graph::GradsFinalFn* on_grads_final, const graph::GradsFinalFn* on_grads_writing) {
    program_->backward(slot, on_grads_final, on_grads_writing);
}
void Gpt::set_params_needed(const graph::ParamsNeededFn* on_params_needed) {
    program_->set_params_needed(on_params_needed);
}
void Gpt::finish_gradients(bool add_head_apart) { program_->finish_gradients(add_head_apart); }
Tensor Gpt::head_gradients_apart() const { return program_->head_gradients_apart(); }
std::vector<graph::GradRange> Gpt::gradients_finished_per_step() const {
    return program_->gradients_finished_per_step();
}

}  // namespace ms
