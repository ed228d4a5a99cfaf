// gpt_test_util.h: small helpers shared by the whole-model tests (tests/model/*.cpp): the tiny shape, a
// deterministic token batch, one training step as the trainer does it, and scale-free error measures.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <ostream>
#include <vector>

#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/core/philox.h"
#include "engine/model/gpt.h"
#include "engine/optim/adamw.h"

namespace ms {
// Lets GoogleTest print "kFast" / "kReference" for a parameterised test instead of the enum's bytes.
inline void PrintTo(OpMode mode, std::ostream* os) { *os << (mode == OpMode::kFast ? "kFast" : "kReference"); }
}  // namespace ms

namespace ms::test {

// The tensor-parallel group of a single-rank model.
inline Communicator& tp_self() {
    static SelfCommunicator self("tp");
    return self;
}

// Small, and deliberately not a multiple of any block size: HS = 12, V = 61 real columns out of Vp = 128.
inline GptShape tiny_shape() {
    GptShape s;
    s.L = 2;
    s.C = 48;
    s.NH = 4;
    s.T = 16;
    s.V = 61;
    s.Vp = 128;
    s.F = 4 * 48;
    return s;
}

// tiny_shape() as a Llama: 2 key/value heads for the 4 query heads, an untied output layer.
inline GptShape tiny_llama_shape() {
    GptShape s = tiny_shape();
    s.arch = ModelArch::kLlama;
    s.NKV = 2;
    s.untied = true;
    return s;
}

// For the CUDA emulation, which is slow: smaller than tiny_shape(), and still no dimension a multiple of a block
// (HS = 16 < 64, T = 9, V = 61 of Vp = 128).
inline GptShape emu_shape() {
    GptShape s;
    s.L = 2;
    s.C = 32;
    s.NH = 2;
    s.T = 9;
    s.V = 61;
    s.Vp = 128;
    s.F = 4 * 32;
    return s;
}

inline std::unique_ptr<Backend> make_cpu_backend(OpMode mode) {
    BackendOptions o;
    o.mode = mode;
    return make_backend(o);
}

inline int64_t flat_size(const Gpt& model) {
    const ParamInfo& last = model.params_info().back();
    return last.offset + last.numel;
}

// (n) uniform token ids in [0, V), a pure function of (seed, stream, index).
inline std::vector<int32_t> random_tokens(int64_t n, int V, uint64_t seed, uint64_t stream) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
        t[i] = std::min(V - 1, static_cast<int>(philox_uniform_double(seed, stream, i) * V));
    return t;
}

struct StepResult {
    float loss;        // before the update
    double grad_norm;  // before clipping
};

// One optimizer step the way engine/train does it: zero, forward, backward, global norm, clip, AdamW.
inline StepResult train_step(Gpt& model, AdamW& opt, Backend& backend, const int32_t* tokens, const int32_t* targets,
                             int B, int T, float lr, float clip_grad) {
    model.zero_grads();
    const float loss = model.forward(tokens, targets, B, T);
    model.backward();
    const double norm = std::sqrt(backend.sum_squares(Tensor::f32(model.grads_f32(), {flat_size(model)})));
    opt.step(model.params(), model.grads_f32(), lr, clip_coefficient(norm, clip_grad));
    return {loss, norm};
}

// max |a - b| / max |b| over n elements: the error of `a` relative to the scale of the reference `b`.
template <typename A, typename B>
double rel_max_error(const A* a, const B* b, int64_t n) {
    double err = 0, scale = 0;
    for (int64_t i = 0; i < n; ++i) {
        err = std::max(err, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
        scale = std::max(scale, std::abs(static_cast<double>(b[i])));
    }
    return scale > 0 ? err / scale : err;
}

}  // namespace ms::test
