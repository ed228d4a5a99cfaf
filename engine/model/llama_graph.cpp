// llama_graph.cpp: Llama's graph builder (gpt_graph.h's build_llama_graph, on chunk_builder.h): the token embedding
// without positions, and the block
//   res2 = res + o_proj(attention(rope(qkv_proj(rmsnorm(res)))))
//   res3 = res2 + down_proj(swiglu(gate_up_proj(rmsnorm(res2))))
// with no biases. Tensor parallelism as GPT's (gpt.h): qkv_proj (q_proj, k_proj and v_proj packed) and gate_up_proj
// (gate_proj and up_proj packed) column-parallel, a rank holding NH/tp query heads, kv_heads/tp key/value heads and
// F/tp columns of gate and of up ([Q_r | K_r | V_r] and [gate_r | up_r] rows); o_proj and down_proj row-parallel;
// the embedding and the untied output layer vocab-parallel. RoPE rotates Q and K in place in the qkv tensor (its
// table of cos and sin is a constant the host writes once per forward); the backward rotates dqkv back in place.
// Under context parallelism (GptGraphOptions::context_parallel) the chunk holds this rank's rows of each sequence
// (context_split.h): the rotary table has their positions, and attention is the ring (ring_attention.h).
#include <fmt/format.h>

#include <memory>
#include <mutex>
#include <string>

#include "engine/backends/rope_table.h"
#include "engine/core/check.h"
#include "engine/model/chunk_builder.h"
#include "engine/parallel/context_split.h"

namespace ms {
namespace {

using graph::kNoTensor;
using graph::Node;
using graph::OpCode;
using graph::TensorId;

// rope_table(), computed once for a run of graphs of the same sequence, head size and RoPE: the layout search
// (engine/sim/search.h) builds thousands of chunks of one model, and the table's sines and cosines in double were
// most of its time. One table is kept, the last asked for (a process plans one model at a time).
std::shared_ptr<const std::vector<float>> shared_rope_table(int64_t positions, int64_t HS, double theta,
                                                            const RopeScaling& scaling) {
    struct Kept {
        int64_t positions = -1, HS = -1;
        double theta = 0;
        RopeScaling scaling;
        std::shared_ptr<const std::vector<float>> table;
    };
    static std::mutex mutex;
    static Kept kept;
    const std::lock_guard<std::mutex> lock(mutex);
    const RopeScaling& k = kept.scaling;
    const bool same = kept.positions == positions && kept.HS == HS && kept.theta == theta &&
                      k.factor == scaling.factor && k.low_freq_factor == scaling.low_freq_factor &&
                      k.high_freq_factor == scaling.high_freq_factor &&
                      k.original_max_position_embeddings == scaling.original_max_position_embeddings;
    if (!same) {
        kept = {positions, HS, theta, scaling,
                std::make_shared<const std::vector<float>>(rope_table(positions, HS, theta, scaling))};
    }
    return kept.table;
}

class LlamaBuilder : public ChunkBuilder {
  public:
    using ChunkBuilder::ChunkBuilder;

  private:
    void embedding(TensorId tokens, TensorId out) override;
    void before_layers() override;
    TensorId layer(TensorId res, int l, bool last) override;
    std::string final_norm() const override { return "model.norm"; }

    TensorId rope_table_ = kNoTensor;  // (T, HS) fp32
};

void LlamaBuilder::embedding(TensorId tokens, TensorId out) {
    Node& e = op(OpCode::kEmbedding, "embedding", {tokens, param("model.embed_tokens.weight"), kNoTensor}, {out}, -1);
    e.vocab_start = s_.tp_rank * (s_.shape.Vp / s_.tp_size);
    e.T = s_.T;
    e.pos_on_this_rank = false;
}

void LlamaBuilder::before_layers() {
    const GptShape& s = s_.shape;
    const int64_t HS = s.C / s.NH;
    rope_table_ = g_.add_tensor({.name = "rope_table", .shape = {s_.T, HS}, .dtype = DType::kF32});
    const ContextSplit split{s_.options.context_parallel, s_.cp_rank};
    const int64_t S = int64_t{s_.T} * split.cp;  // the whole sequence's rows
    std::vector<float>& local = op(OpCode::kLoadConstant, "rope_table", {}, {rope_table_}, -1).constant;
    const std::shared_ptr<const std::vector<float>> whole = shared_rope_table(S, HS, s.rope_theta, s.rope_scaling);
    if (split.cp > 1) {  // this rank's positions
        local.assign(static_cast<size_t>(s_.T * HS), 0.0f);
        split.rows(whole->data(), local.data(), 1, S, HS);
    } else {
        local = *whole;
    }
}

// Layer l's ops; its tensors are "h.<l>.<what>" (the names the memory plan groups layers by), its parameters
// "model.layers.<l>.<what>".
TensorId LlamaBuilder::layer(TensorId res, int l, bool last) {
    layer_ = l;
    const GptShape& s = s_.shape;
    const int64_t tp = s_.tp_size, C = s.C, HS = s.C / s.NH;
    const int64_t NH_local = s.NH / tp, KV_local = s.kv_heads() / tp, F = s.F / tp;
    const std::string h = fmt::format("h.{}.", l), p = fmt::format("model.layers.{}.", l);
    // attention
    TensorId x = norm_to_columns(res, h + "ln_1", p + "input_layernorm", l);
    const TensorId qkv_w =
        packed_params(p + "self_attn.qkv_proj.weight",
                      {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"});
    const TensorId qkv = act(h + "qkv", N_, (NH_local + 2 * KV_local) * HS);
    op(OpCode::kMatmul, h + "self_attn.qkv_proj", {x, qkv_w, kNoTensor}, {qkv}, l);
    Node& rope = op(OpCode::kRope, h + "rope", {qkv, rope_table_}, {qkv}, l);
    rope.T = s_.T;
    rope.NH = NH_local;
    rope.NKV = KV_local;
    const TensorId atty = act(h + "atty", N_, NH_local * HS);
    const TensorId lse = stat(h + "lse", static_cast<int64_t>(s_.B) * NH_local * s_.T);
    const bool ring = s_.options.context_parallel > 1;
    std::vector<TensorId> outs = {atty, lse};
    if (ring) {
        const int64_t scratch = graph::ring_forward_scratch_elems(
            {.B = s_.B, .T = s_.T, .NH = NH_local, .NKV = KV_local, .HS = HS, .act = s_.act});
        outs.push_back(stat(h + "ring", scratch));
    }
    Node& attn = op(ring ? OpCode::kRingAttention : OpCode::kAttention, h + "attn", {qkv}, outs, l);
    attn.B = s_.B;
    attn.T = s_.T;
    attn.NH = NH_local;
    attn.NKV = KV_local;
    const TensorId attn_partial = act(h + "self_attn.o_proj", N_, C);
    op(OpCode::kMatmul, h + "self_attn.o_proj", {atty, param(p + "self_attn.o_proj.weight"), kNoTensor}, {attn_partial},
       l);
    const TensorId attn_out = reduce_rows(attn_partial, h + "attn.out", l);
    const TensorId res2 = act(h + "res2", Nl_, C);
    op(OpCode::kResidual, h + "attn.residual", {res, attn_out, kNoTensor}, {res2}, l).tp_rows = sp_;
    // MLP
    x = norm_to_columns(res2, h + "ln_2", p + "post_attention_layernorm", l);
    const TensorId gate_up_w =
        packed_params(p + "mlp.gate_up_proj.weight", {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"});
    const TensorId gate_up = act(h + "gate_up", N_, 2 * F);
    op(OpCode::kMatmul, h + "mlp.gate_up_proj", {x, gate_up_w, kNoTensor}, {gate_up}, l);
    const TensorId swiglu = act(h + "swiglu", N_, F);
    op(OpCode::kSwiGlu, h + "mlp.swiglu", {gate_up}, {swiglu}, l);
    const TensorId mlp_partial = act(h + "mlp.down_proj", N_, C);
    op(OpCode::kMatmul, h + "mlp.down_proj", {swiglu, param(p + "mlp.down_proj.weight"), kNoTensor}, {mlp_partial}, l);
    const TensorId mlp_out = reduce_rows(mlp_partial, h + "mlp.out", l);
    const TensorId res3 = act(h + "res3", Nl_, C);
    if (last) g_.tensors[static_cast<size_t>(res3)].grad_name = "d.output";
    op(OpCode::kResidual, h + "mlp.residual", {res2, mlp_out, kNoTensor}, {res3}, l).tp_rows = sp_;
    layer_ = -1;
    return res3;
}

}  // namespace

GptGraph build_llama_graph(const GptGraphSpec& spec, const std::vector<ParamInfo>& table) {
    MS_CHECK(spec.B >= 1 && spec.T >= 1, "llama graph: batch {} x sequence {}", spec.B, spec.T);
    return LlamaBuilder(spec, table).build();
}

}  // namespace ms
