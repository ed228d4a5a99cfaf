// philox.h: Philox4x32-10 counter-based RNG (Salmon et al., SC'11) and the layout-invariant draws built on it.
//
// Every parameter element is a pure function of (seed, parameter name, global element index), so any
// TP/PP/DP split of a tensor starts from bit-identical values (docs/design.md invariant 1).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

namespace ms {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

inline PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key) {
    constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
    for (int round = 0; round < 10; ++round) {
        const uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0];
        const uint64_t p1 = static_cast<uint64_t>(kM1) * ctr[2];
        ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(p1),
               static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(p0)};
        key[0] += kW0;
        key[1] += kW1;
    }
    return ctr;
}

// FNV-1a 64 of a canonical parameter name: the parameter's stream id, independent of layout and order.
constexpr uint64_t name_hash(std::string_view s) {
    uint64_t h = 1469598103934665603ull;
    for (char c : s) {
        h ^= static_cast<uint8_t>(c);
        h *= 1099511628211ull;
    }
    return h;
}

// Uniform in (0, 1): 24 random bits, offset by half an ulp so log() is always finite.
inline float philox_uniform(uint32_t bits) { return (static_cast<float>(bits >> 8) + 0.5f) * (1.0f / 16777216.0f); }

// One N(0,1) draw for element `index` of stream `stream` (Box-Muller on the first two Philox words).
inline float philox_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    const PhiloxCounter r = philox4x32_10({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                                           static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                                          {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
    const double u1 = philox_uniform(r[0]);
    const double u2 = philox_uniform(r[1]);
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

// A uniform double in [0, 1) with 53 random bits, for samplers and synthetic data.
inline double philox_uniform_double(uint64_t seed, uint64_t stream, uint64_t index) {
    const PhiloxCounter r = philox4x32_10({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                                           static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                                          {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
    const uint64_t bits = (static_cast<uint64_t>(r[0]) << 21) ^ (r[1] >> 11);
    return static_cast<double>(bits & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

}  // namespace ms
