// cmd_eval.cpp: `eval` -- the loss and perplexity of a GPT-2 or Llama checkpoint on a split of the config's data,
// the held-out zero-shot accuracy and recall of a CLIP checkpoint (model.arch: clip, engine/clip/clip_eval.h), or a
// self-play checkpoint's final evaluation matches (model.arch: alphazero, engine/selfplay/selfplay_eval.h), on one
// rank.
//
// The model is built whole (tp 1, pp 1) from the checkpoint's canonical tensors, whatever layout saved it, and must
// have the config's shape. GPT-2 and Llama: samples are the trainer's: global samples [0, iters * global_batch_size)
// of the split in the sampler's order, in micro-batches of training.micro_batch_size, so `--split valid --iters
// eval.eval_iters` covers the samples of the trainer's validation at any data-parallel size, and the loss is averaged
// the same way (the mean of the micro-batch means). CLIP: the trainer's evaluation on clip.eval_samples held-out
// samples; --split and --iters, which pick a language model's samples, are refused, for self-play as for CLIP.
// Self-play: the trainer's final evaluation on the board of the checkpoint's curriculum stage, so the run's own
// final checkpoint and config give the run's final record. With --json the result is one JSON line alone on stdout
// (`eval ... --json | jq`): the log goes to stderr.
#include <cmath>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/checkpoint_model.h"
#include "engine/clip/clip_eval.h"
#include "engine/config/config.h"
#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/data/dataset.h"
#include "engine/model/gpt.h"
#include "engine/selfplay/selfplay_eval.h"
#include "engine/train/plan.h"
#include "engine/train/reliability.h"

namespace ms::app {
namespace {

struct EvalArgs {
    std::string config_path, load, split = "valid";
    std::vector<std::string> overrides;
    int64_t iters = 0;  // 0: eval.eval_iters
    bool json = false;
    std::vector<std::string> language_model_flags;  // --split and --iters when given: refused for CLIP and self-play
};

// How `eval` evaluates a model of this model.arch (a config's, or a checkpoint manifest's "arch"). Only a language
// model is evaluated on a split of token data, so only it reads --split and --iters.
struct EvalFamily {
    std::string words;       // what eval calls such a model
    std::string evaluation;  // how it is evaluated instead of on a split; empty for a language model
    std::string size_hint;   // how to set that evaluation's size
};
EvalFamily eval_family(const std::string& arch) {
    if (arch == "clip")
        return {"a CLIP model", "as its trainer evaluates it, on the held-out samples",
                "the held-out data is data.source shapes' held-out split or the shards of clip.eval_data_path, and "
                "--set clip.eval_samples=N sets how many samples"};
    if (arch == "alphazero")
        return {"a self-play policy-value network", "by playing the final evaluation's matches",
                "--set selfplay.final_eval_games=N and --set selfplay.final_eval_simulations=N set the games and the "
                "search"};
    return {"a GPT-2 or Llama model", "", ""};
}

// The checkpoint `load` names, verified and opened. Its model family must be the config's: a CLIP checkpoint with a
// GPT-2 or Llama config, or any other pair of families, is refused naming both, before either reads the other's
// tensors.
CheckpointReader open_checkpoint(const EvalArgs& a, const Config& cfg) {
    CheckpointReader reader(resolve_checkpoint(a.load));
    // The reader requires "model"; checkpoints from before Llama name no arch: GPT-2.
    const std::string saved_arch = reader.manifest().at("model").value("arch", "gpt");
    const std::string saved = eval_family(saved_arch).words, configured = eval_family(cfg.model.arch).words;
    if (saved != configured)
        throw UserError(fmt::format(
            "config error: the config {} describes {} (model.arch {}), but '{}' holds {} (model.arch {})\n---> HINT: "
            "evaluate it with the config of the run that saved it (--config {}/{}), or pass a checkpoint of a "
            "model.arch {} run",
            a.config_path, configured, cfg.model.arch, reader.dir(), saved, saved_arch, reader.dir(),
            kResolvedConfigFile, cfg.model.arch));
    return reader;
}

// --split and --iters, given for a model that is not evaluated on a split: refused, saying how it is evaluated.
void refuse_language_model_flags(const EvalArgs& a, const Config& cfg, const EvalFamily& family) {
    if (a.language_model_flags.empty()) return;
    const std::string flags = fmt::format("{}", fmt::join(a.language_model_flags, " and "));
    throw UserError(fmt::format(
        "command line error: {} {} GPT-2 and Llama checkpoints only (the samples of a split of token data); {} "
        "(model.arch {} in {}) is evaluated {}\n---> HINT: drop {}; {}",
        flags, a.language_model_flags.size() == 1 ? "applies to" : "apply to", family.words, cfg.model.arch,
        a.config_path, family.evaluation, flags, family.size_hint));
}

// GPT-2 and Llama: the loss and perplexity on --split (see the top of this file). nullopt when a stop signal ended it.
std::optional<nlohmann::json> eval_language_model(Config cfg, const EvalArgs& a) {
    // SIGTERM, SIGUSR1, SIGINT: stop between micro-batches with exit code 3 and no result; a long start (a large
    // checkpoint to read) is ended by the setup watch (engine/train/reliability.h "Signals").
    install_signal_handlers();
    std::optional<SetupStopWatch> setup_watch(std::in_place);
    cfg.parallel = ParallelConfig{};  // one rank, the whole model
    cfg.run.backend = "cpu";          // what this command runs on, whatever the config trains on
    const std::unique_ptr<TokenSource> source = open_token_source(cfg.data, cfg.model.vocab_size);
    cfg = resolve_vocab(cfg, *source);  // as the trainer resolves it
    const RunLayout layout = make_run_layout(cfg, 1);
    const GptShape& shape = layout.shape;
    const CheckpointReader reader = open_checkpoint(a, cfg);
    const std::string& dir = reader.dir();
    check_checkpoint_shape(reader, shape, "the model of the config " + a.config_path,
                           "make the model settings match it, or pass a checkpoint of that model");
    check_checkpoint_hyperparameters(reader, shape, a.config_path);

    const Split split = a.split == "train" ? Split::kTrain : a.split == "test" ? Split::kTest : Split::kValid;
    const int T = layout.seq_length(), mbs = layout.micro_batch;
    const Sampler sampler(*source, cfg.data.split, split, T, cfg.run.seed);
    // one rank: num_microbatches * mbs = the global batch
    const int64_t iters =
        bound_eval_iters(a.iters > 0 ? a.iters : cfg.eval.eval_iters, a.iters > 0 ? "--iters" : "eval.eval_iters",
                         sampler.num_samples(), layout.global_batch);
    const int64_t micro_batches = iters * layout.num_microbatches;
    const int64_t samples = micro_batches * mbs;
    log_info("eval: {} (iteration {}) on the {} split of {}: {} iterations of {} samples of {} tokens", dir,
             reader.iteration(), a.split, source->describe(), iters, layout.global_batch, T);

    BackendOptions bo;  // the CPU backend: `eval` is a single-process tool
    bo.num_threads = cfg.run.num_threads;
    const std::unique_ptr<Backend> backend = make_backend(bo);
    SelfCommunicator tp("tp");
    Gpt model(shape, *backend, tp, mbs);
    read_whole_model(reader, model);
    setup_watch.reset();
    std::vector<int32_t> tokens(static_cast<size_t>(mbs) * T), targets(tokens.size());
    float total = 0;  // the trainer's accumulation (PipelineModel::evaluate): float, in micro-batch order
    for (int64_t i = 0; i < micro_batches; ++i) {
        if (const int sig = stop_signal()) {
            log_warn("eval: {} received: stopped after {} of {} micro-batches, no result (exit code 3)",
                     signal_name(sig), i, micro_batches);
            return std::nullopt;
        }
        sampler.fill(i * mbs, mbs, tokens.data(), targets.data());
        total += model.forward(tokens.data(), targets.data(), mbs, T, 0, 0.0f);  // no backward follows
    }
    const float loss = total / static_cast<float>(micro_batches);
    const double ppl = std::exp(static_cast<double>(loss));
    log_info("eval loss: {:.6E} | PPL: {:.6E} | iteration {} | split {} | samples {} |", loss, ppl, reader.iteration(),
             a.split, samples);
    return nlohmann::json{
        {"checkpoint", dir}, {"iteration", reader.iteration()},        {"split", a.split}, {"samples", samples},
        {"seq_length", T},   {"eval loss", static_cast<double>(loss)}, {"PPL", ppl}};
}

int run_eval(const EvalArgs& a) {
    if (a.json) set_log_stream(LogStream::kStderr);  // stdout is the JSON alone
    const Config cfg = load_config(a.config_path, a.overrides);
    const EvalFamily family = eval_family(cfg.model.arch);
    std::optional<nlohmann::json> result;
    if (family.evaluation.empty()) {
        result = eval_language_model(cfg, a);
    } else {
        refuse_language_model_flags(a, cfg, family);
        result = cfg.model.arch == "clip" ? run_clip_eval(cfg, open_checkpoint(a, cfg), a.config_path)
                                          : selfplay::run_selfplay_eval(cfg, open_checkpoint(a, cfg), a.config_path);
    }
    if (!result) return kExitSignal;
    if (a.json) std::cout << result->dump() << std::endl;
    return kExitOk;
}

}  // namespace

Command add_eval_command(CLI::App& parent) {
    CLI::App* cmd = parent.add_subcommand(
        "eval",
        "Loss and perplexity of a GPT-2 or Llama checkpoint on a split of the config's data, zero-shot accuracy "
        "and recall of a CLIP checkpoint on its held-out samples, or a self-play checkpoint's final evaluation "
        "matches (one process, the CPU backend, the whole model whatever layout saved it)");
    auto a = std::make_shared<EvalArgs>();
    cmd->add_option("-c,--config", a->config_path, "YAML config: the model (must match the checkpoint) and the data")
        ->required()
        ->check(CLI::ExistingFile);
    cmd->add_option("--set", a->overrides, "Override one config key, section.key=value (repeatable)")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    cmd->add_option("--load", a->load,
                    "A checkpoint save directory (its latest committed checkpoint) or an "
                    "iter_XXXXXXX directory")
        ->required();
    const CLI::Option* split =
        cmd->add_option("--split", a->split, "GPT-2 and Llama: which split of data.split to evaluate on")
            ->default_val("valid")
            ->check(CLI::IsMember({"valid", "test", "train"}));
    const CLI::Option* iters =
        cmd->add_option("--iters", a->iters,
                        "GPT-2 and Llama: iterations of training.global_batch_size samples (default: "
                        "eval.eval_iters, as the trainer's validation)")
            ->check(CLI::PositiveNumber);
    cmd->add_flag("--json", a->json, "Print the result as one JSON line, alone on stdout (the log goes to stderr)");
    return {cmd, [a, split, iters]() {
                for (const CLI::Option* o : {split, iters})
                    if (o->count() > 0) a->language_model_flags.push_back(o->get_name());
                return run_eval(*a);
            }};
}

}  // namespace ms::app
