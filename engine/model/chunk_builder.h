// chunk_builder.h: what the GPT and Llama graph builders share (gpt_graph.cpp, llama_graph.cpp): the chunk's
// parameter and gradient tensors, the tensor-parallel boundaries (the norm before a column-parallel layer, the
// reduction after a row-parallel one), the embedding's reduction, the vocab-parallel head and loss, and the passes
// that follow the forward (backward, recomputation, fusion). A model family supplies its embedding op and its layer.
//
// Activation names are the families' common ones ("tokens", "encoded", "h.<l>.<what>", "logits", "losses", "dout",
// "d.<name>"): the memory plan finds a layer's tensors by "h.<l>." and GptProgram the hand-offs by name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/gpt_graph.h"

namespace ms {

class ChunkBuilder {
  public:
    ChunkBuilder(const GptGraphSpec& s, const std::vector<ParamInfo>& table);
    virtual ~ChunkBuilder() = default;
    GptGraph build();

  protected:
    using TensorId = graph::TensorId;
    // The embedding op of the chunk's first stage: tokens (N) -> out (N, C), this rank's vocabulary shard's part.
    virtual void embedding(TensorId tokens, TensorId out) = 0;
    // Ops of the chunk's own that the layers read (Llama's rope table), before the first layer.
    virtual void before_layers() {}
    // Layer l's ops from the residual stream res; returns the stream after it. The last layer's output gradient is
    // named "d.output".
    virtual TensorId layer(TensorId res, int l, bool last) = 0;
    // The final norm's parameter prefix ("ln_f", "model.norm"); the output layer's weight is output_weight_name.
    virtual std::string final_norm() const = 0;

    TensorId param(const std::string& name) const;
    // The parameters first .. last, packed back to back in the flat buffers (ParamInfo::packed_with_next), as one
    // tensor of their rows: Llama's [Q | K | V] and [gate | up] weights, CLIP's [Q | K | V] weights and biases.
    TensorId packed_params(const std::string& name, const std::vector<std::string>& parts);
    TensorId act(const std::string& name, int64_t rows, int64_t cols, graph::Role role = graph::Role::kActivation);
    TensorId stat(const std::string& name, int64_t n, DType t = DType::kF32);
    graph::Node& op(graph::OpCode code, std::string label, std::vector<TensorId> in, std::vector<TensorId> out,
                    int layer);
    // The norm of the residual stream x (this rank's rows: LayerNorm with weight and bias for GPT, RMSNorm with a
    // weight for Llama, parameters "<norm>.weight" / ".bias"), then the input of a column-parallel layer: all rows
    // (all-gathered under sequence parallelism; Megatron's "copy" otherwise). The output is named `name`.
    TensorId norm_to_columns(TensorId x, const std::string& name, const std::string& norm, int layer);
    // A row-parallel layer's partial sums -> this rank's rows of the sum.
    TensorId reduce_rows(TensorId partial, const std::string& name, int layer);
    // GPT-2's MLP half-block of layer l (GPT and CLIP's towers): res3 = res2 + proj(gelu(fc(norm(res2)))) + proj.bias,
    // fc column-parallel, proj row-parallel with its bias added after the reduction. Parameters "<p><norm>.weight",
    // "<p><fc>.weight", ..., tensors and labels "h.<l>.<fc>", ... Returns res3 ("h.<l>.res3").
    TensorId gelu_mlp(TensorId res2, int l, const std::string& p, const std::string& norm, const std::string& fc,
                      const std::string& proj);
    // The encoder block's self-attention half of layer l under Hugging Face's CLIP names (CLIP's towers and the
    // policy-value trunk; parameters param_table.h's add_encoder_attention_params): res2 = res +
    // out_proj(attention(qkv_proj(layer_norm1(res)))) + out_proj.bias, q/k/v column-parallel per head, packed back
    // to back per rank, out_proj row-parallel with its bias added after the reduction. Causal, or bidirectional (the
    // block ops of a ring of one rank, ring_attention.h, without the mask). Returns res2 ("h.<l>.res2").
    TensorId encoder_attention(TensorId res, int l, const std::string& p, bool causal);
    // A LayerNorm of `rows` rows of x with parameters "<param_prefix>.weight" / ".bias", computed whole on every
    // tensor-parallel rank (no sequence parallelism): a tower's final norm. The output is named `name`.
    TensorId layer_norm(TensorId x, int64_t rows, const std::string& name, const std::string& param_prefix);

    const GptGraphSpec& s_;
    graph::Graph g_;
    int64_t N_ = 0, Nl_ = 0;
    bool sp_ = false;
    int layer_ = -1;  // the layer whose tensors are being made (-1: the chunk's own)

  private:
    void head(TensorId res);
    // The output layer's weight: its parameter, or with the tied gradient kept apart (head_grad_bytes() > 0) the same
    // weights as a tensor "<name>@head" whose gradient is the chunk's kHeadGradient buffer.
    TensorId head_weight();
};

}  // namespace ms
