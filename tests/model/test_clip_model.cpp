// test_clip_model.cpp: CLIP's two towers and contrastive step on one rank (engine/clip/clip_model.h): the features
// depend on each sample, and every kind of parameter's gradient matches central differences of the loss.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/clip/clip_model.h"
#include "engine/core/philox.h"

namespace ms {
namespace {

// Two layers per tower so the residual stream crosses a block boundary; 4 patches of 3 x 4 x 4 plus the class row.
ClipShape tiny_clip() {
    ClipConfig c;
    c.preset = "none";
    c.embed_dim = 8;
    c.image_size = 8;
    c.patch_size = 4;
    c.vision_layers = 2;
    c.vision_width = 16;
    c.vision_heads = 2;
    c.context_length = 8;
    c.text_layers = 2;
    c.text_width = 16;
    c.text_heads = 2;
    return resolve_clip_shape(c);
}

ClipBatch random_batch(const ClipShape& s, int b, uint64_t seed) {
    ClipBatch batch;
    batch.b = b;
    const int S = s.image_size();
    batch.pixels.resize(static_cast<size_t>(b) * 3 * S * S);
    for (size_t i = 0; i < batch.pixels.size(); ++i) batch.pixels[i] = philox_normal(seed, 1, i);
    batch.tokens.resize(static_cast<size_t>(b) * s.text.T);
    batch.end_of_text.resize(static_cast<size_t>(b));
    for (int i = 0; i < b; ++i) {
        std::string caption;
        for (int k = 0; k < 3 + i % 3; ++k) caption += static_cast<char>('a' + (seed + 7 * i + 3 * k) % 26);
        batch.end_of_text[static_cast<size_t>(i)] =
            clip_tokenize(caption, s.text.T, batch.tokens.data() + static_cast<int64_t>(i) * s.text.T);
    }
    return batch;
}

struct OneRank {
    SelfCommunicator world{"world"};
    ProcessGroups groups = make_process_groups(world, Topology{});
    std::unique_ptr<Backend> backend = make_backend({});
};

TEST(ClipModel, FeaturesDependOnEachSample) {
    OneRank r;
    const ClipShape s = tiny_clip();
    ClipModel model(s, *r.backend, r.groups, 4, DType::kF32);
    model.init_weights(5, 0.2f);
    std::vector<float> image, text;
    model.encode(random_batch(s, 4, 11), image, text);
    const int D = s.embed_dim;
    for (int i = 1; i < 4; ++i) {
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
    OneRank r;
    const ClipShape s = tiny_clip();
    ClipModel model(s, *r.backend, r.groups, 4, DType::kF32);
    model.init_weights(5, 0.2f);
    const ClipBatch batch = random_batch(s, 4, 11);
    model.train_step(batch);
    const std::vector<float> grads(model.grads(), model.grads() + model.flat_size());
    float* params = model.params();
    const double h = 1e-2;
    struct Check {
        std::string name;
        double analytic, numeric;
    };
    std::vector<Check> checks;
    double largest = 0;
    for (const ParamInfo& p : model.params_info()) {
        for (int64_t k : {int64_t{0}, p.numel / 2, p.numel - 1}) {
            float& w = params[p.offset + k];
            const float saved = w;
            w = static_cast<float>(saved + h);
            const double up = model.train_step(batch).loss.loss;
            w = static_cast<float>(saved - h);
            const double down = model.train_step(batch).loss.loss;
            w = saved;
            const double numeric = (up - down) / (2 * h), analytic = grads[static_cast<size_t>(p.offset + k)];
            checks.push_back({p.name + "[" + std::to_string(k) + "]", analytic, numeric});
            largest = std::max(largest, std::abs(analytic));
        }
    }
    ASSERT_GT(largest, 1e-3);
    for (const Check& c : checks) EXPECT_NEAR(c.analytic, c.numeric, 1e-2 * largest + 1e-4) << c.name;
}

}  // namespace
}  // namespace ms
