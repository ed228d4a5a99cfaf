// sampler.cpp: split boundaries and the per-epoch seeded bijection that orders samples (dataset.h).
//
// Split: weights "969,30,1" (1 to 3 non-negative numbers, missing ones are 0) are normalized and turned into token
// boundaries exactly as Megatron's _get_split_indices does for documents: cumulative rounding, then a shift that
// makes the last boundary equal the token count. Split k owns tokens [b_k, b_{k+1}); its sample s is the window
// [b_k + s*T, b_k + s*T + T] (T + 1 tokens), so num_samples = floor((b_{k+1} - b_k - 1) / T) and no window
// reads a token of another split.
//
// Order: global index g -> epoch e = g / n, position p = g % n -> sample F_e(p), where F_e is a 4-round balanced
// Feistel network on [0, 4^h) (4^h >= n, so at most 4n) whose round function is Philox keyed by
// (seed, fingerprint, split) with the epoch and round in the counter. A Feistel network is a bijection for any
// round function; cycle walking (apply F_e again while the result is >= n) restricts it to a bijection of
// [0, n). Expected walk length < 4. Nothing is stored, so any rank computes any sample independently.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>

#include "engine/core/check.h"
#include "engine/core/philox.h"
#include "engine/data/dataset.h"

namespace ms {
namespace {

constexpr const char* kSplitNames[3] = {"train", "valid", "test"};

std::vector<double> parse_split(const std::string& text) {
    std::vector<double> w;
    size_t pos = 0;
    while (true) {
        const size_t comma = text.find(',', pos);
        const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        char* end = nullptr;
        const double v = std::strtod(item.c_str(), &end);
        const bool blank_rest = end && std::all_of(static_cast<const char*>(end), item.c_str() + item.size(),
                                                   [](char c) { return c == ' '; });
        if (item.find_first_not_of(' ') == std::string::npos || !blank_rest || !std::isfinite(v) || v < 0) {
            throw UserError(
                fmt::format("config error: data.split='{}' has the entry '{}', which is not a non-negative "
                            "number; hint: give train,valid,test weights, e.g. data.split=969,30,1",
                            text, item));
        }
        w.push_back(v);
        if (comma == std::string::npos) break;
        pos = comma + 1;
    }
    if (w.size() > 3) {
        throw UserError(
            fmt::format("config error: data.split='{}' has {} weights, but there are only 3 splits "
                        "(train,valid,test); hint: e.g. data.split=969,30,1",
                        text, w.size()));
    }
    w.resize(3, 0.0);
    const double sum = w[0] + w[1] + w[2];
    if (sum <= 0) {
        throw UserError(
            fmt::format("config error: data.split='{}' has weights summing to 0; hint: e.g. "
                        "data.split=969,30,1",
                        text));
    }
    for (double& x : w) x /= sum;
    return w;
}

}  // namespace

Sampler::Sampler(const TokenSource& source, const std::string& split_weights, Split split, int seq_length,
                 uint64_t seed)
    : source_(source), seq_length_(seq_length) {
    if (seq_length < 1) {
        throw UserError(fmt::format("config error: model.seq_length={} must be >= 1", seq_length));
    }
    const std::vector<double> w = parse_split(split_weights);
    const int64_t n_tok = source.num_tokens();
    // Megatron's _get_split_indices, on tokens
    int64_t bounds[4] = {0, 0, 0, 0};
    for (int k = 0; k < 3; ++k) bounds[k + 1] = bounds[k] + std::llround(w[k] * static_cast<double>(n_tok));
    const int64_t excess = bounds[3] - n_tok;
    for (int k = 1; k < 4; ++k) bounds[k] = std::clamp<int64_t>(bounds[k] - excess, 0, n_tok);

    const int k = static_cast<int>(split);
    begin_token_ = bounds[k];
    const int64_t len = bounds[k + 1] - bounds[k];
    num_samples_ = len > 0 ? (len - 1) / seq_length : 0;
    if (num_samples_ < 1) {
        throw UserError(fmt::format(
            "data error: the {} split of {} has {} tokens (tokens [{}, {}) of {} with data.split={}), but one sample "
            "needs model.seq_length + 1 = {} tokens; hint: use more data, a smaller model.seq_length, or give the {} "
            "split a larger weight in data.split",
            kSplitNames[k], source.describe(), len, bounds[k], bounds[k + 1], n_tok, split_weights,
            static_cast<int64_t>(seq_length) + 1, kSplitNames[k]));
    }
    order_ = EpochOrder(num_samples_, seed, source.fingerprint(), static_cast<uint64_t>(k));
}

int64_t Sampler::num_samples() const { return num_samples_; }

int64_t Sampler::sample_at(int64_t g) const { return order_.sample_at(g); }

void Sampler::fill(int64_t first, int64_t count, int32_t* inputs, int32_t* targets) const {
    const int T = seq_length_;
    // Two reads of the window (shifted by one) instead of one into a temporary: a training step allocates nothing.
    for (int64_t i = 0; i < count; ++i) {
        const int64_t s = sample_at(first + i);
        source_.read(begin_token_ + s * T, T, inputs + i * T);
        source_.read(begin_token_ + s * T + 1, T, targets + i * T);
    }
}

}  // namespace ms
