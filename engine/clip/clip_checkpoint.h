// clip_checkpoint.h: a CLIP model (model.arch clip) in the training checkpoint format of engine/ckpt/checkpoint.h,
// and a CLIP checkpoint exported as a Hugging Face CLIPModel directory (`convert --to hf-clip`, hf_clip.h).
//
// The files are the format's, with CLIP's table (clip_param_table: the image tower, the text tower, logit_scale;
// Hugging Face's CLIPModel names) as the canonical tensors: any tp x dp layout saves boxes of them and any other loads
// them. The manifest's "model" object is the resolved clip: section, so that a reader rebuilds the ClipShape with
// resolve_clip_shape, the one place a shape is made:
//   {"arch": "clip", "embed_dim", "image_size", "patch_size", "vision_layers", "vision_width", "vision_heads",
//    "vision_mlp", "context_length", "text_layers", "text_width", "text_heads", "text_mlp" (integers),
//    "init_logit_scale", "max_logit_scale" (numbers), "cross_modal_layers" (an integer; absent in checkpoints saved
//    before the cross-modal layers: 0), "vocab_size": kClipTextVocab (the captions' vocabulary)}
#pragma once

#include <string>

#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/hf_dir.h"
#include "engine/clip/clip_shape.h"

namespace ms {

// What the checkpoint format needs of a CLIP model of this shape: clip_param_table(shape, 1) and the manifest above.
CheckpointModel clip_checkpoint_model(const ClipShape& shape);

// The shape of the CLIP model a checkpoint holds: its manifest's keys through resolve_clip_shape, checked against its
// tensors (check_checkpoint_shape). UserError(kExitConfigError) when the checkpoint holds another model family;
// UserError(kExitCheckpoint) when the manifest lacks a key or describes a model that cannot be built.
ClipShape clip_checkpoint_shape(const CheckpointReader& r);

// `convert --to hf-clip`: write_hf_clip of the checkpoint's whole tensors (CheckpointReader::tensor, whatever layout
// saved them) into `dir`.
HfExport export_hf_clip(const CheckpointReader& r, const ClipShape& shape, const std::string& dir);

}  // namespace ms
