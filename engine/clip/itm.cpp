// itm.cpp: hard negatives and the matching loss (itm.h).
#include "engine/clip/itm.h"

#include <algorithm>
#include <cmath>

#include "engine/clip/contrastive_loss.h"
#include "engine/core/check.h"
#include "engine/core/philox.h"

namespace ms::clip {
namespace {

// Draws j != i among the candidates (weight > 0) with probability weight_j / sum, from the uniform u; when no
// candidate has weight, the first index after i.
int draw(std::span<const double> weight, int i, double u) {
    double total = 0;
    for (double w : weight) total += w;
    if (total <= 0) return (i + 1) % static_cast<int>(weight.size());
    double at = u * total;
    int last = -1;
    for (size_t j = 0; j < weight.size(); ++j) {
        if (weight[j] <= 0) continue;
        last = static_cast<int>(j);
        if (at < weight[j]) return last;
        at -= weight[j];
    }
    return last;  // u * total rounded past the last candidate
}

}  // namespace

ItmNegatives draw_itm_negatives(std::span<const float> image, std::span<const float> text,
                                std::span<const int32_t> tokens, int64_t b, int64_t D, float logit_scale,
                                const ItmDraw& d) {
    MS_CHECK(b >= 2 && static_cast<int64_t>(image.size()) == b * D && static_cast<int64_t>(text.size()) == b * D &&
                 static_cast<int64_t>(tokens.size()) % b == 0,
             "itm negatives: {} samples ({} image, {} text values of {}, {} tokens)", b, image.size(), text.size(), D,
             tokens.size());
    const int64_t T = static_cast<int64_t>(tokens.size()) / b;
    std::vector<float> u_img(image.size()), u_txt(text.size());
    l2_normalize_rows(image, b, D, u_img);
    l2_normalize_rows(text, b, D, u_txt);
    const auto same_caption = [&](int64_t i, int64_t j) {
        return std::equal(tokens.begin() + i * T, tokens.begin() + (i + 1) * T, tokens.begin() + j * T);
    };
    // logits[i][j] = s * cos(image i, caption j); each row's weights exp(logit - max) over the candidates
    std::vector<double> cos(static_cast<size_t>(b * b));
    for (int64_t i = 0; i < b; ++i)
        for (int64_t j = 0; j < b; ++j)
            cos[static_cast<size_t>(i * b + j)] =
                dot(&u_img[static_cast<size_t>(i * D)], &u_txt[static_cast<size_t>(j * D)], D);
    ItmNegatives n;
    n.text.resize(static_cast<size_t>(b));
    n.image.resize(static_cast<size_t>(b));
    std::vector<double> weight(static_cast<size_t>(b));
    for (int which = 0; which < 2; ++which) {  // 0: a caption for image i, 1: an image for caption i
        for (int64_t i = 0; i < b; ++i) {
            const auto logit = [&](int64_t j) {
                return static_cast<double>(logit_scale) * cos[static_cast<size_t>(which == 0 ? i * b + j : j * b + i)];
            };
            double top = -INFINITY;
            for (int64_t j = 0; j < b; ++j)
                if (!same_caption(i, j)) top = std::max(top, logit(j));
            for (int64_t j = 0; j < b; ++j)
                weight[static_cast<size_t>(j)] = same_caption(i, j) ? 0.0 : std::exp(logit(j) - top);
            const uint64_t g = static_cast<uint64_t>(d.first_sample + i);
            const int j = draw(weight, static_cast<int>(i), philox_uniform_double(d.seed, d.step, 2 * g + which));
            (which == 0 ? n.text : n.image)[static_cast<size_t>(i)] = j;
        }
    }
    return n;
}

ItmLossResult itm_loss(std::span<const float> logits, int64_t b, float weight, float grad_scale,
                       std::span<float> dlogits) {
    const int64_t pairs = 3 * b;
    MS_CHECK(static_cast<int64_t>(logits.size()) == 2 * pairs && dlogits.size() == logits.size(),
             "itm loss: {} logits and {} gradients for {} pairs", logits.size(), dlogits.size(), pairs);
    double loss = 0;
    int64_t correct = 0;
    const double scale = static_cast<double>(weight) * grad_scale / static_cast<double>(pairs);
    for (int64_t p = 0; p < pairs; ++p) {
        const int label = p < b ? 1 : 0;
        const double l0 = logits[static_cast<size_t>(2 * p)], l1 = logits[static_cast<size_t>(2 * p + 1)];
        const double top = std::max(l0, l1);
        const double lse = top + std::log(std::exp(l0 - top) + std::exp(l1 - top));
        loss += lse - (label == 1 ? l1 : l0);
        correct += (l1 > l0 ? 1 : 0) == label ? 1 : 0;
        for (int c = 0; c < 2; ++c) {
            const double pc = std::exp((c == 0 ? l0 : l1) - lse);
            dlogits[static_cast<size_t>(2 * p + c)] = static_cast<float>(scale * (pc - (c == label ? 1.0 : 0.0)));
        }
    }
    return {.loss = static_cast<float>(loss / static_cast<double>(pairs)),
            .accuracy = static_cast<float>(static_cast<double>(correct) / static_cast<double>(pairs))};
}

}  // namespace ms::clip
