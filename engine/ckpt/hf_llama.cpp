// hf_llama.cpp: Hugging Face Llama export and import (hf_llama.h); the directory itself is hf_dir.h's.
#include "engine/ckpt/hf_llama.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <regex>

#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/train/run_layout.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kModel = "Llama";
constexpr const char* kOutput = "lm_head.weight";  // an untied output layer's (output_weight_name)

int positive_int(const json& config, const char* key, const std::string& where) {
    return hf_positive_int(config, key, where,
                           "a Llama config.json gives hidden_size, intermediate_size, num_hidden_layers, "
                           "num_attention_heads, max_position_embeddings and vocab_size");
}

double positive_number(const json& c, const char* key, double fallback, const std::string& where) {
    const json v = c.value(key, json(fallback));
    if (!v.is_number() || v.get<double>() <= 0)
        hf_input_error(fmt::format("'{}' has \"{}\": {}, not a positive number", where, key, v.dump()));
    return v.get<double>();
}

// A JSON number as config.json writes it: the shortest decimal that reads back as this float (1e-05, not the float's
// 9.99999974e-06).
double decimal(float x) { return std::stod(fmt::format("{}", x)); }

// An integer as JSON writes one where `x` is whole (transformers' configs give original_max_position_embeddings as
// 8192), else the number.
json whole_or_real(double x) {
    return x == std::floor(x) && std::abs(x) < 0x1p53 ? json(static_cast<int64_t>(x)) : json(x);
}

// rope_scaling of config.json (null, absent, or a "llama3" object) as the model's RopeScaling.
RopeScaling rope_scaling(const json& c, const std::string& where) {
    const auto it = c.find("rope_scaling");
    if (it == c.end() || it->is_null()) return {};
    const std::string hint =
        "\n---> HINT: this Llama computes RoPE unscaled (\"rope_scaling\": null) or scaled as Llama 3.1 "
        "({\"rope_type\": \"llama3\", \"factor\", \"low_freq_factor\", \"high_freq_factor\", "
        "\"original_max_position_embeddings\"})";
    if (!it->is_object()) hf_input_error(fmt::format("'{}' has \"rope_scaling\": {}{}", where, it->dump(), hint));
    // transformers reads "rope_type", and "type" from configs written before it was renamed
    const std::string type = it->value("rope_type", it->value("type", std::string()));
    if (type != "llama3")
        hf_input_error(fmt::format("'{}' has a \"rope_scaling\" of type \"{}\", which this Llama does not compute{}",
                                   where, type, hint));
    RopeScaling r;
    const std::string scaling_where = where + "\", \"rope_scaling";  // reads as '<file>', "rope_scaling" in messages
    r.factor = positive_number(*it, "factor", 0.0, scaling_where);
    r.low_freq_factor = positive_number(*it, "low_freq_factor", 0.0, scaling_where);
    r.high_freq_factor = positive_number(*it, "high_freq_factor", 0.0, scaling_where);
    r.original_max_position_embeddings = positive_number(*it, "original_max_position_embeddings", 0.0, scaling_where);
    if (r.high_freq_factor <= r.low_freq_factor)
        hf_input_error(fmt::format("'{}': rope_scaling's high_freq_factor ({}) is not above its low_freq_factor ({})",
                                   where, r.high_freq_factor, r.low_freq_factor));
    return r;
}

// The run config of the imported checkpoint: --config's (`cfg_in`), whose model must be config.json's, or the
// defaults with config.json's model. Sets s.Vp: the vocabulary padded as the config pads it.
Config import_config(const Config* cfg_in, GptShape& s, const std::string& config_path) {
    Config cfg = cfg_in ? *cfg_in : Config{};
    ModelConfig& m = cfg.model;
    if (cfg_in) {
        check_hf_import_arch(m.arch, "llama", config_path);
        const int positions = m.max_position_embeddings > 0 ? m.max_position_embeddings : m.seq_length;
        const RopeScaling& r = s.rope_scaling;
        std::vector<HfImportDim> dims = {
            {"model.num_layers / num_hidden_layers", double(m.num_layers), double(s.L)},
            {"model.hidden_size / hidden_size", double(m.hidden_size), double(s.C)},
            {"model.num_attention_heads / num_attention_heads", double(m.num_attention_heads), double(s.NH)},
            {"model.num_query_groups (0: num_attention_heads) / num_key_value_heads",
             double(m.num_query_groups > 0 ? m.num_query_groups : m.num_attention_heads), double(s.kv_heads())},
            {"model.ffn_hidden_size / intermediate_size", double(m.ffn_hidden_size), double(s.F)},
            {"model.max_position_embeddings (0: seq_length) / max_position_embeddings", double(positions), double(s.T)},
            {"model.vocab_size / vocab_size", double(m.vocab_size == 0 ? s.V : m.vocab_size), double(s.V)},
            {"model.layernorm_epsilon / rms_norm_eps", double(m.layernorm_epsilon), double(s.eps)},
            {"model.rotary_base / rope_theta", m.rotary_base, s.rope_theta},
            {"model.rope_scaling_factor / rope_scaling.factor", m.rope_scaling_factor, r.factor}};
        if (r.factor != 0.0) {
            dims.push_back({"model.rope_low_freq_factor / rope_scaling.low_freq_factor", m.rope_low_freq_factor,
                            r.low_freq_factor});
            dims.push_back({"model.rope_high_freq_factor / rope_scaling.high_freq_factor", m.rope_high_freq_factor,
                            r.high_freq_factor});
            dims.push_back(
                {"model.rope_original_max_position_embeddings / rope_scaling.original_max_position_embeddings",
                 m.rope_original_max_position_embeddings, r.original_max_position_embeddings});
        }
        check_hf_import_dims(dims, config_path);
        // An untied config of a tied Llama is fine (the output layer starts as a copy of the embedding), not the
        // reverse.
        if (!m.untie_embeddings_and_output_weights && s.untied)
            throw UserError(fmt::format(
                "config error: model.untie_embeddings_and_output_weights is false in --config, but '{}' has "
                "\"tie_word_embeddings\": false (an output layer of its own)\n---> HINT: set "
                "model.untie_embeddings_and_output_weights: true",
                config_path));
    } else {
        m.arch = "llama";
        m.num_layers = s.L;
        m.hidden_size = s.C;
        m.num_attention_heads = s.NH;
        m.num_query_groups = s.NKV;
        m.ffn_hidden_size = s.F;
        m.seq_length = s.T;
        m.max_position_embeddings = s.T;
        m.layernorm_epsilon = s.eps;
        m.rotary_base = s.rope_theta;
        m.rope_scaling_factor = s.rope_scaling.factor;
        m.rope_low_freq_factor = s.rope_scaling.low_freq_factor;
        m.rope_high_freq_factor = s.rope_scaling.high_freq_factor;
        m.rope_original_max_position_embeddings = s.rope_scaling.original_max_position_embeddings;
        m.untie_embeddings_and_output_weights = s.untied;
    }
    m.vocab_size = s.V;
    s.Vp = static_cast<int>(padded_vocab_size(s.V, std::max(1, m.make_vocab_size_divisible_by), 1));
    return cfg;
}

// The Llama parameters of `weights` (F32/BF16/F16) in the whole model's flat layout (gpt_param_table(s)); rows >= V
// of the embedding and the output layer are zero. `tied`: config.json ties the output layer to the embedding, which
// an untied `s` then starts its output layer as.
std::vector<float> read_llama_params(const HfWeights& weights, const GptShape& s, bool tied,
                                     const std::string& config_path, Progress::Style progress) {
    const std::vector<ParamInfo> table = gpt_param_table(s);
    const std::regex rotary_buffer(R"(model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq)");
    for (const std::string& key : weights.names()) {
        if (std::regex_match(key, rotary_buffer)) continue;  // a buffer, not a parameter
        if (key == kOutput) continue;                        // checked below when the model is tied
        const bool known = std::any_of(table.begin(), table.end(), [&](const ParamInfo& p) { return p.name == key; });
        if (!known)
            hf_input_error(fmt::format(
                "'{}' holds the tensor '{}', which is not a parameter of the Llama that '{}' describes (Llama "
                "names: model.embed_tokens.weight, model.layers.<0..{}>.{{input_layernorm,self_attn.q_proj,"
                "self_attn.k_proj,self_attn.v_proj,self_attn.o_proj,post_attention_layernorm,mlp.gate_proj,"
                "mlp.up_proj,mlp.down_proj}}.weight, model.norm.weight, lm_head.weight)",
                weights.file(key).path(), key, config_path, s.L - 1));
    }
    std::vector<float> flat(static_cast<size_t>(table.back().offset + table.back().numel), 0.0f);
    std::vector<float> embedding;  // the output layer of a tied config.json
    const std::string needed_by = fmt::format("the Llama of '{}'", config_path), shaped_by = "'" + config_path + "'";
    Progress bar("convert: reading", static_cast<int64_t>(flat.size() * sizeof(float)), progress, "tensors");
    int64_t done = 0, tensors_read = 0;
    for (const ParamInfo& p : table) {
        std::vector<int64_t> want = p.global_shape;
        if (p.vocab_rows) want[0] = s.V;
        std::vector<float> data =
            p.name == kOutput && tied ? embedding : weights.read_f32(p.name, want, needed_by, shaped_by);
        std::copy(data.begin(), data.end(), flat.begin() + p.offset);  // vocabulary rows >= V stay 0
        done += p.numel * static_cast<int64_t>(sizeof(float));
        bar.update(done, ++tensors_read);
        if (p.name == embedding_weight_name(s)) embedding = std::move(data);
    }
    bar.finish();
    // A tied head saved twice must be the embedding.
    if (tied && weights.contains(kOutput) && weights.read_f32(kOutput, {s.V, s.C}, needed_by, shaped_by) != embedding)
        hf_input_error(
            fmt::format("'{}': 'lm_head.weight' differs from model.embed_tokens.weight, but '{}' has "
                        "\"tie_word_embeddings\": true\n---> HINT: set \"tie_word_embeddings\": false in config.json "
                        "if the output layer is a weight of its own",
                        weights.file(kOutput).path(), config_path));
    return flat;
}

}  // namespace

json hf_llama_config(const GptShape& s, std::optional<int32_t> eos_token_id) {
    const int64_t eos = eos_token_id ? *eos_token_id : s.V - 1;
    const RopeScaling& r = s.rope_scaling;
    const json scaling =
        r.factor == 0.0 ? json(nullptr)
                        : json{{"rope_type", "llama3"},
                               {"factor", r.factor},
                               {"low_freq_factor", r.low_freq_factor},
                               {"high_freq_factor", r.high_freq_factor},
                               {"original_max_position_embeddings", whole_or_real(r.original_max_position_embeddings)}};
    return {{"model_type", "llama"},
            {"architectures", {"LlamaForCausalLM"}},
            {"hidden_size", s.C},
            {"intermediate_size", s.F},
            {"num_hidden_layers", s.L},
            {"num_attention_heads", s.NH},
            {"num_key_value_heads", s.kv_heads()},
            {"head_dim", s.C / s.NH},
            {"max_position_embeddings", s.T},
            {"rms_norm_eps", decimal(s.eps)},
            {"rope_theta", s.rope_theta},
            {"rope_scaling", scaling},
            {"vocab_size", s.V},
            {"tie_word_embeddings", !s.untied},
            {"hidden_act", "silu"},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"mlp_bias", false},
            {"initializer_range", 0.02},
            {"pretraining_tp", 1},
            {"use_cache", true},
            {"bos_token_id", eos},
            {"eos_token_id", eos},
            {"torch_dtype", "float32"}};
}

GptShape hf_llama_shape(const json& c, const std::string& where) {
    if (!c.is_object()) hf_input_error(fmt::format("'{}' is not a JSON object", where));
    const std::string type = c.value("model_type", std::string());
    if (type != "llama")
        hf_input_error(
            fmt::format("'{}' has \"model_type\": \"{}\"; --from hf-llama imports Llama (\"llama\") models{}", where,
                        type, type == "gpt2" ? "\n---> HINT: import a GPT-2 with --from hf-gpt2" : ""));
    GptShape s;
    s.arch = ModelArch::kLlama;
    s.C = positive_int(c, "hidden_size", where);
    s.F = positive_int(c, "intermediate_size", where);
    s.L = positive_int(c, "num_hidden_layers", where);
    s.NH = positive_int(c, "num_attention_heads", where);
    s.T = positive_int(c, "max_position_embeddings", where);
    s.V = positive_int(c, "vocab_size", where);
    s.Vp = s.V;
    s.NKV = c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null()
                ? positive_int(c, "num_key_value_heads", where)
                : s.NH;
    s.eps = static_cast<float>(positive_number(c, "rms_norm_eps", 1e-6, where));  // LlamaConfig's default
    s.rope_theta = positive_number(c, "rope_theta", 10000.0, where);
    s.rope_scaling = rope_scaling(c, where);
    s.untied = !hf_bool(c, "tie_word_embeddings", false, where);  // LlamaConfig's default: untied
    if (s.C % s.NH != 0 || (s.C / s.NH) % 2 != 0)
        hf_input_error(fmt::format("'{}': hidden_size ({}) is not num_attention_heads ({}) times an even head size",
                                   where, s.C, s.NH));
    if (c.contains("head_dim") && !c["head_dim"].is_null() && positive_int(c, "head_dim", where) != s.C / s.NH)
        hf_input_error(
            fmt::format("'{}' has \"head_dim\": {}, but this Llama's heads are hidden_size / "
                        "num_attention_heads = {} wide",
                        where, c["head_dim"].dump(), s.C / s.NH));
    if (s.NH % s.NKV != 0)
        hf_input_error(
            fmt::format("'{}': num_key_value_heads ({}) does not divide num_attention_heads ({})", where, s.NKV, s.NH));
    const std::string act = c.value("hidden_act", std::string("silu"));
    if (act != "silu")
        hf_input_error(
            fmt::format("'{}' has \"hidden_act\": \"{}\"; this Llama computes SwiGLU with SiLU (\"silu\"), "
                        "so the imported model would compute something else",
                        where, act));
    for (const char* bias : {"attention_bias", "mlp_bias"})
        if (c.value(bias, false))
            hf_input_error(fmt::format("'{}' has \"{}\": true; this Llama has no biases", where, bias));
    if (c.value("pretraining_tp", 1) != 1)
        hf_input_error(fmt::format("'{}' has \"pretraining_tp\": {}; only 1 (the exact linear layers) is supported",
                                   where, c["pretraining_tp"].dump()));
    return s;
}

HfExport export_hf_llama(const CheckpointReader& r, const GptShape& s, const std::string& out_dir,
                         const HfExportOptions& o) {
    check_hf_export_arch(r, "hf-llama");
    const auto to_hf = [&](const ParamInfo& p, CanonicalTensor& t) {
        if (!p.vocab_rows) return;  // every other weight is Linear's (out, in) already
        t.shape[0] = s.V;           // drop the padded rows
        t.data.resize(static_cast<size_t>(s.V) * static_cast<size_t>(s.C));
    };
    return write_hf_dir(r, gpt_param_table(s), to_hf, hf_llama_config(s, o.eos_token_id), out_dir, o);
}

std::string import_hf_llama(const std::string& hf_dir, const Config* cfg_in, const std::string& save_dir,
                            Progress::Style progress) {
    const std::string config_path = (fs::path(hf_dir) / kHfConfigFile).string();
    GptShape s = hf_llama_shape(read_hf_config(hf_dir, kModel), config_path);
    const GptShape hf_shape = s;
    const Config cfg = import_config(cfg_in, s, config_path);  // sets s.Vp
    Config whole = cfg;  // the checkpoint is one whole model, whatever layout the config trains with
    whole.parallel = ParallelConfig{};
    s = make_run_layout(whole, 1).shape;  // the model the checkpoint's config describes
    const HfWeights weights = HfWeights::open(hf_dir, kModel);
    const bool tied = !hf_shape.untied;
    const std::vector<float> flat = read_llama_params(weights, s, tied, config_path, progress);
    const std::string dir = commit_hf_import(hf_dir, "hf-llama", kModel, weights, cfg, s, flat, save_dir, progress);
    log_info(
        "convert: imported {} ({} layers, hidden {}, {} heads, {} key/value heads, ffn {}, {} positions, rope theta "
        "{}{}, vocabulary {} padded to {}{}; {}; {}) into {}",
        hf_dir, s.L, s.C, s.NH, s.kv_heads(), s.F, s.T, s.rope_theta,
        s.rope_scaling.factor != 0.0 ? fmt::format(" scaled x{} (llama3)", s.rope_scaling.factor) : "", s.V, s.Vp,
        tied ? (s.untied ? "; the tied output layer copied from the embedding" : "; tied output layer") : "",
        weights.dtypes(), weights.describe(), dir);
    return dir;
}

}  // namespace ms
