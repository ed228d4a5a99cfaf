// cmd_generate.cpp: `generate` -- sample text from a checkpoint on one rank (engine/train/sampling.h), with the
// byte-level tokenizer (ids 0..255 = bytes) or GPT-2's BPE (--vocab vocab.json --merges merges.txt).
//
// Sampling ends at the tokenizer's end of document (the byte tokenizer's 256, GPT-2's "<|endoftext|>") unless
// --ignore-eod. Stdout holds only the result -- the prompt and its continuation (without the end-of-document token),
// or with --ids every token id of both -- and the log lines go to stderr, so the output can be piped.
#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/checkpoint_model.h"
#include "engine/config/config.h"
#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/data/dataset.h"
#include "engine/data/gpt2_bpe.h"
#include "engine/model/gpt.h"
#include "engine/train/plan.h"
#include "engine/train/reliability.h"
#include "engine/train/sampling.h"

namespace ms::app {
namespace {

struct GenerateArgs {
    std::string load, config_path, prompt, vocab, merges;
    std::vector<std::string> overrides;
    int tokens = 64;
    float temperature = 1.0f;
    int top_k = 0;
    uint64_t seed = 1234;
    bool ignore_eod = false;  // sample all --tokens, past any end of document
    bool ids = false;         // print token ids instead of text
};

// The tokenizer's end-of-document id, when the model's vocabulary has it.
std::optional<int32_t> end_of_document(const std::optional<Gpt2Bpe>& bpe, const GptShape& shape) {
    const std::optional<int32_t> id = bpe ? bpe->end_of_document() : std::optional<int32_t>(kByteEod);
    return id && *id < shape.V ? id : std::nullopt;
}

int run_generate(const GenerateArgs& a) {
    // SIGTERM, SIGUSR1, SIGINT: stop before the next token with exit code 3 and no text; a long start (a large
    // checkpoint to read) is ended by the setup watch (engine/train/reliability.h "Signals").
    install_signal_handlers();
    std::optional<SetupStopWatch> setup_watch(std::in_place);
    set_log_stream(LogStream::kStderr);  // stdout is the result
    if (a.vocab.empty() != a.merges.empty())
        throw UserError(
            "command line error: GPT-2's BPE needs both --vocab vocab.json and --merges merges.txt (or "
            "neither, for the byte-level tokenizer)");
    if (a.prompt.empty())
        throw UserError("command line error: --prompt is empty; the model needs at least one token to continue");
    const std::string dir = resolve_checkpoint(a.load);
    const CheckpointReader reader(dir);
    GptShape shape;
    int num_threads = 0;
    if (a.config_path.empty() && a.overrides.empty()) {
        shape = checkpoint_shape(reader);
    } else {
        Config cfg = load_config(a.config_path, a.overrides);
        cfg.parallel = ParallelConfig{};  // one rank, the whole model
        cfg.run.backend = "cpu";          // what this command runs on, whatever the config trains on
        if (cfg.model.vocab_size == 0) cfg.model.vocab_size = reader.vocab_size();  // no data is opened here
        shape = make_run_layout(cfg, 1).shape;
        check_checkpoint_shape(reader, shape, "the model of the config " + a.config_path,
                               "make the model settings match it, or pass a checkpoint of that model");
        check_checkpoint_hyperparameters(reader, shape, a.config_path.empty() ? "given by --set" : a.config_path);
        num_threads = cfg.run.num_threads;
    }

    std::optional<Gpt2Bpe> bpe;
    std::vector<int32_t> context;
    if (!a.vocab.empty()) {
        bpe = Gpt2Bpe::load(a.vocab, a.merges);
        if (bpe->vocab_size() > shape.V)
            throw UserError(
                fmt::format("config error: the tokenizer {} has ids up to {}, but the model's vocabulary "
                            "is {}\n---> HINT: pass the tokenizer the model was trained with",
                            a.vocab, bpe->vocab_size() - 1, shape.V));
        context = bpe->encode(a.prompt);
    } else {
        if (shape.V < 256)
            throw UserError(
                fmt::format("config error: the byte-level tokenizer needs a vocabulary of at least 256 "
                            "(ids 0..255 are bytes), but the model's is {}\n---> HINT: pass the model's "
                            "GPT-2 tokenizer with --vocab and --merges, or sample from a model trained "
                            "on byte-level data (`preprocess`)",
                            shape.V));
        context = byte_encode(a.prompt);
    }
    const auto decode = [&](const std::vector<int32_t>& ids) { return bpe ? bpe->decode(ids) : byte_decode(ids); };

    // Activations for the longest window this run feeds the model (the prompt and the new tokens), not its whole
    // position range: an imported Llama 3.1 has 131072 positions, whose activations alone are gigabytes.
    shape.S = static_cast<int>(std::min<int64_t>(shape.seq(), static_cast<int64_t>(context.size()) + a.tokens));
    BackendOptions bo;  // the CPU backend: `generate` is a single-process tool
    bo.num_threads = num_threads;
    const std::unique_ptr<Backend> backend = make_backend(bo);
    SelfCommunicator tp("tp");
    Gpt model(shape, *backend, tp, 1);
    read_whole_model(reader, model);
    setup_watch.reset();
    log_info(
        "generate: {} (iteration {}) | {} tokenizer | prompt of {} tokens | {} new tokens | temperature {} | "
        "top-k {} | seed {}",
        dir, reader.iteration(), bpe ? "GPT-2 BPE" : "byte-level", context.size(), a.tokens, a.temperature, a.top_k,
        a.seed);
    const size_t prompt_len = context.size();
    const std::optional<int32_t> eod = a.ignore_eod ? std::nullopt : end_of_document(bpe, shape);
    const std::vector<int32_t> out = generate(
        model, tp, context, a.tokens, a.temperature, a.top_k, a.seed, [] { return stop_signal() != 0; }, eod);
    const size_t sampled = out.size() - prompt_len;
    if (const int sig = stop_signal()) {
        log_warn("generate: {} received: stopped after {} of {} tokens, no text (exit code 3)", signal_name(sig),
                 sampled, a.tokens);
        return kExitSignal;
    }
    const bool ended = eod && sampled > 0 && out.back() == *eod;
    if (ended) {
        log_info("generate: end of document (token {}) after {} of {} tokens (--ignore-eod samples past it)", *eod,
                 sampled, a.tokens);
    }
    if (a.ids) {
        for (size_t i = 0; i < out.size(); ++i) std::cout << (i > 0 ? " " : "") << out[i];
        std::cout << std::endl;
    } else {
        const auto end = out.end() - (ended ? 1 : 0);  // the end-of-document token is not text
        std::cout << a.prompt << decode(std::vector<int32_t>(out.begin() + static_cast<long>(prompt_len), end))
                  << std::endl;
    }
    return kExitOk;
}

}  // namespace

Command add_generate_command(CLI::App& parent) {
    CLI::App* cmd = parent.add_subcommand(
        "generate",
        "Sample a continuation of a prompt from a checkpoint (one process, the CPU backend) until --tokens or the "
        "end of a document; prints the prompt followed by the sampled text on stdout (logs on stderr)");
    auto a = std::make_shared<GenerateArgs>();
    cmd->add_option("--load", a->load,
                    "A checkpoint save directory (its latest committed checkpoint) or an "
                    "iter_XXXXXXX directory")
        ->required();
    cmd->add_option("-c,--config", a->config_path,
                    "YAML config whose model must match the checkpoint (default: the model the checkpoint describes)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--set", a->overrides, "Override one config key, section.key=value (repeatable)")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    cmd->add_option("--prompt", a->prompt, "The text to continue")->required();
    cmd->add_option("--tokens", a->tokens, "Tokens to sample")->default_val(64)->check(CLI::Range(0, 1 << 20));
    cmd->add_option("--temperature", a->temperature, "Softmax temperature (0: the most likely token)")
        ->default_val(1.0f)
        ->check(CLI::Range(0.0f, 100.0f));
    cmd->add_option("--top-k", a->top_k, "Sample among the k most likely tokens only (0: all)")
        ->default_val(0)
        ->check(CLI::Range(0, 1 << 30));
    cmd->add_option("--seed", a->seed, "Seed of the sampling stream (same seed, same text)")->default_val(1234);
    cmd->add_option("--vocab", a->vocab, "GPT-2 vocab.json (with --merges: GPT-2's byte-level BPE)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--merges", a->merges, "GPT-2 merges.txt (with --vocab)")->check(CLI::ExistingFile);
    cmd->add_flag("--ignore-eod", a->ignore_eod,
                  "Sample all --tokens: do not stop at the tokenizer's end of document (byte-level 256, GPT-2's "
                  "<|endoftext|>)");
    cmd->add_flag("--ids", a->ids, "Print the token ids (the prompt's, then the sampled ones) instead of text");
    return {cmd, [a]() { return run_generate(*a); }};
}

}  // namespace ms::app
