// main.cpp: mindspeed-train's command line -- `--version` and the train / plan / preprocess / convert / eval /
// generate / report / calibrate / selfplay subcommands.
//
// Exit codes (engine/core/check.h): a bad command line or a UserError (bad config, bad data) exits 2 with one
// "error: ..." sentence on stderr before anything large is allocated; any other RunError exits with its own code
// (README "Exit codes") and, once training has an output directory, is recorded in its exit_status.json.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <new>
#include <stdexcept>
#include <string>

#include "apps/commands.h"
#include "engine/core/check.h"
#if defined(MS_HAVE_CUDA_BACKEND)
#include "engine/backends/cuda/cuda_backend.h"
#endif
#if defined(MS_HAVE_NCCL)
#include "comm/nccl/nccl_communicator.h"
#endif
#include "engine/train/reliability.h"

namespace {

// An allocation that failed anywhere -- a size the config's arithmetic let through, a machine short of memory -- ends
// the command with a sentence and exit code 2, never an uncaught exception (134) or a core dump.
int out_of_memory(const std::string& what) {
    const std::string msg = fmt::format(
        "memory error: an allocation failed ({}); the configured sizes need more memory than this process can "
        "get\n---> HINT: run `mindspeed-train plan` with the same config to see what each rank needs; reduce the sizes "
        "the config sets (model.num_layers, model.hidden_size, model.seq_length, training.micro_batch_size, "
        "data.synthetic.num_tokens), or raise the process's memory limit (ulimit -v)",
        what);
    std::fflush(stdout);
    std::cerr << ms::user_error_line(msg) << std::endl;
    ms::record_exit(ms::kExitConfigError, msg);
    return ms::kExitConfigError;
}

}  // namespace

int main(int argc, char** argv) {
#if defined(MS_HAVE_CUDA_BACKEND)
    // Built with a CUDA backend (CMakeLists.txt: ms_cuda_backend; ms_cuda_emu for mindspeed-train-cuda-emu, the
    // tests' binary): run.backend: cuda becomes valid (engine/backends/backend.h).
    ms::install_cuda_backend();
#endif
#if defined(MS_HAVE_NCCL)
    // Built with NCCL (CMakeLists.txt: ms_nccl): run.comm: nccl becomes valid, and auto picks it on run.backend:
    // cuda when every rank has a GPU of its own (comm/nccl/comm_choice.h).
    ms::install_nccl_communicator();
#endif
    CLI::App app{"mindspeed-train: trains GPT models with Megatron-style configs, on CPUs and NVIDIA GPUs"};
    app.set_version_flag("--version", std::string("mindspeed-train ") + MS_VERSION);
    app.require_subcommand(1);
    const ms::app::Command commands[] = {
        ms::app::add_train_command(app),   ms::app::add_plan_command(app),      ms::app::add_preprocess_command(app),
        ms::app::add_convert_command(app), ms::app::add_eval_command(app),      ms::app::add_generate_command(app),
        ms::app::add_report_command(app),  ms::app::add_calibrate_command(app), ms::app::add_selfplay_command(app)};
    try {
        app.parse(argc, argv);
        for (const ms::app::Command& c : commands) {
            if (c.cli->parsed()) return c.run();
        }
        return ms::kExitConfigError;  // unreachable: require_subcommand(1)
    } catch (const CLI::ParseError& e) {
        const int rc = app.exit(e);  // prints help / version to stdout, errors to stderr
        return rc == 0 ? ms::kExitOk : ms::kExitConfigError;
    } catch (const ms::RunError& e) {  // UserError (2, 19), NumericalError (17), CollectiveTimeoutError (18)
        std::fflush(stdout);
        if (!e.reported()) std::cerr << ms::user_error_line(e.what()) << std::endl;
        // exit_status.json, events.jsonl, once a run has an output dir; failed_rank: another rank's failure
        ms::record_exit(e.exit_code(), e.what(), e.failed_rank());
        return e.exit_code();
    } catch (const std::bad_alloc&) {
        return out_of_memory("std::bad_alloc");
    } catch (const std::length_error& e) {  // a size no container can hold
        return out_of_memory(e.what());
    }
}
