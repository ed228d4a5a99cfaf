// clip_shape.h: the shape of a CLIP model (model.arch: clip): its two towers as chunk shapes (gpt.h's GptShape with
// arch kClipVision / kClipText, built by engine/model/clip_tower.cpp) and the logit scale, resolved once from the
// config's clip: section and its preset.
#pragma once

#include <string>

#include "engine/config/config.h"
#include "engine/model/gpt.h"

namespace ms {

// Captions are byte-level: ids 0..255 are bytes, kClipEndOfText ends the caption (the row the text tower pools), and
// the rows after it hold kClipPad, which the causal mask keeps from the end-of-text row.
inline constexpr int kClipTextVocab = 257;
inline constexpr int kClipEndOfText = 256;
inline constexpr int kClipPad = 0;

struct ClipShape {
    GptShape vision;  // T = (image / patch)^2 + 1 rows, V = 2 (the class-token lookup, clip_tower.cpp)
    GptShape text;    // T = context_length, V = kClipTextVocab
    // The cross-modal layers (clip.cross_modal_layers; L = 0: none): the text tower's width, heads and MLP, T text
    // rows per pair, keys and values from the image tower's rows (cross_C = its width), proj = 2 matching logits.
    // With them both towers output their normed rows (GptShape::states).
    GptShape fusion;
    int embed_dim = 0;
    float init_logit_scale = 0;
    float max_logit_scale = 0;
    int image_size() const { return vision.image; }
    int patches() const { return vision.T - 1; }
    bool cross_modal() const { return fusion.L > 0; }
};

// From cfg.clip (its preset filling the keys left at 0). Throws UserError naming the key for a shape that cannot be
// built: a width the heads do not divide, an image the patch does not tile, a tensor-parallel size that does not
// divide both towers' heads and MLPs.
ClipShape resolve_clip_shape(const ClipConfig& cfg, int tp = 1);

// The whole model's parameter table as tensor-parallel rank of tp_size holds it: the image tower's (clip_tower.cpp),
// then the text tower's, each from a 16-aligned offset, then "logit_scale" (1, replicated, no weight decay, starting
// at init_logit_scale), then with cross-modal layers theirs ("fusion.*", "itm_head.*"). ClipModel's flat buffers, the
// optimizer and the exports all read this one table.
std::vector<ParamInfo> clip_param_table(const ClipShape& shape, int tp_size);

// Caption -> context_length token ids: its bytes (cut to context_length - 1), kClipEndOfText, then kClipPad. Returns
// the end-of-text position.
int clip_tokenize(const std::string& caption, int context_length, int32_t* out);

}  // namespace ms
