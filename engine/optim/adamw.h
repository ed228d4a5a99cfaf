// adamw.h: AdamW over the flat parameter buffer (Megatron's "adam": decoupled weight decay, no decay on biases,
// LayerNorm and other 1-D parameters), global gradient-norm clipping, and the learning-rate schedules.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/config/config.h"
#include "engine/model/gpt.h"
#include "memory/host_buffer.h"

namespace ms {

class AdamW {
  public:
    // table: the parameters (offsets into the flat buffers); flat_size: elements in the flat buffers.
    AdamW(const std::vector<ParamInfo>& table, int64_t flat_size, const OptimizerConfig& cfg, Backend& backend);
    // One step over every parameter: one fused pass each. grad_scale multiplies the gradients (clipping).
    void step(float* params, const float* grads, float lr, float grad_scale);
    int64_t steps_taken() const { return step_; }
    float* exp_avg() { return m_.as<float>(); }
    float* exp_avg_sq() { return v_.as<float>(); }

  private:
    const std::vector<ParamInfo>& table_;
    OptimizerConfig cfg_;
    Backend& backend_;
    HostBuffer m_;  // (flat_size) first moments
    HostBuffer v_;  // (flat_size) second moments
    int64_t step_ = 0;
};

// Megatron's clip: coefficient = clip_grad / (norm + 1e-6) when that is < 1, else 1. clip_grad 0 disables.
float clip_coefficient(double grad_norm, float clip_grad);

// Learning rate for iteration `it` (1-based). Warm-up is linear from lr/warmup at it = 1 to lr at it = warmup;
// then constant, or linear / cosine decay from lr to min_lr at decay_iters (0 -> train_iters); min_lr after.
float learning_rate(const OptimizerConfig& opt, const LrScheduleConfig& sched, int64_t train_iters, int64_t it);

}  // namespace ms
