// cmd_preprocess.cpp: `preprocess` -- a text file -> Megatron <prefix>_text_document.{bin,idx} with the
// byte-level tokenizer (engine/data/dataset.h).
#include <fmt/format.h>

#include <memory>
#include <string>

#include "apps/commands.h"
#include "engine/core/check.h"
#include "engine/data/dataset.h"

namespace ms::app {

Command add_preprocess_command(CLI::App& parent) {
    CLI::App* cmd = parent.add_subcommand(
        "preprocess", "Tokenize a text file (documents separated by blank lines) into Megatron .bin/.idx");
    struct Args {
        std::string input;
        std::string output_prefix;
    };
    auto args = std::make_shared<Args>();
    cmd->add_option("--input", args->input, "Text file to tokenize")->required()->check(CLI::ExistingFile);
    cmd->add_option("--output-prefix", args->output_prefix, "Output prefix: writes <prefix>_text_document.bin and .idx")
        ->required();
    return {cmd, [args]() {
                const PreprocessStats s = preprocess_text(args->input, args->output_prefix);
                fmt::print("preprocess: {} documents, {} tokens from {}\n", s.documents, s.tokens, args->input);
                fmt::print("wrote {}.bin\nwrote {}.idx\n", s.prefix, s.prefix);
                fmt::print("train on it with: --set data.source=megatron --set data.data_path={}\n", s.prefix);
                return kExitOk;
            }};
}

}  // namespace ms::app
