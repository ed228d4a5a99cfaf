// test_clip_model.cpp: CLIP's two towers and contrastive step on one rank (engine/clip/clip_model.h): the features
// depend on each sample, and every kind of parameter's gradient matches central differences of the loss.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/clip/clip_model.h"
#include "tests/common/tiny_clip.h"

namespace ms {
namespace {

constexpr int kB = 4;

// Pixels ~ N(0, 1); kB captions of 3 to 5 lowercase letters, which depend on the seed.
ClipBatch random_batch(const ClipShape& s, uint64_t seed) {
    std::vector<std::string> captions(kB);
    for (int i = 0; i < kB; ++i)
        for (int k = 0; k < 3 + i % 3; ++k) captions[i] += static_cast<char>('a' + (seed + 7 * i + 3 * k) % 26);
    return test::clip_batch(s, seed, captions);
}

// The tiny model (tiny_clip.h's default sizes) for batches of kB, initialised from seed 5 with init_std 0.2.
struct TinyClip : test::OneRankClip {
    TinyClip() : OneRankClip(test::tiny_clip_shape(), kB) { model.init_weights(5, 0.2f); }
};

TEST(ClipModel, FeaturesDependOnEachSample) {
    TinyClip c;
    const ClipShape& s = c.shape;
    std::vector<float> image, text;
    c.model.encode(random_batch(s, 11), image, text);
    const int D = s.embed_dim;
    for (int i = 1; i < kB; ++i) {
        double di = 0, dt = 0;
        for (int d = 0; d < D; ++d) {
            di += std::abs(image[static_cast<size_t>(i * D + d)] - image[static_cast<size_t>(d)]);
            dt += std::abs(text[static_cast<size_t>(i * D + d)] - text[static_cast<size_t>(d)]);
        }
        EXPECT_GT(di, 1e-3) << "image " << i << " has image 0's features";
        EXPECT_GT(dt, 1e-3) << "caption " << i << " has caption 0's features";
    }
}

// d(loss)/d(param) from the step against (loss(p + h) - loss(p - h)) / 2h, for elements of every kind of parameter.
// The loss is fp32 and about 1.4 here; with h = 1e-2 (a step the fp32 loss resolves to ~1e-5 relative) the
// differences agreed with the gradients to within 2e-3 of the largest gradient checked when this test was written,
// so 1e-2 of it (plus 1e-4 absolute) is the bound.
TEST(ClipModel, GradientsMatchCentralDifferences) {
    TinyClip c;
    const ClipBatch batch = random_batch(c.shape, 11);
    c.model.train_step(batch);
    test::expect_central_differences(c.model, [&] { return c.model.train_step(batch).loss.loss; },
                                     {.h = 1e-2, .rel_tol = 1e-2, .abs_tol = 1e-4});
}

}  // namespace
}  // namespace ms
