// hf_gpt2.cpp: Hugging Face GPT-2 export and import (hf_gpt2.h).
#include "engine/ckpt/hf_gpt2.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <regex>
#include <set>

#include "engine/ckpt/atomic_dir.h"
#include "engine/ckpt/checkpoint_model.h"
#include "engine/ckpt/safetensors.h"
#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/optim/adamw.h"
#include "engine/train/run_layout.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

[[noreturn]] void input_error(const std::string& msg) { throw UserError("input error: " + msg, kExitConfigError); }

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

// IEEE half -> float, exactly (every half is a float).
float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (mant << 13);  // inf / nan
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        int e = -1;
        do {
            ++e;
            mant <<= 1;
        } while ((mant & 0x400) == 0);
        bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3FF) << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// A tensor of an HF file as fp32 (the data may be unaligned: files from other writers).
std::vector<float> read_as_f32(const SafetensorsFile& f, const std::string& key) {
    const TensorInfo& info = f.info(key);
    const std::byte* p = f.data(key);
    const size_t n = static_cast<size_t>(info.numel());
    std::vector<float> out(n);
    if (info.dtype_name == "F32") {
        if (n) std::memcpy(out.data(), p, n * sizeof(float));
    } else if (info.dtype_name == "BF16" || info.dtype_name == "F16") {
        const bool bf16 = info.dtype_name == "BF16";
        for (size_t i = 0; i < n; ++i) {
            uint16_t h;
            std::memcpy(&h, p + 2 * i, 2);
            if (bf16) {
                const uint32_t bits = static_cast<uint32_t>(h) << 16;
                std::memcpy(&out[i], &bits, sizeof(float));
            } else {
                out[i] = half_to_float(h);
            }
        }
    } else {
        input_error(fmt::format("'{}', tensor '{}' is {}; GPT-2 weights are imported from F32, BF16 or F16", f.path(),
                                key, info.dtype_name));
    }
    return out;
}

int positive_int(const json& config, const char* key, const std::string& where) {
    const auto it = config.find(key);
    if (it == config.end() || !it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > (1 << 30))
        input_error(
            fmt::format("'{}' has {} for \"{}\", not a positive integer\n---> HINT: a GPT-2 config.json gives "
                        "n_embd, n_layer, n_head, n_positions and vocab_size",
                        where, it == config.end() ? std::string("nothing") : it->dump(), key));
    return it->get<int>();
}

std::string shape_str(const std::vector<int64_t>& s) { return json(s).dump(); }

// A file of the Hugging Face directory <hf_dir> that must exist.
void require_input_file(const std::string& path, const std::string& hf_dir) {
    if (fs::is_regular_file(path)) return;
    const bool pickle =
        path.ends_with(kHfWeightsFile) && (fs::exists(fs::path(hf_dir) / "pytorch_model.bin") ||
                                           fs::exists(fs::path(hf_dir) / "pytorch_model.bin.index.json"));
    input_error(
        fmt::format("'{}' does not exist{}\n---> HINT: --load takes a Hugging Face GPT-2 directory holding config.json "
                    "and model.safetensors, or model.safetensors.index.json and the shards it names (what "
                    "save_pretrained writes){}",
                    path, fs::is_directory(hf_dir) ? "" : fmt::format(" ('{}' is not a directory)", hf_dir),
                    pickle ? "; this one has only pytorch_model.bin, a pickle: convert it to safetensors "
                             "first (model.save_pretrained(dir, safe_serialization=True))"
                           : ""));
}

SafetensorsFile open_input(const std::string& path) {
    try {
        return SafetensorsFile::open(path);
    } catch (const UserError& e) {  // the input data is bad, not one of our checkpoints
        throw UserError(e.what(), kExitConfigError);
    }
}

// The tensors of a Hugging Face directory: model.safetensors alone, or the shards model.safetensors.index.json
// ({"metadata": {...}, "weight_map": {tensor: shard file}}) names, each tensor read from the shard the index puts
// it in. `where` names the whole (the file, or the index) in messages about the set of tensors.
class HfWeights {
  public:
    static HfWeights single(const std::string& path) {
        HfWeights w;
        w.where_ = path;
        w.files_.push_back(open_input(path));
        for (const std::string& key : w.files_[0].names()) w.file_of_[key] = 0;
        return w;
    }

    static HfWeights sharded(const fs::path& index_path) {
        HfWeights w;
        w.where_ = index_path.string();
        w.sharded_ = true;
        const std::string hint =
            "\n---> HINT: model.safetensors.index.json is {\"metadata\": {\"total_size\": BYTES}, \"weight_map\": "
            "{\"TENSOR\": \"model-00001-of-00002.safetensors\", ...}}, as save_pretrained writes it";
        std::ifstream in(index_path, std::ios::binary);
        const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        // JSON objects may repeat a key; the parser would keep the last silently, so a repeat is caught here.
        std::string repeated;
        std::vector<std::set<std::string>> keys;
        const json::parser_callback_t on_event = [&](int, json::parse_event_t event, json& parsed) {
            if (event == json::parse_event_t::object_start) keys.emplace_back();
            if (event == json::parse_event_t::object_end) keys.pop_back();
            if (event == json::parse_event_t::key && !keys.back().insert(parsed.get<std::string>()).second &&
                repeated.empty())
                repeated = parsed.get<std::string>();
            return true;
        };
        json index;
        try {
            index = json::parse(text, on_event);
        } catch (const json::exception& e) {
            input_error(fmt::format("'{}' is not valid JSON ({}){}", w.where_, e.what(), hint));
        }
        if (!repeated.empty()) input_error(fmt::format("'{}' names '{}' twice{}", w.where_, repeated, hint));
        if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object() ||
            index["weight_map"].empty())
            input_error(
                fmt::format("'{}' has no \"weight_map\" object of tensor names and shard files{}", w.where_, hint));
        std::map<std::string, std::vector<std::string>> tensors_of;  // shard file -> the tensors the index puts there
        for (const auto& [key, file] : index["weight_map"].items()) {
            if (!file.is_string() || file.get<std::string>().empty() ||
                file.get<std::string>().find('/') != std::string::npos)
                input_error(fmt::format("'{}' puts the tensor '{}' in {}, not a file name in its directory{}", w.where_,
                                        key, file.dump(), hint));
            tensors_of[file.get<std::string>()].push_back(key);
        }
        for (const auto& [name, tensors] : tensors_of) {
            const fs::path path = index_path.parent_path() / name;
            if (!fs::is_regular_file(path))
                input_error(fmt::format("'{}' does not exist, but '{}' puts {} tensor(s) in it ('{}'{})", path.string(),
                                        w.where_, tensors.size(), tensors.front(), tensors.size() > 1 ? ", ..." : ""));
            w.files_.push_back(open_input(path.string()));
        }
        // Every tensor in exactly the shard the index names.
        size_t i = 0;
        for (const auto& [name, tensors] : tensors_of) {
            const SafetensorsFile& f = w.files_[i];
            for (const std::string& key : tensors) {
                if (!f.contains(key))
                    input_error(fmt::format("'{}' puts the tensor '{}' in '{}', which has no such tensor", w.where_,
                                            key, f.path()));
                w.file_of_[key] = i;
            }
            ++i;
        }
        for (size_t j = 0; j < w.files_.size(); ++j) {
            for (const std::string& key : w.files_[j].names()) {
                const auto it = w.file_of_.find(key);
                if (it == w.file_of_.end())
                    input_error(fmt::format("'{}' holds the tensor '{}', which '{}' does not list", w.files_[j].path(),
                                            key, w.where_));
                if (it->second != j)
                    input_error(
                        fmt::format("the tensor '{}' is in two places: '{}' and '{}' (the index '{}' names "
                                    "the second)",
                                    key, w.files_[j].path(), w.files_[it->second].path(), w.where_));
            }
        }
        return w;
    }

    // <hf_dir>/model.safetensors, else <hf_dir>/model.safetensors.index.json and its shards (transformers' order).
    static HfWeights open(const std::string& hf_dir) {
        const fs::path single_path = fs::path(hf_dir) / kHfWeightsFile, index_path = fs::path(hf_dir) / kHfIndexFile;
        if (!fs::exists(single_path) && fs::is_regular_file(index_path)) return sharded(index_path);
        require_input_file(single_path.string(), hf_dir);
        return single(single_path.string());
    }

    const std::string& where() const { return where_; }
    bool sharded() const { return sharded_; }
    // The dtypes of the tensors, as the files name them: "F32", "BF16, F32", ...
    std::string dtypes() const {
        std::string out;
        for (const auto& [key, i] : file_of_) {
            const std::string& dtype = files_[i].info(key).dtype_name;
            if (out.find(dtype) == std::string::npos) out += (out.empty() ? "" : ", ") + dtype;
        }
        return out;
    }
    std::vector<std::string> names() const {  // sorted
        std::vector<std::string> out;
        for (const auto& [key, i] : file_of_) out.push_back(key);
        return out;
    }
    const SafetensorsFile& file(const std::string& key) const { return files_[file_of_.at(key)]; }
    size_t num_files() const { return files_.size(); }

  private:
    std::string where_;
    bool sharded_ = false;
    std::vector<SafetensorsFile> files_;
    std::map<std::string, size_t> file_of_;  // tensor -> index into files_
};

// The run config of the imported checkpoint: --config's (`cfg_in`), whose model dims must be config.json's, or the
// defaults with config.json's dims. Sets s.Vp: the vocabulary padded as the config pads it.
Config import_config(const Config* cfg_in, GptShape& s, const std::string& config_path) {
    Config cfg = cfg_in ? *cfg_in : Config{};
    ModelConfig& m = cfg.model;
    if (cfg_in) {
        const int ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * m.hidden_size;
        const int positions = m.max_position_embeddings > 0 ? m.max_position_embeddings : m.seq_length;
        const std::pair<std::string, std::array<double, 2>> dims[] = {
            {"model.num_layers / n_layer", {double(m.num_layers), double(s.L)}},
            {"model.hidden_size / n_embd", {double(m.hidden_size), double(s.C)}},
            {"model.num_attention_heads / n_head", {double(m.num_attention_heads), double(s.NH)}},
            {"model.ffn_hidden_size (0: 4 * hidden_size) / n_inner", {double(ffn), double(s.F)}},
            {"model.max_position_embeddings (0: seq_length) / n_positions", {double(positions), double(s.T)}},
            {"model.vocab_size / vocab_size", {double(m.vocab_size == 0 ? s.V : m.vocab_size), double(s.V)}},
            {"model.layernorm_epsilon / layer_norm_epsilon", {double(m.layernorm_epsilon), double(s.eps)}}};
        for (const auto& [name, v] : dims)
            if (v[0] != v[1])
                throw UserError(
                    fmt::format("config error: {} is {} in --config but {} in '{}'\n---> HINT: set the "
                                "model section of the config to the imported model's dims",
                                name, v[0], v[1], config_path));
    } else {
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
        if (name == "lm_head.weight") {
            lm_head_key = key;
            continue;
        }
        const bool known = std::any_of(table.begin(), table.end(), [&](const ParamInfo& p) { return p.name == name; });
        if (!known)
            input_error(
                fmt::format("'{}' holds the tensor '{}', which is not a parameter of the GPT-2 that '{}' "
                            "describes (GPT-2 names: wte.weight, wpe.weight, h.<0..{}>.{{ln_1,attn.c_attn,"
                            "attn.c_proj,ln_2,mlp.c_fc,mlp.c_proj}}.{{weight,bias}}, ln_f.{{weight,bias}}, "
                            "optionally prefixed with 'transformer.')",
                            weights.file(key).path(), key, config_path, s.L - 1));
        if (key_of.count(name))
            input_error(fmt::format("'{}' holds '{}' twice: as '{}' and as '{}'", where, name, key_of[name], key));
        key_of[name] = key;
    }
    std::vector<float> flat(static_cast<size_t>(table.back().offset + table.back().numel), 0.0f);
    std::vector<float> wte;  // kept for the tied-head check
    Progress bar("convert: reading", static_cast<int64_t>(flat.size() * sizeof(float)), progress, "tensors");
    int64_t done = 0, tensors_read = 0;
    for (const ParamInfo& p : table) {
        const auto it = key_of.find(p.name);
        std::vector<int64_t> want = p.global_shape;  // in the file's orientation
        if (p.name == "wte.weight") want[0] = s.V;
        if (is_conv1d(p.name)) std::swap(want[0], want[1]);
        if (it == key_of.end())
            input_error(fmt::format("'{}' has no tensor '{}' (shape {}), which the GPT-2 of '{}' needs", where, p.name,
                                    shape_str(want), config_path));
        const SafetensorsFile& file = weights.file(it->second);
        const std::vector<int64_t>& got = file.info(it->second).shape;
        if (got != want)
            input_error(fmt::format("'{}': tensor '{}' has shape {}, but '{}' makes it {}", file.path(), it->second,
                                    shape_str(got), config_path, shape_str(want)));
        std::vector<float> data = read_as_f32(file, it->second);
        if (is_conv1d(p.name)) data = transpose(data.data(), want[0], want[1]);
        std::copy(data.begin(), data.end(), flat.begin() + p.offset);  // wte: rows >= V stay 0
        done += p.numel * static_cast<int64_t>(sizeof(float));
        bar.update(done, ++tensors_read);
        if (p.name == "wte.weight") wte = std::move(data);
    }
    bar.finish();
    if (!lm_head_key.empty()) {
        const SafetensorsFile& file = weights.file(lm_head_key);
        const std::vector<int64_t> want = {s.V, s.C};
        if (file.info(lm_head_key).shape != want || read_as_f32(file, lm_head_key) != wte)
            input_error(
                fmt::format("'{}': '{}' differs from wte.weight: the output head is untied, which this GPT-2 "
                            "does not support (its head is wte)\n---> HINT: only GPT-2 models with tied "
                            "embeddings (all of OpenAI's) can be imported",
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
            {"tie_word_embeddings", true},
            {"use_cache", true},
            {"bos_token_id", eos},
            {"eos_token_id", eos},
            {"torch_dtype", "float32"}};
}

GptShape hf_gpt2_shape(const json& c, const std::string& where) {
    if (!c.is_object()) input_error(fmt::format("'{}' is not a JSON object", where));
    const std::string type = c.value("model_type", std::string("gpt2"));
    if (type != "gpt2")
        input_error(
            fmt::format("'{}' has \"model_type\": \"{}\"; only GPT-2 (\"gpt2\") models can be imported", where, type));
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
        input_error(fmt::format("'{}' has \"layer_norm_epsilon\": {}, not a positive number", where, eps.dump()));
    s.eps = eps.get<float>();
    if (s.C % s.NH != 0)
        input_error(fmt::format("'{}': n_embd ({}) is not a multiple of n_head ({})", where, s.C, s.NH));
    // tanh-approximated GELU is what this model computes; transformers' "gelu_new" and "gelu_pytorch_tanh" are it
    const std::string act = c.value("activation_function", std::string("gelu_new"));
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
        input_error(
            fmt::format("'{}' has \"activation_function\": \"{}\"; this GPT-2 computes the tanh-approximated "
                        "GELU (\"gelu_new\" or \"gelu_pytorch_tanh\"), so the imported model would compute "
                        "something else",
                        where, act));
    if (!c.value("tie_word_embeddings", true))
        input_error(
            fmt::format("'{}' has \"tie_word_embeddings\": false; untied output heads are not supported "
                        "(the head is wte)",
                        where));
    if (c.value("scale_attn_by_inverse_layer_idx", false) || !c.value("scale_attn_weights", true))
        input_error(
            fmt::format("'{}' changes the attention scaling (scale_attn_weights / "
                        "scale_attn_by_inverse_layer_idx); only GPT-2's 1/sqrt(head size) is supported",
                        where));
    return s;
}

std::vector<std::vector<size_t>> plan_hf_shards(const std::vector<int64_t>& nbytes, int64_t max_shard_bytes) {
    std::vector<std::vector<size_t>> shards;
    std::vector<size_t> open;  // the shard being filled
    int64_t used = 0;
    for (size_t i = 0; i < nbytes.size(); ++i) {
        if (nbytes[i] > max_shard_bytes) {  // alone, and the open shard stays open
            shards.push_back({i});
            continue;
        }
        if (nbytes[i] > max_shard_bytes - used) {
            shards.push_back(std::move(open));
            open.clear();
            used = 0;
        }
        open.push_back(i);
        used += nbytes[i];
    }
    if (!open.empty()) shards.push_back(std::move(open));
    return shards;
}

std::string hf_shard_name(size_t i, size_t n) { return fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, n); }

HfExport export_hf_gpt2(const CheckpointReader& r, const GptShape& s, const std::string& out_dir,
                        const HfExportOptions& o) {
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec)
        throw UserError(fmt::format("cannot create the output directory '{}': {}", out_dir, ec.message()),
                        kExitCheckpoint);
    const std::vector<ParamInfo> table = gpt_param_table(s);
    int64_t total_bytes = 0;
    for (const ParamInfo& p : table) total_bytes += p.numel * static_cast<int64_t>(sizeof(float));
    Progress bar("convert: reading", total_bytes, o.progress, "tensors");
    std::vector<CanonicalTensor> tensors;  // HF layout; kept alive for the writer
    HfExport out;
    int64_t done = 0;
    for (const ParamInfo& p : table) {
        CanonicalTensor t = r.tensor(p.name);
        t.shape = p.global_shape;  // c_attn comes as its (3, C, C) view: the same bytes
        if (p.name == "wte.weight") {
            t.shape[0] = s.V;  // drop the padded rows
            t.data.resize(static_cast<size_t>(s.V) * static_cast<size_t>(s.C));
        } else if (is_conv1d(p.name)) {
            t.data = transpose(t.data.data(), t.shape[0], t.shape[1]);
            std::swap(t.shape[0], t.shape[1]);
        }
        tensors.push_back(std::move(t));
        done += p.numel * static_cast<int64_t>(sizeof(float));
        bar.update(done, static_cast<int64_t>(tensors.size()));
    }
    bar.finish();
    std::vector<int64_t> nbytes;
    for (const CanonicalTensor& t : tensors) nbytes.push_back(static_cast<int64_t>(t.data.size() * sizeof(float)));
    const int64_t hf_bytes = std::accumulate(nbytes.begin(), nbytes.end(), int64_t{0});  // wte unpadded
    out.params = hf_bytes / static_cast<int64_t>(sizeof(float));
    const std::vector<std::vector<size_t>> shards =
        plan_hf_shards(nbytes, o.max_shard_bytes > 0 ? o.max_shard_bytes : std::numeric_limits<int64_t>::max());
    json weight_map = json::object();
    Progress written("convert: writing", hf_bytes, o.progress, "tensors");
    int64_t bytes_written = 0, tensors_written = 0;
    const auto on_written = [&](uint64_t n) {
        bytes_written += static_cast<int64_t>(n);
        written.update(bytes_written, ++tensors_written);
    };
    for (size_t k = 0; k < shards.size(); ++k) {
        const std::string name = shards.size() == 1 ? kHfWeightsFile : hf_shard_name(k, shards.size());
        std::vector<TensorEntry> entries;
        for (const size_t i : shards[k]) {
            const CanonicalTensor& t = tensors[i];
            entries.push_back({t.name, DType::kF32, t.shape, t.data.data()});
            weight_map[t.name] = name;
        }
        write_safetensors((fs::path(out_dir) / name).string(), entries, {{"format", "pt"}}, on_written);
        out.files.push_back(name);
    }
    written.finish();
    // One shard is model.safetensors without an index, as save_pretrained writes a model under its shard size.
    if (shards.size() > 1) {
        const json index = {{"metadata", {{"total_size", hf_bytes}}}, {"weight_map", weight_map}};
        write_file_atomic((fs::path(out_dir) / kHfIndexFile).string(), index.dump(2) + "\n");
        out.files.push_back(kHfIndexFile);
    }
    write_file_atomic((fs::path(out_dir) / kHfConfigFile).string(), hf_gpt2_config(s, o.eos_token_id).dump(2) + "\n");
    out.files.push_back(kHfConfigFile);
    return out;
}

std::string import_hf_gpt2(const std::string& hf_dir, const Config* cfg_in, const std::string& save_dir,
                           Progress::Style progress) {
    const std::string config_path = (fs::path(hf_dir) / kHfConfigFile).string();
    require_input_file(config_path, hf_dir);
    std::ifstream config_file(config_path);
    const json hf_config = json::parse(config_file, nullptr, /*allow_exceptions=*/false);
    if (hf_config.is_discarded()) input_error(fmt::format("'{}' is not valid JSON", config_path));
    GptShape s = hf_gpt2_shape(hf_config, config_path);
    const Config cfg = import_config(cfg_in, s, config_path);  // sets s.Vp
    const HfWeights weights = HfWeights::open(hf_dir);
    const std::vector<float> flat = read_gpt2_params(weights, s, config_path, progress);
    const std::string dtypes = weights.dtypes();

    TrainState state;  // iteration 0: nothing trained yet
    state.lr_decay_style = cfg.lr_schedule.lr_decay_style;
    state.lr = cfg.optimizer.lr;
    state.min_lr = cfg.optimizer.min_lr;
    state.lr_warmup_iters = cfg.lr_schedule.lr_warmup_iters;
    state.lr_decay_iters =
        cfg.lr_schedule.lr_decay_iters > 0 ? cfg.lr_schedule.lr_decay_iters : cfg.training.train_iters;
    state.last_lr = learning_rate(cfg.optimizer, cfg.lr_schedule, cfg.training.train_iters, 0);
    state.seed = cfg.run.seed;
    state.data_describe = "none: weights imported from the Hugging Face GPT-2 directory " + hf_dir;
    const json extra = {{"source", {{"format", "hf-gpt2"}, {"path", hf_dir}, {"dtype", dtypes}}},
                        {"optimizer_state", "none: a model-only checkpoint (imported weights)"}};
    const std::string dir = write_model_checkpoint(save_dir, cfg, s, flat.data(), state, extra, progress);
    log_info(
        "convert: imported {} ({} layers, hidden {}, {} heads, {} positions, vocabulary {} padded to {}; {}; {}) "
        "into {}",
        hf_dir, s.L, s.C, s.NH, s.T, s.V, s.Vp, dtypes,
        weights.sharded() ? fmt::format("{} shards", weights.num_files()) : std::string(kHfWeightsFile), dir);
    return dir;
}

}  // namespace ms
