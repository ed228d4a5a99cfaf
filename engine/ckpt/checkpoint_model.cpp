// checkpoint_model.cpp: whole-model reads and model-only writes of checkpoints (checkpoint_model.h).
#include "engine/ckpt/checkpoint_model.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <tuple>

#include "engine/ckpt/atomic_dir.h"
#include "engine/ckpt/checksum.h"
#include "engine/ckpt/safetensors.h"
#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/core/philox.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

[[noreturn]] void fail(const std::string& msg) { throw UserError("checkpoint error: " + msg, kExitCheckpoint); }

int manifest_dim(const CheckpointReader& r, const char* key) {
    const json& m = r.manifest();
    if (!m.contains("model") || !m["model"].contains(key) || !m["model"][key].is_number_integer())
        fail(
            fmt::format("'{}/{}' has no integer \"model\": {{\"{}\": ...}}; it is not a mindspeed-train "
                        "checkpoint of format version {}",
                        r.dir(), kManifestFile, key, kCheckpointFormatVersion));
    return m["model"][key].get<int>();
}

// model.layernorm_epsilon of the checkpoint's config.resolved.yaml (the manifest does not record it).
float checkpoint_epsilon(const CheckpointReader& r) {
    const std::string path = r.dir() + "/" + kResolvedConfigFile;
    constexpr float kDefault = 1e-5f;
    try {
        const YAML::Node eps = YAML::LoadFile(path)["model"]["layernorm_epsilon"];
        if (eps && eps.IsScalar()) return eps.as<float>();
    } catch (const YAML::Exception&) {
    }
    log_warn("checkpoint: '{}' does not give model.layernorm_epsilon; using {}", path, kDefault);
    return kDefault;
}

}  // namespace

std::string resolve_checkpoint(const std::string& path) {
    if (!fs::is_directory(path))
        fail(
            fmt::format("'{}' is not a directory\n---> HINT: pass a checkpoint save directory (the run's "
                        "checkpoint.save) or one of its iter_XXXXXXX directories",
                        path));
    if (fs::exists(fs::path(path) / kManifestFile)) {
        verify_checkpoint(path, /*verify_checksums=*/true);
        return path;
    }
    const std::optional<std::string> dir = CheckpointReader::latest(path, /*verify_checksums=*/true);
    if (!dir)
        fail(
            fmt::format("'{}' holds no committed checkpoint (no iter_XXXXXXX directory with a manifest.json that "
                        "verifies)\n---> HINT: pass a checkpoint save directory (the run's checkpoint.save) or one "
                        "of its iter_XXXXXXX directories",
                        path));
    return *dir;
}

GptShape checkpoint_shape(const CheckpointReader& r) {
    GptShape s;
    s.L = manifest_dim(r, "num_layers");
    s.C = manifest_dim(r, "hidden_size");
    s.NH = manifest_dim(r, "num_attention_heads");
    s.F = manifest_dim(r, "ffn_hidden_size");
    s.T = manifest_dim(r, "max_position_embeddings");
    s.V = r.vocab_size();
    const json& model = r.manifest()["model"];
    const std::string arch = model.value("arch", "gpt");  // checkpoints before Llama name no arch: GPT-2
    if (arch == "clip")
        throw UserError(
            fmt::format("config error: '{}' holds a CLIP model (model.arch clip); this reads GPT-2 and Llama "
                        "checkpoints\n---> HINT: export it with convert --to hf-clip",
                        r.dir()));
    if (arch != "gpt" && arch != "llama")
        fail(fmt::format("'{}/{}' holds a model of arch '{}', which this build does not know (gpt, llama)", r.dir(),
                         kManifestFile, arch));
    if (arch == "llama") {
        s.arch = ModelArch::kLlama;
        s.NKV = manifest_dim(r, "num_query_groups");
        try {
            s.rope_theta = model.at("rotary_base").get<double>();
            const json& scaling = model.at("rope_scaling");
            s.rope_scaling = {
                .factor = scaling.at("factor").get<double>(),
                .low_freq_factor = scaling.at("low_freq_factor").get<double>(),
                .high_freq_factor = scaling.at("high_freq_factor").get<double>(),
                .original_max_position_embeddings = scaling.at("original_max_position_embeddings").get<double>()};
        } catch (const json::exception& e) {
            fail(fmt::format("'{}/{}': the Llama model's rotary_base / rope_scaling are missing or not numbers ({})",
                             r.dir(), kManifestFile, e.what()));
        }
    }
    // checkpoints before untied output layers do not say: theirs was tied
    const json& untied = model.contains("untie_embeddings_and_output_weights")
                             ? model["untie_embeddings_and_output_weights"]
                             : json(false);
    if (!untied.is_boolean())
        fail(fmt::format("'{}/{}': \"untie_embeddings_and_output_weights\" is {}, not true or false", r.dir(),
                         kManifestFile, untied.dump()));
    s.untied = untied.get<bool>();
    const std::string embedding = embedding_weight_name(s);
    const std::vector<int64_t>& wte = r.global_shape(embedding);
    if (wte.size() != 2) fail(fmt::format("'{}': {} has {} dims, not 2", r.dir(), embedding, wte.size()));
    s.Vp = static_cast<int>(wte[0]);
    s.eps = checkpoint_epsilon(r);
    if (s.L < 1 || s.C < 1 || s.NH < 1 || s.C % s.NH != 0 || s.F < 1 || s.T < 1 || s.V < 1 || s.Vp < s.V || s.NKV < 0 ||
        (s.NKV > 0 && s.NH % s.NKV != 0))
        fail(fmt::format("'{}/{}' describes an impossible model {}", r.dir(), kManifestFile,
                         r.manifest()["model"].dump()));
    check_checkpoint_shape(r, s, fmt::format("the model its manifest describes ({})", r.manifest()["model"].dump()),
                           "the checkpoint's files disagree with its manifest: re-export or re-save it");
    return s;
}

void check_checkpoint_hyperparameters(const CheckpointReader& r, const GptShape& configured,
                                      const std::string& config_name) {
    const GptShape saved = checkpoint_shape(r);
    const auto refuse = [&](const char* key, const std::string& in_config, const std::string& in_checkpoint) {
        throw UserError(fmt::format(
            "config error: {} is {} in the config {} but {} in the checkpoint {}; the checkpoint's hyper-parameters "
            "are the model's\n---> HINT: set {}: {} in the config (or --set {}={}), or pass the checkpoint of the "
            "model the config describes",
            key, in_config, config_name, in_checkpoint, r.dir(), key, in_checkpoint, key, in_checkpoint));
    };
    const auto arch = [](const GptShape& s) { return std::string(s.arch == ModelArch::kLlama ? "llama" : "gpt"); };
    if (configured.arch != saved.arch) refuse("model.arch", arch(configured), arch(saved));
    if (configured.untied != saved.untied)
        refuse("model.untie_embeddings_and_output_weights", configured.untied ? "true" : "false",
               saved.untied ? "true" : "false");
    if (configured.NH != saved.NH)
        refuse("model.num_attention_heads", std::to_string(configured.NH), std::to_string(saved.NH));
    if (saved.arch == ModelArch::kLlama) {
        if (configured.kv_heads() != saved.kv_heads())
            refuse("model.num_query_groups", std::to_string(configured.kv_heads()), std::to_string(saved.kv_heads()));
        if (configured.rope_theta != saved.rope_theta)
            refuse("model.rotary_base", fmt::format("{}", configured.rope_theta), fmt::format("{}", saved.rope_theta));
        // the scaling's other settings matter only where it scales (a factor other than 0 and 1)
        const RopeScaling &c = configured.rope_scaling, &s = saved.rope_scaling;
        const bool scaled = s.factor != 0.0 && s.factor != 1.0;
        for (const auto& [key, mine, theirs] :
             {std::tuple<const char*, double, double>{"model.rope_scaling_factor", c.factor, s.factor},
              {"model.rope_low_freq_factor", scaled ? c.low_freq_factor : 0.0, scaled ? s.low_freq_factor : 0.0},
              {"model.rope_high_freq_factor", scaled ? c.high_freq_factor : 0.0, scaled ? s.high_freq_factor : 0.0},
              {"model.rope_original_max_position_embeddings", scaled ? c.original_max_position_embeddings : 0.0,
               scaled ? s.original_max_position_embeddings : 0.0}}) {
            if (mine != theirs) refuse(key, fmt::format("{}", mine), fmt::format("{}", theirs));
        }
    }
    if (configured.eps != saved.eps)
        refuse("model.layernorm_epsilon", fmt::format("{}", configured.eps), fmt::format("{}", saved.eps));
}

void read_whole_model(const CheckpointReader& r, Gpt& model) {
    for (const ParamInfo& p : model.params_info()) {
        MS_CHECK(p.shape == p.global_shape, "read_whole_model: '{}' is a tensor-parallel shard", p.name);
        r.read_box(p.name, std::nullopt, shard_box(p, 0, 1), 0, p.numel, model.params() + p.offset);
    }
}

std::string write_model_checkpoint(const std::string& save_dir, const Config& cfg, const GptShape& shape,
                                   const float* params, const TrainState& state, const json& extra_manifest,
                                   Progress::Style progress) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(save_dir, ec)) {
        const std::string n = e.path().filename().string();
        if (e.is_directory() && n.rfind("iter_", 0) == 0 && n.find('.') == std::string::npos)
            fail(
                fmt::format("'{}' already holds the checkpoint {}; writing iteration {} there would move its "
                            "tracker back\n---> HINT: choose a new or empty directory",
                            save_dir, n, state.iteration));
    }
    fs::create_directories(save_dir, ec);
    if (ec) fail(fmt::format("cannot create '{}': {}", save_dir, ec.message()));

    CheckpointWriter writer(save_dir, state.iteration);
    std::vector<TensorEntry> tensors;
    std::map<std::string, std::string> meta = {{"format", "mindspeed-ckpt"},
                                               {"format_version", std::to_string(kCheckpointFormatVersion)},
                                               {"kind", "model"},
                                               {"tp_rank", "0"},
                                               {"tp_size", "1"},
                                               {"pp_rank", "0"},
                                               {"pp_size", "1"},
                                               {"dp_rank", "0"},
                                               {"dp_size", "1"},
                                               {"vocab_size", std::to_string(shape.V)}};
    int64_t total_bytes = 0;
    for (const ParamInfo& p : gpt_param_table(shape)) {
        tensors.push_back({p.name, DType::kF32, p.shape, params + p.offset});
        total_bytes += p.numel * static_cast<int64_t>(sizeof(float));
        const ShardBox b = shard_box(p, 0, 1);
        meta[p.name] = json{{"global_shape", p.global_shape},
                            {"view_shape", b.view_shape},
                            {"view_offset", b.view_offset},
                            {"view_extent", b.view_extent}}
                           .dump();
    }
    Progress bar("checkpoint: saving", total_bytes, progress, "tensors");
    int64_t bytes_written = 0, tensors_written = 0;
    write_safetensors(writer.path("model/tp00_pp000.safetensors"), tensors, meta, [&](uint64_t n) {
        bytes_written += static_cast<int64_t>(n);
        bar.update(bytes_written, ++tensors_written);
    });
    bar.finish();
    writer.write_file(kTrainStateFile, train_state_to_json(state).dump(2) + "\n");
    const std::string yaml = config_to_yaml(cfg);
    writer.write_file(kResolvedConfigFile, yaml);

    json manifest = {{"format", "mindspeed-ckpt"},
                     {"checkpoint_version", kCheckpointFormatVersion},
                     {"mindspeed_version", MS_VERSION},
                     {"world_size", 1},
                     {"tp", 1},
                     {"pp", 1},
                     {"dp", 1},
                     {"cp", 1},
                     {"virtual_pipeline", 1},
                     {"zero_stage", 0},
                     {"sequence_parallel", false},
                     {"config_hash", xxh64_hex(name_hash(yaml))},
                     {"dtype", "fp32"},
                     {"master_weights", "none: fp32 training, the parameters in model/ are the master weights"},
                     {"model", model_manifest(shape)}};
    manifest.update(extra_manifest);
    return writer.commit(manifest);
}

}  // namespace ms
