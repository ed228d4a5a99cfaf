// cmd_train.cpp: `train` and `plan`, which share the config options: --config FILE, repeatable
// --set section.key=value and --print-config (print the resolved YAML and exit 0).
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "engine/backends/backend.h"
#include "engine/clip/clip_layout.h"
#include "engine/clip/clip_train.h"
#include "engine/config/config.h"
#include "engine/core/check.h"
#include "engine/selfplay/selfplay_train.h"
#include "engine/train/plan.h"
#include "engine/train/trainer.h"

namespace ms::app {
namespace {

struct ConfigArgs {
    std::string config_path;
    std::vector<std::string> overrides;
    bool print_config = false;
};

void add_config_args(CLI::App* cmd, ConfigArgs& args) {
    cmd->add_option("-c,--config", args.config_path,
                    "YAML config file (without it: the built-in defaults and a model named by --set)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--set", args.overrides,
                    "Override one key, applied after the file: section.key=value (repeatable), "
                    "e.g. --set training.train_iters=100")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    cmd->add_flag("--print-config", args.print_config, "Print the resolved config as YAML and exit");
}

// The command's run: the config loaded, printed instead with --print-config, else given to `run`.
std::function<int()> run_with_config(std::shared_ptr<ConfigArgs> args, std::function<int(const Config&)> run) {
    return [args, run]() {
        const Config cfg = load_config(args->config_path, args->overrides);
        if (args->print_config) {
            std::cout << config_to_yaml(cfg) << std::flush;
            return kExitOk;
        }
        return run(cfg);
    };
}

}  // namespace

Command add_train_command(CLI::App& parent) {
    CLI::App* cmd = parent.add_subcommand("train", "Train a model as configured (GPT, Llama or CLIP: model.arch)");
    auto args = std::make_shared<ConfigArgs>();
    add_config_args(cmd, *args);
    return {cmd, run_with_config(args, [](const Config& cfg) {
                if (cfg.model.arch == "clip") return run_clip_train(cfg);
                if (cfg.model.arch == "alphazero")
                    throw UserError(
                        "config error: model.arch: alphazero learns from its own games, not from data; hint: run "
                        "`mindspeed-train selfplay --config ...` with this config");
                return run_train(cfg);
            })};
}

Command add_selfplay_command(CLI::App& parent) {
    CLI::App* cmd = parent.add_subcommand(
        "selfplay", "Train a policy-value network on its own games of tree search (model.arch: alphazero)");
    auto args = std::make_shared<ConfigArgs>();
    add_config_args(cmd, *args);
    return {cmd, run_with_config(args, selfplay::run_selfplay)};
}

Command add_plan_command(CLI::App& parent) {
    CLI::App* cmd = parent.add_subcommand(
        "plan", "Validate a config for a world size and print the layout, derived values and memory per rank");
    auto args = std::make_shared<ConfigArgs>();
    auto plan = std::make_shared<PlanOptions>();
    add_config_args(cmd, *args);
    cmd->add_option("--world-size", plan->world_size, "Number of ranks to plan for")
        ->default_val(1)
        ->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--ranks-per-node,--gpus-per-node", plan->ranks_per_node,
                    "Ranks on one node (the node column, which groups span nodes, the default budget; default: the "
                    "config's run.ranks_per_node, else 8)")
        ->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--memory-gb", plan->memory_gib,
                    "Memory budget per rank in GiB (default: this machine's memory / ranks on a node)")
        ->check(CLI::PositiveNumber);
    cmd->add_flag(
        "--graph", plan->graph,
        "Also print each model chunk's op graph: its ops with the bytes each reads and writes, what the passes "
        "changed, and the bytes moved before and after them");
    cmd->add_option("--dot", plan->dot_path,
                    "Also write the chunks' op graphs as Graphviz to this file (implies --graph)");
    cmd->add_flag("--simulate", plan->simulate,
                  "Also simulate one training step (step time, MFU, bubble, exposed communication, memory per rank) "
                  "on the cost model of --profile or --device");
    cmd->add_option("--profile", plan->profile_path,
                    "--simulate's cost model: a profile `mindspeed-train calibrate` measured");
    cmd->add_option("--device", plan->device,
                    "--simulate's cost model: the estimate from published peaks for a100-80g, h100 or h200");
    cmd->add_flag("--search", plan->search,
                  "Instead of the config's layout, rank every layout of --world-size ranks (tp, pp, vpp, dp, cp, "
                  "micro-batch, recomputation, ZeRO stage, overlap) by simulated throughput within memory, on the "
                  "cost model of --profile or --device; with parallel.auto: true in the config, the layout keys it "
                  "sets are kept, as train keeps them");
    cmd->add_option("--top", plan->top, "--search: how many layouts to print")->check(CLI::Range(1, 1000));
    return {cmd, [args, plan]() {
                const Config cfg = load_config(args->config_path, args->overrides);
                if (args->print_config) {
                    std::cout << config_to_yaml(cfg) << std::flush;
                    return kExitOk;
                }
                // plan is arithmetic for the machines a config names, from any machine (a login node, a laptop): it
                // builds no backend, so run.backend: cuda configs plan in a binary without one too.
                register_planning_cuda_backend();
                if (cfg.model.arch == "clip") return run_clip_plan(cfg, plan->world_size, plan->memory_gib);
                return run_plan(cfg, *plan);
            }};
}

}  // namespace ms::app
