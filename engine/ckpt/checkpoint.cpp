// checkpoint.cpp: save_checkpoint and load_checkpoint (format and protocol in checkpoint.h); the reader is
// checkpoint_reader.cpp.
#include "engine/ckpt/checkpoint.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <numeric>
#include <span>

#include "engine/ckpt/atomic_dir.h"
#include "engine/ckpt/checksum.h"
#include "engine/ckpt/safetensors.h"
#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/core/philox.h"
#include "engine/core/switches.h"
#include "engine/core/timer.h"
#include "engine/data/file_source.h"
#include "engine/data/progress.h"
#include "engine/optim/adamw.h"
#include "engine/optim/distributed_optimizer.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

[[noreturn]] void fail(const std::string& msg) { throw UserError("checkpoint error: " + msg, kExitCheckpoint); }

// Runs fn on this rank, then one all-reduce (MAX of a failed rank's exit code, 0 when fine) turns a failure on any
// rank into a failure on all: the failing rank rethrows its own error, the others throw one saying so. Peers
// never wait forever in the next collective for a rank that gave up.
void agree(Communicator& world, const std::string& what, const std::function<void()>& fn) {
    std::exception_ptr error;
    int32_t code = 0;
    try {
        fn();
    } catch (const UserError& e) {
        error = std::current_exception();
        code = e.exit_code();
    } catch (const std::exception& e) {  // e.g. a JSON type error from a damaged file: still a sentence, still 19
        error = std::make_exception_ptr(
            UserError(fmt::format("checkpoint error: {}: {}", what, e.what()), kExitCheckpoint));
        code = kExitCheckpoint;
    }
    world.all_reduce(std::span<int32_t>(&code, 1), ReduceOp::kMax).wait();
    if (error) std::rethrow_exception(error);
    if (code != 0)
        throw UserError(
            fmt::format("checkpoint error: another rank failed while {} (its error is printed above)", what), code);
}

// Sums non-negative int64 values over `comm` exactly (the typed collectives carry float and int32): 16-bit limbs in
// int32, exact for up to 2^15 ranks.
std::vector<int64_t> sum_i64(Communicator& comm, const std::vector<int64_t>& v) {
    std::vector<int32_t> limbs(v.size() * 4);
    for (size_t i = 0; i < v.size(); ++i)
        for (int k = 0; k < 4; ++k) limbs[i * 4 + k] = static_cast<int32_t>((v[i] >> (16 * k)) & 0xffff);
    comm.all_reduce(std::span<int32_t>(limbs), ReduceOp::kSum).wait();
    std::vector<int64_t> out(v.size(), 0);
    for (size_t i = 0; i < v.size(); ++i)
        for (int k = 0; k < 4; ++k) out[i] += static_cast<int64_t>(limbs[i * 4 + k]) << (16 * k);
    return out;
}

// MS_INJECT_CKPT_FAIL=<phase>[@<world rank>]: the phase this rank fails at, or "".
std::string injected_phase(int world_rank) {
    const std::string& spec = switches().inject_ckpt_fail;
    if (spec.empty()) return "";
    std::string phase = spec;
    const size_t at = spec.find('@');
    if (at != std::string::npos) {
        phase = spec.substr(0, at);
        if (std::atoi(spec.c_str() + at + 1) != world_rank) return "";
    }
    if (phase != "write" && phase != "manifest" && phase != "rename" && phase != "tracker")
        throw UserError(
            fmt::format("MS_INJECT_CKPT_FAIL='{}': the phase must be write, manifest, rename or tracker, "
                        "optionally followed by @<rank>",
                        spec));
    return phase;
}

[[noreturn]] void injected_failure(const std::string& phase, const std::string& dir) {
    fail(fmt::format("injected failure (MS_INJECT_CKPT_FAIL) at phase '{}' of the save into '{}'", phase, dir));
}

// What is stored of a parameter on this rank: never the last stage's tied-wte copy, replicated tensors on tp 0.
bool stored_here(const ParamInfo& p, int tp_rank) {
    return !p.pp_duplicate && (p.shard != ShardKind::kReplicated || tp_rank == 0);
}

std::string piece_metadata(const ParamInfo& p, const ShardBox& b, int64_t begin, int64_t end, bool with_range) {
    json m = {{"global_shape", p.global_shape},
              {"view_shape", b.view_shape},
              {"view_offset", b.view_offset},
              {"view_extent", b.view_extent}};
    if (with_range) m["range"] = {begin, end};
    return m.dump();
}

std::map<std::string, std::string> file_metadata(const CheckpointContext& c, const char* kind) {
    const ProcessGroups& g = c.groups;
    return {{"format", "mindspeed-ckpt"},
            {"format_version", std::to_string(kCheckpointFormatVersion)},
            {"kind", kind},
            {"tp_rank", std::to_string(g.tp_rank)},
            {"tp_size", std::to_string(g.tp_size)},
            {"pp_rank", std::to_string(g.pp_rank)},
            {"pp_size", std::to_string(g.pp_size)},
            {"dp_rank", std::to_string(g.dp_rank)},
            {"dp_size", std::to_string(g.dp_size)},
            {"vocab_size", std::to_string(c.model.vocab_size)}};
}

std::string model_file(int tp, int pp) { return fmt::format("model/tp{:02d}_pp{:03d}.safetensors", tp, pp); }
std::string optim_file(int dp, int tp, int pp) {
    return fmt::format("optim/dp{:04d}_tp{:02d}_pp{:03d}.safetensors", dp, tp, pp);
}

// This rank's elements [a, b) of parameter p's shard that its optimizer holds state for (empty when a >= b).
std::pair<int64_t, int64_t> optim_range(const ParamInfo& p, const DistributedOptimizer& opt) {
    const int64_t lo = std::max(p.offset, opt.state_begin());
    const int64_t hi = std::min(p.offset + p.numel, opt.state_begin() + opt.state_size());
    return {lo - p.offset, hi - p.offset};
}

// AdamW's moments: every rank's shard with ZeRO-1, dp rank 0's replica otherwise.
bool saves_moments(const CheckpointContext& c) { return c.optimizer.zero_stage() >= 1 || c.groups.dp_rank == 0; }
// An optimizer file: the moments, or onebit_adam's residuals, which every dp rank has its own of.
bool saves_optimizer(const CheckpointContext& c) { return saves_moments(c) || c.optimizer.onebit() != nullptr; }

std::string worker_error_kind(int dp_rank) { return fmt::format("onebit_worker_error_dp{:04d}", dp_rank); }

// onebit_adam's residuals of parameter `param` (its index in the table): the worker's, over all its elements, and
// the server's over the elements [a, b) of it this rank serves (a == b: none).
struct OneBitResiduals {
    float* worker = nullptr;
    int64_t a = 0, b = 0;
    float* server = nullptr;
};
// The run of `chunks` (in table order, so a parameter's chunks are neighbours) that belongs to parameter `param`.
std::span<const OneBitChunk> chunks_of(std::span<const OneBitChunk> chunks, int param) {
    const auto lo =
        std::partition_point(chunks.begin(), chunks.end(), [&](const OneBitChunk& c) { return c.param < param; });
    const auto hi = std::partition_point(lo, chunks.end(), [&](const OneBitChunk& c) { return c.param == param; });
    return {lo, hi};
}

OneBitResiduals onebit_residuals(const OneBitAllReduce& ob, int param) {
    OneBitResiduals r;
    const std::span<const OneBitChunk> all = chunks_of(ob.layout().chunks, param);
    if (!all.empty()) r.worker = ob.worker_error().data() + all.front().error_offset;
    const std::span<const OneBitChunk> served = ob.served_chunks(), mine = chunks_of(served, param);
    if (!mine.empty()) {
        r.a = mine.front().param_offset;
        r.b = mine.back().param_offset + mine.back().elems;
        r.server = ob.server_error().data() + (mine.front().error_offset - served.front().error_offset);
    }
    return r;
}

// Whether a save writes on this rank (write_rank_files and the commit): dp rank 0 the model file, saves_optimizer
// the optimizer file, world rank 0 the train state and the commit.
bool writes_files(const CheckpointContext& c) {
    return c.groups.dp_rank == 0 || saves_optimizer(c) || c.groups.world->rank() == 0;
}

// Counts (model elements, optimizer elements) this rank writes, for the coverage check.
std::array<int64_t, 2> stored_counts(const CheckpointContext& c) {
    std::array<int64_t, 2> n = {0, 0};
    for (const ParamInfo& p : c.params_info) {
        if (!stored_here(p, c.groups.tp_rank)) continue;
        if (c.groups.dp_rank == 0) n[0] += p.numel;
        if (saves_moments(c)) {
            const auto [a, b] = optim_range(p, c.optimizer);
            n[1] += std::max<int64_t>(0, b - a);
        }
    }
    return n;
}

// The bar of a save or load on world rank 0 when its stderr is a terminal; nothing otherwise (the other ranks, and
// a log file, which has the save's or load's own summary line).
Progress::Style checkpoint_progress(const ProcessGroups& g) {
    return g.world->rank() == 0 ? Progress::bar_or_none_for_stderr() : Progress::Style::kNone;
}

int64_t tensor_bytes(const std::vector<TensorEntry>& tensors) {
    int64_t n = 0;
    for (const TensorEntry& t : tensors) {
        int64_t numel = 1;
        for (const int64_t d : t.shape) numel *= d;
        n += numel * static_cast<int64_t>(dtype_size(t.dtype));
    }
    return n;
}

void write_rank_files(const CheckpointContext& c, const TrainState& state, const std::string& tmp,
                      const std::string& inject) {
    const ProcessGroups& g = c.groups;
    std::vector<TensorEntry> model_tensors, optim_tensors;
    std::map<std::string, std::string> model_meta, optim_meta;
    if (g.dp_rank == 0) {
        model_meta = file_metadata(c, "model");
        for (const ParamInfo& p : c.params_info) {
            if (!stored_here(p, g.tp_rank)) continue;
            model_tensors.push_back({p.name, DType::kF32, p.shape, c.params + p.offset});
            model_meta[p.name] = piece_metadata(p, shard_box(p, g.tp_rank, g.tp_size), 0, p.numel, false);
        }
    }
    if (saves_optimizer(c)) {
        optim_meta = file_metadata(c, "optim");
        float* const state[2] = {c.optimizer.exp_avg(), c.optimizer.exp_avg_sq()};
        const auto add = [&](const std::string& key, const ParamInfo& p, int64_t a, int64_t b, const float* data) {
            optim_meta[key] = piece_metadata(p, shard_box(p, g.tp_rank, g.tp_size), a, b, true);
            optim_tensors.push_back({key, DType::kF32, {b - a}, data});
        };
        const OneBitAllReduce* onebit = c.optimizer.onebit();
        for (size_t i = 0; i < c.params_info.size(); ++i) {
            const ParamInfo& p = c.params_info[i];
            if (!stored_here(p, g.tp_rank)) continue;
            const auto [a, b] = optim_range(p, c.optimizer);
            if (saves_moments(c) && a < b) {
                for (const OptimState s : {OptimState::kExpAvg, OptimState::kExpAvgSq}) {
                    add(std::string(optim_state_name(s)) + "/" + p.name, p, a, b,
                        state[s == OptimState::kExpAvg ? 0 : 1] + (p.offset + a - c.optimizer.state_begin()));
                }
            }
            if (onebit == nullptr || onebit->worker_error().empty()) continue;
            const OneBitResiduals e = onebit_residuals(*onebit, static_cast<int>(i));
            add(worker_error_kind(g.dp_rank) + "/" + p.name, p, 0, p.numel, e.worker);
            if (e.a < e.b) add("onebit_server_error/" + p.name, p, e.a, e.b, e.server);
        }
    }
    // Progress over the tensor bytes of this rank's files (model, then optimizer).
    Progress bar("checkpoint: saving", tensor_bytes(model_tensors) + tensor_bytes(optim_tensors),
                 checkpoint_progress(g), "tensors");
    int64_t bytes_written = 0, tensors_written = 0;
    const auto on_written = [&](uint64_t n) {
        bytes_written += static_cast<int64_t>(n);
        bar.update(bytes_written, ++tensors_written);
    };
    if (g.dp_rank == 0)
        write_safetensors(tmp + "/" + model_file(g.tp_rank, g.pp_rank), model_tensors, model_meta, on_written);
    if (inject == "write") injected_failure(inject, tmp);
    if (saves_optimizer(c))
        write_safetensors(tmp + "/" + optim_file(g.dp_rank, g.tp_rank, g.pp_rank), optim_tensors, optim_meta,
                          on_written);
    bar.finish();
    if (g.world->rank() == 0) {
        write_file_atomic(tmp + "/" + kTrainStateFile, train_state_to_json(state).dump(2) + "\n");
        write_file_atomic(tmp + "/" + kResolvedConfigFile, config_to_yaml(c.cfg));
        if (c.write_extra) c.write_extra(tmp);
    }
}

json manifest_fields(const CheckpointContext& c) {
    const ProcessGroups& g = c.groups;
    return {{"format", "mindspeed-ckpt"},
            {"checkpoint_version", kCheckpointFormatVersion},
            {"mindspeed_version", MS_VERSION},
            {"world_size", g.world->size()},
            {"tp", g.tp_size},
            {"pp", g.pp_size},
            {"dp", g.dp_size},  // every rank of the same model shard: the optimizer's shards (cp ranks included)
            {"cp", g.cp_size},
            {"virtual_pipeline", c.cfg.parallel.virtual_pipeline_model_parallel_size},
            {"zero_stage", c.optimizer.zero_stage()},
            {"sequence_parallel", c.cfg.parallel.sequence_parallel},
            {"config_hash", xxh64_hex(name_hash(config_to_yaml(c.cfg)))},
            {"dtype", c.cfg.mixed_precision.dtype},
            {"master_weights", c.cfg.mixed_precision.dtype == "fp32"
                                   ? "none: fp32 training, the parameters in model/ are the master weights"
                                   : "in model/: the fp32 master weights; the " + c.cfg.mixed_precision.dtype +
                                         " weights the run computes with are these rounded to nearest even"},
            {"model", c.model.manifest}};
}

// The lr schedule's inputs as this config resolves them (learning_rate() in adamw.h).
void fill_schedule(const Config& cfg, TrainState& s) {
    s.lr_decay_style = cfg.lr_schedule.lr_decay_style;
    s.lr = cfg.optimizer.lr;
    s.min_lr = cfg.optimizer.min_lr;
    s.lr_warmup_iters = cfg.lr_schedule.lr_warmup_iters;
    s.lr_decay_iters = cfg.lr_schedule.lr_decay_iters > 0 ? cfg.lr_schedule.lr_decay_iters : cfg.training.train_iters;
}

// A directory named iter_XXXXXXX (a committed checkpoint, or one that was and is now damaged) under `dir`.
bool holds_committed_name(const std::string& dir) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string n = e.path().filename().string();
        if (n.rfind("iter_", 0) == 0 && n.find('.') == std::string::npos && e.is_directory()) return true;
    }
    return false;
}

// onebit_adam's residuals (the top of checkpoint.h): left zero when the checkpoint has none (AdamW's, or model-only).
void load_onebit_residuals(const CheckpointReader& r, const CheckpointContext& c) {
    const OneBitAllReduce* onebit = c.optimizer.onebit();
    if (onebit == nullptr || onebit->worker_error().empty() || !r.has_state("onebit_server_error")) return;
    const ProcessGroups& g = c.groups;
    const int saved_dp = r.manifest().at("dp").get<int>();
    std::vector<float> one;
    std::vector<double> sum;
    for (size_t i = 0; i < c.params_info.size(); ++i) {
        const ParamInfo& p = c.params_info[i];
        const ShardBox box = shard_box(p, g.tp_rank, g.tp_size);
        const OneBitResiduals e = onebit_residuals(*onebit, static_cast<int>(i));
        if (e.a < e.b) r.read_state_box(p.name, "onebit_server_error", box, e.a, e.b, e.server);
        if (saved_dp == g.dp_size) {
            r.read_state_box(p.name, worker_error_kind(g.dp_rank), box, 0, p.numel, e.worker);
            continue;
        }
        one.resize(static_cast<size_t>(p.numel));
        sum.assign(static_cast<size_t>(p.numel), 0.0);
        for (int d = 0; d < saved_dp; ++d) {
            r.read_state_box(p.name, worker_error_kind(d), box, 0, p.numel, one.data());
            for (size_t k = 0; k < one.size(); ++k) sum[k] += one[k];
        }
        for (size_t k = 0; k < sum.size(); ++k) e.worker[k] = static_cast<float>(sum[k] / saved_dp);
    }
}

void load_rank_state(const CheckpointReader& r, const CheckpointContext& c) {
    const ProcessGroups& g = c.groups;
    const bool with_optimizer = r.has_optimizer_state();
    // Progress over the fp32 bytes this rank reads: each parameter, and its moments' range when there are any.
    std::vector<int64_t> read_bytes(c.params_info.size());
    for (size_t i = 0; i < c.params_info.size(); ++i) {
        const ParamInfo& p = c.params_info[i];
        const auto [a, b] = optim_range(p, c.optimizer);
        read_bytes[i] =
            static_cast<int64_t>(sizeof(float)) * (p.numel + (with_optimizer ? 2 * std::max<int64_t>(0, b - a) : 0));
    }
    int64_t bytes_read = 0, tensors_read = 0;
    Progress bar("checkpoint: loading", std::accumulate(read_bytes.begin(), read_bytes.end(), int64_t{0}),
                 checkpoint_progress(g), "tensors");
    for (size_t i = 0; i < c.params_info.size(); ++i) {
        const ParamInfo& p = c.params_info[i];
        const ShardBox box = shard_box(p, g.tp_rank, g.tp_size);
        r.read_box(p.name, std::nullopt, box, 0, p.numel, c.params + p.offset);
        const auto [a, b] = optim_range(p, c.optimizer);
        ++tensors_read;
        // A model-only checkpoint: exp_avg and exp_avg_sq stay zero.
        if (with_optimizer && a < b) {
            float* const state[2] = {c.optimizer.exp_avg(), c.optimizer.exp_avg_sq()};
            for (const OptimState s : {OptimState::kExpAvg, OptimState::kExpAvgSq}) {
                float* out = state[s == OptimState::kExpAvg ? 0 : 1] + (p.offset + a - c.optimizer.state_begin());
                r.read_box(p.name, s, box, a, b, out);
                ++tensors_read;
            }
        }
        bytes_read += read_bytes[i];
        bar.update(bytes_read, tensors_read);
    }
    load_onebit_residuals(r, c);
    bar.finish();
    // Zero moments restart the bias correction too (AdamW's first step after a model-only load is its step 1).
    c.optimizer.set_steps_taken(with_optimizer ? r.train_state().optimizer_step : 0);
    c.optimizer.take_loaded_state();  // sharded master weights: this rank's shard of what was just read
}

}  // namespace

nlohmann::json train_state_to_json(const TrainState& s) {
    return {{"iteration", s.iteration},
            {"consumed_samples", s.consumed_samples},
            {"skipped_iterations", s.skipped_iterations},
            {"nan_iterations", s.nan_iterations},
            {"optimizer_step", s.optimizer_step},
            {"optimizer_steps_per_iteration", s.optimizer_steps_per_iteration},
            {"lr_schedule",
             {{"lr_decay_style", s.lr_decay_style},
              {"lr", s.lr},
              {"min_lr", s.min_lr},
              {"lr_warmup_iters", s.lr_warmup_iters},
              {"lr_decay_iters", s.lr_decay_iters},
              {"last_lr", s.last_lr}}},
            {"seed", s.seed},
            {"data", {{"fingerprint", s.data_fingerprint}, {"describe", s.data_describe}}},
            {"loss_scaler",
             {{"scale", s.loss_scaler.scale},
              {"growth_tracker", s.loss_scaler.growth_tracker},
              {"hysteresis_tracker", s.loss_scaler.hysteresis_tracker}}}};
}

TrainState train_state_from_json(const nlohmann::json& j, const std::string& where) {
    TrainState s;
    try {
        s.iteration = j.at("iteration").get<int64_t>();
        s.consumed_samples = j.at("consumed_samples").get<int64_t>();
        s.skipped_iterations = j.at("skipped_iterations").get<int64_t>();
        s.nan_iterations = j.at("nan_iterations").get<int64_t>();
        s.optimizer_step = j.at("optimizer_step").get<int64_t>();
        s.optimizer_steps_per_iteration = j.value("optimizer_steps_per_iteration", int64_t{1});
        const json& lr = j.at("lr_schedule");
        s.lr_decay_style = lr.at("lr_decay_style").get<std::string>();
        s.lr = lr.at("lr").get<double>();
        s.min_lr = lr.at("min_lr").get<double>();
        s.lr_warmup_iters = lr.at("lr_warmup_iters").get<int64_t>();
        s.lr_decay_iters = lr.at("lr_decay_iters").get<int64_t>();
        s.last_lr = lr.at("last_lr").get<double>();
        s.seed = j.at("seed").get<uint64_t>();
        s.data_fingerprint = j.at("data").at("fingerprint").get<std::string>();
        s.data_describe = j.at("data").at("describe").get<std::string>();
        if (j.contains("loss_scaler")) {  // absent in checkpoints written before mixed precision
            const json& ls = j.at("loss_scaler");
            s.loss_scaler.scale = ls.at("scale").get<double>();
            s.loss_scaler.growth_tracker = ls.at("growth_tracker").get<int64_t>();
            s.loss_scaler.hysteresis_tracker = ls.at("hysteresis_tracker").get<int64_t>();
        }
    } catch (const json::exception& e) {
        fail(fmt::format("'{}' is not a train state: {}", where, e.what()));
    }
    if (s.iteration < 0 || s.consumed_samples < 0 || s.optimizer_step < 0 || s.optimizer_steps_per_iteration < 1 ||
        s.optimizer_step > s.iteration * s.optimizer_steps_per_iteration)
        fail(fmt::format("'{}': iteration {}, consumed_samples {}, optimizer_step {} are inconsistent", where,
                         s.iteration, s.consumed_samples, s.optimizer_step));
    return s;
}

std::string data_fingerprint(uint64_t source_fingerprint, const DataConfig& data, int seq_length, uint64_t seed) {
    const std::string id = fmt::format("{:016x}|{}|{}|{}", source_fingerprint, data.split, seq_length, seed);
    return xxh64_hex(xxh64(id.data(), id.size()));
}

json model_manifest(const GptShape& s) {
    json m = {{"arch", s.arch == ModelArch::kLlama ? "llama" : "gpt"},
              {"num_layers", s.L},
              {"hidden_size", s.C},
              {"num_attention_heads", s.NH},
              {"ffn_hidden_size", s.F},
              {"max_position_embeddings", s.T},
              {"vocab_size", s.V},
              {"padded_vocab_size", s.Vp},
              {"untie_embeddings_and_output_weights", s.untied}};
    if (s.arch == ModelArch::kLlama) {
        m["num_query_groups"] = s.kv_heads();
        m["rotary_base"] = s.rope_theta;
        m["rope_scaling"] = {{"factor", s.rope_scaling.factor},
                             {"low_freq_factor", s.rope_scaling.low_freq_factor},
                             {"high_freq_factor", s.rope_scaling.high_freq_factor},
                             {"original_max_position_embeddings", s.rope_scaling.original_max_position_embeddings}};
    }
    return m;
}

int64_t CheckpointModel::num_params() const {
    int64_t n = 0;
    for (const ParamInfo& p : whole_table) n += p.numel;
    return n;
}

CheckpointModel checkpoint_model(const GptShape& shape) {
    return {.whole_table = gpt_param_table(shape), .manifest = model_manifest(shape), .vocab_size = shape.V};
}

int64_t checkpoint_tensor_bytes(const CheckpointModel& model) {
    constexpr int64_t kCopies = 3;  // the weight, exp_avg, exp_avg_sq
    return model.num_params() * kCopies * static_cast<int64_t>(sizeof(float));
}

std::unique_ptr<SaveDirLock> open_save_dir(const CheckpointContext& c) {
    const std::string& save = c.cfg.checkpoint.save;
    if (save.empty() || !writes_files(c)) return nullptr;
    check_dir_writable(save);
    const uint64_t need = static_cast<uint64_t>(checkpoint_tensor_bytes(c.model)), free = free_bytes(save);
    const std::string numbers = fmt::format(
        "one checkpoint of this model needs at least {} bytes ({}: {} parameters, each as an fp32 weight "
        "and two fp32 AdamW moments), and {} bytes ({}) are free there",
        need, data::human_bytes(need), c.model.num_params(), free, data::human_bytes(free));
    if (free < need)
        throw UserError(
            fmt::format("checkpoint.save '{}' has no room for a checkpoint: {}; the first save would "
                        "fail\n---> HINT: free space there, or point checkpoint.save at a larger filesystem",
                        save, numbers));
    if (c.groups.world->rank() != 0) return nullptr;
    if (free / 2 < need && c.cfg.checkpoint.save_interval > 0)
        log_warn(
            "checkpoint: checkpoint.save '{}' has room for one checkpoint but not two ({}): a save writes the new "
            "checkpoint before checkpoint.keep_latest_k removes an old one, so the second save will fail unless "
            "space is freed",
            save, numbers);
    auto lock = std::make_unique<SaveDirLock>(save);
    clean_uncommitted(save);
    return lock;
}

void check_no_newer_checkpoint(const CheckpointContext& c, int64_t start_iteration) {
    const std::string& save = c.cfg.checkpoint.save;
    const std::string& load = c.cfg.checkpoint.load;
    if (save.empty() || c.groups.world->rank() != 0) return;
    const auto canonical = [](std::string p) {
        while (p.size() > 1 && p.back() == '/') p.pop_back();
        std::error_code ec;
        const fs::path c = fs::weakly_canonical(p, ec);
        return ec ? fs::path(p) : c;
    };
    if (!load.empty() && canonical(save) == canonical(load)) return;
    const std::optional<int64_t> newest = find_latest_committed(save, /*verify_checksums=*/false);
    if (!newest || *newest <= start_iteration) return;
    throw UserError(fmt::format(
        "checkpoint.save '{}' holds {}, a committed checkpoint newer than where this run starts ({}): its saves "
        "would replace it, or checkpoint.keep_latest_k would delete them as older\n---> HINT: set checkpoint.load to "
        "'{}' to continue that run, move its iter_* directories away, or set checkpoint.save to another directory",
        save, checkpoint_dir_name(*newest),
        start_iteration > 0 ? fmt::format("iteration {}, resumed from '{}'", start_iteration, load) : "from scratch",
        save));
}

std::string save_checkpoint(const CheckpointContext& c, const TrainState& state_in) {
    Communicator& world = *c.groups.world;
    const std::string& save = c.cfg.checkpoint.save;
    MS_CHECK(!save.empty(), "save_checkpoint called without checkpoint.save");
    const double t0 = now_seconds();
    TrainState state = state_in;
    fill_schedule(c.cfg, state);
    state.optimizer_step = c.optimizer.steps_taken();
    c.optimizer.finish_param_gather();  // c.params as the step left them (parallel.overlap_param_gather)
    c.optimizer.gather_masters();       // sharded master weights: the whole fp32 parameters into c.params

    // Every rank must be saving the same iteration (DeepSpeed's tag check): min and max over the world agree.
    std::array<int32_t, 2> it = {static_cast<int32_t>(state.iteration), -static_cast<int32_t>(state.iteration)};
    world.all_reduce(std::span<int32_t>(it), ReduceOp::kMax).wait();
    if (it[0] != -it[1])
        fail(fmt::format("the ranks are saving different iterations (from {} to {}); nothing was written", -it[1],
                         it[0]));

    // Coverage: the pieces written by all ranks hold every element of every tensor once (model, and optimizer
    // state), counted against the whole model's table. A broken rule in stored_here() stops the save here.
    std::array<int64_t, 2> mine = stored_counts(c);
    const std::vector<int64_t> total = sum_i64(world, {mine[0], mine[1]});
    const int64_t expected = c.model.num_params();
    MS_CHECK(total[0] == expected && total[1] == expected,
             "checkpoint: the ranks would store {} model and {} optimizer elements of a model of {}: the pieces do not "
             "tile the tensors exactly once",
             total[0], total[1], expected);

    const int rank = world.rank();
    const std::string inject = injected_phase(rank);
    const std::string tmp = checkpoint_tmp_dir(save, state.iteration);
    std::unique_ptr<CheckpointWriter> writer;
    agree(world, "creating the checkpoint directory", [&] {
        if (rank != 0) return;
        writer = std::make_unique<CheckpointWriter>(save, state.iteration);
        for (const char* sub : {"model", "optim"}) {  // for every rank's files
            std::error_code ec;
            fs::create_directories(fs::path(writer->tmp_dir()) / sub, ec);
            if (ec) fail(fmt::format("cannot create '{}/{}': {}", writer->tmp_dir(), sub, ec.message()));
        }
    });
    const double t_write = now_seconds();
    agree(world, "writing its checkpoint files", [&] { write_rank_files(c, state, tmp, inject); });
    const double t_commit = now_seconds();
    std::string final_dir;
    agree(world, "committing the checkpoint", [&] {
        if (rank != 0) return;
        writer->set_phase_hook([&](std::string_view phase) {
            if (phase == inject) injected_failure(inject, tmp);
        });
        final_dir = writer->commit(manifest_fields(c));
    });
    const double t_retain = now_seconds();
    agree(world, "removing old checkpoints", [&] {
        if (rank == 0 && c.cfg.checkpoint.keep_latest_k > 0) keep_latest(save, c.cfg.checkpoint.keep_latest_k);
    });
    final_dir = (fs::path(save) / checkpoint_dir_name(state.iteration)).string();
    uint64_t bytes = 0;
    if (rank == 0) {
        std::error_code ec;
        for (const auto& e : fs::recursive_directory_iterator(final_dir, ec))
            if (e.is_regular_file()) bytes += e.file_size();
    }
    log_info(
        "checkpoint: saved iteration {} to {} ({:.1f} MiB) in {:.2f} s (write {:.2f} s, commit: checksums, fsync, "
        "rename, tracker {:.2f} s)",
        state.iteration, final_dir, static_cast<double>(bytes) / (1 << 20), now_seconds() - t0, t_commit - t_write,
        t_retain - t_commit);
    return final_dir;
}

std::optional<TrainState> load_checkpoint(const CheckpointContext& c, const std::string& fingerprint) {
    const std::string& load = c.cfg.checkpoint.load;
    if (load.empty()) return std::nullopt;
    Communicator& world = *c.groups.world;
    const double t0 = now_seconds();
    const bool full = c.cfg.checkpoint.verify_on_load == "full";

    // Rank 0 picks the checkpoint (verifying it) and tells the others: {status, iteration}, status 0 = fresh
    // start, 1 = resume, 2 = failed (rank 0's error is thrown below on rank 0).
    std::array<int32_t, 2> pick = {0, 0};
    std::exception_ptr error;
    if (world.rank() == 0) {
        try {
            const std::optional<int64_t> it = find_latest_committed(load, full);
            if (it) {
                pick = {1, static_cast<int32_t>(*it)};
            } else if (fs::is_directory(load) && holds_committed_name(load)) {
                fail(
                    fmt::format("no checkpoint in '{}' passes verification (verify_on_load: {}; each problem is "
                                "printed above)\n---> HINT: move the damaged iter_* directories away to start from "
                                "scratch, or point checkpoint.load elsewhere",
                                load, c.cfg.checkpoint.verify_on_load));
            }
        } catch (const UserError&) {
            error = std::current_exception();
            pick = {2, 0};
        }
    }
    world.broadcast(std::span<int32_t>(pick), 0).wait();
    if (error) std::rethrow_exception(error);
    if (pick[0] == 2) fail("rank 0 could not choose a checkpoint to resume from (its error is printed above)");
    if (pick[0] == 0) {
        log_info("checkpoint: no committed checkpoint in '{}'; starting from scratch", load);
        return std::nullopt;
    }

    const std::string dir = (fs::path(load) / checkpoint_dir_name(pick[1])).string();
    std::optional<TrainState> state;
    json manifest;
    bool optimizer_state = true;
    agree(world, "loading the checkpoint " + dir, [&] {
        const CheckpointReader reader(dir);
        if (reader.iteration() != pick[1])
            fail(fmt::format("'{}/{}' says iteration {}, but the directory is iteration {}", dir, kTrainStateFile,
                             reader.iteration(), pick[1]));
        check_checkpoint_shape(reader, c.model, "the configured model",
                               "set model.* to match it, or point checkpoint.load at a checkpoint of this model (or "
                               "at an empty directory to start from scratch)");
        load_rank_state(reader, c);
        state = reader.train_state();
        manifest = reader.manifest();
        optimizer_state = reader.has_optimizer_state();
    });

    const bool logging = world.rank() == 0;
    if (logging && !optimizer_state)
        log_info("checkpoint: {} is model-only (no optimizer state): AdamW starts from zero moments", dir);
    if (logging && !state->data_fingerprint.empty() && state->data_fingerprint != fingerprint)
        log_warn(
            "checkpoint: the training data differs from the data this checkpoint was trained on "
            "(fingerprint {} then, {} now: the source, data.split, model.seq_length or run.seed changed). "
            "Continuing at consumed sample {} of the new data; the exact-resume guarantee does not hold across "
            "the change.\n    then: {}\n    now:  see the 'data:' line above",
            state->data_fingerprint, fingerprint, state->consumed_samples, state->data_describe);
    TrainState now;
    fill_schedule(c.cfg, now);
    if (logging && state->iteration > 0 &&
        (now.lr_decay_style != state->lr_decay_style || now.lr != state->lr || now.min_lr != state->min_lr ||
         now.lr_warmup_iters != state->lr_warmup_iters || now.lr_decay_iters != state->lr_decay_iters))
        log_warn(
            "checkpoint: the learning-rate schedule changed since the save (then: {} lr {} min_lr {} "
            "warm-up {} decay over {} iterations; now: {} lr {} min_lr {} warm-up {} decay over {}); the run "
            "continues on the new schedule from iteration {}",
            state->lr_decay_style, state->lr, state->min_lr, state->lr_warmup_iters, state->lr_decay_iters,
            now.lr_decay_style, now.lr, now.min_lr, now.lr_warmup_iters, now.lr_decay_iters, state->iteration + 1);
    log_info(
        "checkpoint: resumed from {} (iteration {}, consumed samples {}, optimizer step {}; saved at tp {} pp {} "
        "dp {}{} zero_stage {}) in {:.2f} s (verify_on_load: {})",
        dir, state->iteration, state->consumed_samples, state->optimizer_step, manifest.value("tp", 0),
        manifest.value("pp", 0), manifest.value("dp", 0),
        manifest.value("cp", 1) > 1 ? fmt::format(" (of them cp {})", manifest.value("cp", 1)) : std::string(),
        manifest.value("zero_stage", 0), now_seconds() - t0, c.cfg.checkpoint.verify_on_load);
    return state;
}

void check_checkpoint_shape(const CheckpointReader& r, const GptShape& shape, const std::string& what,
                            const std::string& hint) {
    check_checkpoint_shape(r, checkpoint_model(shape), what, hint);
}

void check_checkpoint_shape(const CheckpointReader& r, const CheckpointModel& model, const std::string& what,
                            const std::string& hint) {
    const std::vector<ParamInfo>& table = model.whole_table;
    const std::string tail =
        fmt::format("\n---> HINT: the checkpoint holds model {}; {}",
                    r.manifest().contains("model") ? r.manifest()["model"].dump() : "(unknown)", hint);
    const auto fail_config = [](const std::string& msg) { throw UserError("config error: " + msg, kExitConfigError); };
    for (const ParamInfo& p : table) {
        if (!r.contains(p.name))
            fail_config(fmt::format("'{}' has no tensor '{}', which {} has (global shape {}){}", r.dir(), p.name, what,
                                    json(p.global_shape).dump(), tail));
        const std::vector<int64_t>& saved = r.global_shape(p.name);
        bool same = saved == p.global_shape;
        if (p.vocab_rows && saved.size() == 2)  // the padding depends on tp; the real vocabulary may not differ
            same = saved[1] == p.global_shape[1] && r.vocab_size() == model.vocab_size && saved[0] >= model.vocab_size;
        if (!same)
            fail_config(
                fmt::format("tensor '{}' has global shape {} (vocabulary {}) in '{}', but {} expects {} "
                            "(vocabulary {}){}",
                            p.name, json(saved).dump(), r.vocab_size(), r.dir(), what, json(p.global_shape).dump(),
                            model.vocab_size, tail));
    }
    for (const std::string& name : r.names()) {
        if (std::none_of(table.begin(), table.end(), [&](const ParamInfo& p) { return p.name == name; }))
            fail_config(fmt::format("'{}' holds tensor '{}' (global shape {}), which {} does not have{}", r.dir(), name,
                                    json(r.global_shape(name)).dump(), what, tail));
    }
}

}  // namespace ms
