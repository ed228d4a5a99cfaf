// gpt.h: GPT-2, exactly (token + learned position embeddings, pre-LayerNorm blocks, causal multi-head attention,
// GELU-tanh MLP, biases everywhere, final LayerNorm, output head tied to the token embedding, vocabulary padded
// to Vp with the padded logits masked), forward and backward over a Backend.
//
// Parameters live in one contiguous fp32 buffer in the order of param_table(); gradients mirror it. Names are
// Hugging Face GPT-2's (`wte.weight`, `h.3.attn.c_attn.weight`, ...) but weights are stored in Linear
// orientation (out_features, in_features); HF's Conv1D stores the transpose. c_attn's rows are [Q | K | V],
// each block head-major. Activations for up to `max_batch` sequences are allocated once at construction.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "memory/host_buffer.h"

namespace ms {

struct GptShape {
    int L = 12;      // layers
    int C = 768;     // hidden
    int NH = 12;     // heads
    int T = 1024;    // max sequence length (= number of position embeddings)
    int V = 50257;   // real vocabulary
    int Vp = 50304;  // padded vocabulary (multiple of make_vocab_size_divisible_by)
    int F = 3072;    // ffn hidden
    float eps = 1e-5f;
};

struct ParamInfo {
    std::string name;            // canonical, e.g. "h.3.mlp.c_fc.weight"
    std::vector<int64_t> shape;  // e.g. (4C, C)
    int64_t offset = 0;          // element offset in the flat parameter buffer
    int64_t numel = 0;
    bool weight_decay = false;   // true for >= 2-D weights; false for biases, LayerNorm and other 1-D params
    float init_std = 0.0f;       // N(0, init_std); 0 -> constant init_value
    float init_value = 0.0f;
};

// The parameter table of a GPT-2 of this shape (pure function; used by the model, the optimizer and tests).
std::vector<ParamInfo> gpt_param_table(const GptShape& s, float init_std);
int64_t gpt_num_params(const GptShape& s);
// Forward+backward FLOPs per token of a training step at sequence length T (Megatron's formula), for MFU.
double gpt_train_flops_per_token(const GptShape& s, int T);

class Gpt {
public:
    Gpt(const GptShape& shape, Backend& backend, int max_batch);
    ~Gpt();

    const GptShape& shape() const { return shape_; }
    const std::vector<ParamInfo>& params_info() const { return table_; }
    int64_t num_params() const { return num_params_; }
    float* params() { return params_.as<float>(); }
    float* grads() { return grads_.as<float>(); }
    const ParamInfo& param(const std::string& name) const;

    // Layout-invariant init: element i of parameter p is N(0, std_p) drawn from Philox(seed, name_hash(p), i);
    // residual output projections (attn.c_proj, mlp.c_proj) use std / sqrt(2 L); biases 0; LayerNorm weights 1;
    // padded vocabulary rows of wte 0.
    void init_weights(uint64_t seed);

    // tokens, targets: (B, T) int32 with B <= max_batch, T <= shape.T. Returns the mean loss over B*T.
    // With targets == nullptr only the logits are computed (returns NaN). Keeps activations for backward().
    float forward(const int32_t* tokens, const int32_t* targets, int B, int T);
    // Accumulates d(loss_scale * mean loss)/d(params) into grads() (+=). Must follow forward() with targets.
    void backward(float loss_scale);
    void zero_grads();
    // (B, T, Vp) logits of the last forward() (valid until backward(), which overwrites them with dlogits).
    const float* logits() const;
    // per-position losses (B*T) of the last forward()
    const float* losses() const;

private:
    struct Activations;
    GptShape shape_;
    Backend& backend_;
    int max_batch_;
    std::vector<ParamInfo> table_;
    int64_t num_params_ = 0;
    HostBuffer params_;  // (num_params)
    HostBuffer grads_;   // (num_params)
    std::unique_ptr<Activations> acts_;
    int B_ = 0, T_ = 0;  // shape of the last forward
};

}  // namespace ms
