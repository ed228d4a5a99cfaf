// hf_clip.h: export of a CLIP model (clip_model.h) as a Hugging Face CLIPModel directory, which transformers'
// CLIPModel.from_pretrained loads.
//
// The directory, as written here:
//   config.json        transformers' CLIPConfig: {"model_type": "clip", "architectures": ["CLIPModel"],
//                      "projection_dim": D, "logit_scale_init_value": the config's init, "torch_dtype": "float32",
//                      "text_config": {vocab_size 257, hidden_size, intermediate_size, num_hidden_layers,
//                                      num_attention_heads, max_position_embeddings = context length, hidden_act,
//                                      layer_norm_eps, bos/eos/pad_token_id},
//                      "vision_config": {hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
//                                        image_size, patch_size, num_channels 3, hidden_act, layer_norm_eps}}
//   model.safetensors  __metadata__ {"format": "pt"}; every tensor F32 under its CLIPModel name (the names of
//                      clip_tower_param_table and "logit_scale"), as our tensors except:
//                        vision_model.embeddings.class_embedding         ours (1, C)       -> (C)
//                        vision_model.embeddings.patch_embedding.weight  ours (C, 3*p*p)   -> Conv2d's (C, 3, p, p)
//                        logit_scale                                     ours (1)          -> a 0-d scalar
//                      The same bytes in each case: our patch vector is ordered (channel, row, column), Conv2d's
//                      kernel index. The Linear weights (q/k/v/out_proj, fc1, fc2, both projections) are (out, in)
//                      on both sides.
//
// Choices that make transformers compute what this model computes:
//   hidden_act "gelu_new": our GELU is the tanh approximation; "gelu_new" names it in every transformers release
//     (the equivalent "gelu_pytorch_tanh" is newer), and the GPT-2 export (hf_gpt2.h) writes it too.
//   eos_token_id 256 (kClipEndOfText): transformers pools each caption at the first position holding eos_token_id
//     (any eos_token_id but 2), where clip_tokenize put the one end-of-text token; releases before that rule pool
//     at the argmax of the ids, which is the same position because 256 is the largest id.
//   pad_token_id 0 (kClipPad). bos_token_id 0: the captions have no begin token, so the value only reaches a consumer
//     that prepends one; it must not be 256, which would make the first-eos pooling pick the prepended token.
//   No position_ids buffers: transformers registers them non-persistent (recent releases) or ignores their absence
//     on load (_keys_to_ignore_on_load_missing, older ones), and builds them as arange either way.
// transformers does not clamp exp(logit_scale) at max_logit_scale as our loss does, so the two losses agree while
// the parameter stays below log(max_logit_scale).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/ckpt/hf_dir.h"
#include "engine/clip/clip_shape.h"
#include "engine/model/gpt.h"

namespace ms {

// The whole tensor a ParamInfo of the whole model's table names, fp32 in our layout (global_shape, C order).
using ClipTensorSource = std::function<std::vector<float>(const ParamInfo& whole)>;

// The tensors of a model on one tensor-parallel rank (every shard is the whole tensor), read from its flat
// parameter buffer at each ParamInfo's offset: ClipModel::params() of a tp = 1 model.
ClipTensorSource clip_flat_tensors(const float* params);

// config.json of a CLIP model of this shape.
nlohmann::json hf_clip_config(const ClipShape& shape);

// Writes dir/model.safetensors and dir/config.json (each atomically, creating dir) from the tensors of `table` (the
// whole model's: ClipModel::params_info() at tp = 1, or a checkpoint's), each read once through `tensor`. Throws
// UserError (kExitConfigError) naming the tensor when the table's names and shapes are not those of a CLIP model of
// `shape`: a missing, extra, repeated or differently shaped tensor.
HfExport write_hf_clip(const ClipShape& shape, const std::vector<ParamInfo>& table, const ClipTensorSource& tensor,
                       const std::string& dir);

}  // namespace ms
