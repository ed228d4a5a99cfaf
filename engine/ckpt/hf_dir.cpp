// hf_dir.cpp: the parts of a Hugging Face model directory every format shares (hf_dir.h).
#include "engine/ckpt/hf_dir.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <set>

#include "engine/ckpt/atomic_dir.h"
#include "engine/ckpt/checkpoint_model.h"
#include "engine/core/check.h"
#include "engine/optim/adamw.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// IEEE half -> float, exactly (every half is a float).
float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (mant << 13);  // inf / nan
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        int e = -1;
        do {
            ++e;
            mant <<= 1;
        } while ((mant & 0x400) == 0);
        bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3FF) << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// A file of the Hugging Face directory <hf_dir> that must exist.
void require_input_file(const std::string& path, const std::string& hf_dir, const std::string& model) {
    if (fs::is_regular_file(path)) return;
    const bool pickle =
        path.ends_with(kHfWeightsFile) && (fs::exists(fs::path(hf_dir) / "pytorch_model.bin") ||
                                           fs::exists(fs::path(hf_dir) / "pytorch_model.bin.index.json"));
    hf_input_error(fmt::format(
        "'{}' does not exist{}\n---> HINT: --load takes a Hugging Face {} directory holding config.json and "
        "model.safetensors, or model.safetensors.index.json and the shards it names (what save_pretrained writes){}",
        path, fs::is_directory(hf_dir) ? "" : fmt::format(" ('{}' is not a directory)", hf_dir), model,
        pickle ? "; this one has only pytorch_model.bin, a pickle: convert it to safetensors "
                 "first (model.save_pretrained(dir, safe_serialization=True))"
               : ""));
}

SafetensorsFile open_input(const std::string& path) {
    try {
        return SafetensorsFile::open(path);
    } catch (const UserError& e) {  // the input data is bad, not one of our checkpoints
        throw UserError(e.what(), kExitConfigError);
    }
}

}  // namespace

void hf_input_error(const std::string& msg) { throw UserError("input error: " + msg, kExitConfigError); }

std::string hf_shape_str(const std::vector<int64_t>& s) { return json(s).dump(); }

int hf_positive_int(const json& config, const char* key, const std::string& where, const std::string& hint) {
    const auto it = config.find(key);
    if (it == config.end() || !it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > (1 << 30))
        hf_input_error(fmt::format("'{}' has {} for \"{}\", not a positive integer\n---> HINT: {}", where,
                                   it == config.end() ? std::string("nothing") : it->dump(), key, hint));
    return it->get<int>();
}

bool hf_bool(const json& config, const char* key, bool fallback, const std::string& where) {
    const auto it = config.find(key);
    if (it == config.end() || it->is_null()) return fallback;
    if (!it->is_boolean())
        hf_input_error(
            fmt::format("'{}' has {} for \"{}\", not true or false\n---> HINT: write it as a JSON boolean, "
                        "without quotes",
                        where, it->dump(), key));
    return it->get<bool>();
}

json read_hf_config(const std::string& hf_dir, const std::string& model) {
    const std::string path = (fs::path(hf_dir) / kHfConfigFile).string();
    require_input_file(path, hf_dir, model);
    std::ifstream in(path);
    const json config = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded()) hf_input_error(fmt::format("'{}' is not valid JSON", path));
    if (!config.is_object()) hf_input_error(fmt::format("'{}' is not a JSON object", path));
    return config;
}

HfWeights HfWeights::single(const std::string& path) {
    HfWeights w;
    w.where_ = path;
    w.files_.push_back(open_input(path));
    for (const std::string& key : w.files_[0].names()) w.file_of_[key] = 0;
    return w;
}

HfWeights HfWeights::sharded(const std::string& index_file) {
    const fs::path index_path = index_file;
    HfWeights w;
    w.where_ = index_path.string();
    w.sharded_ = true;
    const std::string hint =
        "\n---> HINT: model.safetensors.index.json is {\"metadata\": {\"total_size\": BYTES}, \"weight_map\": "
        "{\"TENSOR\": \"model-00001-of-00002.safetensors\", ...}}, as save_pretrained writes it";
    std::ifstream in(index_path, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // JSON objects may repeat a key; the parser would keep the last silently, so a repeat is caught here.
    std::string repeated;
    std::vector<std::set<std::string>> keys;
    const json::parser_callback_t on_event = [&](int, json::parse_event_t event, json& parsed) {
        if (event == json::parse_event_t::object_start) keys.emplace_back();
        if (event == json::parse_event_t::object_end) keys.pop_back();
        if (event == json::parse_event_t::key && !keys.back().insert(parsed.get<std::string>()).second &&
            repeated.empty())
            repeated = parsed.get<std::string>();
        return true;
    };
    json index;
    try {
        index = json::parse(text, on_event);
    } catch (const json::exception& e) {
        hf_input_error(fmt::format("'{}' is not valid JSON ({}){}", w.where_, e.what(), hint));
    }
    if (!repeated.empty()) hf_input_error(fmt::format("'{}' names '{}' twice{}", w.where_, repeated, hint));
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object() ||
        index["weight_map"].empty())
        hf_input_error(
            fmt::format("'{}' has no \"weight_map\" object of tensor names and shard files{}", w.where_, hint));
    std::map<std::string, std::vector<std::string>> tensors_of;  // shard file -> the tensors the index puts there
    for (const auto& [key, file] : index["weight_map"].items()) {
        if (!file.is_string() || file.get<std::string>().empty() ||
            file.get<std::string>().find('/') != std::string::npos)
            hf_input_error(fmt::format("'{}' puts the tensor '{}' in {}, not a file name in its directory{}", w.where_,
                                       key, file.dump(), hint));
        tensors_of[file.get<std::string>()].push_back(key);
    }
    for (const auto& [name, tensors] : tensors_of) {
        const fs::path path = index_path.parent_path() / name;
        if (!fs::is_regular_file(path))
            hf_input_error(fmt::format("'{}' does not exist, but '{}' puts {} tensor(s) in it ('{}'{})", path.string(),
                                       w.where_, tensors.size(), tensors.front(), tensors.size() > 1 ? ", ..." : ""));
        w.files_.push_back(open_input(path.string()));
    }
    // Every tensor in exactly the shard the index names.
    size_t i = 0;
    for (const auto& [name, tensors] : tensors_of) {
        const SafetensorsFile& f = w.files_[i];
        for (const std::string& key : tensors) {
            if (!f.contains(key))
                hf_input_error(fmt::format("'{}' puts the tensor '{}' in '{}', which has no such tensor", w.where_, key,
                                           f.path()));
            w.file_of_[key] = i;
        }
        ++i;
    }
    for (size_t j = 0; j < w.files_.size(); ++j) {
        for (const std::string& key : w.files_[j].names()) {
            const auto it = w.file_of_.find(key);
            if (it == w.file_of_.end())
                hf_input_error(fmt::format("'{}' holds the tensor '{}', which '{}' does not list", w.files_[j].path(),
                                           key, w.where_));
            if (it->second != j)
                hf_input_error(
                    fmt::format("the tensor '{}' is in two places: '{}' and '{}' (the index '{}' names "
                                "the second)",
                                key, w.files_[j].path(), w.files_[it->second].path(), w.where_));
        }
    }
    return w;
}

HfWeights HfWeights::open(const std::string& hf_dir, const std::string& model) {
    const fs::path single_path = fs::path(hf_dir) / kHfWeightsFile, index_path = fs::path(hf_dir) / kHfIndexFile;
    if (!fs::exists(single_path) && fs::is_regular_file(index_path)) return sharded(index_path.string());
    require_input_file(single_path.string(), hf_dir, model);
    return single(single_path.string());
}

std::string HfWeights::dtypes() const {
    std::string out;
    for (const auto& [key, i] : file_of_) {
        const std::string& dtype = files_[i].info(key).dtype_name;
        if (out.find(dtype) == std::string::npos) out += (out.empty() ? "" : ", ") + dtype;
    }
    return out;
}

std::vector<std::string> HfWeights::names() const {
    std::vector<std::string> out;
    for (const auto& [key, i] : file_of_) out.push_back(key);
    return out;
}

std::string HfWeights::describe() const {
    return sharded_ ? fmt::format("{} shards", files_.size()) : std::string(kHfWeightsFile);
}

// The data may be unaligned: files from other writers.
std::vector<float> HfWeights::read_f32(const std::string& key) const {
    const SafetensorsFile& f = file(key);
    const TensorInfo& info = f.info(key);
    const std::byte* p = f.data(key);
    const size_t n = static_cast<size_t>(info.numel());
    std::vector<float> out(n);
    if (info.dtype_name == "F32") {
        if (n) std::memcpy(out.data(), p, n * sizeof(float));
    } else if (info.dtype_name == "BF16" || info.dtype_name == "F16") {
        const bool bf16 = info.dtype_name == "BF16";
        for (size_t i = 0; i < n; ++i) {
            uint16_t h;
            std::memcpy(&h, p + 2 * i, 2);
            if (bf16) {
                const uint32_t bits = static_cast<uint32_t>(h) << 16;
                std::memcpy(&out[i], &bits, sizeof(float));
            } else {
                out[i] = half_to_float(h);
            }
        }
    } else {
        hf_input_error(fmt::format("'{}', tensor '{}' is {}; weights are imported from F32, BF16 or F16", f.path(), key,
                                   info.dtype_name));
    }
    return out;
}

std::vector<float> HfWeights::read_f32(const std::string& key, const std::vector<int64_t>& want,
                                       const std::string& needed_by, const std::string& shaped_by) const {
    if (!contains(key))
        hf_input_error(fmt::format("'{}' has no tensor '{}' (shape {}), which {} needs", where_, key,
                                   hf_shape_str(want), needed_by));
    const SafetensorsFile& f = file(key);
    const std::vector<int64_t>& got = f.info(key).shape;
    if (got != want)
        hf_input_error(fmt::format("'{}': tensor '{}' has shape {}, but {} makes it {}", f.path(), key,
                                   hf_shape_str(got), shaped_by, hf_shape_str(want)));
    return read_f32(key);
}

std::vector<std::vector<size_t>> plan_hf_shards(const std::vector<int64_t>& nbytes, int64_t max_shard_bytes) {
    std::vector<std::vector<size_t>> shards;
    std::vector<size_t> open;  // the shard being filled
    int64_t used = 0;
    for (size_t i = 0; i < nbytes.size(); ++i) {
        if (nbytes[i] > max_shard_bytes) {  // alone, and the open shard stays open
            shards.push_back({i});
            continue;
        }
        if (nbytes[i] > max_shard_bytes - used) {
            shards.push_back(std::move(open));
            open.clear();
            used = 0;
        }
        open.push_back(i);
        used += nbytes[i];
    }
    if (!open.empty()) shards.push_back(std::move(open));
    return shards;
}

std::string hf_shard_name(size_t i, size_t n) { return fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, n); }

HfExport write_hf_dir(const CheckpointReader& r, const std::vector<ParamInfo>& table,
                      const std::function<void(const ParamInfo&, CanonicalTensor&)>& to_hf, const json& config,
                      const std::string& out_dir, const HfExportOptions& o) {
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec)
        throw UserError(fmt::format("cannot create the output directory '{}': {}", out_dir, ec.message()),
                        kExitCheckpoint);
    int64_t total_bytes = 0;
    for (const ParamInfo& p : table) total_bytes += p.numel * static_cast<int64_t>(sizeof(float));
    Progress bar("convert: reading", total_bytes, o.progress, "tensors");
    std::vector<CanonicalTensor> tensors;  // HF layout; kept alive for the writer
    HfExport out;
    int64_t done = 0;
    for (const ParamInfo& p : table) {
        CanonicalTensor t = r.tensor(p.name);
        t.shape = p.global_shape;  // a tensor may come as a view of other dims (GPT-2's c_attn): the same bytes
        to_hf(p, t);
        tensors.push_back(std::move(t));
        done += p.numel * static_cast<int64_t>(sizeof(float));
        bar.update(done, static_cast<int64_t>(tensors.size()));
    }
    bar.finish();
    std::vector<int64_t> nbytes;
    for (const CanonicalTensor& t : tensors) nbytes.push_back(static_cast<int64_t>(t.data.size() * sizeof(float)));
    const int64_t hf_bytes = std::accumulate(nbytes.begin(), nbytes.end(), int64_t{0});  // vocabulary unpadded
    out.params = hf_bytes / static_cast<int64_t>(sizeof(float));
    const std::vector<std::vector<size_t>> shards =
        plan_hf_shards(nbytes, o.max_shard_bytes > 0 ? o.max_shard_bytes : std::numeric_limits<int64_t>::max());
    json weight_map = json::object();
    Progress written("convert: writing", hf_bytes, o.progress, "tensors");
    int64_t bytes_written = 0, tensors_written = 0;
    const auto on_written = [&](uint64_t n) {
        bytes_written += static_cast<int64_t>(n);
        written.update(bytes_written, ++tensors_written);
    };
    for (size_t k = 0; k < shards.size(); ++k) {
        const std::string name = shards.size() == 1 ? kHfWeightsFile : hf_shard_name(k, shards.size());
        std::vector<TensorEntry> entries;
        for (const size_t i : shards[k]) {
            const CanonicalTensor& t = tensors[i];
            entries.push_back({t.name, DType::kF32, t.shape, t.data.data()});
            weight_map[t.name] = name;
        }
        write_safetensors((fs::path(out_dir) / name).string(), entries, {{"format", "pt"}}, on_written);
        out.files.push_back(name);
    }
    written.finish();
    // One shard is model.safetensors without an index, as save_pretrained writes a model under its shard size.
    if (shards.size() > 1) {
        const json index = {{"metadata", {{"total_size", hf_bytes}}}, {"weight_map", weight_map}};
        write_file_atomic((fs::path(out_dir) / kHfIndexFile).string(), index.dump(2) + "\n");
        out.files.push_back(kHfIndexFile);
    }
    write_file_atomic((fs::path(out_dir) / kHfConfigFile).string(), config.dump(2) + "\n");
    out.files.push_back(kHfConfigFile);
    return out;
}

void check_hf_export_arch(const CheckpointReader& r, const std::string& format) {
    struct Family {
        const char* arch;    // the manifest's "model": {"arch": ...}
        const char* name;    // in the message
        const char* format;  // the --to that exports it
    };
    static constexpr Family kFamilies[] = {
        {"gpt", "GPT-2", "hf-gpt2"}, {"llama", "Llama", "hf-llama"}, {"clip", "CLIP", "hf-clip"}};
    const nlohmann::json& model = r.manifest().at("model");  // the reader requires it
    const std::string arch = model.value("arch", "gpt");     // checkpoints before Llama name no arch: GPT-2
    for (const Family& f : kFamilies) {
        if (arch != f.arch) continue;
        if (format == f.format) return;
        throw UserError(
            fmt::format("command line error: '{}' holds a {} model (model.arch {}), which --to {} does not "
                        "export\n---> HINT: export it with --to {}",
                        r.dir(), f.name, f.arch, format, f.format));
    }
    throw UserError(fmt::format("checkpoint error: '{}/{}' holds a model of arch '{}', which this build does not know "
                                "(gpt, llama, clip)",
                                r.dir(), kManifestFile, arch),
                    kExitCheckpoint);
}

void check_hf_import_arch(const std::string& configured, const std::string& imported, const std::string& config_path) {
    if (configured != imported)
        throw UserError(
            fmt::format("config error: model.arch is {} in --config, but '{}' describes a {} model"
                        "\n---> HINT: set model.arch: {} and the rest of the model section to the "
                        "imported model's",
                        configured, config_path, imported, imported));
}

void check_hf_import_dims(const std::vector<HfImportDim>& dims, const std::string& config_path) {
    for (const HfImportDim& d : dims)
        if (d.configured != d.imported)
            throw UserError(
                fmt::format("config error: {} is {} in --config but {} in '{}'\n---> HINT: set the model section of "
                            "the config to the imported model's dims",
                            d.name, d.configured, d.imported, config_path));
}

std::string commit_hf_import(const std::string& hf_dir, const std::string& format, const std::string& model,
                             const HfWeights& weights, const Config& cfg, const GptShape& s,
                             const std::vector<float>& flat, const std::string& save_dir, Progress::Style progress) {
    TrainState state;  // iteration 0: nothing trained yet
    state.lr_decay_style = cfg.lr_schedule.lr_decay_style;
    state.lr = cfg.optimizer.lr;
    state.min_lr = cfg.optimizer.min_lr;
    state.lr_warmup_iters = cfg.lr_schedule.lr_warmup_iters;
    state.lr_decay_iters =
        cfg.lr_schedule.lr_decay_iters > 0 ? cfg.lr_schedule.lr_decay_iters : cfg.training.train_iters;
    state.last_lr = learning_rate(cfg.optimizer, cfg.lr_schedule, cfg.training.train_iters, 0);
    state.seed = cfg.run.seed;
    state.data_describe = fmt::format("none: weights imported from the Hugging Face {} directory {}", model, hf_dir);
    const json extra = {{"source", {{"format", format}, {"path", hf_dir}, {"dtype", weights.dtypes()}}},
                        {"optimizer_state", "none: a model-only checkpoint (imported weights)"}};
    return write_model_checkpoint(save_dir, cfg, s, flat.data(), state, extra, progress);
}

}  // namespace ms
