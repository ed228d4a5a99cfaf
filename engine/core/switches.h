// switches.h: the environment switches (MS_* variables), read in one place, once (docs/style.md "Switches").
//
// A switch changes what a run reports or tests, never its numerics: anything that changes numerics is a config key
// in the debug: section, so it is part of the config hash (the CUDA GEMMs' TF32, the cuBLASLt GELU epilogues, the
// CUDA attention kernels; they were MS_CUDA_TF32, MS_CUDA_GELU_EPILOGUE, MS_CUDA_ATTENTION, MS_CUDA_ATTENTION_BWD,
// and a run that still sets one of those is refused with a sentence naming the key). kSwitchTable lists every
// switch with its meaning; an MS_* variable that is in no table gets a warning naming it and the known ones (a typo
// would otherwise be ignored in silence). Launcher variables (OMPI_*, SLURM_*, ...) and the ${VAR} references of a
// config file are read where they are used (comm/bootstrap.cpp, engine/config/config_load.cpp), not here.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ms {

// One environment switch: its variable and what it does.
struct SwitchInfo {
    std::string_view name;
    std::string_view meaning;
};

// Every MS_* variable mindspeed-train knows, in the order describe_switches() prints them.
inline constexpr SwitchInfo kSwitchTable[] = {
    {"MS_DUMP_GRADS", "PATH: after the first backward, write every parameter's full gradient to PATH.stage<s>"},
    {"MS_DEFER_OPS", "1: queue the ops and run them at each synchronize (the deferred backend)"},
    {"MS_PROFILE_OPS", "1: time every backend op and print a table at the end"},
    {"MS_INJECT", "<crash|hang|nan|sigterm>@step=S[,rank=R]: a fault for the tests (wins over reliability.inject)"},
    {"MS_INJECT_CKPT_FAIL", "<write|manifest|rename|tracker>[@rank]: fail a checkpoint save at that phase (tests)"},
    {"MS_CHECK_ALLOCS", "1: count heap allocations inside training steps and fail on any"},
    {"MS_OP_TEST_VERBOSE", "1: the op tests print each comparison's error (read by tests/ops, not the engine)"},
};

// MS_* variables that scripts/ and bench/ read (not the binary): known, so not warned about.
inline constexpr std::string_view kScriptVariables[] = {
    "MS_JOBS",
    "MS_FUZZ_SECONDS",
    "MS_CUDA_ARCH",
    "MS_GPU_CHECK_BUDGET",
    "MS_GPU_CHECK_DRY",
    "MS_GPU_BENCH_BATCH",
    "MS_BENCH_THREADS",
    "MS_BENCH_STEPS",
    "MS_BENCH_TORCH_STEPS",
    "MS_BENCH_ENVS",
    "MS_BENCH_PP",
    "MS_BENCH_PYTHON",
};

// Former switches that changed numerics, now config keys: setting one is refused with a sentence naming the key.
struct RetiredSwitch {
    std::string_view name;
    std::string_view config_key;
    std::string_view how;  // the old value's spelling as the key's
};
inline constexpr RetiredSwitch kRetiredSwitches[] = {
    {"MS_CUDA_TF32", "debug.cuda_tf32", "MS_CUDA_TF32=1 is debug.cuda_tf32: true"},
    {"MS_CUDA_GELU_EPILOGUE", "debug.cuda_gelu_epilogue", "MS_CUDA_GELU_EPILOGUE=0 is debug.cuda_gelu_epilogue: false"},
    {"MS_CUDA_ATTENTION", "debug.cuda_attention", "MS_CUDA_ATTENTION=scalar is debug.cuda_attention: scalar"},
    {"MS_CUDA_ATTENTION_BWD", "debug.cuda_attention_bwd",
     "MS_CUDA_ATTENTION_BWD=split is debug.cuda_attention_bwd: split"},
};

// The parsed switches.
struct Switches {
    std::string dump_grads;        // MS_DUMP_GRADS: a path prefix; "" = off
    bool defer_ops = false;        // MS_DEFER_OPS=1
    bool profile_ops = false;      // MS_PROFILE_OPS=1
    std::string inject;            // MS_INJECT: a fault spec (parsed by reliability.cpp); "" = none
    std::string inject_ckpt_fail;  // MS_INJECT_CKPT_FAIL: a phase spec (parsed by checkpoint.cpp); "" = none
    bool check_allocs = false;     // MS_CHECK_ALLOCS=1
    bool op_test_verbose = false;  // MS_OP_TEST_VERBOSE set (tests only)

    std::vector<std::string> set;       // "NAME=value" of every known switch that is set, in kSwitchTable order
    std::vector<std::string> warnings;  // one sentence per unknown MS_* variable
};

// Parses `env` ("NAME=value" entries, as in environ). Throws UserError when a retired switch is set or a value is
// not one the switch takes (MS_DEFER_OPS=yes). Pure: for tests; the process's switches come from switches().
Switches parse_switches(std::span<const char* const> env);

// The process's switches: the first call reads environ (call it at startup, before any thread starts: run_train
// does), prints the unknown-variable warnings once and throws UserError as parse_switches() does; later calls
// return the same object.
const Switches& switches();

// "environment switches: MS_PROFILE_OPS=1 MS_DUMP_GRADS=/tmp/g", or "" when none is set: the line the trainer prints
// at startup.
std::string describe_switches(const Switches& s);
std::string describe_switches();  // of switches()

}  // namespace ms
