// test_itm.cpp: the image-text matching objective's host parts (engine/clip/itm.h): the loss and its gradient, and
// the hard negatives: never the sample itself or a caption equal to its own, drawn in proportion to exp(logit).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/clip/clip_shape.h"
#include "engine/clip/itm.h"

namespace ms::clip {
namespace {

TEST(ItmLoss, CrossEntropyOfThePairsAndItsGradient) {
    const int64_t b = 2;  // pairs: 2 matches, 4 negatives
    const std::vector<float> logits = {0.5f, 1.5f, 2.0f, -1.0f, 0.3f, 0.1f, -0.2f, 0.4f, 1.0f, 1.0f, 3.0f, 0.0f};
    std::vector<float> d(logits.size());
    const ItmLossResult r = itm_loss(logits, b, 0.5f, 4.0f, d);
    double loss = 0;
    int correct = 0;
    for (int p = 0; p < 6; ++p) {
        const int label = p < b ? 1 : 0;
        const double l0 = logits[2 * p], l1 = logits[2 * p + 1];
        loss += std::log(std::exp(l0) + std::exp(l1)) - (label ? l1 : l0);
        correct += ((l1 > l0) ? 1 : 0) == label;
    }
    EXPECT_NEAR(r.loss, loss / 6, 1e-6);
    EXPECT_FLOAT_EQ(r.accuracy, correct / 6.0f);
    EXPECT_EQ(correct, 4);  // pairs 1 (2.0 > -1.0) and 3 (0.4 > -0.2) are wrong; pair 4's tie counts as "no match"
    // d = weight * grad_scale * d(mean loss)/d(logit), against central differences of the loss
    const double h = 1e-3;
    for (size_t k = 0; k < logits.size(); ++k) {
        std::vector<float> up = logits, down = logits, scratch(logits.size());
        up[k] += static_cast<float>(h);
        down[k] -= static_cast<float>(h);
        const double numeric = (itm_loss(up, b, 1, 1, scratch).loss - itm_loss(down, b, 1, 1, scratch).loss) / (2 * h);
        EXPECT_NEAR(d[k], 0.5 * 4.0 * numeric, 2e-3) << k;
    }
}

// Features (b, D = 2) whose cosines we choose: image i at angle a_i, caption j at angle c_j.
std::vector<float> at_angles(const std::vector<double>& angles) {
    std::vector<float> x;
    for (double a : angles) {
        x.push_back(static_cast<float>(std::cos(a)));
        x.push_back(static_cast<float>(std::sin(a)));
    }
    return x;
}

std::vector<int32_t> captions(const std::vector<std::string>& texts, int T) {
    std::vector<int32_t> tokens(texts.size() * T);
    for (size_t i = 0; i < texts.size(); ++i) clip_tokenize(texts[i], T, tokens.data() + i * T);
    return tokens;
}

TEST(ItmNegatives, NeverTheSampleOrAnEqualCaption) {
    const std::vector<float> image = at_angles({0.0, 0.1, 0.2, 0.3}), text = at_angles({0.0, 0.05, 0.15, 2.0});
    const std::vector<int32_t> tokens = captions({"a red circle", "a red circle", "a blue square", "a dog"}, 16);
    for (uint64_t step = 0; step < 200; ++step) {
        const ItmNegatives n = draw_itm_negatives(image, text, tokens, 4, 2, 10.0f, {.seed = 1, .step = step});
        for (int i = 0; i < 4; ++i) {
            EXPECT_NE(n.text[i], i);
            EXPECT_NE(n.image[i], i);
            if (i < 2) {  // captions 0 and 1 are the same text: neither is the other's negative
                EXPECT_GE(n.text[i], 2);
                EXPECT_GE(n.image[i], 2);
            }
        }
    }
}

TEST(ItmNegatives, AllCaptionsEqualFallsBackToTheNextSample) {
    const std::vector<float> x = at_angles({0.0, 0.1, 0.2});
    const ItmNegatives n = draw_itm_negatives(x, x, captions({"same", "same", "same"}, 8), 3, 2, 10.0f, {});
    EXPECT_EQ(n.text, (std::vector<int>{1, 2, 0}));
    EXPECT_EQ(n.image, (std::vector<int>{1, 2, 0}));
}

// Over many steps, image 0's caption negatives follow softmax(s * cos(image 0, caption j)) over j != 0.
TEST(ItmNegatives, DrawnInProportionToTheSimilarity) {
    const float s = 4.0f;
    const std::vector<double> text_angles = {0.0, 0.3, 1.0, 2.5};
    const std::vector<float> image = at_angles({0.0, 1.0, 2.0, 3.0}), text = at_angles(text_angles);
    const std::vector<int32_t> tokens = captions({"a", "b", "c", "d"}, 4);
    std::vector<double> expected(4, 0.0);
    double total = 0;
    for (int j = 1; j < 4; ++j) total += expected[j] = std::exp(s * std::cos(text_angles[j]));
    const int steps = 20000;
    std::vector<int> count(4, 0);
    for (int step = 0; step < steps; ++step)
        ++count[draw_itm_negatives(image, text, tokens, 4, 2, s, {.seed = 9, .step = static_cast<uint64_t>(step)})
                    .text[0]];
    EXPECT_EQ(count[0], 0);
    for (int j = 1; j < 4; ++j) {
        const double p = expected[j] / total, sd = std::sqrt(p * (1 - p) / steps);
        EXPECT_NEAR(static_cast<double>(count[j]) / steps, p, 5 * sd) << j;
    }
}

// A pure function of (seed, step, global sample index): the same inputs draw the same pairs; another step or another
// rank's first sample draws others.
TEST(ItmNegatives, APureFunctionOfSeedStepAndSample) {
    const std::vector<float> image = at_angles({0.0, 0.5, 1.0, 1.5, 2.0, 2.5}),
                             text = at_angles({0.1, 0.6, 1.1, 1.6, 2.1, 2.6});
    const std::vector<int32_t> tokens = captions({"a", "b", "c", "d", "e", "f"}, 4);
    const auto draw = [&](ItmDraw d) { return draw_itm_negatives(image, text, tokens, 6, 2, 1.0f, d); };
    const ItmNegatives a = draw({.seed = 4, .step = 7, .first_sample = 12});
    const ItmNegatives again = draw({.seed = 4, .step = 7, .first_sample = 12});
    EXPECT_EQ(a.text, again.text);
    EXPECT_EQ(a.image, again.image);
    int differ = 0;
    for (const ItmDraw d :
         {ItmDraw{.seed = 5, .step = 7, .first_sample = 12}, ItmDraw{.seed = 4, .step = 8, .first_sample = 12},
          ItmDraw{.seed = 4, .step = 7, .first_sample = 18}}) {
        const ItmNegatives o = draw(d);
        differ += o.text != a.text || o.image != a.image;
    }
    EXPECT_EQ(differ, 3);
}

}  // namespace
}  // namespace ms::clip
