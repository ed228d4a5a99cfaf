// clip_tower.cpp: CLIP's image and text towers (gpt.h's ModelArch::kClipVision / kClipText) and its optional
// cross-modal layers (kClipFusion): their parameter tables (the towers' under Hugging Face's CLIPModel names) and
// their graph builder (on chunk_builder.h). The model that pairs the towers and trains them contrastively is
// engine/clip/clip_model.h.
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
// With GptShape::states (cross-modal layers on) the final norm runs on every row instead, "states" (B*T, C), a second
// output whose gradient "d.states" the host writes (the cross-modal layers' input gradients, clip_model.h); the
// pooled rows are gathered from it, so the features are the same, and the pooling's backward adds into d.states.
//
// Cross-modal layers, for B image-caption pairs (ALBEF's fusion encoder, pre-LN as the towers): the input "text"
// (B*T, C) is the text tower's states of each pair's caption and "image" (B*S, cross_C) the image tower's states of
// its image (S = its rows). Each layer is the text tower's causal self-attention block, then a cross-attention block
// (layer_norm_cross, q_proj of the text rows, k_proj / v_proj of the image rows, cross_attention.h: every text row
// sees every image row of its pair, out_proj), then the MLP block. The caption's end-of-text row, through
// final_layer_norm, goes to itm_head (2, C) + bias: the matching logits, the chunk's output "logits", with gradient
// "dout". Parameter names "fusion.layers.<l>.<as the towers'>", "fusion.final_layer_norm", "itm_head.*": ours, as
// CLIPModel has none.
//
// Tensor parallelism: inside the blocks as GPT-2's (gpt.h): q/k/v and fc1 column-parallel (q, k and v packed
// back to back per rank as Llama's are, weights and biases), out_proj and fc2 row-parallel with replicated biases
// added after the reduction (the cross-attention's q/k/v and out_proj likewise; the image rows reach its k/v
// through a tensor-parallel copy). The embeddings, norms and projections are replicated: every tensor-parallel rank
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
bool fusion(const GptShape& s) { return s.arch == ModelArch::kClipFusion; }
std::string tower_prefix(const GptShape& s) {
    return vision(s) ? "vision_model." : fusion(s) ? "fusion." : "text_model.";
}
std::string layer_prefix(const GptShape& s, int l) {
    return fmt::format("{}{}layers.{}.", tower_prefix(s), fusion(s) ? "" : "encoder.", l);
}
std::string final_norm_name(const GptShape& s) {
    return tower_prefix(s) + (vision(s) ? "post_layernorm" : "final_layer_norm");
}
std::string projection_name(const GptShape& s) {
    return vision(s) ? "visual_projection.weight" : fusion(s) ? "itm_head.weight" : "text_projection.weight";
}
int64_t patch_width(const GptShape& s) { return 3 * int64_t{s.patch} * s.patch; }
// The image rows of one image: its patches and the class token.
int64_t image_rows(const GptShape& s) { return int64_t{s.image / s.patch} * (s.image / s.patch) + 1; }

class ClipTowerBuilder : public ChunkBuilder {
  public:
    using ChunkBuilder::ChunkBuilder;
    GptGraph build_tower();
    GptGraph build_fusion();

  private:
    void embedding(TensorId, TensorId) override {}  // build_tower() writes each tower's own
    TensorId layer(TensorId res, int l, bool last) override;
    std::string final_norm() const override { return final_norm_name(s_.shape); }

    // The chunk's end: the rows at `pool_rows` (one per sequence) of the normed stream, projected to shape.proj
    // columns ("features", or the matching head's "logits"), whose gradient "dout" the host writes.
    void pool_and_project(TensorId res, TensorId bias);
    GptGraph finish();

    TensorId image_ = kNoTensor;  // kClipFusion: the image rows the cross-attention reads (all tp ranks' whole)
};

// Layer l's ops, tensors "h.<l>.<what>" as GPT-2's (the memory plan groups layers by them).
TensorId ClipTowerBuilder::layer(TensorId res, int l, bool last) {
    layer_ = l;
    const GptShape& s = s_.shape;
    const int64_t tp = s_.tp_size, C = s.C, NH_local = s.NH / tp, C_local = NH_local * (s.C / s.NH);
    const std::string h = fmt::format("h.{}.", l), p = layer_prefix(s, l);
    TensorId res2 = encoder_attention(res, l, p, !vision(s));
    if (fusion(s)) {
        // cross-attention: res2 += out_proj(attention(q_proj(layer_norm_cross(res2)), kv_proj(image))) + bias, the
        // text rows of a pair seeing every image row of that pair; q and [K | V] column-parallel per head
        const std::string c = p + "cross_attn.";
        const TensorId xc = norm_to_columns(res2, h + "ln_cross", p + "layer_norm_cross", l);
        const TensorId q = act(h + "cross_q", N_, C_local);
        op(OpCode::kMatmul, h + "cross_attn.q_proj", {xc, param(c + "q_proj.weight"), param(c + "q_proj.bias")}, {q},
           l);
        const int64_t S = image_rows(s), M = S * s_.B;
        const TensorId kv = act(h + "cross_kv", M, 2 * C_local);
        op(OpCode::kMatmul, h + "cross_attn.kv_proj",
           {image_, packed_params(c + "kv_proj.weight", {c + "k_proj.weight", c + "v_proj.weight"}),
            packed_params(c + "kv_proj.bias", {c + "k_proj.bias", c + "v_proj.bias"})},
           {kv}, l);
        const TensorId cross = act(h + "cross_atty", N_, C_local);
        const graph::CrossAttentionShape cs{
            .B = s_.B, .T = s_.T, .S = S, .NH = NH_local, .HS = s.C / s.NH, .act = s_.act};
        Node& ca = op(OpCode::kCrossAttention, h + "cross_attn", {q, kv},
                      {cross, stat(h + "cross_lse", s_.B * NH_local * s_.T),
                       stat(h + "cross_scratch", graph::cross_forward_scratch_elems(cs))},
                      l);
        ca.B = s_.B;
        ca.T = s_.T;
        ca.S = S;
        ca.NH = NH_local;
        const TensorId cross_partial = act(h + "cross_attn.out_proj", N_, C);
        op(OpCode::kMatmul, h + "cross_attn.out_proj", {cross, param(c + "out_proj.weight"), kNoTensor},
           {cross_partial}, l);
        const TensorId cross_out = reduce_rows(cross_partial, h + "cross.out", l);
        const TensorId res_cross = act(h + "res_cross", N_, C);
        op(OpCode::kResidual, h + "cross.residual", {res2, cross_out, param(c + "out_proj.bias")}, {res_cross}, l);
        res2 = res_cross;
    }
    // MLP: res3 = res2 + fc2(gelu(fc1(layer_norm2(res2)))) + bias
    const TensorId res3 = gelu_mlp(res2, l, p, "layer_norm2", "mlp.fc1", "mlp.fc2");
    // the memory plan's representative graph (its first two layers) names the last layer's output gradient so
    if (last) g_.tensors[static_cast<size_t>(res3)].grad_name = "d.output";
    layer_ = -1;
    return res3;
}

void ClipTowerBuilder::pool_and_project(TensorId res, TensorId bias) {
    const GptShape& s = s_.shape;
    const int64_t B = s_.B;
    const TensorId rows = stat("pool_rows", B, DType::kI32);
    op(OpCode::kLoadRows, "pool_rows", {}, {rows}, -1).vocab_valid = N_;
    const TensorId pooled = act("pooled", B, s.C);
    TensorId normed = kNoTensor;
    if (s.states) {  // every row normed, an output of its own; the pooled rows are among them
        const TensorId states = layer_norm(res, N_, "states", final_norm());
        g_.tensors[static_cast<size_t>(states)].role = Role::kOutput;
        g_.grad_of[static_cast<size_t>(states)] = act("d.states", N_, s.C, Role::kGradInput);
        op(OpCode::kGatherRows, "pool", {states, rows}, {pooled}, -1);
        normed = pooled;
    } else {  // the norm of the pooled rows alone: a row-wise norm, so the same values for B rows instead of B*T
        op(OpCode::kGatherRows, "pool", {res, rows}, {pooled}, -1);
        normed = layer_norm(pooled, B, "pooled_norm", final_norm());
    }
    const TensorId out = act(fusion(s) ? "logits" : "features", B, s.proj, Role::kOutput);
    op(OpCode::kMatmul, "projection", {normed, param(projection_name(s)), bias}, {out}, -1);
    g_.grad_of[static_cast<size_t>(out)] = act("dout", B, s.proj, Role::kGradInput);
}

GptGraph ClipTowerBuilder::finish() {
    graph::derive_backward(g_);
    GptGraph out{.g = std::move(g_), .recompute = {}, .fusion = {}};
    out.recompute = graph::recompute(out.g, s_.options.recompute, 0);
    if (s_.fuse) out.fusion = graph::fuse(out.g, {});
    return out;
}

// every layer, or the memory plan's representative first ones (plan_gpt_memory)
int num_layers(const GptGraphSpec& spec) { return spec.part.num_layers < 0 ? spec.shape.L : spec.part.num_layers; }

GptGraph ClipTowerBuilder::build_tower() {
    const GptShape& s = s_.shape;
    const int64_t C = s.C;
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
    for (int l = 0; l < num_layers(s_); ++l) res = layer(res, l, l == num_layers(s_) - 1);
    pool_and_project(res, kNoTensor);
    return finish();
}

// The cross-modal layers of B pairs: "text" (B*T, C), the text tower's states of each pair's caption, and "image"
// (B*S, cross_C), the image tower's states of its image, both inputs whose gradients ("d.text", "d.image") the host
// reads after the backward; the output is the matching head's two logits per pair, read at the caption's
// end-of-text row.
GptGraph ClipTowerBuilder::build_fusion() {
    const GptShape& s = s_.shape;
    TensorId res = act("text", N_, s.C, Role::kInput);
    const TensorId text = res;
    image_ = g_.add_tensor(
        {.name = "image", .shape = {image_rows(s) * s_.B, s.cross_C}, .dtype = s_.act, .role = Role::kInput});
    const TensorId image = image_;
    if (s_.tp_size > 1) op(OpCode::kTpCopy, "image", {image_}, {image_}, -1);  // column-parallel keys and values
    for (int l = 0; l < num_layers(s_); ++l) res = layer(res, l, l == num_layers(s_) - 1);
    pool_and_project(res, param("itm_head.bias"));
    GptGraph out = finish();
    for (TensorId input : {text, image}) {
        graph::TensorInfo& d = out.g.tensors[static_cast<size_t>(out.g.grad_of[static_cast<size_t>(input)])];
        d.role = Role::kGradInput;
        if (input == image) d.layer = -1;  // every layer adds into it: the chunk's own
    }
    return out;
}

}  // namespace

std::vector<ParamInfo> clip_tower_param_table(const GptShape& s, int tp) {
    MS_CHECK(is_clip_tower(s.arch), "clip_tower_param_table: not a CLIP tower");
    MS_CHECK(tp >= 1 && s.NH % tp == 0 && s.F % tp == 0,
             "tensor-parallel size {} must divide the {} tower's heads {} and ffn {}", tp,
             vision(s)   ? "image"
             : fusion(s) ? "cross-modal"
                         : "text",
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
        add_layer_norm_params(w, tower_prefix(s) + "pre_layrnorm", C);
    } else if (!fusion(s)) {
        w.add(e + "token_embedding.weight", {s.V, C}, K::kReplicated, 1, 0);
        w.add(e + "position_embedding.weight", {s.T, C}, K::kReplicated, 1, 0);
    }
    for (int l = 0; l < s.L; ++l) {
        const std::string p = layer_prefix(s, l);
        add_encoder_attention_params(w, p, C, proj);
        if (fusion(s)) {
            add_layer_norm_params(w, p + "layer_norm_cross", C);
            add_attention_input_params(w, p + "cross_attn.", {"q_proj"}, C, C);
            add_attention_input_params(w, p + "cross_attn.", {"k_proj", "v_proj"}, C, s.cross_C);
            add_out_proj_params(w, p + "cross_attn.", C, proj);
        }
        add_encoder_mlp_params(w, p, C, F, proj);
    }
    add_layer_norm_params(w, final_norm_name(s), C);
    w.add(projection_name(s), {s.proj, C}, K::kReplicated, 1, 0);
    if (fusion(s)) w.add("itm_head.bias", {s.proj}, K::kReplicated, 0, 0);
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
    ClipTowerBuilder builder(spec, table);
    return fusion(s) ? builder.build_fusion() : builder.build_tower();
}

}  // namespace ms
