// clip_shape.cpp: presets, the resolved shape and the caption tokens (clip_shape.h).
#include "engine/clip/clip_shape.h"

#include <algorithm>

#include "engine/core/check.h"
#include "engine/model/param_table.h"

namespace ms {
namespace {

struct Preset {
    int embed_dim, image_size, patch_size, vision_layers, vision_width, vision_heads;
    int context_length, text_layers, text_width, text_heads;
};

Preset preset(const std::string& name) {
    if (name == "tiny") return {64, 32, 8, 2, 64, 4, 48, 2, 64, 4};
    if (name == "vit-b16") return {512, 224, 16, 12, 768, 12, 77, 12, 512, 8};
    if (name == "vit-h14") return {1024, 224, 14, 32, 1280, 16, 77, 24, 1024, 16};
    return {};  // none: every key is set
}

int pick(int value, int from_preset, const char* key, const std::string& preset_name) {
    const int v = value > 0 ? value : from_preset;
    if (v <= 0)
        throw UserError(fmt::format("config error: clip.{} is 0 and clip.preset '{}' has none; hint: set clip.{}", key,
                                    preset_name, key));
    return v;
}

GptShape tower(ModelArch arch, int L, int C, int NH, int F, int T, int V, int proj) {
    GptShape s;
    s.arch = arch;
    s.L = L;
    s.C = C;
    s.NH = NH;
    s.F = F;
    s.T = T;
    s.V = V;
    s.Vp = V;
    s.proj = proj;
    return s;
}

}  // namespace

ClipShape resolve_clip_shape(const ClipConfig& c, int tp) {
    const Preset p = preset(c.preset);
    const std::string& n = c.preset;
    const int embed = pick(c.embed_dim, p.embed_dim, "embed_dim", n);
    const int image = pick(c.image_size, p.image_size, "image_size", n);
    const int patch = pick(c.patch_size, p.patch_size, "patch_size", n);
    const int vl = pick(c.vision_layers, p.vision_layers, "vision_layers", n);
    const int vw = pick(c.vision_width, p.vision_width, "vision_width", n);
    const int vh = pick(c.vision_heads, p.vision_heads, "vision_heads", n);
    const int ctx = pick(c.context_length, p.context_length, "context_length", n);
    const int tl = pick(c.text_layers, p.text_layers, "text_layers", n);
    const int tw = pick(c.text_width, p.text_width, "text_width", n);
    const int th = pick(c.text_heads, p.text_heads, "text_heads", n);
    const int vf = c.vision_mlp > 0 ? c.vision_mlp : 4 * vw;
    const int tf = c.text_mlp > 0 ? c.text_mlp : 4 * tw;
    auto fail = [](const std::string& msg) { throw UserError("config error: " + msg); };
    if (image % patch != 0)
        fail(
            fmt::format("clip.image_size({}) is not a multiple of clip.patch_size({}): the patches must tile the image",
                        image, patch));
    if (vw % vh != 0) fail(fmt::format("clip.vision_width({}) is not a multiple of clip.vision_heads({})", vw, vh));
    if (tw % th != 0) fail(fmt::format("clip.text_width({}) is not a multiple of clip.text_heads({})", tw, th));
    if (ctx < 2)
        fail(fmt::format("clip.context_length({}) holds no caption: at least 2 (a byte and end-of-text)", ctx));
    if (vh % tp != 0 || th % tp != 0 || vf % tp != 0 || tf % tp != 0)
        fail(
            fmt::format("parallel.tensor_model_parallel_size({}) must divide both towers' heads ({} and {}) and MLP "
                        "widths ({} and {})",
                        tp, vh, th, vf, tf));
    const int grid = image / patch;
    ClipShape s;
    s.vision = tower(ModelArch::kClipVision, vl, vw, vh, vf, grid * grid + 1, 2, embed);
    s.vision.image = image;
    s.vision.patch = patch;
    s.text = tower(ModelArch::kClipText, tl, tw, th, tf, ctx, kClipTextVocab, embed);
    s.fusion = tower(ModelArch::kClipFusion, c.cross_modal_layers, tw, th, tf, ctx, 0, 2);
    s.fusion.image = image;
    s.fusion.patch = patch;
    s.fusion.cross_C = vw;
    s.vision.states = s.text.states = s.cross_modal();
    s.embed_dim = embed;
    s.init_logit_scale = c.init_logit_scale;
    s.max_logit_scale = c.max_logit_scale;
    return s;
}

std::vector<ParamInfo> clip_param_table(const ClipShape& shape, int tp_size) {
    const auto next = [](const std::vector<ParamInfo>& t) {
        return (t.back().offset + t.back().numel + kParamAlign - 1) / kParamAlign * kParamAlign;
    };
    std::vector<ParamInfo> table = clip_tower_param_table(shape.vision, tp_size);
    const auto append = [&](const GptShape& tower) {
        const int64_t base = next(table);
        for (ParamInfo p : clip_tower_param_table(tower, tp_size)) {
            p.offset += base;
            table.push_back(std::move(p));
        }
    };
    append(shape.text);
    ParamInfo scale;
    scale.name = "logit_scale";
    scale.shape = scale.global_shape = {1};
    scale.offset = next(table);
    scale.numel = 1;
    scale.init_value = shape.init_logit_scale;
    table.push_back(std::move(scale));
    if (shape.cross_modal()) append(shape.fusion);
    return table;
}

int clip_tokenize(const std::string& caption, int context_length, int32_t* out) {
    const int n = std::min<int>(static_cast<int>(caption.size()), context_length - 1);
    for (int i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(caption[static_cast<size_t>(i)]);
    out[n] = kClipEndOfText;
    std::fill(out + n + 1, out + context_length, kClipPad);
    return n;
}

}  // namespace ms
