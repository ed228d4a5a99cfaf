// retrieval.h: the evaluation metrics of a CLIP model from its features: zero-shot classification accuracy, image-text
// retrieval recall@k, and the prompt-ensembled class features zero-shot classification uses.
//
// Layouts: feature matrices are row-major fp32, one row per image, caption or class, (rows, D). They need not be
// normalised: every function normalises rows itself (l2_normalize_rows, torch.nn.functional.normalize's eps), and
// ranks by cosine similarity accumulated in double. Ties are broken deterministically toward the lower index: a
// candidate ranks above the correct one when its similarity is greater, or equal and its index is lower. So a
// query's rank is the count of such candidates, and it is a top-k hit when that count is below k.
//
// Pure functions of their inputs, on one host: an evaluation over a data-parallel group gathers the features first.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace ms::clip {

struct ZeroShotAccuracy {
    int64_t count = 0;                    // images with a label (label -1: skipped)
    int64_t top1_correct = 0;             // of those, the label's class is the most similar
    std::optional<int64_t> top5_correct;  // ... among the five most similar; absent with fewer than 5 classes
    double top1() const { return count > 0 ? static_cast<double>(top1_correct) / static_cast<double>(count) : 0.0; }
    std::optional<double> top5() const;  // fraction of count; absent with fewer than 5 classes
};

// Zero-shot classification of image_features (n, D) against class_text_features (k, D), one row per class. labels
// (n): the class of each image in [0, k), or -1 to skip the image. A label outside that range throws UserError.
ZeroShotAccuracy zero_shot_accuracy(std::span<const float> image_features, std::span<const int32_t> labels,
                                    std::span<const float> class_text_features, int64_t n, int64_t k, int64_t D);

// CLIP's prompt ensembling: class c's feature (k, D) is the normalised mean of the normalised features of its m
// captions, template_features rows c*m .. c*m+m-1 of (k*m, D) (class-major).
std::vector<float> ensemble_class_features(std::span<const float> template_features, int64_t k, int64_t m, int64_t D);

struct RetrievalRanks {
    std::vector<int64_t> image_to_text;  // (n) per image, the number of captions ranked above its own (0: first)
    std::vector<int64_t> text_to_image;  // (n) per caption, the number of images ranked above its own
};

// The ranks of the matching rows of image (n, D) and text (n, D), where image row i and text row i are the matching
// pair and every other row is a non-match (one caption per image). One pass over the n x n similarities.
RetrievalRanks retrieval_ranks(std::span<const float> image, std::span<const float> text, int64_t n, int64_t D);

struct RetrievalRecall {
    int64_t k = 0;
    double image_to_text = 0;  // fraction of images whose caption (the same row of text) ranks in the top k
    double text_to_image = 0;  // fraction of captions whose image ranks in the top k
};

// Recall@k for each k in ks (each >= 1) over the pairs of retrieval_ranks.
std::vector<RetrievalRecall> recall_at_k(std::span<const float> image, std::span<const float> text, int64_t n,
                                         int64_t D, std::span<const int64_t> ks);

}  // namespace ms::clip
