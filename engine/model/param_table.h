// param_table.h: how the model families write their parameter tables (gpt.h's ParamInfo): each parameter at the
// next aligned offset of the flat buffers, or packed right after the one before it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/gpt.h"

namespace ms {

// Parameters start on 64-byte boundaries so the fused elementwise passes vectorise cleanly.
inline constexpr int64_t kParamAlign = 16;

// Appends parameters to a table, each at the next 16-aligned offset (or right after one packed_with_next).
class TableWriter {
  public:
    explicit TableWriter(int tp) : tp_(tp) {}
    // divisor 0: constant `value`; else N(0, (init_std / divisor)^2)
    ParamInfo& add(std::string name, std::vector<int64_t> global, ShardKind shard, float divisor, float value) {
        ParamInfo p;
        p.name = std::move(name);
        p.global_shape = global;
        p.shard = shard;
        p.shape = std::move(global);
        if (shard == ShardKind::kRows || shard == ShardKind::kQkvRows) p.shape[0] /= tp_;
        if (shard == ShardKind::kCols) p.shape[1] /= tp_;
        p.numel = 1;
        for (int64_t d : p.shape) p.numel *= d;
        p.offset = offset_;
        p.weight_decay = p.shape.size() >= 2;
        p.init = divisor > 0.0f ? InitKind::kNormal : InitKind::kConstant;
        p.init_divisor = divisor > 0.0f ? divisor : 1.0f;
        p.init_value = value;
        offset_ = (offset_ + p.numel + kParamAlign - 1) / kParamAlign * kParamAlign;
        t_.push_back(std::move(p));
        return t_.back();
    }
    // The next add() follows the last parameter without a gap.
    void pack() {
        ParamInfo& p = t_.back();
        p.packed_with_next = true;
        offset_ = p.offset + p.numel;
    }
    std::vector<ParamInfo> take() { return std::move(t_); }

  private:
    int tp_;
    int64_t offset_ = 0;
    std::vector<ParamInfo> t_;
};

// The pre-LayerNorm encoder block under Hugging Face's CLIP names, which CLIP's towers and the policy-value trunk
// share (chunk_builder.h's encoder_attention and gelu_mlp build its ops). `proj` is the residual projections' init
// divisor, sqrt(2 L).
// A LayerNorm's "<name>.weight" (ones) and ".bias" (zeros), replicated.
void add_layer_norm_params(TableWriter& w, const std::string& name, int64_t C);
// The attention inputs `parts` of attention prefix `a` ("q_proj", "k_proj", "v_proj": each (C, in) with a bias),
// weights then biases, each column-parallel per head and packed back to back per rank; q reads rows of width C,
// the others rows of kv_width (a cross-attention's other side).
void add_attention_input_params(TableWriter& w, const std::string& a, const std::vector<const char*>& parts, int64_t C,
                                int64_t kv_width);
// "<a>out_proj.weight" (row-parallel) and its replicated bias.
void add_out_proj_params(TableWriter& w, const std::string& a, int64_t C, float proj);
// Layer prefix p's self-attention half: layer_norm1, self_attn's q/k/v and out_proj.
void add_encoder_attention_params(TableWriter& w, const std::string& p, int64_t C, float proj);
// Layer prefix p's MLP half: layer_norm2, mlp.fc1 (column-parallel) and mlp.fc2 (row-parallel), with biases.
void add_encoder_mlp_params(TableWriter& w, const std::string& p, int64_t C, int64_t F, float proj);

}  // namespace ms
