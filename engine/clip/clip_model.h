// clip_model.h: CLIP (Radford et al. 2021) on this engine: an image tower and a text tower
// (engine/model/clip_tower.cpp, each one chunk's op graph run by GptProgram), trained with the symmetric InfoNCE loss
// over the data-parallel global batch (contrastive_loss.h).
//
// Parameters: one flat buffer, [image tower | text tower | logit_scale], each tower's table (Hugging Face's CLIPModel
// names) at a 16-aligned base; gradients mirror it (fp32), and with bf16 / fp16 a second flat buffer holds the 16-bit
// weights the ops read. The optimizer (distributed_optimizer.h) sees the one table; logit_scale is replicated over
// tensor-parallel ranks and has no weight decay.
//
// A step on this rank's b samples: both towers' forwards (b images, b captions) write b feature rows each; the
// features come to the host in fp32, the loss all-gathers them over dp (every rank sees every negative) and hands
// back the gradient of the local rows' loss summed over ranks; the towers' backwards start from it. The reduction of
// the parameter gradients over dp (an average) then gives the global batch's gradient: the loss's file comment has
// the arithmetic. The step is one micro-batch: the negatives of a contrastive batch are the whole global batch, so
// accumulating micro-batches would change the loss rather than split its work.
//
// With cross-modal layers (ClipShape::cross_modal()) a third chunk, the fusion program (clip_tower.cpp's
// kClipFusion), reads both towers' normed rows ("states") for 3b image-caption pairs with hard negatives (itm.h): its
// matching logits' loss, times itm_weight, is added to the contrastive loss, and the gradients of its inputs are
// added back into the towers' states, whose backward starts from them and from the features' gradients together.
//
// Pipeline parallelism is not offered: the loss needs every sample's features from both towers before any backward
// can start, so a pipeline could only run GPipe's forward-all-then-backward-all with a full bubble, and the two towers
// (ViT-H/14 and its text transformer: about a billion parameters) fit one device under tensor parallelism.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/process_groups.h"
#include "engine/backends/backend.h"
#include "engine/clip/clip_shape.h"
#include "engine/clip/contrastive_loss.h"
#include "engine/clip/itm.h"
#include "engine/model/gpt_graph.h"
#include "memory/memory_block.h"

namespace ms {

// One step's (or one evaluation chunk's) samples on this rank, as the towers take them.
struct ClipBatch {
    int b = 0;
    std::vector<float> pixels;         // (b, 3, S, S) normalised RGB (engine/data/image_text.h)
    std::vector<int32_t> tokens;       // (b, context_length) clip_tokenize()'s ids
    std::vector<int32_t> end_of_text;  // (b) each caption's end-of-text position
};

struct ClipStepResult {
    clip::ContrastiveLossResult loss;
    clip::ItmLossResult itm;  // the mean over dp of each rank's matching loss and accuracy (zeros without the layers)
};

class ClipModel {
  public:
    // b: samples per rank and step (training.micro_batch_size). groups: tp and dp (pp and cp of 1).
    // itm_weight: the matching loss's weight (clip.itm_weight), with cross-modal layers.
    ClipModel(const ClipShape& shape, Backend& backend, const ProcessGroups& groups, int b, DType dtype,
              float itm_weight = 1.0f);
    ~ClipModel();

    const ClipShape& shape() const { return shape_; }
    const std::vector<ParamInfo>& params_info() const { return table_; }
    int64_t flat_size() const { return flat_; }
    int64_t padded_size() const { return padded_; }  // padded_flat_size(flat_size(), dp)
    float* params() { return params_.as<float>(); }
    float* grads() { return grads_.as<float>(); }
    // The weights the ops read: params() in fp32, else the 16-bit copy.
    void* weights() { return dtype_ == DType::kF32 ? params_.data() : weights_.data(); }
    DType dtype() const { return dtype_; }
    int logit_scale_index() const { return logit_scale_; }  // in params_info()
    float logit_scale_param() const { return params_.as<float>()[table_[static_cast<size_t>(logit_scale_)].offset]; }

    void init_weights(uint64_t seed, float init_std);
    void refresh_weights();  // weights = params rounded to dtype() (a no-op in fp32)

    // Forward and backward of this rank's b samples: gradients into grads() (zeroed first), multiplied by grad_scale.
    // draw: where the matching pairs' hard negatives come from (itm.h), with cross-modal layers.
    ClipStepResult train_step(const ClipBatch& batch, float grad_scale = 1.0f, const clip::ItmDraw& draw = {});
    // The towers' features of this rank's b samples, unnormalised, fp32: image (b, D) and text (b, D).
    void encode(const ClipBatch& batch, std::vector<float>& image, std::vector<float>& text);
    void encode_images(const ClipBatch& batch, std::vector<float>& image);
    void encode_texts(const ClipBatch& batch, std::vector<float>& text);
    // With cross-modal layers, right after encode(batch, image, text): the matching head's loss and accuracy on the
    // batch's 3b pairs (itm.h), forward only, this rank's alone.
    clip::ItmLossResult evaluate_matching(const ClipBatch& batch, std::span<const float> image,
                                          std::span<const float> text, const clip::ItmDraw& draw);

  private:
    void write_patches(const ClipBatch& batch);
    void set_text_rows(const ClipBatch& batch);  // text_rows_: each caption's end-of-text row
    void read_features(const GptProgram& tower, std::vector<float>& out) const;
    void write_feature_grads(GptProgram& tower, const std::vector<float>& grads);
    // Rows [row, row + count) of a (rows, width) tensor of the activation dtype at base.
    Tensor rows(const void* base, int64_t row, int64_t count, int64_t width) const;
    // The matching pairs of the batch whose features and states the towers hold: hard negatives drawn, the pairs'
    // rows copied into the fusion program's inputs and its forward run (loss_scale 0: no backward follows); the
    // logits' loss, its gradient in ditm_logits_ (times weight and grad_scale).
    clip::ItmLossResult matching_forward(const ClipBatch& batch, std::span<const float> image,
                                         std::span<const float> text, float logit_scale, float loss_scale, float weight,
                                         float grad_scale, const clip::ItmDraw& draw);
    // The matching pairs' forward and backward through the fusion program; adds their gradients into the towers'
    // "d.states". Returns the mean over dp of each rank's loss and accuracy.
    clip::ItmLossResult cross_modal_step(const ClipBatch& batch, float logit_scale, float grad_scale,
                                         const clip::ItmDraw& draw);

    ClipShape shape_;
    Backend& backend_;
    const ProcessGroups& groups_;
    int b_;
    DType dtype_;
    std::vector<ParamInfo> table_;  // image tower, text tower, logit_scale: offsets in the flat buffers
    int64_t text_base_ = 0, flat_ = 0, padded_ = 0;
    int logit_scale_ = -1;
    MemoryBlock params_, grads_, weights_;
    graph::GradPlacement grad_placement_;
    std::unique_ptr<GptProgram> vision_, text_, fusion_;  // fusion_: with cross-modal layers
    int64_t fusion_base_ = 0;                             // its parameters' offset in the flat buffers
    float itm_weight_;
    clip::ContrastiveLoss loss_;
    std::vector<int32_t> class_tokens_, class_rows_;  // (b * T_image), (b): the image tower's lookup and pooled rows
    std::vector<int32_t> text_rows_;                  // (b) the captions' end-of-text rows
    std::vector<float> image_features_, text_features_, dimage_, dtext_;  // (b, D)
    std::vector<float> patch_rows_;                                       // (b * T_image, 3 * patch^2) staging
    std::vector<int32_t> pair_rows_;                                      // (3b) the pairs' end-of-text rows
    clip::ItmNegatives negatives_;                                        // of the last matching_forward
    std::vector<float> itm_logits_, ditm_logits_;                         // (3b, 2)
};

}  // namespace ms
