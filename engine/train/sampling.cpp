// sampling.cpp: generate() (sampling.h), moved here from trainer.cpp so that the `generate` subcommand shares it.
#include "engine/train/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <utility>

#include "engine/core/philox.h"

namespace ms {

std::vector<int32_t> generate(Gpt& model, Communicator& tp, std::vector<int32_t> context, int num_tokens,
                              float temperature, int top_k, uint64_t seed, const std::function<bool()>& stop,
                              std::optional<int32_t> end_token) {
    const GptShape& s = model.shape();
    const uint64_t stream = name_hash("generate");
    std::vector<std::pair<float, int>> probs(static_cast<size_t>(s.V));
    const int64_t Vl = s.Vp / tp.size();
    std::vector<float> full(static_cast<size_t>(s.Vp));
    // the last row's logits of every TP rank, in the model's dtype (the all-gather follows the backend's kernels)
    std::vector<std::byte> gathered(static_cast<size_t>(s.Vp) * dtype_size(model.dtype()));
    for (int i = 0; i < num_tokens; ++i) {
        if (stop && stop()) break;
        const int T = static_cast<int>(std::min<size_t>(context.size(), static_cast<size_t>(s.seq())));
        const int32_t* window = context.data() + context.size() - T;
        model.forward(window, nullptr, 1, T);
        const std::byte* row = static_cast<const std::byte*>(model.logits_tensor().data) +
                               static_cast<size_t>(T - 1) * Vl * dtype_size(model.dtype());
        auto gather = [&](auto z) {
            using E = decltype(z);
            tp.all_gather(std::span<const E>(reinterpret_cast<const E*>(row), static_cast<size_t>(Vl)),
                          std::span<E>(reinterpret_cast<E*>(gathered.data()), static_cast<size_t>(s.Vp)))
                .wait();
            const E* g = reinterpret_cast<const E*>(gathered.data());
            for (int64_t v = 0; v < s.Vp; ++v) full[static_cast<size_t>(v)] = to_float(g[v]);
        };
        visit_float(model.dtype(), gather);
        const float* logits = full.data();
        for (int v = 0; v < s.V; ++v) probs[v] = {logits[v] / std::max(temperature, 1e-6f), v};
        size_t keep = probs.size();
        if (top_k > 0 && static_cast<size_t>(top_k) < keep) {
            keep = static_cast<size_t>(top_k);
            std::partial_sort(probs.begin(), probs.begin() + keep, probs.end(),
                              [](auto& a, auto& b) { return a.first > b.first; });
        }
        float mx = -std::numeric_limits<float>::infinity();
        for (size_t j = 0; j < keep; ++j) mx = std::max(mx, probs[j].first);
        double sum = 0;
        for (size_t j = 0; j < keep; ++j) sum += std::exp(static_cast<double>(probs[j].first - mx));
        double u = philox_uniform_double(seed, stream, static_cast<uint64_t>(i)) * sum;
        int next = probs[keep - 1].second;
        for (size_t j = 0; j < keep; ++j) {
            u -= std::exp(static_cast<double>(probs[j].first - mx));
            if (u <= 0) {
                next = probs[j].second;
                break;
            }
        }
        context.push_back(next);
        if (end_token && next == *end_token) break;
    }
    return context;
}

}  // namespace ms
