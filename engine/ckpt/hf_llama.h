// hf_llama.h: Hugging Face Llama interop (docs/formats.md): export a model.arch llama checkpoint as a hub-style
// LlamaForCausalLM directory, and import one as a model-only checkpoint.
//
// A Hugging Face Llama directory, as this code reads and writes it:
//   config.json         {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": C,
//                        "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": NH,
//                        "num_key_value_heads": NKV, "head_dim": C / NH, "max_position_embeddings": T,
//                        "rms_norm_eps": eps, "rope_theta": theta, "rope_scaling": null or {"rope_type": "llama3",
//                        "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
//                        "vocab_size": V, "tie_word_embeddings": false, "hidden_act": "silu",
//                        "attention_bias": false, "mlp_bias": false, ...}
//   model.safetensors   __metadata__ {"format": "pt"}; LlamaForCausalLM's names, which are the checkpoint's own
//                       (gpt_param_table's Llama table), every weight in Linear's (out, in) layout as ours:
//                         model.embed_tokens.weight (V, C)    lm_head.weight (V, C)   the real vocabulary only
//                         model.layers.{l}.input_layernorm.weight (C), post_attention_layernorm.weight (C)
//                         model.layers.{l}.self_attn.q_proj.weight (NH*HS, C), k_proj / v_proj (NKV*HS, C),
//                                                   o_proj.weight (C, NH*HS)
//                         model.layers.{l}.mlp.gate_proj.weight (F, C), up_proj (F, C), down_proj (C, F)
//                         model.norm.weight (C)
//                       Our RoPE pairs column i of a head with i + HS/2, as transformers' rotate_half does, so q_proj
//                       and k_proj need no permutation. A tied model (model.untie_embeddings_and_output_weights
//                       false) has no lm_head.weight and says "tie_word_embeddings": true.
//   or sharded, and the dtypes read and written: hf_dir.h.
//   tokenizer files (hf_tokenizer.h), when the export is given the tokenizer the data was preprocessed with.
// Import takes a tied config.json (Llama 3.2 1B and 3B) as a tied model, or, with a --config that unties it, with the
// output layer starting as a copy of model.embed_tokens.weight (the same logits); an lm_head.weight saved beside a
// tied embedding must equal it bit for bit. The rotary buffers model.layers.{l}.self_attn.rotary_emb.inv_freq
// some older exports hold are ignored (the frequencies follow from rope_theta and rope_scaling).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/hf_dir.h"
#include "engine/config/config.h"
#include "engine/data/progress.h"
#include "engine/model/gpt.h"

namespace ms {

// config.json of a Llama of this shape. bos/eos_token_id are eos_token_id, by default V - 1 (as hf_gpt2_config).
nlohmann::json hf_llama_config(const GptShape& s, std::optional<int32_t> eos_token_id = std::nullopt);

// The model shape config.json describes (arch llama, Vp = V: no padding). Throws UserError(kExitConfigError) naming
// the file and the key when a dim is missing or not a positive integer, or the model is not one this Llama computes
// (model_type, hidden_act, biases, a head_dim other than hidden_size / num_attention_heads, a rope_scaling other than
// "llama3", key/value heads not dividing the heads).
GptShape hf_llama_shape(const nlohmann::json& config, const std::string& where);

// Writes the Llama directory (model.safetensors or shards + index, config.json) from the checkpoint `r`, whose model
// has shape `s` (checkpoint_shape()). A GPT-2 checkpoint is refused (UserError naming --to hf-gpt2).
HfExport export_hf_llama(const CheckpointReader& r, const GptShape& s, const std::string& out_dir,
                         const HfExportOptions& options = {});

// Imports <hf_dir> into a committed model-only checkpoint <save_dir>/iter_0000000, as import_hf_gpt2 does: `cfg` (a
// --config with model.arch llama; nullptr: the defaults with config.json's model) supplies the vocabulary padding, the
// schedule and the seed, and its model must be config.json's (UserError(kExitConfigError) naming the key and both
// values). Returns the committed directory.
std::string import_hf_llama(const std::string& hf_dir, const Config* cfg, const std::string& save_dir,
                            Progress::Style progress = Progress::Style::kNone);

}  // namespace ms
