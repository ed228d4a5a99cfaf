// hf_gpt2.h: Hugging Face GPT-2 interop (docs/formats.md): export a
// checkpoint as a hub-style GPT-2 directory, and import one as a model-only checkpoint.
//
// A Hugging Face GPT-2 directory, as this code reads and writes it:
//   config.json         {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": C, "n_layer": L,
//                        "n_head": NH, "n_positions": T, "n_ctx": T, "vocab_size": V, "n_inner": null (= 4C) or F,
//                        "activation_function": "gelu_new", "layer_norm_epsilon": eps, dropouts 0,
//                        "tie_word_embeddings": true, ...}
//   model.safetensors   __metadata__ {"format": "pt"}; GPT-2's names as on the hub (no "transformer." prefix):
//                         wte.weight (V, C)          the real vocabulary only (our rows >= V are padding)
//                         wpe.weight (T, C)
//                         h.{l}.ln_1.weight/bias (C), h.{l}.ln_2.weight/bias (C), ln_f.weight/bias (C)
//                         h.{l}.attn.c_attn.weight (C, 3C)  c_attn.bias (3C)   Conv1D: (in, out), the transpose
//                         h.{l}.attn.c_proj.weight (C, C)   c_proj.bias (C)    of our Linear (out, in); c_attn's
//                         h.{l}.mlp.c_fc.weight (C, F)      c_fc.bias (F)      columns are [Q | K | V], heads
//                         h.{l}.mlp.c_proj.weight (F, C)    c_proj.bias (C)    contiguous within each, as our rows
//                       no lm_head.weight: the head is tied to wte (transformers ties it on load); an untied
//                       checkpoint's lm_head.weight (V, C) is exported with "tie_word_embeddings": false,
//                       and such a directory imports as an untied model.
//   or sharded, and the dtypes read and written: hf_dir.h.
//   tokenizer files (hf_tokenizer.h), when the export is given the tokenizer the data was preprocessed with.
// Import accepts keys with or without the "transformer." prefix, ignores the causal-mask buffers h.{l}.attn.bias /
// h.{l}.attn.masked_bias, and in a tied model accepts lm_head.weight only when it equals wte.weight bit for bit (a
// tied head saved twice). Dims come from config.json; a config.json of another model_type (a Llama's) is refused with
// the --from that imports it.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/hf_dir.h"
#include "engine/config/config.h"
#include "engine/data/progress.h"
#include "engine/model/gpt.h"

namespace ms {

// config.json of a model of this shape. bos/eos_token_id are eos_token_id, by default V - 1: GPT-2's <|endoftext|>
// (50256) at V = 50257, the byte tokenizer's end-of-document (256) at V = 257.
nlohmann::json hf_gpt2_config(const GptShape& s, std::optional<int32_t> eos_token_id = std::nullopt);

// The model shape config.json describes (Vp = V: no padding). Throws UserError(kExitConfigError) naming the file and
// the key when a dim is missing or not a positive integer, or the model is not one GPT-2 (model_type, activation,
// per-layer attention scaling). "tie_word_embeddings": false gives an untied shape.
GptShape hf_gpt2_shape(const nlohmann::json& config, const std::string& where);

// Writes <out_dir>/model.safetensors (or the shards and model.safetensors.index.json when more than one is needed)
// and <out_dir>/config.json, each atomically, from the checkpoint `r`, whose model has shape `s`
// (checkpoint_shape()). A Llama checkpoint is refused (UserError naming --to hf-llama).
HfExport export_hf_gpt2(const CheckpointReader& r, const GptShape& s, const std::string& out_dir,
                        const HfExportOptions& options = {});

// Imports <hf_dir> (config.json + model.safetensors, or + model.safetensors.index.json and its shards) into a committed
// model-only checkpoint <save_dir>/iter_0000000 (write_model_checkpoint: iteration 0, no optimizer state). `cfg` (a
// --config; nullptr: the built-in defaults) supplies what config.json does not -- model.make_vocab_size_divisible_by
// (wte is zero-padded to that multiple), the schedule and seed recorded in train_state.json -- and its model dims must
// agree with config.json's (UserError(kExitConfigError) naming both; a vocab_size of 0, "from the data", agrees with
// any). Every problem with the input directory is a UserError(kExitConfigError) naming the file, the tensor and what is
// wrong -- for a sharded one also a missing shard, a tensor the index puts in a shard that lacks it, a tensor in two
// shards or in none the index lists, and an index that is not JSON or has no weight_map. Returns the committed
// directory.
std::string import_hf_gpt2(const std::string& hf_dir, const Config* cfg, const std::string& save_dir,
                           Progress::Style progress = Progress::Style::kNone);

}  // namespace ms
