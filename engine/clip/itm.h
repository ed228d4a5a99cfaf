// itm.h: the image-text matching objective of CLIP's cross-modal layers (ALBEF, Li et al. 2021; BLIP), on the host:
// hard negatives drawn from the contrastive similarities, and the matching head's loss.
//
// Each rank pairs its b samples three ways, 3b pairs in this order:
//   [0, b)    image i with its caption i                 label 1 (match)
//   [b, 2b)   image i with caption t(i)                  label 0
//   [2b, 3b)  image m(i) with caption i                  label 0
// t(i) is drawn among the rank's captions with probability proportional to exp(s * cos(image i, caption j)) (the
// contrastive logits), m(i) among its images by exp(s * cos(image j, caption i)): the negatives the model finds most
// alike are drawn most often. A candidate whose caption is the same text as caption i is no negative (the drawn-
// shapes data repeats captions) and is never drawn; if every caption of the rank is caption i's, any other sample is.
// The draws are a pure function of (seed, step, global sample index): Philox, stream `step`, index 2g (caption) and
// 2g + 1 (image), so every tensor-parallel rank draws the same pairs. Negatives come from the rank's own b samples,
// as in ALBEF, so the matching loss depends on the data-parallel size (the contrastive loss does not).
//
// Loss: the mean over the 3b pairs of the cross-entropy of the head's two logits (index 1: match) against the label;
// its gradient w.r.t. the logits is weight * grad_scale * (softmax - onehot) / 3b. Averaged over dp by the trainer's
// gradient reduction, that is the gradient of the mean over all ranks' pairs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ms::clip {

struct ItmNegatives {
    std::vector<int> text;   // (b) t(i): the caption paired with image i as a negative
    std::vector<int> image;  // (b) m(i): the image paired with caption i as a negative
};

struct ItmDraw {
    uint64_t seed = 0;         // run.seed
    uint64_t step = 0;         // the iteration
    int64_t first_sample = 0;  // the global index of the rank's first sample
};

// image, text (b, D) the towers' unnormalised features; tokens (b, context_length) the captions (equal rows: the same
// text); logit_scale s. b >= 2.
ItmNegatives draw_itm_negatives(std::span<const float> image, std::span<const float> text,
                                std::span<const int32_t> tokens, int64_t b, int64_t D, float logit_scale,
                                const ItmDraw& draw);

struct ItmLossResult {
    float loss = 0;      // the mean cross-entropy over the pairs
    float accuracy = 0;  // the fraction of pairs whose larger logit is their label's (ties: no match)
};

// logits (3b, 2) of the pairs in the order above; dlogits (3b, 2) = weight * grad_scale * d(loss)/d(logits).
ItmLossResult itm_loss(std::span<const float> logits, int64_t b, float weight, float grad_scale,
                       std::span<float> dlogits);

}  // namespace ms::clip
