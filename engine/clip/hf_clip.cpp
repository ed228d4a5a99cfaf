// hf_clip.cpp: the Hugging Face CLIPModel export (hf_clip.h).
#include "engine/clip/hf_clip.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <numeric>

#include "engine/ckpt/atomic_dir.h"
#include "engine/ckpt/safetensors.h"
#include "engine/core/check.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kHiddenAct = "gelu_new";
constexpr int kBosTokenId = 0;

// A float as its shortest decimal (1e-05, not the float's 9.99999974e-06), so config.json holds the value set.
double shortest(float x) { return std::stod(fmt::format("{}", x)); }

// The names and whole shapes of a CLIP model of shape `s` (ClipModel's table at tp = 1).
std::map<std::string, std::vector<int64_t>> expected_shapes(const ClipShape& s) {
    std::map<std::string, std::vector<int64_t>> out;
    for (const ParamInfo& p : clip_param_table(s, 1)) out[p.name] = p.global_shape;
    return out;
}

std::string describe(const ClipShape& s) {
    const GptShape &v = s.vision, &t = s.text;
    return fmt::format(
        "the CLIP model the clip section describes (embed_dim {}; image tower: {} layers of width {}, {} heads, MLP "
        "{}, image {} in patches of {}; text tower: {} layers of width {}, {} heads, MLP {}, context {})",
        s.embed_dim, v.L, v.C, v.NH, v.F, v.image, v.patch, t.L, t.C, t.NH, t.F, t.T);
}

[[noreturn]] void table_error(const ClipShape& s, const std::string& what) {
    throw UserError(
        fmt::format("config error: the model to export is not {}: {}\n---> HINT: export with the clip "
                    "section the model was trained with",
                    describe(s), what));
}

void check_table(const ClipShape& s, const std::vector<ParamInfo>& table) {
    const std::map<std::string, std::vector<int64_t>> want = expected_shapes(s);
    std::map<std::string, int> seen;
    for (const ParamInfo& p : table) {
        const auto it = want.find(p.name);
        if (it == want.end())
            table_error(s, fmt::format("it holds the tensor '{}', which that model does not have", p.name));
        if (++seen[p.name] > 1) table_error(s, fmt::format("it holds the tensor '{}' twice", p.name));
        if (p.global_shape != it->second)
            table_error(s, fmt::format("its tensor '{}' has shape {} where that model's has {}", p.name,
                                       hf_shape_str(p.global_shape), hf_shape_str(it->second)));
    }
    for (const auto& [name, shape] : want)
        if (!seen.count(name))
            table_error(s, fmt::format("it lacks the tensor '{}' (shape {})", name, hf_shape_str(shape)));
}

// The file's shape of a tensor whose data is ours (global_shape): the same bytes.
std::vector<int64_t> hf_shape(const ClipShape& s, const ParamInfo& p) {
    if (p.name == "vision_model.embeddings.class_embedding") return {s.vision.C};
    if (p.name == "vision_model.embeddings.patch_embedding.weight")
        return {s.vision.C, 3, s.vision.patch, s.vision.patch};
    if (p.name == "logit_scale") return {};
    return p.global_shape;
}

}  // namespace

ClipTensorSource clip_flat_tensors(const float* params) {
    return [params](const ParamInfo& p) {
        MS_CHECK(p.shape == p.global_shape, "clip_flat_tensors: '{}' is a shard {} of {}: export needs tp = 1", p.name,
                 hf_shape_str(p.shape), hf_shape_str(p.global_shape));
        return std::vector<float>(params + p.offset, params + p.offset + p.numel);
    };
}

json hf_clip_config(const ClipShape& s) {
    MS_CHECK(s.vision.eps == s.text.eps, "hf_clip_config: the towers' LayerNorm eps differ ({} and {})", s.vision.eps,
             s.text.eps);
    const double eps = shortest(s.vision.eps);
    const json text = {{"model_type", "clip_text_model"},
                       {"vocab_size", kClipTextVocab},
                       {"hidden_size", s.text.C},
                       {"intermediate_size", s.text.F},
                       {"num_hidden_layers", s.text.L},
                       {"num_attention_heads", s.text.NH},
                       {"max_position_embeddings", s.text.T},
                       {"projection_dim", s.embed_dim},
                       {"hidden_act", kHiddenAct},
                       {"layer_norm_eps", eps},
                       {"attention_dropout", 0.0},
                       {"dropout", 0.0},
                       {"bos_token_id", kBosTokenId},
                       {"eos_token_id", kClipEndOfText},
                       {"pad_token_id", kClipPad}};
    const json vision = {{"model_type", "clip_vision_model"},
                         {"hidden_size", s.vision.C},
                         {"intermediate_size", s.vision.F},
                         {"num_hidden_layers", s.vision.L},
                         {"num_attention_heads", s.vision.NH},
                         {"image_size", s.vision.image},
                         {"patch_size", s.vision.patch},
                         {"num_channels", 3},
                         {"projection_dim", s.embed_dim},
                         {"hidden_act", kHiddenAct},
                         {"layer_norm_eps", eps},
                         {"attention_dropout", 0.0},
                         {"dropout", 0.0}};
    return {{"model_type", "clip"},          {"architectures", {"CLIPModel"}},
            {"projection_dim", s.embed_dim}, {"logit_scale_init_value", shortest(s.init_logit_scale)},
            {"initializer_factor", 1.0},     {"text_config", text},
            {"vision_config", vision},       {"torch_dtype", "float32"}};
}

HfExport write_hf_clip(const ClipShape& shape, const std::vector<ParamInfo>& table, const ClipTensorSource& tensor,
                       const std::string& dir) {
    check_table(shape, table);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
        throw UserError(fmt::format("cannot create the output directory '{}': {}", dir, ec.message()), kExitCheckpoint);
    std::vector<std::vector<float>> data;  // alive for the writer
    std::vector<TensorEntry> entries;
    data.reserve(table.size());
    HfExport out;
    for (const ParamInfo& p : table) {
        const int64_t numel =
            std::accumulate(p.global_shape.begin(), p.global_shape.end(), int64_t{1}, std::multiplies<>());
        data.push_back(tensor(p));
        MS_CHECK(static_cast<int64_t>(data.back().size()) == numel,
                 "write_hf_clip: the source gave {} values for '{}' of shape {}", data.back().size(), p.name,
                 hf_shape_str(p.global_shape));
        entries.push_back({p.name, DType::kF32, hf_shape(shape, p), data.back().data()});
        out.params += numel;
    }
    write_safetensors((fs::path(dir) / kHfWeightsFile).string(), entries, {{"format", "pt"}});
    out.files.push_back(kHfWeightsFile);
    write_file_atomic((fs::path(dir) / kHfConfigFile).string(), hf_clip_config(shape).dump(2) + "\n");
    out.files.push_back(kHfConfigFile);
    return out;
}

}  // namespace ms
