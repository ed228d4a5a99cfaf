// test_retrieval.cpp: engine/clip/retrieval.h on hand-made features whose ranks are known: features along a few axes,
// scaled rows (the metrics normalise), exact ties (broken toward the lower index) and the prompt ensemble's mean.
#include "engine/clip/retrieval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/core/check.h"

namespace ms::clip {
namespace {

// Zero-shot with three classes along the axes of D = 3. Image rows, unnormalised on purpose:
//   0: (2, 0.1, 0)    label 0   nearest class 0           hit
//   1: (0, 5, 1)      label 1   nearest class 1           hit
//   2: (0.2, 0, 0.1)  label 0   nearest class 0           hit
//   3: (1, 3, 0)      label 0   nearest class 1           miss
//   4: (1, 1, 0)      label 1   classes 0 and 1 tie       miss: the tie goes to class 0
//   5: (1, 1, 0)      label 0   the same tie              hit
//   6: (0, 0, 1)      label -1  skipped
TEST(Retrieval, ZeroShotTop1CountsHitsAndBreaksTiesTowardTheLowerClass) {
    const std::vector<float> classes = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    const std::vector<float> images = {2, 0.1f, 0, 0, 5, 1, 0.2f, 0, 0.1f, 1, 3, 0, 1, 1, 0, 1, 1, 0, 0, 0, 1};
    const std::vector<int32_t> labels = {0, 1, 0, 0, 1, 0, -1};
    const ZeroShotAccuracy a = zero_shot_accuracy(images, labels, classes, 7, 3, 3);
    EXPECT_EQ(a.count, 6);
    EXPECT_EQ(a.top1_correct, 4);
    EXPECT_DOUBLE_EQ(a.top1(), 4.0 / 6.0);
    EXPECT_FALSE(a.top5_correct.has_value());  // three classes: no top-5
    EXPECT_FALSE(a.top5().has_value());
}

// Six classes along the axes of D = 6; each image's similarities to the classes are its coordinates, so the label's
// rank is the number of larger coordinates (plus equal ones at lower indices).
TEST(Retrieval, ZeroShotTop5) {
    const int64_t k = 6, D = 6;
    std::vector<float> classes(k * D, 0.0f);
    for (int64_t c = 0; c < k; ++c) classes[c * D + c] = 1.0f;
    const std::vector<float> images = {
        6, 5, 4, 3, 2, 1,  // label 5: rank 5, a top-5 miss
        6, 5, 4, 3, 2, 1,  // label 4: rank 4, a top-5 hit (top-1 miss)
        1, 1, 1, 1, 1, 1,  // label 5: five ties at lower indices, rank 5: a miss
        1, 1, 1, 1, 1, 1,  // label 0: rank 0, a top-1 hit
    };
    const std::vector<int32_t> labels = {5, 4, 5, 0};
    const ZeroShotAccuracy a = zero_shot_accuracy(images, labels, classes, 4, k, D);
    EXPECT_EQ(a.count, 4);
    EXPECT_EQ(a.top1_correct, 1);
    ASSERT_TRUE(a.top5_correct.has_value());
    EXPECT_EQ(*a.top5_correct, 2);
    EXPECT_DOUBLE_EQ(*a.top5(), 0.5);
}

TEST(Retrieval, ZeroShotRejectsALabelOutsideTheClasses) {
    const std::vector<float> classes = {1, 0, 0, 1}, images = {1, 0};
    const std::vector<int32_t> labels = {2};
    try {
        zero_shot_accuracy(images, labels, classes, 1, 2, 2);
        FAIL() << "no error for label 2 of 2 classes";
    } catch (const UserError& e) {
        EXPECT_NE(std::string(e.what()).find("label 2 of image 0 is outside [0, 2)"), std::string::npos) << e.what();
    }
}

// Four pairs in D = 4: images along the axes (scaled: the metrics normalise), captions permutations of (4, 3, 2, 1),
// so every caption has the same norm and cosine(image i, caption j) orders as caption j's coordinate i:
//   caption 0 (4, 3, 2, 1)  own image 0 has its largest coordinate:        text->image rank 0
//   caption 1 (3, 4, 1, 2)  image 1 largest:                               rank 0
//   caption 2 (1, 2, 3, 4)  image 2 has 3, image 3 has 4:                  rank 1
//   caption 3 (2, 1, 4, 3)  image 3 has 3, image 2 has 4:                  rank 1
// Image i reads column i: image 0 (4, 3, 1, 2) and image 1 (3, 4, 2, 1) put their caption first (rank 0), image 2
// (2, 1, 3, 4) and image 3 (1, 2, 4, 3) second (rank 1).
TEST(Retrieval, RecallAtKFromKnownRanks) {
    const std::vector<float> image = {2, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0.5f, 0, 0, 0, 0, 3};
    const std::vector<float> text = {4, 3, 2, 1, 3, 4, 1, 2, 1, 2, 3, 4, 2, 1, 4, 3};
    const RetrievalRanks r = retrieval_ranks(image, text, 4, 4);
    EXPECT_EQ(r.image_to_text, (std::vector<int64_t>{0, 0, 1, 1}));
    EXPECT_EQ(r.text_to_image, (std::vector<int64_t>{0, 0, 1, 1}));
    const std::vector<int64_t> ks = {1, 2};
    const std::vector<RetrievalRecall> rec = recall_at_k(image, text, 4, 4, ks);
    ASSERT_EQ(rec.size(), 2u);
    EXPECT_EQ(rec[0].k, 1);
    EXPECT_DOUBLE_EQ(rec[0].image_to_text, 0.5);
    EXPECT_DOUBLE_EQ(rec[0].text_to_image, 0.5);
    EXPECT_EQ(rec[1].k, 2);
    EXPECT_DOUBLE_EQ(rec[1].image_to_text, 1.0);
    EXPECT_DOUBLE_EQ(rec[1].text_to_image, 1.0);
}

// Exact ties from identical rows: every caption equals every other, so image i's own caption ranks i (all the lower
// indices tie with it and go first), and likewise for the captions.
TEST(Retrieval, IdenticalRowsRankByIndex) {
    const int64_t n = 5, D = 3;
    std::vector<float> image, text;
    for (int64_t i = 0; i < n; ++i) {
        image.insert(image.end(), {1, 2, 3});
        text.insert(text.end(), {2, 4, 6});
    }
    const RetrievalRanks r = retrieval_ranks(image, text, n, D);
    EXPECT_EQ(r.image_to_text, (std::vector<int64_t>{0, 1, 2, 3, 4}));
    EXPECT_EQ(r.text_to_image, (std::vector<int64_t>{0, 1, 2, 3, 4}));
    const std::vector<int64_t> ks = {1, 3, 5};
    const std::vector<RetrievalRecall> rec = recall_at_k(image, text, n, D, ks);
    EXPECT_DOUBLE_EQ(rec[0].image_to_text, 0.2);
    EXPECT_DOUBLE_EQ(rec[1].image_to_text, 0.6);
    EXPECT_DOUBLE_EQ(rec[2].text_to_image, 1.0);
}

// Class 0's templates (2, 0, 0) and (0, 5, 0) normalise to e0 and e1, whose mean normalises to (1, 1, 0) / sqrt 2;
// class 1's single direction (0, 0, 3) twice stays e2.
TEST(Retrieval, EnsembleIsTheNormalisedMeanOfNormalisedTemplates) {
    const std::vector<float> templates = {2, 0, 0, 0, 5, 0, 0, 0, 3, 0, 0, 7};
    const std::vector<float> f = ensemble_class_features(templates, 2, 2, 3);
    const float r = static_cast<float>(1.0 / std::sqrt(2.0));
    ASSERT_EQ(f.size(), 6u);
    EXPECT_FLOAT_EQ(f[0], r);
    EXPECT_FLOAT_EQ(f[1], r);
    EXPECT_EQ(f[2], 0.0f);
    EXPECT_EQ(f[3], 0.0f);
    EXPECT_EQ(f[4], 0.0f);
    EXPECT_EQ(f[5], 1.0f);
}

}  // namespace
}  // namespace ms::clip
