// cmd_convert.cpp: `convert` -- a checkpoint to a Hugging Face GPT-2 or Llama directory (--to hf-gpt2, hf-llama),
// optionally sharded and with the tokenizer files, and back (--from hf-gpt2, hf-llama): engine/ckpt/hf_gpt2.h,
// hf_llama.h and hf_tokenizer.h; a CLIP checkpoint to a CLIPModel directory (--to hf-clip): engine/clip/
// clip_checkpoint.h.
#include <cctype>
#include <memory>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/checkpoint_model.h"
#include "engine/ckpt/hf_gpt2.h"
#include "engine/ckpt/hf_llama.h"
#include "engine/ckpt/hf_tokenizer.h"
#include "engine/clip/clip_checkpoint.h"
#include "engine/config/config.h"
#include "engine/core/check.h"
#include "engine/core/log.h"

namespace ms::app {
namespace {

struct ConvertArgs {
    std::string to, from, load, out, config_path, max_shard_size, tokenizer_type;
    std::vector<std::string> overrides;
    HfTokenizerSource tokenizer;
};

// save_pretrained's max_shard_size: bytes, or a number with KB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB (of
// 1024), any case.
int64_t parse_shard_size(const std::string& text) {
    size_t digits = 0;
    while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.'))
        ++digits;
    const std::string unit = text.substr(digits);
    const std::pair<const char*, double> units[] = {{"", 1},         {"B", 1},       {"KB", 1e3},     {"MB", 1e6},
                                                    {"GB", 1e9},     {"TB", 1e12},   {"KIB", 0x1p10}, {"MIB", 0x1p20},
                                                    {"GIB", 0x1p30}, {"TIB", 0x1p40}};
    std::string upper;
    for (const char c : unit) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    for (const auto& [name, scale] : units) {
        if (digits == 0 || upper != name) continue;
        try {
            const double bytes = std::stod(text.substr(0, digits)) * scale;
            if (bytes >= 1 && bytes < 9e18) return static_cast<int64_t>(bytes);
        } catch (const std::exception&) {
        }
    }
    throw UserError(fmt::format(
        "command line error: --max-shard-size {} is not a size\n---> HINT: give bytes or a number with KB, MB, "
        "GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), as save_pretrained's max_shard_size: "
        "e.g. 5GB",
        text));
}

// --to hf-clip: the CLIPModel directory of a CLIP checkpoint (one model.safetensors; captions are bytes, so there
// are no tokenizer files to write).
int export_clip(const ConvertArgs& a, const CheckpointReader& reader) {
    if (!a.tokenizer.empty() || !a.tokenizer_type.empty() || !a.max_shard_size.empty())
        throw UserError(
            "command line error: --tokenizer-type, --vocab-file, --merge-file, --tokenizer-model and "
            "--max-shard-size apply to --to hf-gpt2 and hf-llama only; --to hf-clip writes one model.safetensors "
            "and a CLIP model's captions are bytes");
    const ClipShape shape = clip_checkpoint_shape(reader);
    const HfExport e = export_hf_clip(reader, shape, a.out);
    log_info(
        "convert: wrote {} into {} ({} parameters; image tower {} layers x {}, text tower {} layers x {}, embedding "
        "{}) from {} (iteration {})",
        fmt::join(e.files, ", "), a.out, e.params, shape.vision.L, shape.vision.C, shape.text.L, shape.text.C,
        shape.embed_dim, reader.dir(), reader.iteration());
    return kExitOk;
}

int run_convert(ConvertArgs a) {
    set_log_stream(LogStream::kStderr);  // convert's output is files; its lines are log, with the progress bars
    if (!a.tokenizer_type.empty()) a.tokenizer.type = parse_tokenizer_type(a.tokenizer_type);
    if (a.to.empty() == a.from.empty())
        throw UserError(
            "command line error: convert needs exactly one of --to hf-gpt2, hf-llama or hf-clip (checkpoint -> "
            "Hugging Face) and --from hf-gpt2 or hf-llama (Hugging Face -> checkpoint)");
    const Progress::Style progress = Progress::style_for_stderr();
    if (!a.to.empty()) {
        if (!a.config_path.empty() || !a.overrides.empty())
            throw UserError(fmt::format(
                "command line error: --config and --set apply to --from {} only; --to {} takes the model from the "
                "checkpoint",
                a.to, a.to));
        const std::string dir = resolve_checkpoint(a.load);
        const CheckpointReader reader(dir);
        check_hf_export_arch(reader, a.to);  // before anything is written
        if (a.to == "hf-clip") return export_clip(a, reader);
        const GptShape shape = checkpoint_shape(reader);
        HfExportOptions options;
        options.max_shard_bytes = a.max_shard_size.empty() ? 0 : parse_shard_size(a.max_shard_size);
        options.progress = progress;
        // The tokenizer first: a wrong one is refused before any weights are written.
        std::optional<HfTokenizerExport> tokenizer;
        if (!a.tokenizer.empty()) {
            tokenizer = export_hf_tokenizer(a.tokenizer, shape.V, shape.T, a.out);
            options.eos_token_id = tokenizer->eos_token_id;
        }
        const HfExport e = a.to == "hf-llama" ? export_hf_llama(reader, shape, a.out, options)
                                              : export_hf_gpt2(reader, shape, a.out, options);
        log_info(
            "convert: wrote {} into {} ({} parameters; {} layers, hidden {}, {} heads, vocabulary {}) from {} "
            "(iteration {})",
            fmt::join(e.files, ", "), a.out, e.params, shape.L, shape.C, shape.NH, shape.V, dir, reader.iteration());
        if (tokenizer)
            log_info("convert: wrote the {} tokenizer ({} ids) as {}", tokenizer->kind, tokenizer->vocab_size,
                     fmt::join(tokenizer->files, ", "));
        else
            log_info(
                "convert: no tokenizer files: a checkpoint does not record the tokenizer its data was "
                "preprocessed with; pass the one preprocess was given (--tokenizer-type byte for its default, "
                "--vocab-file and --merge-file, or --tokenizer-model) to add them");
        return kExitOk;
    }
    if (!a.tokenizer.empty() || !a.max_shard_size.empty())
        throw UserError(
            fmt::format("command line error: --tokenizer-type, --vocab-file, --merge-file, --tokenizer-model and "
                        "--max-shard-size apply to --to {} only",
                        a.from));
    std::unique_ptr<Config> cfg;
    if (!a.config_path.empty() || !a.overrides.empty())
        cfg = std::make_unique<Config>(load_config(a.config_path, a.overrides));
    if (a.from == "hf-llama")
        import_hf_llama(a.load, cfg.get(), a.out, progress);
    else
        import_hf_gpt2(a.load, cfg.get(), a.out, progress);
    return kExitOk;
}

}  // namespace

Command add_convert_command(CLI::App& parent) {
    CLI::App* cmd = parent.add_subcommand(
        "convert",
        "Convert a checkpoint to a Hugging Face directory (model.safetensors + config.json; with the tokenizer files "
        "given): --to hf-gpt2 for a GPT-2 (model.arch gpt, loadable by transformers' GPT2LMHeadModel), --to hf-llama "
        "for a Llama (model.arch llama, LlamaForCausalLM), --to hf-clip for a CLIP (model.arch clip, CLIPModel); or a "
        "GPT-2 or Llama directory (also sharded: "
        "model.safetensors.index.json; F32, BF16 or F16) to a model-only checkpoint at iteration 0 (--from hf-gpt2, "
        "--from hf-llama)");
    auto a = std::make_shared<ConvertArgs>();
    CLI::Option* to =
        cmd->add_option("--to", a->to,
                        "Export to this format: hf-gpt2 (a GPT-2 checkpoint), hf-llama (a Llama one) or hf-clip (a "
                        "CLIP one)")
            ->check(CLI::IsMember({"hf-gpt2", "hf-llama", "hf-clip"}));
    CLI::Option* from =
        cmd->add_option("--from", a->from, "Import from this format: hf-gpt2 (model_type gpt2) or hf-llama (llama)")
            ->check(CLI::IsMember({"hf-gpt2", "hf-llama"}));
    to->excludes(from);
    cmd->add_option("--load", a->load,
                    "--to: a checkpoint save directory (its latest committed checkpoint) or an iter_XXXXXXX directory; "
                    "--from: a Hugging Face GPT-2 or Llama directory (config.json + model.safetensors, or "
                    "model.safetensors.index.json and its shards)")
        ->required();
    cmd->add_option("--out", a->out,
                    "--to: the directory to write model.safetensors and config.json into; --from: the save directory "
                    "to create the checkpoint iter_0000000 in (new or empty)")
        ->required();
    cmd->add_option("-c,--config", a->config_path,
                    "--from only: the YAML config the checkpoint is for (model dims must match config.json; "
                    "model.make_vocab_size_divisible_by pads the vocabulary, default 128)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--set", a->overrides, "--from only: override one config key, section.key=value (repeatable)")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    cmd->add_option("--max-shard-size", a->max_shard_size,
                    "--to only: split the weights into model-0000i-of-0000n.safetensors of at most this size plus "
                    "model.safetensors.index.json, as save_pretrained(max_shard_size=...): bytes, or with KB/MB/GB "
                    "or KiB/MiB/GiB (default: one model.safetensors)");
    cmd->add_option("--tokenizer-type", a->tokenizer_type,
                    "--to only: the tokenizer the data was preprocessed with, as preprocess's --tokenizer-type "
                    "(default: from the files given; none, no tokenizer files): byte writes a tokenizer.json of "
                    "the byte-level tokenizer (ids = UTF-8 bytes, <|endoftext|> = 256)")
        ->check(CLI::IsMember({"byte", "GPT2BPETokenizer", "HuggingFaceTokenizer"}));
    cmd->add_option("--vocab-file", a->tokenizer.vocab_file,
                    "--to only: the GPT-2 BPE vocab.json the data was preprocessed with (with --merge-file): "
                    "written with merges.txt, tokenizer.json and tokenizer_config.json for AutoTokenizer")
        ->check(CLI::ExistingFile);
    cmd->add_option("--merge-file", a->tokenizer.merge_file, "--to only: the GPT-2 BPE merges.txt (with --vocab-file)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--tokenizer-model", a->tokenizer.tokenizer_json,
                    "--to only: the tokenizer.json the data was preprocessed with: copied (with the "
                    "tokenizer_config.json beside it, if any)")
        ->check(CLI::ExistingFile);
    return {cmd, [a]() { return run_convert(*a); }};
}

}  // namespace ms::app
