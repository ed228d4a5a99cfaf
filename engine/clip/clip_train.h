// clip_train.h: `mindspeed-train train` for model.arch: clip: tensor- and data-parallel contrastive training of the
// two towers (clip_model.h) on image-text pairs (engine/data/image_text.h: drawn shapes or WebDataset shards), with
// zero-shot accuracy and retrieval recall on held-out samples every eval.eval_interval iterations and at the end.
#pragma once

#include "engine/config/config.h"

namespace ms {

// Returns the process exit code. Throws UserError for bad input (a layout CLIP cannot run, bad data).
int run_clip_train(const Config& cfg);

}  // namespace ms
