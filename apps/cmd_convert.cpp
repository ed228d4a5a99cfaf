// cmd_convert.cpp: `convert` -- a checkpoint to a Hugging Face GPT-2 directory (--to hf-gpt2) and back
// (--from hf-gpt2), engine/ckpt/hf_gpt2.h.
#include <memory>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/checkpoint_model.h"
#include "engine/ckpt/hf_gpt2.h"
#include "engine/config/config.h"
#include "engine/core/check.h"
#include "engine/core/log.h"

namespace ms::app {
namespace {

struct ConvertArgs {
    std::string to, from, load, out, config_path;
    std::vector<std::string> overrides;
};

int run_convert(const ConvertArgs& a) {
    if (a.to.empty() == a.from.empty())
        throw UserError(
            "command line error: convert needs exactly one of --to hf-gpt2 (checkpoint -> Hugging Face) "
            "and --from hf-gpt2 (Hugging Face -> checkpoint)");
    if (!a.to.empty()) {
        if (!a.config_path.empty() || !a.overrides.empty())
            throw UserError(
                "command line error: --config and --set apply to --from hf-gpt2 only; --to hf-gpt2 takes "
                "the model from the checkpoint");
        const std::string dir = resolve_checkpoint(a.load);
        const CheckpointReader reader(dir);
        const GptShape shape = checkpoint_shape(reader);
        const int64_t params = export_hf_gpt2(reader, shape, a.out);
        log_info(
            "convert: wrote {}/{} and {}/{} ({} parameters; {} layers, hidden {}, {} heads, vocabulary {}) from "
            "{} (iteration {})",
            a.out, kHfWeightsFile, a.out, kHfConfigFile, params, shape.L, shape.C, shape.NH, shape.V, dir,
            reader.iteration());
        return kExitOk;
    }
    std::unique_ptr<Config> cfg;
    if (!a.config_path.empty() || !a.overrides.empty())
        cfg = std::make_unique<Config>(load_config(a.config_path, a.overrides));
    import_hf_gpt2(a.load, cfg.get(), a.out);
    return kExitOk;
}

}  // namespace

Command add_convert_command(CLI::App& parent) {
    CLI::App* cmd = parent.add_subcommand(
        "convert",
        "Convert a checkpoint to a Hugging Face GPT-2 directory (--to hf-gpt2: model.safetensors + config.json, "
        "loadable by transformers' GPT2LMHeadModel.from_pretrained) or such a directory to a model-only checkpoint "
        "at iteration 0 (--from hf-gpt2)");
    auto a = std::make_shared<ConvertArgs>();
    CLI::Option* to = cmd->add_option("--to", a->to, "Export to this format")->check(CLI::IsMember({"hf-gpt2"}));
    CLI::Option* from =
        cmd->add_option("--from", a->from, "Import from this format")->check(CLI::IsMember({"hf-gpt2"}));
    to->excludes(from);
    cmd->add_option("--load", a->load,
                    "--to: a checkpoint save directory (its latest committed checkpoint) or an iter_XXXXXXX directory; "
                    "--from: a Hugging Face GPT-2 directory (config.json + model.safetensors)")
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
    return {cmd, [a]() { return run_convert(*a); }};
}

}  // namespace ms::app
