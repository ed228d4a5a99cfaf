// retrieval.cpp: the metrics of retrieval.h. Each query's similarities and rank are computed by one thread, so the
// results do not depend on the thread count.
#include "engine/clip/retrieval.h"

#include <fmt/format.h>

#include <cmath>

#include "engine/clip/contrastive_loss.h"
#include "engine/core/check.h"

namespace ms::clip {
namespace {

std::vector<float> normalized(std::span<const float> x, int64_t rows, int64_t D, const char* what) {
    MS_CHECK(rows >= 0 && D > 0 && x.size() == static_cast<size_t>(rows * D), "{}: {} elements, not rows {} * D {}",
             what, x.size(), rows, D);
    std::vector<float> u(x.size());
    l2_normalize_rows(x, rows, D, u);
    return u;
}

// Whether a candidate with similarity `sim` and index `j` ranks above the correct one (`target`, `target_index`).
bool ranks_above(double sim, int64_t j, double target, int64_t target_index) {
    return sim > target || (sim == target && j < target_index);
}

// The rank of candidate `target` among sims (n): the candidates that rank above it.
int64_t rank_of(const std::vector<double>& sims, int64_t target) {
    const double t = sims[static_cast<size_t>(target)];
    int64_t above = 0;
    for (int64_t j = 0; j < static_cast<int64_t>(sims.size()); ++j)
        above += ranks_above(sims[static_cast<size_t>(j)], j, t, target) ? 1 : 0;
    return above;
}

}  // namespace

std::optional<double> ZeroShotAccuracy::top5() const {
    if (!top5_correct) return std::nullopt;
    return count > 0 ? static_cast<double>(*top5_correct) / static_cast<double>(count) : 0.0;
}

ZeroShotAccuracy zero_shot_accuracy(std::span<const float> image_features, std::span<const int32_t> labels,
                                    std::span<const float> class_text_features, int64_t n, int64_t k, int64_t D) {
    MS_CHECK(labels.size() == static_cast<size_t>(n), "zero_shot_accuracy: {} labels for {} images", labels.size(), n);
    MS_CHECK(k > 0, "zero_shot_accuracy: no classes");
    for (int64_t i = 0; i < n; ++i)
        if (labels[i] < -1 || labels[i] >= k)
            throw UserError(
                fmt::format("data error: zero-shot label {} of image {} is outside [0, {}) for {} classes "
                            "(-1 marks an image without a label)",
                            labels[i], i, k, k));
    const std::vector<float> img = normalized(image_features, n, D, "zero_shot_accuracy image features");
    const std::vector<float> cls = normalized(class_text_features, k, D, "zero_shot_accuracy class features");
    std::vector<int64_t> rank(static_cast<size_t>(n), -1);
#pragma omp parallel
    {
        std::vector<double> sims(static_cast<size_t>(k));
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; ++i) {
            if (labels[i] < 0) continue;
            for (int64_t c = 0; c < k; ++c) sims[c] = dot(&img[i * D], &cls[c * D], D);
            rank[i] = rank_of(sims, labels[i]);
        }
    }
    ZeroShotAccuracy a;
    if (k >= 5) a.top5_correct = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (rank[i] < 0) continue;
        a.count += 1;
        a.top1_correct += rank[i] < 1 ? 1 : 0;
        if (a.top5_correct) *a.top5_correct += rank[i] < 5 ? 1 : 0;
    }
    return a;
}

std::vector<float> ensemble_class_features(std::span<const float> template_features, int64_t k, int64_t m, int64_t D) {
    MS_CHECK(k > 0 && m > 0, "ensemble_class_features: k = {} classes of m = {} templates", k, m);
    const std::vector<float> u = normalized(template_features, k * m, D, "ensemble_class_features");
    std::vector<float> mean(static_cast<size_t>(k * D));
    for (int64_t c = 0; c < k; ++c)
        for (int64_t d = 0; d < D; ++d) {
            double s = 0;
            for (int64_t t = 0; t < m; ++t) s += u[(c * m + t) * D + d];
            mean[c * D + d] = static_cast<float>(s / static_cast<double>(m));
        }
    std::vector<float> out(mean.size());
    l2_normalize_rows(mean, k, D, out);
    return out;
}

RetrievalRanks retrieval_ranks(std::span<const float> image, std::span<const float> text, int64_t n, int64_t D) {
    const std::vector<float> img = normalized(image, n, D, "retrieval_ranks image features");
    const std::vector<float> txt = normalized(text, n, D, "retrieval_ranks text features");
    std::vector<double> match(static_cast<size_t>(n));  // (n) cosine of each matching pair
    for (int64_t i = 0; i < n; ++i) match[i] = dot(&img[i * D], &txt[i * D], D);
    RetrievalRanks r;
    r.image_to_text.assign(static_cast<size_t>(n), 0);
    r.text_to_image.assign(static_cast<size_t>(n), 0);
    // Row i of the similarities ranks image i's captions, and adds to each caption j's count of images above its
    // own; the product is symmetric (dot(a, b) and dot(b, a) are the same bits), so one pass serves both. Integer
    // counts are the same whichever thread adds first.
#pragma omp parallel
    {
        std::vector<double> sims(static_cast<size_t>(n));
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; ++i) {
            for (int64_t j = 0; j < n; ++j) sims[j] = dot(&img[i * D], &txt[j * D], D);
            r.image_to_text[i] = rank_of(sims, i);
            for (int64_t j = 0; j < n; ++j)
                if (ranks_above(sims[j], i, match[j], j)) {
#pragma omp atomic
                    r.text_to_image[j] += 1;
                }
        }
    }
    return r;
}

std::vector<RetrievalRecall> recall_at_k(std::span<const float> image, std::span<const float> text, int64_t n,
                                         int64_t D, std::span<const int64_t> ks) {
    MS_CHECK(n > 0, "recall_at_k: no pairs");
    const RetrievalRanks ranks = retrieval_ranks(image, text, n, D);
    const std::vector<int64_t>& i2t = ranks.image_to_text;
    const std::vector<int64_t>& t2i = ranks.text_to_image;
    std::vector<RetrievalRecall> out;
    for (int64_t k : ks) {
        MS_CHECK(k > 0, "recall_at_k: k = {}", k);
        int64_t hits_i2t = 0, hits_t2i = 0;
        for (int64_t i = 0; i < n; ++i) {
            hits_i2t += i2t[i] < k ? 1 : 0;
            hits_t2i += t2i[i] < k ? 1 : 0;
        }
        out.push_back({k, static_cast<double>(hits_i2t) / static_cast<double>(n),
                       static_cast<double>(hits_t2i) / static_cast<double>(n)});
    }
    return out;
}

}  // namespace ms::clip
