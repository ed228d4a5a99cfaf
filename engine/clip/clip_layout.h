// clip_layout.h: what a model.arch: clip run is, checked once from the config and the world size: the towers' shape,
// the tensor x data parallel split, the per-rank batch and the dtype. train and plan both start here.
#pragma once

#include <cstdint>
#include <string>

#include "engine/clip/clip_shape.h"
#include "engine/config/config.h"

namespace ms {

struct ClipLayout {
    ClipShape shape;
    int tp = 1, dp = 1;
    int b = 1;  // samples per rank and step (training.micro_batch_size): one micro-batch per step
    int64_t global_batch = 1;
    DType dtype = DType::kF32;
    int64_t num_params = 0;  // the whole model's
};

// Throws UserError with a sentence for what CLIP cannot run: pipeline, context or sequence parallelism, an
// optimizer other than AdamW, zero_stage 2, bf16 with zero_stage 1 (sharded master weights), fp16, gradient
// accumulation (a global batch other than micro batch x dp), a world the tensor-parallel size does not divide, a
// data source that is not image-text, and the shape errors of resolve_clip_shape.
ClipLayout clip_layout(const Config& cfg, int world_size);

// "clip: image tower ...; text tower ...; embedding ...; N parameters" and "clip: world = tp x dp; global batch".
void log_clip_layout(const ClipLayout& l);

// `plan` for model.arch: clip: the layout and the bytes each rank holds (parameters, 16-bit weights, gradients,
// optimizer state, each tower's activations), as ClipModel and the optimizer allocate them. Returns the exit code.
int run_clip_plan(const Config& cfg, int world_size, double memory_gib);

}  // namespace ms
