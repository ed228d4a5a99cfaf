// cmd_report.cpp: `report RUN_DIR [-o FILE]` -- one self-contained HTML page of a training run's metrics, memory and
// communication matrix (engine/report/run_report.h). Writes RUN_DIR/report.html unless -o names another file; prints
// the page's path on stdout.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "apps/commands.h"
#include "engine/core/check.h"
#include "engine/report/run_report.h"

namespace ms::app {
namespace {

struct ReportArgs {
    std::string run_dir, output;
};

int run_report(const ReportArgs& a) {
    const std::string page = report::render_run_report(a.run_dir);
    const std::string path = a.output.empty() ? (std::filesystem::path(a.run_dir) / "report.html").string() : a.output;
    std::ofstream out(path);
    if (!(out << page)) {
        throw UserError("report error: cannot write '" + path +
                        "'\n---> HINT: check its directory exists and is writable, or pass another file with -o");
    }
    std::cout << path << std::endl;
    return kExitOk;
}

}  // namespace

Command add_report_command(CLI::App& parent) {
    CLI::App* cmd = parent.add_subcommand(
        "report",
        "One self-contained HTML page (inline SVG, no network) of a training run: loss, validation loss, learning "
        "rate, tokens/s, MFU, pipeline bubble and communication, memory plan vs peak, communication matrix");
    auto a = std::make_shared<ReportArgs>();
    cmd->add_option("run_dir", a->run_dir, "The run's run.output_dir (holds metrics.jsonl)")->required();
    cmd->add_option("-o,--output", a->output, "The HTML file to write (default: RUN_DIR/report.html)");
    return {cmd, [a]() { return run_report(*a); }};
}

}  // namespace ms::app
