// test_clip_itm.cpp: CLIP's cross-modal layers and image-text matching head (engine/clip/itm.h, clip_model.h with
// clip.cross_modal_layers): every kind of parameter's gradient of the total loss (contrastive + weight x matching)
// matches central differences, the fusion leaves the towers' features alone, and the matching head learns.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/clip/clip_model.h"
#include "tests/common/tiny_clip.h"

namespace ms {
namespace {

constexpr int kB = 4;
constexpr float kItmWeight = 0.7f;
const clip::ItmDraw kDraw{.seed = 3, .step = 1, .first_sample = 0};

const std::vector<std::string> kCaptions = {"red", "blue sq", "a cat", "dog"};

struct TinyItm : test::OneRankClip {
    explicit TinyItm(int layers = 1)
        : OneRankClip(test::tiny_clip_shape({.cross_modal_layers = layers}), kB, kItmWeight) {
        model.init_weights(5, 0.2f);
    }
};

double total_loss(const ClipStepResult& r) { return r.loss.loss + kItmWeight * r.itm.loss; }

// As test_clip_model.cpp's check of the contrastive loss alone, over the total (about 2.3 here). The hard negatives
// are drawn again at every step from the perturbed features, so h must be small enough that no draw moves: at
// h = 1e-2 one did (a jump in the loss), at h = 3e-3 none does, and the differences agreed with the gradients within
// 1e-4 of the largest gradient checked when this test was written (default and Haswell OpenBLAS kernels), so 1e-3
// of it (plus 1e-5 absolute) is the bound.
TEST(ClipItm, GradientsMatchCentralDifferences) {
    TinyItm c;
    ClipModel& model = c.model;
    int fusion_params = 0;
    for (const ParamInfo& p : model.params_info())
        fusion_params += p.name.starts_with("fusion.") || p.name.starts_with("itm_head.");
    EXPECT_EQ(fusion_params, 30);  // a layer's 26 (3 norms, q/k/v, cross q/k/v, 2 projections, MLP), norm, head
    const ClipBatch batch = test::clip_batch(c.shape, 11, kCaptions);
    ASSERT_GT(model.train_step(batch, 1.0f, kDraw).itm.loss, 0.1f);
    test::expect_central_differences(model, [&] { return total_loss(model.train_step(batch, 1.0f, kDraw)); },
                                     {.h = 3e-3, .rel_tol = 1e-3, .abs_tol = 1e-5});
}

// The states output and the fusion chunk change nothing about the features: a model with cross-modal layers and one
// without, from the same seed, give the same features bit for bit (the towers' parameters start the same: the
// fusion's come after them in the table).
TEST(ClipItm, TowersComputeTheSameFeatures) {
    TinyItm with;
    test::OneRankClip without(test::tiny_clip_shape(), kB);
    without.model.init_weights(5, 0.2f);
    const ClipBatch batch = test::clip_batch(with.shape, 11, kCaptions);
    std::vector<float> image_a, text_a, image_b, text_b;
    with.model.encode(batch, image_a, text_a);
    without.model.encode(batch, image_b, text_b);
    EXPECT_EQ(image_a, image_b);
    EXPECT_EQ(text_a, text_b);
}

// Plain gradient descent on one batch: the matching loss first falls to the label prior's, then the head learns to
// tell the batch's matching pairs from its hard negatives. The negatives are drawn again at every step from the
// features, so the objective jumps when a draw changes; the step is small enough that the descent still converges
// under every OpenBLAS kernel (with a step of 0.1 it cycled well above the bound on most of them, the draws following
// the last bits of the GEMMs).
TEST(ClipItm, MatchingLossFallsOnOneBatch) {
    constexpr float kLr = 0.03f;
    constexpr int kSteps = 240;
    TinyItm c(2);
    ClipModel& model = c.model;
    const ClipBatch batch = test::clip_batch(c.shape, 11, kCaptions);
    const float first = model.train_step(batch, 1.0f, kDraw).itm.loss;
    float last = first;
    for (int step = 0; step < kSteps; ++step) {
        for (int64_t i = 0; i < model.flat_size(); ++i) model.params()[i] -= kLr * model.grads()[i];
        last = model.train_step(batch, 1.0f, kDraw).itm.loss;
    }
    EXPECT_GT(first, 0.5f);  // undecided: 2/3 of the pairs are negatives, log 3 - 2/3 log 2 ~ 0.64 at best
    EXPECT_LT(last, 0.05f);  // it tells this batch's pairs apart
}

}  // namespace
}  // namespace ms
