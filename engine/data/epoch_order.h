// epoch_order.h: the order a run visits n samples in, with nothing stored: global position g -> epoch e = g / n,
// position p = g % n -> sample F_e(p), where F_e is a 4-round balanced Feistel network on [0, 4^h) (4^h >= n, so at
// most 4n) whose round function is Philox keyed by a mix of (seed, the data's fingerprint, a stream) with the epoch
// and the round in the counter, cycle-walked into [0, n). A Feistel network is a bijection for any round function,
// and cycle walking keeps it one on [0, n): each epoch visits every sample once. The order is a pure function of
// (seed, fingerprint, stream, g), so the whole data state of a run is its consumed samples, under any data-parallel
// size. The token sampler (dataset.h, one stream per split) and the image-text order (image_text.h) both use it.
#pragma once

#include <cstdint>

namespace ms {

class EpochOrder {
  public:
    EpochOrder() = default;
    EpochOrder(int64_t n, uint64_t seed, uint64_t fingerprint, uint64_t stream);  // n >= 1
    int64_t sample_at(int64_t g) const;                                           // g >= 0
    int64_t size() const { return n_; }                                           // samples per epoch

  private:
    int64_t permute(int64_t position, int64_t epoch) const;

    int64_t n_ = 0;
    uint64_t key_ = 0;   // the Philox key of the Feistel rounds
    int half_bits_ = 1;  // Feistel half width in bits
};

}  // namespace ms
