// hf_gpt2.cpp: Hugging Face GPT-2 export and import (hf_gpt2.h); the directory itself is hf_dir.h's.
#include "engine/ckpt/hf_gpt2.h"

#include <algorithm>
#include <filesystem>
#include <regex>

#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/train/run_layout.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kModel = "GPT-2";

// The weights HF stores as Conv1D (in, out): the transpose of our Linear (out, in).
bool is_conv1d(const std::string& name) {
    for (const char* suffix : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
        if (name.ends_with(suffix)) return true;
    return false;
}

// (rows, cols) C-order -> (cols, rows).
std::vector<float> transpose(const float* in, int64_t rows, int64_t cols) {
    std::vector<float> out(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(c * rows + r)] = in[r * cols + c];
    return out;
}

int positive_int(const json& config, const char* key, const std::string& where) {
    return hf_positive_int(config, key, where,
                           "a GPT-2 config.json gives n_embd, n_layer, n_head, n_positions and vocab_size");
}

// The run config of the imported checkpoint: --config's (`cfg_in`), whose model dims must be config.json's, or the
// defaults with config.json's dims. Sets s.Vp: the vocabulary padded as the config pads it.
Config import_config(const Config* cfg_in, GptShape& s, const std::string& config_path) {
    Config cfg = cfg_in ? *cfg_in : Config{};
    ModelConfig& m = cfg.model;
    if (cfg_in) {
        const int ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * m.hidden_size;
        const int positions = m.max_position_embeddings > 0 ? m.max_position_embeddings : m.seq_length;
        check_hf_import_arch(m.arch, "gpt", config_path);
        check_hf_import_dims(
            {{"model.num_layers / n_layer", double(m.num_layers), double(s.L)},
             {"model.hidden_size / n_embd", double(m.hidden_size), double(s.C)},
             {"model.num_attention_heads / n_head", double(m.num_attention_heads), double(s.NH)},
             {"model.ffn_hidden_size (0: 4 * hidden_size) / n_inner", double(ffn), double(s.F)},
             {"model.max_position_embeddings (0: seq_length) / n_positions", double(positions), double(s.T)},
             {"model.vocab_size / vocab_size", double(m.vocab_size == 0 ? s.V : m.vocab_size), double(s.V)},
             {"model.layernorm_epsilon / layer_norm_epsilon", double(m.layernorm_epsilon), double(s.eps)},
             {"model.untie_embeddings_and_output_weights / !tie_word_embeddings",
              double(m.untie_embeddings_and_output_weights), double(s.untied)}},
            config_path);
    } else {
        m.untie_embeddings_and_output_weights = s.untied;
        m.num_layers = s.L;
        m.hidden_size = s.C;
        m.num_attention_heads = s.NH;
        m.ffn_hidden_size = s.F;
        m.seq_length = s.T;
        m.max_position_embeddings = s.T;
        m.layernorm_epsilon = s.eps;
    }
    m.vocab_size = s.V;
    s.Vp = static_cast<int>(padded_vocab_size(s.V, std::max(1, m.make_vocab_size_divisible_by), 1));
    return cfg;
}

// The GPT-2 parameters of `weights` (any key prefix, F32/BF16/F16, Conv1D transposed back) in the whole model's flat
// layout (gpt_param_table(s)); wte's padding rows are zero.
std::vector<float> read_gpt2_params(const HfWeights& weights, const GptShape& s, const std::string& config_path,
                                    Progress::Style progress) {
    const std::string& where = weights.where();
    const std::vector<ParamInfo> table = gpt_param_table(s);
    std::map<std::string, std::string> key_of;  // canonical name -> the file's key
    std::string lm_head_key;
    const std::regex mask_buffer(R"(h\.\d+\.attn\.(bias|masked_bias))");
    for (const std::string& key : weights.names()) {
        const std::string name = key.starts_with("transformer.") ? key.substr(12) : key;
        if (std::regex_match(name, mask_buffer)) continue;  // causal-mask buffers, not parameters
        if (name == "lm_head.weight" && !s.untied) {        // a tied head saved twice: checked against wte below
            lm_head_key = key;
            continue;
        }
        const bool known = std::any_of(table.begin(), table.end(), [&](const ParamInfo& p) { return p.name == name; });
        if (!known)
            hf_input_error(
                fmt::format("'{}' holds the tensor '{}', which is not a parameter of the GPT-2 that '{}' "
                            "describes (GPT-2 names: wte.weight, wpe.weight, h.<0..{}>.{{ln_1,attn.c_attn,"
                            "attn.c_proj,ln_2,mlp.c_fc,mlp.c_proj}}.{{weight,bias}}, ln_f.{{weight,bias}}, "
                            "optionally prefixed with 'transformer.')",
                            weights.file(key).path(), key, config_path, s.L - 1));
        if (key_of.count(name))
            hf_input_error(fmt::format("'{}' holds '{}' twice: as '{}' and as '{}'", where, name, key_of[name], key));
        key_of[name] = key;
    }
    std::vector<float> flat(static_cast<size_t>(table.back().offset + table.back().numel), 0.0f);
    std::vector<float> wte;  // kept for the tied-head check
    Progress bar("convert: reading", static_cast<int64_t>(flat.size() * sizeof(float)), progress, "tensors");
    int64_t done = 0, tensors_read = 0;
    for (const ParamInfo& p : table) {
        const auto it = key_of.find(p.name);
        std::vector<int64_t> want = p.global_shape;  // in the file's orientation
        if (p.vocab_rows) want[0] = s.V;
        if (is_conv1d(p.name)) std::swap(want[0], want[1]);
        std::vector<float> data =
            weights.read_f32(it == key_of.end() ? p.name : it->second, want,
                             fmt::format("the GPT-2 of '{}'", config_path), "'" + config_path + "'");
        if (is_conv1d(p.name)) data = transpose(data.data(), want[0], want[1]);
        std::copy(data.begin(), data.end(), flat.begin() + p.offset);  // wte, lm_head: rows >= V stay 0
        done += p.numel * static_cast<int64_t>(sizeof(float));
        bar.update(done, ++tensors_read);
        if (p.name == "wte.weight") wte = std::move(data);
    }
    bar.finish();
    if (!lm_head_key.empty()) {
        const SafetensorsFile& file = weights.file(lm_head_key);
        const std::vector<int64_t> want = {s.V, s.C};
        if (file.info(lm_head_key).shape != want || weights.read_f32(lm_head_key) != wte)
            hf_input_error(
                fmt::format("'{}': '{}' differs from wte.weight: the output head is untied, but config.json "
                            "ties it (\"tie_word_embeddings\" true or absent)\n---> HINT: if the model was "
                            "trained with its own output layer, set \"tie_word_embeddings\": false in config.json "
                            "(it then imports with model.untie_embeddings_and_output_weights: true)",
                            file.path(), lm_head_key));
    }
    return flat;
}

}  // namespace

json hf_gpt2_config(const GptShape& s, std::optional<int32_t> eos_token_id) {
    const int64_t eos = eos_token_id ? *eos_token_id : s.V - 1;
    return {{"model_type", "gpt2"},
            {"architectures", {"GPT2LMHeadModel"}},
            {"n_embd", s.C},
            {"n_layer", s.L},
            {"n_head", s.NH},
            {"n_positions", s.T},
            {"n_ctx", s.T},
            {"vocab_size", s.V},
            {"n_inner", s.F == 4 * s.C ? json(nullptr) : json(s.F)},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", std::stod(fmt::format("{}", s.eps))},  // 1e-05, not the float's 9.99999974e-06
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"initializer_range", 0.02},
            {"scale_attn_weights", true},
            {"scale_attn_by_inverse_layer_idx", false},
            {"reorder_and_upcast_attn", false},
            {"tie_word_embeddings", !s.untied},
            {"use_cache", true},
            {"bos_token_id", eos},
            {"eos_token_id", eos},
            {"torch_dtype", "float32"}};
}

GptShape hf_gpt2_shape(const json& c, const std::string& where) {
    if (!c.is_object()) hf_input_error(fmt::format("'{}' is not a JSON object", where));
    const std::string type = c.value("model_type", std::string("gpt2"));
    if (type != "gpt2")
        hf_input_error(fmt::format("'{}' has \"model_type\": \"{}\"; --from hf-gpt2 imports GPT-2 (\"gpt2\") models{}",
                                   where, type,
                                   type == "llama" ? "\n---> HINT: import a Llama with --from hf-llama" : ""));
    GptShape s;
    s.C = positive_int(c, "n_embd", where);
    s.L = positive_int(c, "n_layer", where);
    s.NH = positive_int(c, "n_head", where);
    s.T = positive_int(c, "n_positions", where);
    s.V = positive_int(c, "vocab_size", where);
    s.Vp = s.V;
    s.F = c.contains("n_inner") && !c["n_inner"].is_null() ? positive_int(c, "n_inner", where) : 4 * s.C;
    const json eps = c.value("layer_norm_epsilon", json(1e-5));
    if (!eps.is_number() || eps.get<double>() <= 0)
        hf_input_error(fmt::format("'{}' has \"layer_norm_epsilon\": {}, not a positive number", where, eps.dump()));
    s.eps = eps.get<float>();
    if (s.C % s.NH != 0)
        hf_input_error(fmt::format("'{}': n_embd ({}) is not a multiple of n_head ({})", where, s.C, s.NH));
    // tanh-approximated GELU is what this model computes; transformers' "gelu_new" and "gelu_pytorch_tanh" are it
    const std::string act = c.value("activation_function", std::string("gelu_new"));
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
        hf_input_error(
            fmt::format("'{}' has \"activation_function\": \"{}\"; this GPT-2 computes the tanh-approximated "
                        "GELU (\"gelu_new\" or \"gelu_pytorch_tanh\"), so the imported model would compute "
                        "something else",
                        where, act));
    s.untied = !hf_bool(c, "tie_word_embeddings", true, where);  // an output layer of its own: lm_head.weight
    if (c.value("scale_attn_by_inverse_layer_idx", false) || !c.value("scale_attn_weights", true))
        hf_input_error(
            fmt::format("'{}' changes the attention scaling (scale_attn_weights / "
                        "scale_attn_by_inverse_layer_idx); only GPT-2's 1/sqrt(head size) is supported",
                        where));
    return s;
}

HfExport export_hf_gpt2(const CheckpointReader& r, const GptShape& s, const std::string& out_dir,
                        const HfExportOptions& o) {
    check_hf_export_arch(r, "hf-gpt2");
    const auto to_hf = [&](const ParamInfo& p, CanonicalTensor& t) {
        if (p.vocab_rows) {
            t.shape[0] = s.V;  // drop the padded rows
            t.data.resize(static_cast<size_t>(s.V) * static_cast<size_t>(s.C));
        } else if (is_conv1d(p.name)) {
            t.data = transpose(t.data.data(), t.shape[0], t.shape[1]);
            std::swap(t.shape[0], t.shape[1]);
        }
    };
    return write_hf_dir(r, gpt_param_table(s), to_hf, hf_gpt2_config(s, o.eos_token_id), out_dir, o);
}

std::string import_hf_gpt2(const std::string& hf_dir, const Config* cfg_in, const std::string& save_dir,
                           Progress::Style progress) {
    const std::string config_path = (fs::path(hf_dir) / kHfConfigFile).string();
    GptShape s = hf_gpt2_shape(read_hf_config(hf_dir, kModel), config_path);
    const Config cfg = import_config(cfg_in, s, config_path);  // sets s.Vp
    const HfWeights weights = HfWeights::open(hf_dir, kModel);
    const std::vector<float> flat = read_gpt2_params(weights, s, config_path, progress);
    const std::string dir = commit_hf_import(hf_dir, "hf-gpt2", kModel, weights, cfg, s, flat, save_dir, progress);
    log_info(
        "convert: imported {} ({} layers, hidden {}, {} heads, {} positions, vocabulary {} padded to {}; {}; {}) "
        "into {}",
        hf_dir, s.L, s.C, s.NH, s.T, s.V, s.Vp, weights.dtypes(), weights.describe(), dir);
    return dir;
}

}  // namespace ms
