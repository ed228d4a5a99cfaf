// contrastive_loss_grads.h: one call of clip::contrastive_loss (engine/clip/contrastive_loss.h) with its gradient
// buffers, for the tests of the loss on one rank (tests/unit/test_contrastive_loss.cpp) and over data-parallel groups
// (tests/comm/test_contrastive_loss_dp.cpp). Header-only.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/clip/contrastive_loss.h"

namespace ms::test {

struct ContrastiveLossGrads {
    clip::ContrastiveLossResult r;
    std::vector<float> dimage, dtext;  // d(this rank's local loss)/d(its rows), as image and text
};

// The loss of this rank's b rows of image (b, D) and text (b, D) over the group `dp`, and their gradients.
inline ContrastiveLossGrads contrastive_loss_grads(const std::vector<float>& image, const std::vector<float>& text,
                                                   int64_t b, int64_t D, float logit_scale_param, Communicator& dp,
                                                   float grad_scale = 1.0f) {
    ContrastiveLossGrads g;
    g.dimage.resize(image.size());
    g.dtext.resize(text.size());
    g.r = clip::contrastive_loss(image, text, b, D, logit_scale_param, dp, g.dimage, g.dtext, grad_scale);
    return g;
}

}  // namespace ms::test
