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

ClipModel::ClipModel(const ClipShape& shape, Backend& backend, const ProcessGroups& groups, int b, DType dtype,
                     float itm_weight)
    : shape_(shape),
      backend_(backend),
      groups_(groups),
      b_(b),
      dtype_(dtype),
      itm_weight_(itm_weight),
      loss_(b, shape.embed_dim, *groups.dp, shape.max_logit_scale) {
    MS_CHECK(b >= 1 && (b >= 2 || !shape.cross_modal()), "ClipModel: {} samples per rank", b);
    table_ = clip_param_table(shape, groups.tp->size());
    for (size_t i = 0; i < table_.size(); ++i) {
        if (table_[i].name.starts_with("text_model.") && text_base_ == 0) text_base_ = table_[i].offset;
        if (table_[i].name.starts_with("fusion.") && fusion_base_ == 0) fusion_base_ = table_[i].offset;
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
    if (shape.cross_modal()) {
        fusion_ = std::make_unique<GptProgram>(
            shape.fusion, backend, *groups.tp,
            tower_options(3 * b, dtype, params() + fusion_base_, w + fusion_base_ * static_cast<int64_t>(act),
                          grad_placement_.from(fusion_base_)));
        pair_rows_.resize(static_cast<size_t>(3 * b));
        itm_logits_.resize(static_cast<size_t>(6 * b));
        ditm_logits_.resize(static_cast<size_t>(6 * b));
    }

    const int T = shape.vision.T;
    class_tokens_.assign(static_cast<size_t>(b) * T, 1);  // 1: outside the class-token table (clip_tower.cpp)
    class_rows_.resize(static_cast<size_t>(b));
    for (int i = 0; i < b; ++i) {
        class_tokens_[static_cast<size_t>(i) * T] = 0;
        class_rows_[static_cast<size_t>(i)] = i * T;
    }
    text_rows_.resize(static_cast<size_t>(b));
    const int64_t patch = shape.vision.patch;
    patch_rows_.resize(static_cast<size_t>(int64_t{b} * T * 3 * patch * patch));
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
    std::vector<float>& rows = patch_rows_;  // the class rows stay zero
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

namespace {

// n values of the activation dtype at src, in fp32 on the host (after the ops before it, stream-ordered).
void read_f32(Backend& be, const void* src, DType dtype, std::vector<float>& out, int64_t n) {
    out.resize(static_cast<size_t>(n));
    be.cast({Tensor(const_cast<void*>(src), dtype, {n}), Tensor::f32(out.data(), {n})});
    be.synchronize();
}

}  // namespace

void ClipModel::read_features(const GptProgram& tower, std::vector<float>& out) const {
    read_f32(backend_, tower.tensor("features", 0), dtype_, out, int64_t{b_} * shape_.embed_dim);
}

void ClipModel::write_feature_grads(GptProgram& tower, const std::vector<float>& grads) {
    const int64_t n = int64_t{b_} * shape_.embed_dim;
    backend_.cast({Tensor::f32(const_cast<float*>(grads.data()), {n}), Tensor(tower.grad_output(0), dtype_, {n})});
}

void ClipModel::set_text_rows(const ClipBatch& batch) {
    const int T = shape_.text.T;
    MS_CHECK(batch.b == b_ && static_cast<int64_t>(batch.tokens.size()) == int64_t{b_} * T &&
                 static_cast<int>(batch.end_of_text.size()) == b_,
             "ClipModel: {} captions of {} tokens, expected {} of {}", batch.b, batch.tokens.size(), b_, T);
    for (int i = 0; i < b_; ++i) text_rows_[static_cast<size_t>(i)] = i * T + batch.end_of_text[static_cast<size_t>(i)];
}

void ClipModel::encode_images(const ClipBatch& batch, std::vector<float>& image) {
    write_patches(batch);
    vision_->forward(class_tokens_.data(), nullptr, b_, shape_.vision.T, 0, 0.0f, class_rows_.data());
    read_features(*vision_, image);
}

void ClipModel::encode_texts(const ClipBatch& batch, std::vector<float>& text) {
    set_text_rows(batch);
    text_->forward(batch.tokens.data(), nullptr, b_, shape_.text.T, 0, 0.0f, text_rows_.data());
    read_features(*text_, text);
}

void ClipModel::encode(const ClipBatch& batch, std::vector<float>& image, std::vector<float>& text) {
    encode_images(batch, image);
    encode_texts(batch, text);
}

ClipStepResult ClipModel::train_step(const ClipBatch& batch, float grad_scale, const clip::ItmDraw& draw) {
    backend_.zero(Tensor::f32(grads(), {padded_}));
    write_patches(batch);
    vision_->forward(class_tokens_.data(), nullptr, b_, shape_.vision.T, 0, 1.0f, class_rows_.data());
    read_features(*vision_, image_features_);
    set_text_rows(batch);
    text_->forward(batch.tokens.data(), nullptr, b_, shape_.text.T, 0, 1.0f, text_rows_.data());
    read_features(*text_, text_features_);

    ClipStepResult r;
    r.loss = loss_.forward_backward(image_features_, text_features_, logit_scale_param(), dimage_, dtext_, grad_scale);
    if (fusion_) r.itm = cross_modal_step(batch, r.loss.logit_scale, grad_scale, draw);
    write_feature_grads(*vision_, dimage_);
    write_feature_grads(*text_, dtext_);
    vision_->backward(0);
    text_->backward(0);
    backend_.synchronize();
    grads()[table_[static_cast<size_t>(logit_scale_)].offset] = r.loss.dlogit_scale_param;
    return r;
}

namespace {

// Pair p's caption and image among the batch's (itm.h's order).
int pair_caption(const clip::ItmNegatives& n, int b, int p) {
    return p < b ? p : p < 2 * b ? n.text[static_cast<size_t>(p - b)] : p - 2 * b;
}
int pair_image(const clip::ItmNegatives& n, int b, int p) {
    return p < 2 * b ? p % b : n.image[static_cast<size_t>(p - 2 * b)];
}

}  // namespace

clip::ItmLossResult ClipModel::matching_forward(const ClipBatch& batch, std::span<const float> image,
                                                std::span<const float> text, float logit_scale, float loss_scale,
                                                float weight, float grad_scale, const clip::ItmDraw& draw) {
    negatives_ = clip::draw_itm_negatives(image, text, batch.tokens, b_, shape_.embed_dim, logit_scale, draw);
    const int64_t Tt = shape_.text.T, Ti = shape_.vision.T, Ct = shape_.text.C, Cv = shape_.vision.C;
    void* text_in = fusion_->tensor("text", 0);
    void* image_in = fusion_->tensor("image", 0);
    const void* text_states = text_->tensor("states", 0);
    const void* image_states = vision_->tensor("states", 0);
    for (int p = 0; p < 3 * b_; ++p) {
        const int caption = pair_caption(negatives_, b_, p), img = pair_image(negatives_, b_, p);
        backend_.copy_columns({rows(text_states, caption * Tt, Tt, Ct), rows(text_in, p * Tt, Tt, Ct), 0, 0, Ct});
        backend_.copy_columns({rows(image_states, img * Ti, Ti, Cv), rows(image_in, p * Ti, Ti, Cv), 0, 0, Cv});
        pair_rows_[static_cast<size_t>(p)] =
            static_cast<int32_t>(p * Tt + batch.end_of_text[static_cast<size_t>(caption)]);
    }
    fusion_->forward(nullptr, nullptr, 3 * b_, static_cast<int>(Tt), 0, loss_scale, pair_rows_.data());
    read_f32(backend_, fusion_->tensor("logits", 0), dtype_, itm_logits_, 6 * int64_t{b_});
    return clip::itm_loss(itm_logits_, b_, weight, grad_scale, ditm_logits_);
}

clip::ItmLossResult ClipModel::evaluate_matching(const ClipBatch& batch, std::span<const float> image,
                                                 std::span<const float> text, const clip::ItmDraw& draw) {
    MS_CHECK(fusion_ != nullptr, "ClipModel::evaluate_matching: the model has no cross-modal layers");
    const float scale = std::min(std::exp(logit_scale_param()), shape_.max_logit_scale);  // the loss's clamp
    return matching_forward(batch, image, text, scale, 0.0f, 1.0f, 0.0f, draw);
}

clip::ItmLossResult ClipModel::cross_modal_step(const ClipBatch& batch, float logit_scale, float grad_scale,
                                                const clip::ItmDraw& draw) {
    const clip::ItmLossResult local =
        matching_forward(batch, image_features_, text_features_, logit_scale, 1.0f, itm_weight_, grad_scale, draw);
    const int64_t Tt = shape_.text.T, Ti = shape_.vision.T, Ct = shape_.text.C, Cv = shape_.vision.C;
    backend_.cast({Tensor::f32(ditm_logits_.data(), {6 * int64_t{b_}}),
                   Tensor(fusion_->grad_output(0), dtype_, {6 * int64_t{b_}})});
    fusion_->backward(0);
    // the pairs' input gradients, added into the states they were copied from, in pair order
    void* dtext_states = text_->gradient("states", 0);
    void* dimage_states = vision_->gradient("states", 0);
    backend_.zero(rows(dtext_states, 0, b_ * Tt, Ct));
    backend_.zero(rows(dimage_states, 0, b_ * Ti, Cv));
    const void* dtext_in = fusion_->gradient("text", 0);
    const void* dimage_in = fusion_->gradient("image", 0);
    const auto add = [&](const Tensor& into, const Tensor& from) {
        const Tensor flat(into.data, dtype_, {into.numel()});
        backend_.residual_forward({.a = flat, .b = Tensor(from.data, dtype_, {from.numel()}), .out = flat, .bias = {}});
    };
    for (int p = 0; p < 3 * b_; ++p) {
        add(rows(dtext_states, pair_caption(negatives_, b_, p) * Tt, Tt, Ct), rows(dtext_in, p * Tt, Tt, Ct));
        add(rows(dimage_states, pair_image(negatives_, b_, p) * Ti, Ti, Cv), rows(dimage_in, p * Ti, Ti, Cv));
    }
    // the logged numbers: the mean over dp
    float stats[2] = {local.loss, local.accuracy};
    groups_.dp->all_reduce(std::span<float>(stats), ReduceOp::kSum).wait();
    const float dp = static_cast<float>(groups_.dp->size());
    return {.loss = stats[0] / dp, .accuracy = stats[1] / dp};
}

Tensor ClipModel::rows(const void* base, int64_t row, int64_t count, int64_t width) const {
    return Tensor(
        static_cast<std::byte*>(const_cast<void*>(base)) + row * width * static_cast<int64_t>(dtype_size(dtype_)),
        dtype_, {count, width});
}

}  // namespace ms
