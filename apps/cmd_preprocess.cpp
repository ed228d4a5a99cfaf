// cmd_preprocess.cpp: `preprocess` -- a text file (documents separated by blank lines) or Megatron's JSON Lines
// input -> Megatron <prefix>_<key>_document.{bin,idx}, with the byte tokenizer, GPT-2's BPE or a Hugging Face
// tokenizer.json (engine/data/preprocess.h). Progress on stderr, the summary on stdout.
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "engine/core/check.h"
#include "engine/data/preprocess.h"

namespace ms::app {

Command add_preprocess_command(CLI::App& parent) {
    CLI::App* cmd = parent.add_subcommand(
        "preprocess",
        "Tokenize a text file (documents separated by blank lines) or JSON Lines into Megatron .bin/.idx");
    struct Args {
        PreprocessOptions options;
        std::string tokenizer_type = "byte";
        std::string vocab_file, merge_file, tokenizer_model;
    };
    auto args = std::make_shared<Args>();
    PreprocessOptions& o = args->options;
    cmd->add_option("--input", o.input, "Text file, or JSON Lines with --json-keys")
        ->required()
        ->check(CLI::ExistingFile);
    cmd->add_option("--output-prefix", o.output_prefix,
                    "Output prefix: writes <prefix>_<key>_document.bin and .idx (key text for a text file)")
        ->required();
    cmd->add_option("--json-keys", o.json_keys,
                    "Read --input as JSON Lines (one object per line); each key's values become one dataset");
    cmd->add_option("--tokenizer-type", args->tokenizer_type,
                    "byte (ids 0..255, EOD 256), GPT2BPETokenizer or HuggingFaceTokenizer")
        ->capture_default_str();
    cmd->add_option("--vocab-file", args->vocab_file, "GPT2BPETokenizer: the model's vocab.json");
    cmd->add_option("--merge-file", args->merge_file, "GPT2BPETokenizer: the model's merges.txt");
    cmd->add_option("--tokenizer-model", args->tokenizer_model, "HuggingFaceTokenizer: the model's tokenizer.json");
    cmd->add_flag("--append-eod", o.append_eod,
                  "End every document with the tokenizer's end-of-document id (always on for the byte tokenizer)");
    cmd->add_option("--workers", o.workers, "Threads that encode documents (the output is the same for any number)")
        ->capture_default_str()
        ->check(CLI::Range(1, 1024));
    return {cmd, [args]() {
                PreprocessOptions options = args->options;
                options.progress = Progress::style_for_stderr();
                const DocumentTokenizer tokenizer =
                    load_document_tokenizer(parse_tokenizer_type(args->tokenizer_type), args->vocab_file,
                                            args->merge_file, args->tokenizer_model);
                for (const PreprocessOutput& out : preprocess(options, tokenizer)) {
                    const std::string skipped =
                        out.empty_documents > 0 ? fmt::format(", {} empty documents skipped", out.empty_documents) : "";
                    fmt::print("preprocess: {} documents, {} tokens from {} ({} tokenizer, key {}{})\n", out.documents,
                               out.tokens, options.input, tokenizer.name, out.key, skipped);
                    fmt::print("wrote {}.bin\nwrote {}.idx\n", out.prefix, out.prefix);
                    fmt::print("train on it with: --set data.source=megatron --set data.data_path={}\n", out.prefix);
                }
                return kExitOk;
            }};
}

}  // namespace ms::app
