// loss_scaler.h: fp16's loss scaling, Megatron's DynamicGradScaler (and ConstantGradScaler) with its defaults.
//
// fp16 gradients underflow without it: the backward starts from scale() * loss, so every activation gradient is
// scaled too, and the optimizer divides the fp32 gradients by scale() again (folded into AdamW's grad_scale). A
// step whose gradients overflowed (a non-finite global gradient norm, the same on every rank) is skipped and
// counted in "number of skipped iterations". Dynamic scaling, after each step:
//   overflow:     growth_tracker = 0; hysteresis_tracker -= 1; when it reaches 0: scale = max(scale / 2, min_scale)
//   no overflow:  growth_tracker += 1; after loss_scale_window such steps: scale *= 2, growth_tracker = 0,
//                 hysteresis_tracker = hysteresis
// (hysteresis_tracker is not reset by a good step, so after the first hysteresis - 1 overflows every overflow halves
// the scale, as in Megatron.) bf16 and fp32 need none: scale() is 1 and update() does nothing. A constant
// mixed_precision.loss_scale is used as is, and overflowing steps are skipped without changing it.
#pragma once

#include <cstdint>

#include "engine/config/config.h"

namespace ms {

// What a checkpoint keeps for a bit-identical resume (train_state.json).
struct LossScalerState {
    double scale = 1.0;
    int64_t growth_tracker = 0;
    int64_t hysteresis_tracker = 0;
};

class LossScaler {
  public:
    explicit LossScaler(const MixedPrecisionConfig& cfg);

    bool enabled() const { return enabled_; }  // fp16
    bool dynamic() const { return dynamic_; }  // fp16 without a constant loss_scale
    float scale() const { return static_cast<float>(state_.scale); }
    // After each step: found_overflow = the step's gradients were not finite (and the step was skipped).
    void update(bool found_overflow);

    const LossScalerState& state() const { return state_; }
    void set_state(const LossScalerState& s) { state_ = s; }

  private:
    bool enabled_ = false, dynamic_ = false;
    double min_scale_ = 1.0;
    int64_t window_ = 1000, hysteresis_ = 2;
    LossScalerState state_;
};

}  // namespace ms
