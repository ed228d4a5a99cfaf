// rope_table.h: the rotary position embedding's table of cos and sin, computed once on the host in double (so the
// CPU and CUDA backends read the same fp32 numbers) and handed to Backend::rope as RopeArgs::table.
//
// Inverse frequencies f_i = theta^(-2i/HS), i < HS/2 (Hugging Face's _compute_default_rope_parameters), optionally
// rescaled as Llama 3 does (rope_type "llama3", transformers' _compute_llama3_parameters): with wavelength
// w_i = 2 pi / f_i, low = original_max_position_embeddings / low_freq_factor and high = ... / high_freq_factor,
//   w_i < high:          f_i unchanged (high frequencies);
//   w_i > low:           f_i / factor (low frequencies);
//   otherwise:           (1 - s) f_i / factor + s f_i, s = (original_max_position_embeddings / w_i - low_freq_factor)
//                        / (high_freq_factor - low_freq_factor).
// Scaling is off when factor is 0 or 1. Row p of the table is [cos(p f_i), i < HS/2 | sin(p f_i), i < HS/2].
#pragma once

#include <compare>
#include <cstdint>
#include <vector>

#include "engine/backends/backend.h"

namespace ms {

struct RopeScaling {
    double factor = 0.0;  // 0 or 1: no scaling (Llama 3.1: 8)
    double low_freq_factor = 1.0;
    double high_freq_factor = 4.0;
    double original_max_position_embeddings = 8192.0;
    auto operator<=>(const RopeScaling&) const = default;
};

// (HS/2) inverse frequencies f_i, scaled as above. Fatal unless HS is even and positive, theta > 1, and (with scaling
// on) factor > 0 and high_freq_factor > low_freq_factor > 0.
std::vector<double> rope_inv_freq(int64_t HS, double theta, const RopeScaling& scaling);

// (positions, HS) fp32 rows [cos(p f_i) | sin(p f_i)] for p in [0, positions), each computed in double and rounded
// once.
std::vector<float> rope_table(int64_t positions, int64_t HS, double theta, const RopeScaling& scaling);

// The sizes of a Backend::rope call, checked once for every backend: qkv (N, row), the table (P, HS) fp32, the
// positions (N) int32 when defined (their values are the caller's to keep in [0, P): the CPU backend checks them,
// the CUDA kernels cannot), rotated = (NH + NKV) * HS leading columns of each row. Fatal, with a sentence, on an odd
// HS, NKV not dividing NH, or sizes that disagree.
struct RopeDims {
    int64_t N, HS, P, row, rotated;
};
RopeDims rope_dims(const RopeArgs& a);

}  // namespace ms
