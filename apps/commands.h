// commands.h: the subcommands of mindspeed-train. Each add_*_command() registers its options on the parent
// CLI11 app and returns the function that runs it once the command line has been parsed.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace ms::app {

struct Command {
    CLI::App* cli = nullptr;   // owned by the parent app
    std::function<int()> run;  // returns the process exit code; throws UserError for bad input
};

Command add_train_command(CLI::App& parent);       // cmd_train.cpp
Command add_plan_command(CLI::App& parent);        // cmd_train.cpp
Command add_selfplay_command(CLI::App& parent);    // cmd_train.cpp
Command add_preprocess_command(CLI::App& parent);  // cmd_preprocess.cpp
Command add_convert_command(CLI::App& parent);     // cmd_convert.cpp
Command add_eval_command(CLI::App& parent);        // cmd_eval.cpp
Command add_generate_command(CLI::App& parent);    // cmd_generate.cpp
Command add_report_command(CLI::App& parent);      // cmd_report.cpp
Command add_calibrate_command(CLI::App& parent);   // cmd_calibrate.cpp

}  // namespace ms::app
