// clip_tower.cpp: CLIP's image and text towers (gpt.h's ModelArch::kClipVision / kClipText): their parameter tables
// under Hugging Face's CLIPModel names and their graph builder (on chunk_builder.h). The model that pairs the towers
// and trains them contrastively is engine/clip/clip_model.h.
//
// Image tower (a ViT), for B images of P = (image / patch)^2 patches, T = P + 1 rows each (the class token first):
//   patches (B*T, 3*patch^2)   the host's flattened patches (channel, row, column within the patch); each image's
//                              first row is zeros, where the class token goes
//   encoded = ln_pre(patches @ patch_embedding^T + class_position)
//   class_position: an embedding lookup whose "tokens" are 0 on the class row and 1 elsewhere, in a table of one row
//                   (class_embedding): row 1 lies outside the table and contributes 0, as a vocab-parallel lookup of
//                   a token another rank holds does; the position embedding is added to every row. So the class
//                   token, its gradient (the sum over the batch of the class rows') and the positions' are the
//                   embedding op's own, and the patch matmul's zero rows add nothing to the patch weights' gradient.
//   blocks: GPT-2's pre-LayerNorm block (layer_norm1, attention, out_proj, layer_norm2, fc1, GELU, fc2) with
//           bidirectional attention: the block ops' attention of a ring of one rank (ring_attention.h) without
//           the causal mask
//   features = post_layernorm(x[class rows]) @ visual_projection^T      (B, proj)
// Text tower, for B captions of T tokens:
//   encoded = token_embedding[tokens] + position_embedding;  causal blocks as GPT-2's
//   features = final_layer_norm(x[end-of-text rows]) @ text_projection^T  (B, proj)
// The pooled rows come from the host (kLoadRows): each image's class row, each caption's end-of-text token. The norm
// after pooling is the norm of the pooled rows (a row-wise norm, so pooling first computes the same values for B
// rows instead of B*T).
//
// The features are the chunk's output (role kOutput), and their gradient "dout" (kGradInput) is what the contrastive
// loss hands back: the towers' backward starts there, as a pipeline stage's does from the next stage's gradient.
//
// Tensor parallelism: inside the blocks as GPT-2's (gpt.h): q/k/v and fc1 column-parallel (q, k and v packed
// back to back per rank as Llama's are, weights and biases), out_proj and fc2 row-parallel with replicated biases
// added after the reduction. The embeddings, norms and projections are replicated: every tensor-parallel rank
// computes them whole (they are small), so the features are identical on every rank. Sequence parallelism is not
// offered (the pooled rows would need a gather of their own).
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "engine/core/check.h"
#include "engine/model/chunk_builder.h"
#include "engine/model/param_table.h"

namespace ms {
namespace {

using graph::kNoTensor;
using graph::Node;
using graph::OpCode;
using graph::Role;
using graph::TensorId;

bool vision(const GptShape& s) { return s.arch == ModelArch::kClipVision; }
std::string tower_prefix(const GptShape& s) { return vision(s) ? "vision_model." : "text_model."; }
std::string layer_prefix(const GptShape& s, int l) { return fmt::format("{}encoder.layers.{}.", tower_prefix(s), l); }
std::string final_norm_name(const GptShape& s) {
    return tower_prefix(s) + (vision(s) ? "post_layernorm" : "final_layer_norm");
}
std::string projection_name(const GptShape& s) {
    return vision(s) ? "visual_projection.weight" : "text_projection.weight";
}
int64_t patch_width(const GptShape& s) { return 3 * int64_t{s.patch} * s.patch; }

class ClipTowerBuilder : public ChunkBuilder {
  public:
    using ChunkBuilder::ChunkBuilder;
    GptGraph build_tower();

  private:
    void embedding(TensorId, TensorId) override {}  // build_tower() writes each tower's own
    TensorId layer(TensorId res, int l, bool last) override;
    std::string final_norm() const override { return final_norm_name(s_.shape); }

    TensorId layer_norm(TensorId x, int64_t rows, const std::string& name, const std::string& param_prefix);
};

TensorId ClipTowerBuilder::layer_norm(TensorId x, int64_t rows, const std::string& name,
                                      const std::string& param_prefix) {
    const TensorId y = act(name, rows, s_.shape.C);
    const TensorId mean = stat(name + "_mean", rows), rstd = stat(name + "_rstd", rows);
    op(OpCode::kLayerNorm, name, {x, param(param_prefix + ".weight"), param(param_prefix + ".bias")}, {y, mean, rstd},
       layer_)
        .eps = s_.shape.eps;
    return y;
}

// Layer l's ops, tensors "h.<l>.<what>" as GPT-2's (the memory plan groups layers by them).
TensorId ClipTowerBuilder::layer(TensorId res, int l, bool) {
    layer_ = l;
    const GptShape& s = s_.shape;
    const int64_t tp = s_.tp_size, C = s.C, NH_local = s.NH / tp, C_local = NH_local * (s.C / s.NH);
    const std::string h = fmt::format("h.{}.", l), p = layer_prefix(s, l);
    // attention: res2 = res + out_proj(attention(qkv_proj(layer_norm1(res)))) + bias
    const TensorId x = norm_to_columns(res, h + "ln_1", p + "layer_norm1", l);
    const std::string a = p + "self_attn.";
    const TensorId qkv_w =
        packed_params(a + "qkv_proj.weight", {a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"});
    const TensorId qkv_b =
        packed_params(a + "qkv_proj.bias", {a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"});
    const TensorId qkv = act(h + "qkv", N_, 3 * C_local);
    op(OpCode::kMatmul, h + "self_attn.qkv_proj", {x, qkv_w, qkv_b}, {qkv}, l);
    const TensorId atty = act(h + "atty", N_, C_local);
    const TensorId lse = stat(h + "lse", static_cast<int64_t>(s_.B) * NH_local * s_.T);
    Node* attn = nullptr;
    if (vision(s)) {
        const int64_t scratch = graph::ring_forward_scratch_elems(
            {.B = s_.B, .T = s_.T, .NH = NH_local, .NKV = NH_local, .HS = s.C / s.NH, .act = s_.act, .causal = false});
        attn = &op(OpCode::kRingAttention, h + "attn", {qkv}, {atty, lse, stat(h + "attn_scratch", scratch)}, l);
        attn->causal = false;
    } else {
        attn = &op(OpCode::kAttention, h + "attn", {qkv}, {atty, lse}, l);
    }
    attn->B = s_.B;
    attn->T = s_.T;
    attn->NH = NH_local;
    const TensorId attn_partial = act(h + "self_attn.out_proj", N_, C);
    op(OpCode::kMatmul, h + "self_attn.out_proj", {atty, param(a + "out_proj.weight"), kNoTensor}, {attn_partial}, l);
    const TensorId attn_out = reduce_rows(attn_partial, h + "attn.out", l);
    const TensorId res2 = act(h + "res2", N_, C);
    op(OpCode::kResidual, h + "attn.residual", {res, attn_out, param(a + "out_proj.bias")}, {res2}, l);
    // MLP: res3 = res2 + fc2(gelu(fc1(layer_norm2(res2)))) + bias
    const TensorId res3 = gelu_mlp(res2, l, p, "layer_norm2", "mlp.fc1", "mlp.fc2");
    layer_ = -1;
    return res3;
}

GptGraph ClipTowerBuilder::build_tower() {
    const GptShape& s = s_.shape;
    const int64_t C = s.C, B = s_.B;
    const std::string e = tower_prefix(s) + "embeddings.";
    const TensorId tokens = stat("tokens", N_, DType::kI32);
    op(OpCode::kLoadTokens, "tokens", {}, {tokens}, -1).vocab_valid = s.V;
    TensorId res;
    if (vision(s)) {
        const TensorId patches = g_.add_tensor(
            {.name = "patches", .shape = {N_, patch_width(s)}, .dtype = s_.act, .role = Role::kInput, .no_grad = true});
        const TensorId patch_embeds = act("patch_embeds", N_, C);
        op(OpCode::kMatmul, "embeddings.patch_embedding", {patches, param(e + "patch_embedding.weight"), kNoTensor},
           {patch_embeds}, -1);
        const TensorId class_position = act("class_position", N_, C);
        Node& cp =
            op(OpCode::kEmbedding, "embeddings.class_position",
               {tokens, param(e + "class_embedding"), param(e + "position_embedding.weight")}, {class_position}, -1);
        cp.T = s_.T;
        const TensorId embeddings = act("embeddings", N_, C);
        op(OpCode::kResidual, "embeddings", {patch_embeds, class_position, kNoTensor}, {embeddings}, -1);
        res = layer_norm(embeddings, N_, "encoded", tower_prefix(s) + "pre_layrnorm");
    } else {
        res = act("encoded", N_, C);
        Node& te = op(OpCode::kEmbedding, "embeddings",
                      {tokens, param(e + "token_embedding.weight"), param(e + "position_embedding.weight")}, {res}, -1);
        te.T = s_.T;
    }
    // every layer, or the memory plan's representative first ones (plan_gpt_memory)
    const int num_layers = s_.part.num_layers < 0 ? s.L : s_.part.num_layers;
    for (int l = 0; l < num_layers; ++l) res = layer(res, l, l == num_layers - 1);
    const TensorId rows = stat("pool_rows", B, DType::kI32);
    op(OpCode::kLoadRows, "pool_rows", {}, {rows}, -1).vocab_valid = N_;
    const TensorId pooled = act("pooled", B, C);
    op(OpCode::kGatherRows, "pool", {res, rows}, {pooled}, -1);
    const TensorId normed = layer_norm(pooled, B, "pooled_norm", final_norm());
    const TensorId features = act("features", B, s.proj, Role::kOutput);
    op(OpCode::kMatmul, "projection", {normed, param(projection_name(s)), kNoTensor}, {features}, -1);
    g_.grad_of[static_cast<size_t>(features)] = act("dout", B, s.proj, Role::kGradInput);
    graph::derive_backward(g_);
    GptGraph out{.g = std::move(g_), .recompute = {}, .fusion = {}};
    out.recompute = graph::recompute(out.g, s_.options.recompute, 0);
    if (s_.fuse) out.fusion = graph::fuse(out.g, {});
    return out;
}

}  // namespace

std::vector<ParamInfo> clip_tower_param_table(const GptShape& s, int tp) {
    MS_CHECK(is_clip_tower(s.arch), "clip_tower_param_table: not a CLIP tower");
    MS_CHECK(tp >= 1 && s.NH % tp == 0 && s.F % tp == 0,
             "tensor-parallel size {} must divide the {} tower's heads {} and ffn {}", tp, vision(s) ? "image" : "text",
             s.NH, s.F);
    TableWriter w(tp);
    const float proj = std::sqrt(2.0f * static_cast<float>(s.L));  // the residual projections' init divisor
    const int64_t C = s.C, F = s.F;
    using K = ShardKind;
    const std::string e = tower_prefix(s) + "embeddings.";
    if (vision(s)) {
        w.add(e + "class_embedding", {1, C}, K::kReplicated, 1, 0).weight_decay = false;
        w.add(e + "patch_embedding.weight", {C, patch_width(s)}, K::kReplicated, 1, 0);
        w.add(e + "position_embedding.weight", {s.T, C}, K::kReplicated, 1, 0);
        w.add(tower_prefix(s) + "pre_layrnorm.weight", {C}, K::kReplicated, 0, 1);
        w.add(tower_prefix(s) + "pre_layrnorm.bias", {C}, K::kReplicated, 0, 0);
    } else {
        w.add(e + "token_embedding.weight", {s.V, C}, K::kReplicated, 1, 0);
        w.add(e + "position_embedding.weight", {s.T, C}, K::kReplicated, 1, 0);
    }
    for (int l = 0; l < s.L; ++l) {
        const std::string p = layer_prefix(s, l), a = p + "self_attn.";
        w.add(p + "layer_norm1.weight", {C}, K::kReplicated, 0, 1);
        w.add(p + "layer_norm1.bias", {C}, K::kReplicated, 0, 0);
        for (const char* m : {"q_proj", "k_proj", "v_proj"}) {
            w.add(a + m + ".weight", {C, C}, K::kRows, 1, 0);
            if (std::string(m) != "v_proj") w.pack();
        }
        for (const char* m : {"q_proj", "k_proj", "v_proj"}) {
            w.add(a + m + ".bias", {C}, K::kRows, 0, 0);
            if (std::string(m) != "v_proj") w.pack();
        }
        w.add(a + "out_proj.weight", {C, C}, K::kCols, proj, 0);
        w.add(a + "out_proj.bias", {C}, K::kReplicated, 0, 0);
        w.add(p + "layer_norm2.weight", {C}, K::kReplicated, 0, 1);
        w.add(p + "layer_norm2.bias", {C}, K::kReplicated, 0, 0);
        w.add(p + "mlp.fc1.weight", {F, C}, K::kRows, 1, 0);
        w.add(p + "mlp.fc1.bias", {F}, K::kRows, 0, 0);
        w.add(p + "mlp.fc2.weight", {C, F}, K::kCols, proj, 0);
        w.add(p + "mlp.fc2.bias", {C}, K::kReplicated, 0, 0);
    }
    w.add(final_norm_name(s) + ".weight", {C}, K::kReplicated, 0, 1);
    w.add(final_norm_name(s) + ".bias", {C}, K::kReplicated, 0, 0);
    w.add(projection_name(s), {s.proj, C}, K::kReplicated, 1, 0);
    return w.take();
}

GptGraph build_clip_tower_graph(const GptGraphSpec& spec, const std::vector<ParamInfo>& table) {
    const GptShape& s = spec.shape;
    MS_CHECK(spec.B >= 1 && spec.T == s.T, "clip tower graph: batch {} x rows {} (the tower's rows are {})", spec.B,
             spec.T, s.T);
    MS_CHECK(!spec.sequence_parallel || spec.tp_size == 1,
             "a CLIP tower has no sequence parallelism: its pooled rows would need a gather of their own");
    MS_CHECK(spec.options.context_parallel == 1, "a CLIP tower has no context parallelism");
    MS_CHECK(spec.part.first_layer == 0 && spec.part.embedding, "a CLIP tower is one chunk: it has no pipeline parts");
    return ClipTowerBuilder(spec, table).build_tower();
}

}  // namespace ms
