// policy_value.cpp: the self-play network's parameter table and graph builder (policy_value.h).
#include "engine/model/policy_value.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/core/check.h"
#include "engine/model/chunk_builder.h"
#include "engine/model/param_table.h"

namespace ms {
namespace {

using graph::kNoTensor;
using graph::OpCode;
using graph::Role;
using graph::TensorId;

std::string layer_prefix(int l) { return fmt::format("trunk.layers.{}.", l); }
constexpr const char* kFinalNorm = "trunk.final_layer_norm";

// The feature columns, in one place: [codes | rows from the bottom | rows from the top | columns from the left |
// columns from the right | summary | first player to move, second player to move | with threat features: playable,
// the side to move's threat, the opponent's threat].
// With threat features, one column per bit of a cell's flags (games::Connect4::cell_flags).
constexpr int kThreatColumns = 3;

struct FeatureColumns {
    int rows_bottom, rows_top, cols_left, cols_right, summary, turn, threats, width;
    explicit FeatureColumns(const GptShape& s)
        : rows_bottom(3),
          rows_top(rows_bottom + s.board_rows),
          cols_left(rows_top + s.board_rows),
          cols_right(cols_left + s.board_cols),
          summary(cols_right + s.board_cols),
          turn(summary + 1),
          threats(turn + 2),
          width(threats + (s.threat_features ? kThreatColumns : 0)) {}
};

class PolicyValueBuilder : public ChunkBuilder {
  public:
    using ChunkBuilder::ChunkBuilder;
    GptGraph build_network();

  private:
    void embedding(TensorId, TensorId) override {}  // build_network() writes the cells' embedding
    TensorId layer(TensorId res, int l, bool last) override {
        layer_ = l;
        const std::string p = layer_prefix(l);
        const TensorId res3 = gelu_mlp(encoder_attention(res, l, p, false), l, p, "layer_norm2", "mlp.fc1", "mlp.fc2");
        if (last) g_.tensors[static_cast<size_t>(res3)].grad_name = "d.output";  // chunk_builder.h: the plan's name
        layer_ = -1;
        return res3;
    }
    std::string final_norm() const override { return kFinalNorm; }
    // An output of the chunk whose gradient the host writes.
    TensorId output(const std::string& name, int64_t rows) {
        const TensorId out = act(name, rows, 1, Role::kOutput);
        g_.grad_of[static_cast<size_t>(out)] = act("d." + name, rows, 1, Role::kGradInput);
        return out;
    }
};

GptGraph PolicyValueBuilder::build_network() {
    const GptShape& s = s_.shape;
    const int64_t C = s.C, B = s_.B;
    const TensorId cells = g_.add_tensor({.name = "cells",
                                          .shape = {N_, policy_value_input_width(s)},
                                          .dtype = s_.act,
                                          .role = Role::kInput,
                                          .no_grad = true});
    TensorId res = act("encoded", N_, C);
    op(OpCode::kMatmul, "trunk.embedding", {cells, param("trunk.embedding.weight"), kNoTensor}, {res}, -1);
    const int L = s_.part.num_layers < 0 ? s.L : s_.part.num_layers;  // the memory plan's representative: fewer
    for (int l = 0; l < L; ++l) res = layer(res, l, l == L - 1);
    const TensorId states = layer_norm(res, N_, "states", kFinalNorm);
    // policy: a logit per row
    op(OpCode::kMatmul, "policy_head", {states, param("policy_head.weight"), param("policy_head.bias")},
       {output("policy", N_)}, -1);
    // value: the summary rows through a GELU layer to one number each
    const TensorId rows = stat("summary_rows", B, DType::kI32);
    op(OpCode::kLoadRows, "summary_rows", {}, {rows}, -1).vocab_valid = N_;
    const TensorId summary = act("summary", B, C);
    op(OpCode::kGatherRows, "summary", {states, rows}, {summary}, -1);
    const TensorId hidden = act("value_hidden", B, C);
    op(OpCode::kMatmul, "value_head.fc", {summary, param("value_head.fc.weight"), param("value_head.fc.bias")},
       {hidden}, -1);
    const TensorId hidden_gelu = act("value_hidden_gelu", B, C);
    op(OpCode::kGelu, "value_head.gelu", {hidden}, {hidden_gelu}, -1);
    op(OpCode::kMatmul, "value_head.out", {hidden_gelu, param("value_head.out.weight"), param("value_head.out.bias")},
       {output("value", B)}, -1);

    graph::derive_backward(g_);
    GptGraph out{.g = std::move(g_), .recompute = {}, .fusion = {}};
    out.recompute = graph::recompute(out.g, s_.options.recompute, 0);
    if (s_.fuse) out.fusion = graph::fuse(out.g, {});
    return out;
}

}  // namespace

GptShape policy_value_shape(const PolicyValueSizes& z) {
    GptShape s;
    s.arch = ModelArch::kPolicyValue;
    s.L = z.layers;
    s.C = z.hidden;
    s.NH = z.heads;
    s.F = z.ffn;
    s.board_rows = z.board_rows;
    s.board_cols = z.board_cols;
    s.T = z.board_rows * z.board_cols + 1;
    s.V = s.Vp = 0;  // no vocabulary: the input is the cells' features
    s.eps = z.eps;
    s.threat_features = z.threat_features;
    return s;
}

int policy_value_input_width(const GptShape& s) { return FeatureColumns(s).width; }

void write_board_features(const GptShape& s, int rows, int cols, std::span<const int8_t> cells,
                          std::span<const int8_t> flags, int moves_played, std::span<float> out) {
    const FeatureColumns f(s);
    MS_CHECK(rows >= 1 && cols >= 1 && rows <= s.board_rows && cols <= s.board_cols,
             "write_board_features: a {} x {} board on a network of boards up to {} x {}", rows, cols, s.board_rows,
             s.board_cols);
    const size_t T = static_cast<size_t>(rows) * cols + 1, width = static_cast<size_t>(f.width);
    MS_CHECK(cells.size() + 1 == T && out.size() == T * width, "write_board_features: {} cells, {} floats for {} x {}",
             cells.size(), out.size(), rows, cols);
    MS_CHECK(flags.size() == (s.threat_features ? cells.size() : 0), "write_board_features: {} flags for {} cells{}",
             flags.size(), cells.size(), s.threat_features ? "" : " without threat features");
    std::fill(out.begin(), out.end(), 0.0f);
    out[static_cast<size_t>(f.summary)] = 1.0f;
    const int turn = f.turn + (moves_played & 1);
    for (size_t row = 0; row < T; ++row) out[row * width + static_cast<size_t>(turn)] = 1.0f;
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
            const size_t cell = static_cast<size_t>(r) * cols + c;
            float* row = out.data() + (cell + 1) * width;
            const int code = cells[cell];
            MS_CHECK(code >= 0 && code < 3, "write_board_features: cell code {}", code);
            row[code] = 1.0f;
            row[f.rows_bottom + (rows - 1 - r)] = 1.0f;
            row[f.rows_top + r] = 1.0f;
            row[f.cols_left + c] = 1.0f;
            row[f.cols_right + (cols - 1 - c)] = 1.0f;
            if (!s.threat_features) continue;
            MS_CHECK(flags[cell] >= 0 && flags[cell] < 1 << kThreatColumns, "write_board_features: cell flags {}",
                     flags[cell]);
            for (int k = 0; k < kThreatColumns; ++k) row[f.threats + k] = static_cast<float>(flags[cell] >> k & 1);
        }
}

std::vector<ParamInfo> policy_value_param_table(const GptShape& s, int tp) {
    MS_CHECK(s.arch == ModelArch::kPolicyValue, "policy_value_param_table: not the policy-value network");
    MS_CHECK(tp >= 1 && s.NH % tp == 0 && s.F % tp == 0,
             "tensor-parallel size {} must divide the network's heads {} and ffn {}", tp, s.NH, s.F);
    TableWriter w(tp);
    const float proj = std::sqrt(2.0f * static_cast<float>(s.L));  // the residual projections' init divisor
    const int64_t C = s.C;
    using K = ShardKind;
    w.add("trunk.embedding.weight", {C, policy_value_input_width(s)}, K::kReplicated, 1, 0);
    for (int l = 0; l < s.L; ++l) {
        add_encoder_attention_params(w, layer_prefix(l), C, proj);
        add_encoder_mlp_params(w, layer_prefix(l), C, s.F, proj);
    }
    add_layer_norm_params(w, kFinalNorm, C);
    w.add("policy_head.weight", {1, C}, K::kReplicated, 1, 0);
    w.add("policy_head.bias", {1}, K::kReplicated, 0, 0);
    w.add("value_head.fc.weight", {C, C}, K::kReplicated, 1, 0);
    w.add("value_head.fc.bias", {C}, K::kReplicated, 0, 0);
    w.add("value_head.out.weight", {1, C}, K::kReplicated, 1, 0);
    w.add("value_head.out.bias", {1}, K::kReplicated, 0, 0);
    return w.take();
}

GptGraph build_policy_value_graph(const GptGraphSpec& spec, const std::vector<ParamInfo>& table) {
    const GptShape& s = spec.shape;
    MS_CHECK(spec.B >= 1 && spec.T >= 2 && spec.T <= s.T, "policy-value graph: batch {} x rows {} (at most {})", spec.B,
             spec.T, s.T);
    MS_CHECK(!spec.sequence_parallel || spec.tp_size == 1, "the policy-value network has no sequence parallelism");
    MS_CHECK(spec.options.context_parallel == 1, "the policy-value network has no context parallelism");
    MS_CHECK(spec.part.first_layer == 0 && spec.part.embedding, "the policy-value network is one chunk");
    return PolicyValueBuilder(spec, table).build_network();
}

}  // namespace ms
