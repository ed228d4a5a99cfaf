// param_table.cpp: the encoder block's parameters, shared by CLIP's towers and the policy-value trunk (param_table.h).
#include "engine/model/param_table.h"

namespace ms {

void add_layer_norm_params(TableWriter& w, const std::string& name, int64_t C) {
    w.add(name + ".weight", {C}, ShardKind::kReplicated, 0, 1);
    w.add(name + ".bias", {C}, ShardKind::kReplicated, 0, 0);
}

void add_attention_input_params(TableWriter& w, const std::string& a, const std::vector<const char*>& parts, int64_t C,
                                int64_t kv_width) {
    for (bool weights : {true, false})
        for (size_t i = 0; i < parts.size(); ++i) {
            const std::string m = parts[i];
            const int64_t in = m == "q_proj" ? C : kv_width;
            w.add(a + m + (weights ? ".weight" : ".bias"),
                  weights ? std::vector<int64_t>{C, in} : std::vector<int64_t>{C}, ShardKind::kRows, weights ? 1 : 0,
                  0);
            if (i + 1 < parts.size()) w.pack();
        }
}

void add_out_proj_params(TableWriter& w, const std::string& a, int64_t C, float proj) {
    w.add(a + "out_proj.weight", {C, C}, ShardKind::kCols, proj, 0);
    w.add(a + "out_proj.bias", {C}, ShardKind::kReplicated, 0, 0);
}

void add_encoder_attention_params(TableWriter& w, const std::string& p, int64_t C, float proj) {
    add_layer_norm_params(w, p + "layer_norm1", C);
    add_attention_input_params(w, p + "self_attn.", {"q_proj", "k_proj", "v_proj"}, C, C);
    add_out_proj_params(w, p + "self_attn.", C, proj);
}

void add_encoder_mlp_params(TableWriter& w, const std::string& p, int64_t C, int64_t F, float proj) {
    add_layer_norm_params(w, p + "layer_norm2", C);
    w.add(p + "mlp.fc1.weight", {F, C}, ShardKind::kRows, 1, 0);
    w.add(p + "mlp.fc1.bias", {F}, ShardKind::kRows, 0, 0);
    w.add(p + "mlp.fc2.weight", {C, F}, ShardKind::kCols, proj, 0);
    w.add(p + "mlp.fc2.bias", {C}, ShardKind::kReplicated, 0, 0);
}

}  // namespace ms
