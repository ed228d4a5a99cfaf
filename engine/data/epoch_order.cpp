// epoch_order.cpp: the seeded per-epoch bijection (epoch_order.h).
#include "engine/data/epoch_order.h"

#include <algorithm>
#include <bit>

#include "engine/core/check.h"
#include "engine/core/philox.h"

namespace ms {
namespace {

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

}  // namespace

EpochOrder::EpochOrder(int64_t n, uint64_t seed, uint64_t fingerprint, uint64_t stream) : n_(n) {
    MS_CHECK(n >= 1, "EpochOrder over {} samples", n);
    const int bits = std::max(2, static_cast<int>(std::bit_width(static_cast<uint64_t>(n - 1))));
    half_bits_ = (bits + 1) / 2;
    key_ = splitmix64(splitmix64(seed ^ splitmix64(fingerprint)) + stream);
}

int64_t EpochOrder::permute(int64_t position, int64_t epoch) const {
    const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
    const PhiloxKey key = {static_cast<uint32_t>(key_), static_cast<uint32_t>(key_ >> 32)};
    auto feistel = [&](uint64_t x) {
        uint64_t left = x >> half_bits_, right = x & mask;
        for (uint32_t round = 0; round < 4; ++round) {
            const PhiloxCounter r = philox4x32_10({static_cast<uint32_t>(right), round, static_cast<uint32_t>(epoch),
                                                   static_cast<uint32_t>(static_cast<uint64_t>(epoch) >> 32)},
                                                  key);
            const uint64_t f = (static_cast<uint64_t>(r[1]) << 32) | r[0];
            const uint64_t next_right = left ^ (f & mask);
            left = right;
            right = next_right;
        }
        return (left << half_bits_) | right;
    };
    uint64_t y = feistel(static_cast<uint64_t>(position));
    while (y >= static_cast<uint64_t>(n_)) y = feistel(y);  // cycle walking
    return static_cast<int64_t>(y);
}

int64_t EpochOrder::sample_at(int64_t g) const {
    MS_CHECK(g >= 0, "negative global sample index {}", g);
    return permute(g % n_, g / n_);
}

}  // namespace ms
