// checkpoint_model.h: a checkpoint's model as one whole (tp 1, pp 1) model on one rank -- for `eval`, `generate`
// and `convert` -- and the writer of a model-only checkpoint (`convert --from hf-gpt2`).
//
// Reading goes through CheckpointReader (checkpoint.h), so any layout that saved the checkpoint gives the same whole
// model. Writing produces exactly what save_checkpoint writes for tp = pp = dp = 1 (one model file
// model/tp00_pp000.safetensors with the same __metadata__, train_state.json, config.resolved.yaml and a manifest
// with the same fields), minus the optimizer files: a model-only checkpoint.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "engine/ckpt/checkpoint.h"
#include "engine/config/config.h"
#include "engine/data/progress.h"
#include "engine/model/gpt.h"

namespace ms {

// `path` is a save directory (its newest committed checkpoint, CheckpointReader::latest) or one iter_XXXXXXX
// directory. Verifies the checkpoint's files (sizes and XXH64) and returns the iter_XXXXXXX directory. Throws
// UserError(kExitCheckpoint) naming the path when it holds no committed checkpoint or fails verification.
std::string resolve_checkpoint(const std::string& path);

// The shape of the model a checkpoint holds: the manifest's "model" dims, the padded vocabulary of its wte, and
// model.layernorm_epsilon from its config.resolved.yaml (1e-5 with a warning when that file lacks it). Checked
// against the tensors (check_checkpoint_shape). UserError(kExitCheckpoint) when the manifest lacks a dim;
// UserError(kExitConfigError) for a CLIP checkpoint (engine/clip/clip_checkpoint.h reads those).
GptShape checkpoint_shape(const CheckpointReader& r);

// The model hyper-parameters a checkpoint's tensor shapes do not show -- model.num_attention_heads (its manifest) and
// model.layernorm_epsilon (its config.resolved.yaml) -- are the checkpoint's: where `configured` (the model of the
// config `config_name`) differs in one, UserError(kExitConfigError) naming the key and both values. Call it after
// check_checkpoint_shape, which compares the tensors.
void check_checkpoint_hyperparameters(const CheckpointReader& r, const GptShape& configured,
                                      const std::string& config_name);

// Copies every tensor of the checkpoint into a whole model (model.params_info() at tp 1: one part holding
// everything). wte rows >= the checkpoint's padded vocabulary, if the model's is larger, are zero.
void read_whole_model(const CheckpointReader& r, Gpt& model);

// Writes a committed model-only checkpoint <save>/iter_XXXXXXX (state.iteration) from a whole model's flat
// parameter buffer laid out by gpt_param_table(shape): the model file, train_state.json (`state`),
// config.resolved.yaml (config_to_yaml(cfg)) and the manifest (the trainer's fields for a 1-rank layout, plus
// `extra_manifest` merged in). Refuses (UserError(kExitCheckpoint)) a save directory that already holds a committed
// checkpoint, whose tracker this would overwrite. `progress` draws the model file's writing (Progress, over its
// tensor bytes). Returns the committed directory.
std::string write_model_checkpoint(const std::string& save_dir, const Config& cfg, const GptShape& shape,
                                   const float* params, const TrainState& state, const nlohmann::json& extra_manifest,
                                   Progress::Style progress = Progress::Style::kNone);

}  // namespace ms
