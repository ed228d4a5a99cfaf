// tiny_clip.h: a tiny CLIP model on one rank for the model tests (tests/model/test_clip_*.cpp): its shape, resolved
// from a clip: section as the trainer resolves one (resolve_clip_shape, so every key a test does not set keeps its
// default), a batch of given captions, the model on a SelfCommunicator and the CPU backend (its gradients are checked
// with central_differences.h). Header-only.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/clip/clip_model.h"
#include "engine/clip/clip_shape.h"
#include "engine/core/philox.h"
#include "tests/common/central_differences.h"

namespace ms::test {

// The sizes of a tiny CLIP model's clip: section; the defaults are the smallest that test anything (8 x 8 images,
// 4 patches of 3 x 4 x 4 plus the class row; widths of 16 in 2 heads).
struct TinyClipSizes {
    int embed_dim = 8;
    int image_size = 8, patch_size = 4;
    int vision_width = 16, vision_heads = 2, vision_mlp = 0;  // vision_mlp 0: 4 * width
    int context_length = 8;
    int text_width = 16, text_heads = 2, text_mlp = 0;  // text_mlp 0: 4 * width
    int cross_modal_layers = 0;
};

// Two layers per tower, so that the residual stream crosses a block boundary; preset none (no key filled in).
inline ClipShape tiny_clip_shape(const TinyClipSizes& s = {}) {
    ClipConfig c;
    c.preset = "none";
    c.embed_dim = s.embed_dim;
    c.image_size = s.image_size;
    c.patch_size = s.patch_size;
    c.vision_layers = 2;
    c.vision_width = s.vision_width;
    c.vision_heads = s.vision_heads;
    c.vision_mlp = s.vision_mlp;
    c.context_length = s.context_length;
    c.text_layers = 2;
    c.text_width = s.text_width;
    c.text_heads = s.text_heads;
    c.text_mlp = s.text_mlp;
    c.cross_modal_layers = s.cross_modal_layers;
    return resolve_clip_shape(c);
}

// One sample per caption: pixels ~ N(0, 1) (Philox, stream 1 of `seed`), the captions tokenized (clip_tokenize).
inline ClipBatch clip_batch(const ClipShape& s, uint64_t seed, const std::vector<std::string>& captions) {
    ClipBatch batch;
    batch.b = static_cast<int>(captions.size());
    const int S = s.image_size(), T = s.text.T;
    batch.pixels.resize(captions.size() * 3 * S * S);
    for (size_t i = 0; i < batch.pixels.size(); ++i) batch.pixels[i] = philox_normal(seed, 1, i);
    batch.tokens.resize(captions.size() * T);
    batch.end_of_text.resize(captions.size());
    for (size_t i = 0; i < captions.size(); ++i)
        batch.end_of_text[i] = clip_tokenize(captions[i], T, batch.tokens.data() + static_cast<int64_t>(i) * T);
    return batch;
}

// A ClipModel of `shape` in fp32 for batches of `b` on one rank (its weights not yet initialised).
struct OneRankClip {
    SelfCommunicator world{"world"};
    ProcessGroups groups = make_process_groups(world, Topology{});
    std::unique_ptr<Backend> backend = make_backend({});
    ClipShape shape;
    ClipModel model;
    OneRankClip(const ClipShape& s, int b, float itm_weight = 1.0f)
        : shape(s), model(shape, *backend, groups, b, DType::kF32, itm_weight) {}
};

}  // namespace ms::test
