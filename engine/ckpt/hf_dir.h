// hf_dir.h: what every Hugging Face model directory this code reads or writes has in common (docs/formats.md),
// whatever the model (hf_gpt2.h, hf_llama.h):
//   config.json                   the model's hyper-parameters (each format reads and writes its own keys)
//   model.safetensors             every tensor, __metadata__ {"format": "pt"}
//   or, sharded (what save_pretrained writes above its max_shard_size: 5 GB in transformers 4, 50 GB in 5):
//   model.safetensors.index.json  {"metadata": {"total_size": BYTES}, "weight_map": {"TENSOR":
//                                  "model-00001-of-00003.safetensors", ...}}: every tensor in exactly one shard
//   model-0000i-of-0000n.safetensors  the tensors, cut as huggingface_hub's split_state_dict_into_shards cuts them
//                                  (plan_hf_shards)
// Export writes F32. Import reads F32, BF16 or F16, widened to fp32 exactly. Every problem with an input directory is
// a UserError(kExitConfigError) naming the file, the tensor and what is wrong.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/safetensors.h"
#include "engine/config/config.h"
#include "engine/data/progress.h"
#include "engine/model/gpt.h"

namespace ms {

inline constexpr const char* kHfConfigFile = "config.json";
inline constexpr const char* kHfWeightsFile = "model.safetensors";
inline constexpr const char* kHfIndexFile = "model.safetensors.index.json";

// Throws UserError("input error: " + msg, kExitConfigError).
[[noreturn]] void hf_input_error(const std::string& msg);
// "[3, 4]"
std::string hf_shape_str(const std::vector<int64_t>& shape);

// config[key] as a positive int; otherwise an input error naming `where`, the key and what it holds, then `hint`.
int hf_positive_int(const nlohmann::json& config, const char* key, const std::string& where, const std::string& hint);

// config[key] as a boolean, `fallback` when absent or null; otherwise (a string "false", a number) an input error
// naming `where`, the key and what it holds.
bool hf_bool(const nlohmann::json& config, const char* key, bool fallback, const std::string& where);

// <hf_dir>/config.json, parsed. `model` ("GPT-2", "Llama") names the directory in the hint when it is missing.
nlohmann::json read_hf_config(const std::string& hf_dir, const std::string& model);

// The tensors of a Hugging Face directory: model.safetensors alone, or the shards model.safetensors.index.json names,
// each tensor read from the shard the index puts it in (a missing shard, a tensor the index puts in a shard that lacks
// it, a tensor in two shards or in none the index lists, an index that is not JSON or has no weight_map: input
// errors). where() names the whole (the file, or the index) in messages about the set of tensors.
class HfWeights {
  public:
    // <hf_dir>/model.safetensors, else <hf_dir>/model.safetensors.index.json and its shards (transformers' order).
    // `model` as for read_hf_config.
    static HfWeights open(const std::string& hf_dir, const std::string& model);

    const std::string& where() const { return where_; }
    bool sharded() const { return sharded_; }
    std::string dtypes() const;              // as the files name them: "F32", "BF16, F32", ...
    std::vector<std::string> names() const;  // sorted
    bool contains(const std::string& key) const { return file_of_.count(key) != 0; }
    const SafetensorsFile& file(const std::string& key) const { return files_[file_of_.at(key)]; }
    size_t num_files() const { return files_.size(); }
    // The tensor `key` as fp32 (F32, BF16 or F16 widened exactly). An input error when it is absent ("which `needed_by`
    // needs"), its shape is not `want` ("but `shaped_by` makes it ...") or its dtype is another.
    std::vector<float> read_f32(const std::string& key, const std::vector<int64_t>& want, const std::string& needed_by,
                                const std::string& shaped_by) const;
    // The same, shape unchecked.
    std::vector<float> read_f32(const std::string& key) const;
    // A summary for the import's log line: "model.safetensors" or "3 shards".
    std::string describe() const;

  private:
    static HfWeights single(const std::string& path);
    static HfWeights sharded(const std::string& index_path);

    std::string where_;
    bool sharded_ = false;
    std::vector<SafetensorsFile> files_;
    std::map<std::string, size_t> file_of_;  // tensor -> index into files_
};

// The shards of tensors of these sizes (bytes, in the model's order) as huggingface_hub's
// split_state_dict_into_shards_factory cuts them for save_pretrained: indices into `nbytes`. Tensors fill the open
// shard until the next would take it past max_shard_bytes, which closes it; a tensor larger than max_shard_bytes
// gets a shard of its own, placed when it comes, and the open shard stays open.
std::vector<std::vector<size_t>> plan_hf_shards(const std::vector<int64_t>& nbytes, int64_t max_shard_bytes);
// "model-00002-of-00005.safetensors" for i = 1, n = 5.
std::string hf_shard_name(size_t i, size_t n);

struct HfExportOptions {
    int64_t max_shard_bytes = 0;          // > 0: shards of at most this much tensor data, and the index; 0: one file
    std::optional<int32_t> eos_token_id;  // config.json's bos/eos_token_id (the tokenizer's); default V - 1
    Progress::Style progress = Progress::Style::kNone;
};
struct HfExport {
    int64_t params = 0;
    std::vector<std::string> files;  // written into out_dir, in order
};

// Writes the whole model of checkpoint `r` (the tensors of `table`, in its order, each turned into the file's layout
// by `to_hf`: name, shape and data) into out_dir as model.safetensors (or the shards and model.safetensors.index.json
// when more than one is needed) and config.json (`config`), each atomically. Creates out_dir.
HfExport write_hf_dir(const CheckpointReader& r, const std::vector<ParamInfo>& table,
                      const std::function<void(const ParamInfo&, CanonicalTensor&)>& to_hf,
                      const nlohmann::json& config, const std::string& out_dir, const HfExportOptions& options);

// UserError(kExitConfigError) when the --config's model.arch (`configured`) is not the imported model's.
void check_hf_import_arch(const std::string& configured, const std::string& imported, const std::string& config_path);

// UserError(kExitConfigError) when the checkpoint `r` (its manifest's "model": {"arch": ...}) is not of the arch
// `format` ("hf-gpt2", "hf-llama", "hf-clip") exports, naming the --to that does; UserError(kExitCheckpoint) for an
// arch this build does not know.
void check_hf_export_arch(const CheckpointReader& r, const std::string& format);

// One hyper-parameter of an import: its name ("model.num_layers / n_layer"), the --config's value and config.json's.
struct HfImportDim {
    std::string name;
    double configured, imported;
};
// UserError(kExitConfigError) naming the first dim whose values differ, both values and config.json.
void check_hf_import_dims(const std::vector<HfImportDim>& dims, const std::string& config_path);

// Writes the committed model-only checkpoint <save_dir>/iter_0000000 of an import (write_model_checkpoint: the
// schedule and seed of `cfg` in train_state.json, the source -- `format` ("hf-gpt2"), hf_dir, its dtypes -- in the
// manifest; `model` ("GPT-2") names it in train_state.json) from
// the whole model's flat parameters `flat` (gpt_param_table(s)'s layout). Returns the committed directory.
std::string commit_hf_import(const std::string& hf_dir, const std::string& format, const std::string& model,
                             const HfWeights& weights, const Config& cfg, const GptShape& s,
                             const std::vector<float>& flat, const std::string& save_dir, Progress::Style progress);

}  // namespace ms
