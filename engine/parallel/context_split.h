// context_split.h: which tokens of a sequence a context-parallel rank holds (Megatron's context parallelism with
// causal load balancing). A sequence of S tokens is cut into 2*cp chunks of S / (2*cp); context rank r holds chunk r
// and chunk 2*cp - 1 - r, in that order, so every rank gets the same share of the causal attention's work (an early
// chunk sees few keys, its partner many). The one place this arithmetic lives: the pipeline takes its tokens and
// targets through rows(), and Llama's builder its rotary table's positions.
#pragma once

#include <cstdint>

#include "engine/core/check.h"

namespace ms {

struct ContextSplit {
    int cp = 1;    // context-parallel ranks
    int rank = 0;  // this one, in [0, cp)

    // The rows of a sequence of S tokens held here (S / cp), and one chunk's (S / (2 cp)).
    int64_t local(int64_t S) const { return S / cp; }
    int64_t chunk(int64_t S) const { return S / (2 * int64_t{cp}); }
    // The position in the sequence of local row i (in [0, local(S))).
    int64_t position(int64_t i, int64_t S) const {
        const int64_t c = chunk(S);
        return i < c ? rank * c + i : (2 * int64_t{cp} - 1 - rank) * c + (i - c);
    }
    // local[b][i][:] = full[b][position(i)][:] for `batch` sequences of S rows of `width` elements.
    template <class T>
    void rows(const T* full, T* local, int64_t batch, int64_t S, int64_t width) const {
        MS_CHECK(S % (2 * int64_t{cp}) == 0, "context split: {} rows do not cut into 2 * cp({}) chunks", S, cp);
        const int64_t n = this->local(S);
        for (int64_t b = 0; b < batch; ++b) {
            for (int64_t i = 0; i < n; ++i) {
                const T* src = full + (b * S + position(i, S)) * width;
                T* dst = local + (b * n + i) * width;
                for (int64_t w = 0; w < width; ++w) dst[w] = src[w];
            }
        }
    }
};

}  // namespace ms
