#include "engine/optim/loss_scaler.h"

#include <algorithm>

namespace ms {

LossScaler::LossScaler(const MixedPrecisionConfig& cfg) {
    if (cfg.dtype != "fp16") return;
    enabled_ = true;
    dynamic_ = cfg.loss_scale <= 0;
    min_scale_ = cfg.min_loss_scale;
    window_ = cfg.loss_scale_window;
    hysteresis_ = cfg.hysteresis;
    state_.scale = dynamic_ ? cfg.initial_loss_scale : cfg.loss_scale;
    state_.hysteresis_tracker = hysteresis_;
}

void LossScaler::update(bool found_overflow) {
    if (!dynamic_) return;
    if (found_overflow) {
        state_.growth_tracker = 0;
        state_.hysteresis_tracker -= 1;
        if (state_.hysteresis_tracker <= 0) state_.scale = std::max(state_.scale * 0.5, min_scale_);
        return;
    }
    state_.growth_tracker += 1;
    if (state_.growth_tracker == window_) {
        state_.growth_tracker = 0;
        state_.hysteresis_tracker = hysteresis_;
        state_.scale *= 2.0;
    }
}

}  // namespace ms
