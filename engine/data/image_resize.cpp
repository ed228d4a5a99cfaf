// image_resize.cpp: shorter side to S, centre crop, normalise (image_ops.h).
//
// The resized image is W' x H' with the shorter side S and the longer one round(longer * S / shorter); the crop
// keeps its columns [(W' - S) / 2, + S) and rows [(H' - S) / 2, + S) (integer division), so only those outputs are
// computed. Each axis is resampled separately with PIL's bilinear filter: output o of the resized axis has its
// centre at source coordinate (o + 0.5) / scale, and takes the source pixels within `support` of it weighted by a
// triangle of half-width support = max(1, 1 / scale) (so shrinking averages every source pixel instead of
// skipping some), weights normalised to sum 1 over the pixels inside the image. At scale 1 the weights are exactly
// 1 and 0: an S x S image comes out unchanged. Intermediate values stay float (no rounding between the passes).
#include <algorithm>
#include <cmath>

#include "engine/data/image_ops.h"
#include "engine/data/image_text.h"

namespace ms {
namespace {

// Source taps of `count` consecutive outputs, starting at output `first_out` of an axis resized from in_size to
// out_size.
struct AxisTaps {
    std::vector<int> first;      // (count) first source pixel of each output
    std::vector<int> length;     // (count) number of source pixels of each output
    std::vector<float> weights;  // (count, max_length) row o: weights of first[o] .. first[o] + length[o] - 1
    int max_length = 0;
};

AxisTaps axis_taps(int in_size, int out_size, int first_out, int count) {
    const double scale = static_cast<double>(out_size) / in_size;
    const double stretch = std::max(1.0, 1.0 / scale);  // the triangle's half-width in source pixels
    AxisTaps t;
    t.max_length = static_cast<int>(std::ceil(stretch)) * 2 + 1;
    t.first.resize(static_cast<size_t>(count));
    t.length.resize(static_cast<size_t>(count));
    t.weights.assign(static_cast<size_t>(count) * t.max_length, 0.0f);
    for (int o = 0; o < count; ++o) {
        const double centre = (first_out + o + 0.5) / scale;
        const int lo = std::max(static_cast<int>(centre - stretch + 0.5), 0);
        const int hi = std::min(static_cast<int>(centre + stretch + 0.5), in_size);
        const int n = std::min(hi - lo, t.max_length);
        float* w = t.weights.data() + static_cast<size_t>(o) * t.max_length;
        double sum = 0;
        for (int k = 0; k < n; ++k) {
            const double x = std::abs((lo + k - centre + 0.5) / stretch);
            w[k] = static_cast<float>(x < 1.0 ? 1.0 - x : 0.0);
            sum += w[k];
        }
        for (int k = 0; k < n; ++k) w[k] = static_cast<float>(w[k] / sum);
        t.first[static_cast<size_t>(o)] = lo;
        t.length[static_cast<size_t>(o)] = n;
    }
    return t;
}

}  // namespace

void resize_crop_normalize(const RgbImage& image, int S, float* out) {
    const int w = image.width, h = image.height;
    const int shorter = std::min(w, h);
    const int new_w = w == shorter ? S : std::max(S, static_cast<int>(std::lround(static_cast<double>(w) * S / h)));
    const int new_h = h == shorter ? S : std::max(S, static_cast<int>(std::lround(static_cast<double>(h) * S / w)));
    const AxisTaps tx = axis_taps(w, new_w, (new_w - S) / 2, S);
    const AxisTaps ty = axis_taps(h, new_h, (new_h - S) / 2, S);

    // horizontal pass over the source rows the vertical pass reads: rows [y0, y1) -> (y1 - y0, S, 3)
    const int y0 = ty.first.front(), y1 = ty.first.back() + ty.length.back();
    std::vector<float> rows(static_cast<size_t>(y1 - y0) * S * 3);
    for (int y = y0; y < y1; ++y) {
        const uint8_t* src = image.pixels.data() + static_cast<size_t>(y) * w * 3;
        float* dst = rows.data() + static_cast<size_t>(y - y0) * S * 3;
        for (int ox = 0; ox < S; ++ox) {
            const float* wt = tx.weights.data() + static_cast<size_t>(ox) * tx.max_length;
            const uint8_t* p = src + static_cast<size_t>(tx.first[static_cast<size_t>(ox)]) * 3;
            float r = 0, g = 0, b = 0;
            for (int k = 0; k < tx.length[static_cast<size_t>(ox)]; ++k) {
                r += wt[k] * p[3 * k];
                g += wt[k] * p[3 * k + 1];
                b += wt[k] * p[3 * k + 2];
            }
            dst[3 * ox] = r;
            dst[3 * ox + 1] = g;
            dst[3 * ox + 2] = b;
        }
    }
    // vertical pass and normalisation into (3, S, S)
    const size_t plane = static_cast<size_t>(S) * S;
    for (int oy = 0; oy < S; ++oy) {
        const float* wt = ty.weights.data() + static_cast<size_t>(oy) * ty.max_length;
        const int first = ty.first[static_cast<size_t>(oy)] - y0;
        for (int ox = 0; ox < S; ++ox) {
            float acc[3] = {0, 0, 0};
            for (int k = 0; k < ty.length[static_cast<size_t>(oy)]; ++k) {
                const float* p = rows.data() + (static_cast<size_t>(first + k) * S + ox) * 3;
                for (int c = 0; c < 3; ++c) acc[c] += wt[k] * p[c];
            }
            for (int c = 0; c < 3; ++c) {
                out[c * plane + static_cast<size_t>(oy) * S + ox] = (acc[c] / 255.0f - kClipMean[c]) / kClipStd[c];
            }
        }
    }
}

}  // namespace ms
