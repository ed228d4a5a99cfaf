// clip_model.cpp: the two towers over one flat parameter buffer, and a contrastive step (clip_model.h).
#include "engine/clip/clip_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "engine/core/check.h"
#include "engine/optim/distributed_optimizer.h"

namespace ms {
namespace {

GptProgram::Options tower_options(int b, DType dtype, float* params, void* weights, const graph::GradPlacement& grads) {
    GptProgram::Options o;
    o.max_batch = b;
    o.num_slots = 1;
    o.part = GptPart{.first_layer = 0, .num_layers = -1, .embedding = true, .head = false};
    o.dtype = dtype;
    o.params = params;
    o.weights = weights;
    o.grads = grads;
    return o;
}

}  // namespace

ClipModel::ClipModel(const ClipShape& shape, Backend& backend, const ProcessGroups& groups, int b, DType dtype)
    : shape_(shape),
      backend_(backend),
      groups_(groups),
      b_(b),
      dtype_(dtype),
      loss_(b, shape.embed_dim, *groups.dp, shape.max_logit_scale) {
    MS_CHECK(b >= 1, "ClipModel: {} samples per rank", b);
    table_ = clip_param_table(shape, groups.tp->size());
    for (size_t i = 0; i < table_.size(); ++i) {
        if (table_[i].name.starts_with("text_model.") && text_base_ == 0) text_base_ = table_[i].offset;
        if (table_[i].name == "logit_scale") logit_scale_ = static_cast<int>(i);
    }
    flat_ = table_.back().offset + table_.back().numel;
    padded_ = padded_flat_size(flat_, groups.dp->size());

    const size_t f32_bytes = static_cast<size_t>(padded_) * sizeof(float);
    params_ = MemoryBlock(f32_bytes, nullptr, MemCategory::kParameter, "clip parameters");
    grads_ = MemoryBlock(f32_bytes, nullptr, MemCategory::kGradient, "clip gradients");
    std::fill_n(params_.as<float>(), padded_, 0.0f);
    backend_.zero(Tensor::f32(grads(), {padded_}));
    if (dtype != DType::kF32) {
        weights_ = MemoryBlock(static_cast<size_t>(padded_) * dtype_size(dtype), nullptr, MemCategory::kParameter,
                               "clip 16-bit weights");
    }
    grad_placement_ = graph::GradPlacement(grads(), DType::kF32, padded_);
    auto* w = static_cast<std::byte*>(weights());
    const size_t act = dtype_size(dtype);
    vision_ = std::make_unique<GptProgram>(shape.vision, backend, *groups.tp,
                                           tower_options(b, dtype, params(), w, grad_placement_));
    text_ = std::make_unique<GptProgram>(
        shape.text, backend, *groups.tp,
        tower_options(b, dtype, params() + text_base_, w + text_base_ * static_cast<int64_t>(act),
                      grad_placement_.from(text_base_)));

    const int T = shape.vision.T;
    class_tokens_.assign(static_cast<size_t>(b) * T, 1);  // 1: outside the class-token table (clip_tower.cpp)
    class_rows_.resize(static_cast<size_t>(b));
    for (int i = 0; i < b; ++i) {
        class_tokens_[static_cast<size_t>(i) * T] = 0;
        class_rows_[static_cast<size_t>(i)] = i * T;
    }
    text_rows_.resize(static_cast<size_t>(b));
    const size_t features = static_cast<size_t>(b) * shape.embed_dim;
    image_features_.resize(features);
    text_features_.resize(features);
    dimage_.resize(features);
    dtext_.resize(features);
}

ClipModel::~ClipModel() = default;

void ClipModel::init_weights(uint64_t seed, float init_std) {
    backend_.synchronize();
    init_params(table_, params(), seed, init_std, groups_.tp->rank(), groups_.tp->size(), INT64_MAX);
    refresh_weights();
}

void ClipModel::refresh_weights() {
    if (dtype_ == DType::kF32) return;
    backend_.cast({Tensor::f32(params(), {padded_}), Tensor(weights_.data(), dtype_, {padded_})});
}

// Patch rows of each image: its class row (zeros), then patch (py, px) as (channel, row, column) within the patch.
void ClipModel::write_patches(const ClipBatch& batch) {
    const int S = shape_.vision.image, p = shape_.vision.patch, grid = S / p, T = shape_.vision.T;
    const int64_t width = 3 * int64_t{p} * p;
    MS_CHECK(batch.b == b_ && static_cast<int64_t>(batch.pixels.size()) == int64_t{b_} * 3 * S * S,
             "ClipModel: {} images of {} values, expected {} of 3 x {} x {}", batch.b, batch.pixels.size(), b_, S, S);
    std::vector<float> rows(static_cast<size_t>(int64_t{b_} * T * width), 0.0f);
    for (int i = 0; i < b_; ++i) {
        const float* img = batch.pixels.data() + static_cast<int64_t>(i) * 3 * S * S;
        for (int py = 0; py < grid; ++py)
            for (int px = 0; px < grid; ++px) {
                float* row = rows.data() + (static_cast<int64_t>(i) * T + 1 + py * grid + px) * width;
                for (int c = 0; c < 3; ++c)
                    for (int ky = 0; ky < p; ++ky)
                        for (int kx = 0; kx < p; ++kx)
                            row[(c * p + ky) * p + kx] = img[(int64_t{c} * S + py * p + ky) * S + px * p + kx];
            }
    }
    backend_.synchronize();  // an earlier step's ops may still read the slot
    backend_.cast({Tensor::f32(rows.data(), {static_cast<int64_t>(rows.size())}),
                   Tensor(vision_->tensor("patches", 0), dtype_, {static_cast<int64_t>(rows.size())})});
    backend_.synchronize();
}

void ClipModel::read_features(const GptProgram& tower, std::vector<float>& out) const {
    const int64_t n = int64_t{b_} * shape_.embed_dim;
    out.resize(static_cast<size_t>(n));
    backend_.synchronize();
    backend_.cast({Tensor(const_cast<void*>(tower.output(0)), dtype_, {n}), Tensor::f32(out.data(), {n})});
    backend_.synchronize();
}

void ClipModel::write_feature_grads(GptProgram& tower, const std::vector<float>& grads) {
    const int64_t n = int64_t{b_} * shape_.embed_dim;
    backend_.cast({Tensor::f32(const_cast<float*>(grads.data()), {n}), Tensor(tower.grad_output(0), dtype_, {n})});
}

void ClipModel::encode_images(const ClipBatch& batch, std::vector<float>& image) {
    write_patches(batch);
    vision_->forward(class_tokens_.data(), nullptr, b_, shape_.vision.T, 0, 0.0f, class_rows_.data());
    read_features(*vision_, image);
}

void ClipModel::encode_texts(const ClipBatch& batch, std::vector<float>& text) {
    const int T = shape_.text.T;
    MS_CHECK(batch.b == b_ && static_cast<int64_t>(batch.tokens.size()) == int64_t{b_} * T &&
                 static_cast<int>(batch.end_of_text.size()) == b_,
             "ClipModel: {} captions of {} tokens, expected {} of {}", batch.b, batch.tokens.size(), b_, T);
    for (int i = 0; i < b_; ++i) text_rows_[static_cast<size_t>(i)] = i * T + batch.end_of_text[static_cast<size_t>(i)];
    text_->forward(batch.tokens.data(), nullptr, b_, T, 0, 0.0f, text_rows_.data());
    read_features(*text_, text);
}

void ClipModel::encode(const ClipBatch& batch, std::vector<float>& image, std::vector<float>& text) {
    encode_images(batch, image);
    encode_texts(batch, text);
}

ClipStepResult ClipModel::train_step(const ClipBatch& batch, float grad_scale) {
    backend_.zero(Tensor::f32(grads(), {padded_}));
    write_patches(batch);
    vision_->forward(class_tokens_.data(), nullptr, b_, shape_.vision.T, 0, 1.0f, class_rows_.data());
    read_features(*vision_, image_features_);
    const int T = shape_.text.T;
    for (int i = 0; i < b_; ++i) text_rows_[static_cast<size_t>(i)] = i * T + batch.end_of_text[static_cast<size_t>(i)];
    text_->forward(batch.tokens.data(), nullptr, b_, T, 0, 1.0f, text_rows_.data());
    read_features(*text_, text_features_);

    ClipStepResult r;
    r.loss = loss_.forward_backward(image_features_, text_features_, logit_scale_param(), dimage_, dtext_, grad_scale);
    write_feature_grads(*vision_, dimage_);
    write_feature_grads(*text_, dtext_);
    vision_->backward(0);
    text_->backward(0);
    backend_.synchronize();
    grads()[table_[static_cast<size_t>(logit_scale_)].offset] = r.loss.dlogit_scale_param;
    return r;
}

}  // namespace ms
