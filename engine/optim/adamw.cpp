#include "engine/optim/adamw.h"

#include <cmath>
#include <numbers>

namespace ms {

AdamW::AdamW(const std::vector<ParamInfo>& table, int64_t flat_size, const OptimizerConfig& cfg, Backend& backend)
    : table_(table),
      cfg_(cfg),
      backend_(backend),
      m_(static_cast<size_t>(flat_size) * sizeof(float)),
      v_(static_cast<size_t>(flat_size) * sizeof(float)) {}

void AdamW::step(float* params, const float* grads, float lr, float grad_scale) {
    ++step_;
    for (const ParamInfo& p : table_) {
        const int64_t n = p.numel;
        backend_.adamw({Tensor::f32(params + p.offset, {n}), Tensor::f32(const_cast<float*>(grads) + p.offset, {n}),
                        Tensor::f32(m_.as<float>() + p.offset, {n}), Tensor::f32(v_.as<float>() + p.offset, {n}), lr,
                        cfg_.adam_beta1, cfg_.adam_beta2, cfg_.adam_eps, p.weight_decay ? cfg_.weight_decay : 0.0f,
                        grad_scale, step_, Tensor()});
    }
}

float clip_coefficient(double grad_norm, float clip_grad) {
    if (clip_grad <= 0.0f || !std::isfinite(grad_norm)) return 1.0f;
    const double coeff = clip_grad / (grad_norm + 1e-6);
    return coeff < 1.0 ? static_cast<float>(coeff) : 1.0f;
}

float learning_rate(const OptimizerConfig& opt, const LrScheduleConfig& sched, int64_t train_iters, int64_t it) {
    const int64_t warmup = sched.lr_warmup_iters;
    if (warmup > 0 && it <= warmup) return opt.lr * static_cast<float>(it) / static_cast<float>(warmup);
    if (sched.lr_decay_style == "constant") return opt.lr;
    const int64_t decay_iters = sched.lr_decay_iters > 0 ? sched.lr_decay_iters : train_iters;
    if (it >= decay_iters) return opt.min_lr;
    const double ratio = static_cast<double>(it - warmup) / static_cast<double>(decay_iters - warmup);
    double coeff = 1.0 - ratio;  // linear
    if (sched.lr_decay_style == "cosine") coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
    return static_cast<float>(opt.min_lr + coeff * (opt.lr - opt.min_lr));
}

}  // namespace ms
