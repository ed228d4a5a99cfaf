// clip_checkpoint.cpp: CLIP's CheckpointModel, its shape read back from a manifest, and the export of a CLIP
// checkpoint (clip_checkpoint.h).
#include "engine/clip/clip_checkpoint.h"

#include <fmt/format.h>

#include "engine/ckpt/atomic_dir.h"
#include "engine/clip/hf_clip.h"
#include "engine/core/check.h"
#include "engine/core/log.h"

namespace ms {
namespace {

using nlohmann::json;

// The manifest's keys: the clip: section's shape keys, written from and read into a ClipConfig by this one table.
struct IntKey {
    const char* key;
    int ClipConfig::*member;
};
constexpr IntKey kIntKeys[] = {
    {"embed_dim", &ClipConfig::embed_dim},       {"image_size", &ClipConfig::image_size},
    {"patch_size", &ClipConfig::patch_size},     {"vision_layers", &ClipConfig::vision_layers},
    {"vision_width", &ClipConfig::vision_width}, {"vision_heads", &ClipConfig::vision_heads},
    {"vision_mlp", &ClipConfig::vision_mlp},     {"context_length", &ClipConfig::context_length},
    {"text_layers", &ClipConfig::text_layers},   {"text_width", &ClipConfig::text_width},
    {"text_heads", &ClipConfig::text_heads},     {"text_mlp", &ClipConfig::text_mlp}};
struct FloatKey {
    const char* key;
    float ClipConfig::*member;
};
constexpr FloatKey kFloatKeys[] = {{"init_logit_scale", &ClipConfig::init_logit_scale},
                                   {"max_logit_scale", &ClipConfig::max_logit_scale}};

// Written by every save; a checkpoint without it has no cross-modal layers.
constexpr const char* kCrossModalKey = "cross_modal_layers";

// The clip: section that resolves to `s` with every shape key set (preset none).
ClipConfig resolved_config(const ClipShape& s) {
    ClipConfig c;
    c.preset = "none";
    c.embed_dim = s.embed_dim;
    c.image_size = s.image_size();
    c.patch_size = s.vision.patch;
    c.vision_layers = s.vision.L;
    c.vision_width = s.vision.C;
    c.vision_heads = s.vision.NH;
    c.vision_mlp = s.vision.F;
    c.context_length = s.text.T;
    c.text_layers = s.text.L;
    c.text_width = s.text.C;
    c.text_heads = s.text.NH;
    c.text_mlp = s.text.F;
    c.init_logit_scale = s.init_logit_scale;
    c.max_logit_scale = s.max_logit_scale;
    c.cross_modal_layers = s.fusion.L;
    return c;
}

[[noreturn]] void fail(const std::string& msg) { throw UserError("checkpoint error: " + msg, kExitCheckpoint); }

}  // namespace

CheckpointModel clip_checkpoint_model(const ClipShape& shape) {
    const ClipConfig c = resolved_config(shape);
    json m = {{"arch", "clip"}};
    for (const IntKey& k : kIntKeys) m[k.key] = c.*k.member;
    for (const FloatKey& k : kFloatKeys) m[k.key] = c.*k.member;
    m[kCrossModalKey] = c.cross_modal_layers;
    m["vocab_size"] = shape.text.V;
    return {.whole_table = clip_param_table(shape, 1), .manifest = std::move(m), .vocab_size = shape.text.V};
}

ClipShape clip_checkpoint_shape(const CheckpointReader& r) {
    const json& m = r.manifest().at("model");  // the reader requires it
    const std::string where = fmt::format("'{}/{}'", r.dir(), kManifestFile);
    const std::string arch = m.value("arch", "gpt");  // checkpoints before Llama name no arch: GPT-2
    if (arch != "clip")
        throw UserError(fmt::format(
            "config error: '{}' holds a model of arch {} (model.arch {}), not a CLIP model\n---> HINT: pass a "
            "checkpoint of a model.arch clip run",
            r.dir(), arch, arch));
    ClipConfig c;
    c.preset = "none";
    for (const IntKey& k : kIntKeys) {
        if (!m.contains(k.key) || !m[k.key].is_number_integer())
            fail(
                fmt::format("{} has no integer \"model\": {{\"{}\": ...}}; it is not a mindspeed-train CLIP "
                            "checkpoint of format version {}",
                            where, k.key, kCheckpointFormatVersion));
        c.*k.member = m[k.key].get<int>();
    }
    for (const FloatKey& k : kFloatKeys) {
        if (!m.contains(k.key) || !m[k.key].is_number())
            fail(
                fmt::format("{} has no number \"model\": {{\"{}\": ...}}; it is not a mindspeed-train CLIP "
                            "checkpoint of format version {}",
                            where, k.key, kCheckpointFormatVersion));
        c.*k.member = m[k.key].get<float>();
    }
    if (m.contains(kCrossModalKey)) {
        if (!m[kCrossModalKey].is_number_integer())
            fail(fmt::format("{}: \"model\": {{\"{}\"}} is not an integer", where, kCrossModalKey));
        c.cross_modal_layers = m[kCrossModalKey].get<int>();
    }
    ClipShape shape;
    try {
        shape = resolve_clip_shape(c, 1);
    } catch (const UserError& e) {
        fail(fmt::format("{} describes a CLIP model that cannot be built ({}): {}", where, m.dump(), e.what()));
    }
    check_checkpoint_shape(r, clip_checkpoint_model(shape),
                           fmt::format("the model its manifest describes ({})", m.dump()),
                           "the checkpoint's files disagree with its manifest: re-save it");
    return shape;
}

HfExport export_hf_clip(const CheckpointReader& r, const ClipShape& shape, const std::string& dir) {
    ClipShape towers = shape;  // CLIPModel has no cross-modal layers: the towers and the logit scale alone
    towers.fusion.L = 0;
    towers.vision.states = towers.text.states = false;
    if (shape.cross_modal())
        log_warn(
            "convert: CLIPModel has no cross-modal layers: the {} layers and the matching head of '{}' are not "
            "exported (the towers and logit_scale are)",
            shape.fusion.L, r.dir());
    return write_hf_clip(
        towers, clip_param_table(towers, 1), [&](const ParamInfo& p) { return r.tensor(p.name).data; }, dir);
}

}  // namespace ms
