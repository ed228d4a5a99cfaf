// synthetic_shapes.cpp: procedurally drawn coloured shapes with captions (image_text.h), the data a new user trains
// CLIP on in minutes on a CPU (a tiny ViT at S = 32, patch 8).
//
// Sample i is a pure function of (seed, split, i): its draws come from Philox keyed by the seed with counter
// (i, draw number, stream), the stream word holding the split, so split 1 (held-out) draws other images than split
// 0. Geometry lives in the unit square (x right, y down) and is rasterised at whatever S is asked, one sample point
// per pixel centre, antialiased by coverage = clamp(0.5 - distance * S, 0, 1) from each shape's signed distance.
//
// An image is a grey background (level 0.05..0.35, uniform pixel noise of +-0.03) with
// - one object (70%): radius 0.18..0.28, caption "a red circle", label = colour * kNumShapes + shape; or
// - two objects of different classes (30%): radius 0.12..0.17, one in the left (or upper) part and one in the right
//   (or lower) part, caption "a red circle left of a blue square" / "a red circle above a blue square" with the
//   relation read from their centres (the axis they differ more along), label -1.
// Sizes and separations keep every object inside the image and apart from the other; the smallest (a square of
// r = 0.12) is still 6 pixels across at S = 32.
#include <algorithm>
#include <cmath>

#include "engine/core/check.h"
#include "engine/core/philox.h"
#include "engine/data/image_text.h"

namespace ms {
namespace {

constexpr int kNumShapes = 4;
constexpr const char* kShapes[kNumShapes] = {"circle", "square", "triangle", "cross"};
struct Colour {
    const char* name;
    float rgb[3];  // in [0, 1]
};
constexpr int kNumColours = 6;
constexpr Colour kColours[kNumColours] = {{"red", {0.86f, 0.15f, 0.15f}},    {"green", {0.15f, 0.72f, 0.25f}},
                                          {"blue", {0.20f, 0.35f, 0.92f}},   {"yellow", {0.95f, 0.85f, 0.15f}},
                                          {"purple", {0.60f, 0.22f, 0.80f}}, {"white", {0.96f, 0.96f, 0.96f}}};
constexpr int kNumClasses = kNumColours * kNumShapes;
constexpr uint32_t kDrawStream = 0x53480000u;   // + split: the object draws
constexpr uint32_t kNoiseStream = 0x4E530000u;  // + split: the background noise, 4 pixels per Philox call
constexpr double kTwoObjects = 0.3;

struct Shape {
    int cls = 0;  // colour * kNumShapes + shape
    float cx = 0, cy = 0, r = 0;
    float rgb[3] = {0, 0, 0};
};

struct Scene {
    float background = 0;
    int count = 1;
    Shape objects[2];
};

// Draws of sample i: consecutive Philox counters, two 32-bit words per uniform.
class Draws {
  public:
    Draws(uint64_t seed, uint32_t stream, int64_t i)
        : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)},
          lo_(static_cast<uint32_t>(i)),
          hi_(static_cast<uint32_t>(static_cast<uint64_t>(i) >> 32)),
          stream_(stream) {}
    double uniform() {
        if (used_ == 4) {
            words_ = philox4x32_10({lo_, hi_, next_++, stream_}, key_);
            used_ = 0;
        }
        const uint64_t bits = (static_cast<uint64_t>(words_[used_]) << 21) ^ (words_[used_ + 1] >> 11);
        used_ += 2;
        return static_cast<double>(bits & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
    }
    double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
    int below(int n) { return std::min(n - 1, static_cast<int>(uniform() * n)); }

  private:
    PhiloxKey key_;
    uint32_t lo_, hi_, stream_, next_ = 0;
    PhiloxCounter words_{};
    int used_ = 4;
};

void draw_colour(Draws& d, Shape& s) {
    const float* base = kColours[s.cls / kNumShapes].rgb;
    for (int c = 0; c < 3; ++c) s.rgb[c] = std::clamp(base[c] + static_cast<float>(d.uniform(-0.04, 0.04)), 0.f, 1.f);
}

Scene draw_scene(uint64_t seed, int split, int64_t i) {
    Draws d(seed, kDrawStream + static_cast<uint32_t>(split), i);
    Scene scene;
    scene.background = static_cast<float>(d.uniform(0.05, 0.35));
    if (d.uniform() >= kTwoObjects) {
        Shape& s = scene.objects[0];
        s.cls = d.below(kNumClasses);
        s.r = static_cast<float>(d.uniform(0.18, 0.28));
        const double margin = 1.1 * s.r + 0.02;  // the widest shape (triangle) reaches 1.04 r from its centre
        s.cx = static_cast<float>(d.uniform(margin, 1 - margin));
        s.cy = static_cast<float>(d.uniform(margin, 1 - margin));
        draw_colour(d, s);
        return scene;
    }
    scene.count = 2;
    Shape& a = scene.objects[0];
    Shape& b = scene.objects[1];
    a.cls = d.below(kNumClasses);
    b.cls = d.below(kNumClasses - 1);
    if (b.cls >= a.cls) ++b.cls;
    const bool horizontal = d.uniform() < 0.5;
    // along the relation's axis the centres are >= 0.44 apart (two radii plus a gap); across it <= 0.40
    const float along_a = static_cast<float>(d.uniform(0.20, 0.28)),
                along_b = static_cast<float>(d.uniform(0.72, 0.80));
    const float across_a = static_cast<float>(d.uniform(0.30, 0.70)),
                across_b = static_cast<float>(d.uniform(0.30, 0.70));
    a.r = static_cast<float>(d.uniform(0.12, 0.17));
    b.r = static_cast<float>(d.uniform(0.12, 0.17));
    a.cx = horizontal ? along_a : across_a;
    a.cy = horizontal ? across_a : along_a;
    b.cx = horizontal ? along_b : across_b;
    b.cy = horizontal ? across_b : along_b;
    draw_colour(d, a);
    draw_colour(d, b);
    return scene;
}

// Signed distance from offset (dx, dy) to the shape's outline, negative inside, in unit-square lengths.
float signed_distance(int shape, float dx, float dy, float r) {
    switch (shape) {
        case 0:  // circle
            return std::sqrt(dx * dx + dy * dy) - r;
        case 1:  // square of half-side 0.85 r
            return std::max(std::abs(dx), std::abs(dy)) - 0.85f * r;
        case 2: {  // equilateral triangle, apex up, circumradius R = 1.2 r, its bounding box centred on the centre
            const float R = 1.2f * r;
            const float y = dy - 0.25f * R;  // from the triangle's centroid
            const float bottom = y - 0.5f * R;
            const float right = 0.8660254f * dx - 0.5f * y - 0.5f * R;
            const float left = -0.8660254f * dx - 0.5f * y - 0.5f * R;
            return std::max({bottom, right, left});
        }
        default: {  // cross: two bars 1.9 r long, 0.6 r wide
            const float ax = std::abs(dx), ay = std::abs(dy), L = 0.95f * r, W = 0.3f * r;
            return std::min(std::max(ax - L, ay - W), std::max(ax - W, ay - L));
        }
    }
}

std::string object_phrase(const Shape& s) {
    return fmt::format("a {} {}", kColours[s.cls / kNumShapes].name, kShapes[s.cls % kNumShapes]);
}

std::string caption_of(const Scene& scene) {
    if (scene.count == 1) return object_phrase(scene.objects[0]);
    const Shape& a = scene.objects[0];
    const Shape& b = scene.objects[1];
    const float dx = b.cx - a.cx, dy = b.cy - a.cy;
    if (std::abs(dx) >= std::abs(dy)) {
        const bool a_left = dx > 0;
        return fmt::format("{} left of {}", object_phrase(a_left ? a : b), object_phrase(a_left ? b : a));
    }
    const bool a_above = dy > 0;
    return fmt::format("{} above {}", object_phrase(a_above ? a : b), object_phrase(a_above ? b : a));
}

class SyntheticShapesSource final : public ImageTextSource {
  public:
    SyntheticShapesSource(uint64_t seed, int64_t num_samples, int split)
        : seed_(seed), num_samples_(num_samples), split_(split) {
        for (const Colour& c : kColours) {
            for (const char* shape : kShapes) classes_.push_back(fmt::format("{} {}", c.name, shape));
        }
    }
    int64_t size() const override { return num_samples_; }
    const std::vector<std::string>& classes() const override { return classes_; }
    int64_t skipped() const override { return 0; }
    std::string describe() const override {
        return fmt::format(
            "synthetic shapes: {} samples ({} split), seed {}, {} classes ({} colours x {} shapes), one "
            "object ({:.0f}%) or two per image",
            num_samples_, split_ == 0 ? "train" : "held-out", seed_, kNumClasses, kNumColours, kNumShapes,
            100 * (1 - kTwoObjects));
    }
    uint64_t fingerprint() const override {
        uint64_t h = name_hash("synthetic shapes");
        for (uint64_t v : {seed_, static_cast<uint64_t>(num_samples_), static_cast<uint64_t>(split_)}) {
            h = (h ^ v) * 1099511628211ull;
        }
        return h;
    }
    bool read(int64_t i, int S, ImageTextSample& out) const override;

  private:
    uint64_t seed_;
    int64_t num_samples_;
    int split_;
    std::vector<std::string> classes_;
};

bool SyntheticShapesSource::read(int64_t i, int S, ImageTextSample& out) const {
    MS_CHECK(i >= 0 && i < num_samples_, "sample {} outside [0, {})", i, num_samples_);
    MS_CHECK(S >= 1, "image side {} < 1", S);
    const Scene scene = draw_scene(seed_, split_, i);
    out.key = fmt::format("synthetic-{}:{}", split_ == 0 ? "train" : "heldout", i);
    out.caption = caption_of(scene);
    out.label = scene.count == 1 ? scene.objects[0].cls : -1;
    const size_t plane = static_cast<size_t>(S) * S;
    out.pixels.resize(3 * plane);
    const PhiloxKey key = {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)};
    const uint32_t lo = static_cast<uint32_t>(i), hi = static_cast<uint32_t>(static_cast<uint64_t>(i) >> 32);
    PhiloxCounter noise{};
    for (size_t p = 0; p < plane; ++p) {
        if (p % 4 == 0)
            noise = philox4x32_10({lo, hi, static_cast<uint32_t>(p / 4), kNoiseStream + static_cast<uint32_t>(split_)},
                                  key);
        const float x = (static_cast<float>(p % S) + 0.5f) / S, y = (static_cast<float>(p / S) + 0.5f) / S;
        const float grey = scene.background + 0.06f * (philox_uniform(noise[p % 4]) - 0.5f);
        float rgb[3] = {grey, grey, grey};
        for (int k = 0; k < scene.count; ++k) {
            const Shape& s = scene.objects[k];
            const float sd = signed_distance(s.cls % kNumShapes, x - s.cx, y - s.cy, s.r);
            const float cover = std::clamp(0.5f - sd * static_cast<float>(S), 0.f, 1.f);
            for (int c = 0; c < 3; ++c) rgb[c] += cover * (s.rgb[c] - rgb[c]);
        }
        for (int c = 0; c < 3; ++c) out.pixels[c * plane + p] = (rgb[c] - kClipMean[c]) / kClipStd[c];
    }
    return true;
}

}  // namespace

std::unique_ptr<ImageTextSource> open_synthetic_shapes(uint64_t seed, int64_t num_samples, int split) {
    if (num_samples < 1) {
        throw UserError(
            fmt::format("config error: the synthetic shapes source needs at least 1 sample, got {}", num_samples));
    }
    MS_CHECK(split == 0 || split == 1, "synthetic shapes split {} is neither 0 (train) nor 1 (held-out)", split);
    return std::make_unique<SyntheticShapesSource>(seed, num_samples, split);
}

}  // namespace ms
