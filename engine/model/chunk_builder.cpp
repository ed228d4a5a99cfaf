// chunk_builder.cpp: the graph-building steps GPT and Llama share (chunk_builder.h).
#include "engine/model/chunk_builder.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "engine/core/check.h"

namespace ms {

using graph::kNoTensor;
using graph::Node;
using graph::OpCode;
using graph::Role;
using graph::TensorId;

ChunkBuilder::ChunkBuilder(const GptGraphSpec& s, const std::vector<ParamInfo>& table) : s_(s) {
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

TensorId ChunkBuilder::param(const std::string& name) const {
    const TensorId t = g_.find(name);
    MS_CHECK(t != kNoTensor && g_.info(t).role == Role::kParameter, "model graph: no parameter '{}'", name);
    return t;
}

TensorId ChunkBuilder::packed_params(const std::string& name, const std::vector<std::string>& parts) {
    const graph::TensorInfo first = g_.info(param(parts.front()));
    int64_t rows = 0, end = first.param_offset;
    for (const std::string& part : parts) {
        const graph::TensorInfo& p = g_.info(param(part));
        const bool same_cols =
            p.shape.size() == first.shape.size() && (p.shape.size() == 1 || p.shape[1] == first.shape[1]);
        MS_CHECK(p.param_offset == end && p.shape.size() <= 2 && same_cols,
                 "model graph: '{}' does not follow the parameter before it in the flat buffer (packed_with_next)",
                 part);
        rows += p.shape[0];
        end += p.numel();
    }
    const std::vector<int64_t> shape =
        first.shape.size() == 2 ? std::vector<int64_t>{rows, first.shape[1]} : std::vector<int64_t>{rows};
    const TensorId w = g_.add_tensor({.name = name,
                                      .shape = shape,
                                      .dtype = s_.act,
                                      .role = Role::kParameter,
                                      .param_offset = first.param_offset,
                                      .param = first.param});
    const TensorId d = g_.add_tensor({.name = "grad." + name,
                                      .shape = shape,
                                      .dtype = s_.options.grads,
                                      .role = Role::kGradient,
                                      .param_offset = first.param_offset,
                                      .param = first.param});
    g_.grad_of[static_cast<size_t>(w)] = d;
    return w;
}

TensorId ChunkBuilder::act(const std::string& name, int64_t rows, int64_t cols, Role role) {
    return g_.add_tensor({.name = name, .shape = {rows, cols}, .dtype = s_.act, .role = role, .layer = layer_});
}

TensorId ChunkBuilder::stat(const std::string& name, int64_t n, DType t) {
    return g_.add_tensor({.name = name, .shape = {n}, .dtype = t, .layer = layer_});
}

Node& ChunkBuilder::op(OpCode code, std::string label, std::vector<TensorId> in, std::vector<TensorId> out, int layer) {
    Node n;
    n.op = code;
    n.in = std::move(in);
    n.out = std::move(out);
    n.layer = layer;
    n.label = std::move(label);
    g_.nodes.push_back(std::move(n));
    return g_.nodes.back();
}

TensorId ChunkBuilder::norm_to_columns(TensorId x, const std::string& name, const std::string& norm, int layer) {
    const TensorId y = act(sp_ ? name + ".local" : name, Nl_, s_.shape.C);
    if (s_.shape.arch == ModelArch::kLlama) {
        const TensorId rstd = stat(name + "_rstd", Nl_);
        op(OpCode::kRmsNorm, name, {x, param(norm + ".weight")}, {y, rstd}, layer).eps = s_.shape.eps;
    } else {
        const TensorId mean = stat(name + "_mean", Nl_), rstd = stat(name + "_rstd", Nl_);
        op(OpCode::kLayerNorm, name, {x, param(norm + ".weight"), param(norm + ".bias")}, {y, mean, rstd}, layer).eps =
            s_.shape.eps;
    }
    g_.nodes.back().tp_rows = sp_;
    if (sp_) {
        const TensorId full = act(name, N_, s_.shape.C);
        op(OpCode::kAllGather, name, {y}, {full}, layer);
        return full;
    }
    if (s_.tp_size > 1) op(OpCode::kTpCopy, name, {y}, {y}, layer);
    return y;
}

TensorId ChunkBuilder::reduce_rows(TensorId partial, const std::string& name, int layer) {
    if (sp_) {
        const TensorId local = act(name, Nl_, s_.shape.C);
        op(OpCode::kReduceScatter, name, {partial}, {local}, layer);
        return local;
    }
    if (s_.tp_size > 1) op(OpCode::kAllReduce, name, {partial}, {partial}, layer);
    return partial;
}

TensorId ChunkBuilder::gelu_mlp(TensorId res2, int l, const std::string& p, const std::string& norm,
                                const std::string& fc, const std::string& proj) {
    const std::string h = fmt::format("h.{}.", l);
    const int64_t C = s_.shape.C, F = s_.shape.F / s_.tp_size;
    const TensorId x = norm_to_columns(res2, h + "ln_2", p + norm, l);
    const TensorId fch = act(h + "fch", N_, F);
    op(OpCode::kMatmul, h + fc, {x, param(p + fc + ".weight"), param(p + fc + ".bias")}, {fch}, l);
    const TensorId fch_gelu = act(h + "fch_gelu", N_, F);
    op(OpCode::kGelu, h + "mlp.gelu", {fch}, {fch_gelu}, l);
    const TensorId mlp_partial = act(h + proj, N_, C);
    op(OpCode::kMatmul, h + proj, {fch_gelu, param(p + proj + ".weight"), kNoTensor}, {mlp_partial}, l);
    const TensorId mlp_out = reduce_rows(mlp_partial, h + "mlp.out", l);
    const TensorId res3 = act(h + "res3", Nl_, C);
    op(OpCode::kResidual, h + "mlp.residual", {res2, mlp_out, param(p + proj + ".bias")}, {res3}, l).tp_rows = sp_;
    return res3;
}

TensorId ChunkBuilder::encoder_attention(TensorId res, int l, const std::string& p, bool causal) {
    const GptShape& s = s_.shape;
    const int64_t tp = s_.tp_size, C = s.C, NH_local = s.NH / tp, C_local = NH_local * (s.C / s.NH);
    const std::string h = fmt::format("h.{}.", l);
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
    if (!causal) {
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
    return res2;
}

TensorId ChunkBuilder::layer_norm(TensorId x, int64_t rows, const std::string& name, const std::string& param_prefix) {
    const TensorId y = act(name, rows, s_.shape.C);
    const TensorId mean = stat(name + "_mean", rows), rstd = stat(name + "_rstd", rows);
    op(OpCode::kLayerNorm, name, {x, param(param_prefix + ".weight"), param(param_prefix + ".bias")}, {y, mean, rstd},
       layer_)
        .eps = s_.shape.eps;
    return y;
}

TensorId ChunkBuilder::head_weight() {
    const TensorId shared = param(output_weight_name(s_.shape));
    if (head_grad_bytes(s_.shape, s_.part, s_.tp_size, s_.options) == 0) return shared;
    // the same weights read as a parameter of its own, whose gradient goes to the chunk's head buffer
    graph::TensorInfo w = g_.info(shared);
    w.name += "@head";
    graph::TensorInfo d = w;
    d.name = "grad." + w.name;
    d.dtype = s_.options.grads;
    d.role = Role::kHeadGradient;
    d.param_offset = 0;
    const TensorId t = g_.add_tensor(std::move(w));
    g_.grad_of[static_cast<size_t>(t)] = g_.add_tensor(std::move(d));
    return t;
}

void ChunkBuilder::head(TensorId res) {
    const GptShape& s = s_.shape;
    const int64_t Vl = s.Vp / s_.tp_size, vocab_start = s_.tp_rank * Vl;
    const TensorId x = norm_to_columns(res, "ln_f", final_norm(), -1);
    const TensorId logits = act("logits", N_, Vl, Role::kOutput);
    op(OpCode::kMatmul, "lm_head", {x, head_weight(), kNoTensor}, {logits}, -1);
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

GptGraph ChunkBuilder::build() {
    const GptShape& s = s_.shape;
    const GptPart& part = s_.part;
    const int64_t C = s.C;
    TensorId res;
    if (part.embedding) {
        const TensorId tokens = stat("tokens", N_, DType::kI32);
        op(OpCode::kLoadTokens, "tokens", {}, {tokens}, -1).vocab_valid = s.V;
        const TensorId partial = act(sp_ ? "embedding" : "encoded", N_, C);
        embedding(tokens, partial);
        res = reduce_rows(partial, "encoded", -1);
    } else {
        res = act("input", Nl_, C, Role::kInput);
    }
    const TensorId input = res;
    graph::PassReport recompute{.pass = "recompute", .steps = {}};
    const int num_layers = part.num_layers < 0 ? s.L - part.first_layer : part.num_layers;
    const int end = part.first_layer + num_layers;
    if (num_layers > 0) before_layers();
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

}  // namespace ms
