// test_switches.cpp: the environment switch table (engine/core/switches.h) and the debug: config keys that replaced
// the switches which changed numerics (engine/config/config.h DebugConfig, BackendOptions::cuda).
//
// The switches are parsed from crafted environments (parse_switches), not from the process's, so the tests do not
// depend on how ctest was started.
#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/config/config.h"
#include "engine/core/check.h"
#include "engine/core/switches.h"

namespace {

// A config with the model keys every config must set, plus `sets`.
ms::Config load(std::vector<std::string> sets = {}) {
    sets.insert(sets.begin(), {"model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4"});
    return ms::load_config("", sets);
}

ms::Switches parse(std::initializer_list<const char*> env) {
    const std::vector<const char*> v(env);
    return ms::parse_switches(v);
}

// Runs f, expects a UserError whose message contains every one of `parts`; returns the message.
std::string user_error(const std::function<void()>& f, std::initializer_list<std::string> parts) {
    try {
        f();
    } catch (const ms::UserError& e) {
        const std::string what = e.what();
        for (const std::string& p : parts)
            EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
        return what;
    }
    ADD_FAILURE() << "no UserError thrown";
    return "";
}

TEST(Switches, ParsesTheKnownOnesAndIgnoresOtherVariables) {
    const ms::Switches s =
        parse({"PATH=/usr/bin", "MS_INJECT=crash@step=2", "MS_PROFILE_OPS=1", "HOME=/root", "MS_DUMP_GRADS=/tmp/g",
               "MS_DEFER_OPS=0", "MS_INJECT_CKPT_FAIL=write@1", "MS_CHECK_ALLOCS=1"});
    EXPECT_EQ(s.dump_grads, "/tmp/g");
    EXPECT_FALSE(s.defer_ops);
    EXPECT_TRUE(s.profile_ops);
    EXPECT_EQ(s.inject, "crash@step=2");
    EXPECT_EQ(s.inject_ckpt_fail, "write@1");
    EXPECT_TRUE(s.check_allocs);
    EXPECT_FALSE(s.op_test_verbose);
    EXPECT_TRUE(s.warnings.empty());
    // in table order, whatever the environment's
    EXPECT_EQ(ms::describe_switches(s),
              "environment switches: MS_DUMP_GRADS=/tmp/g MS_DEFER_OPS=0 MS_PROFILE_OPS=1 MS_INJECT=crash@step=2 "
              "MS_INJECT_CKPT_FAIL=write@1 MS_CHECK_ALLOCS=1");
}

TEST(Switches, NoneSetDescribesNothing) {
    const ms::Switches s = parse({"PATH=/usr/bin", "OMPI_COMM_WORLD_SIZE=2"});
    EXPECT_EQ(ms::describe_switches(s), "");
    EXPECT_TRUE(s.set.empty());
    EXPECT_TRUE(s.dump_grads.empty());
    EXPECT_FALSE(s.defer_ops || s.profile_ops || s.check_allocs);
}

// A typo is not ignored in silence: the warning names the variable and every known switch.
TEST(Switches, AnUnknownMsVariableIsWarnedAboutByName) {
    const ms::Switches s = parse({"MS_PROFILE_OP=1", "MS_DEFER_OPS=1"});
    ASSERT_EQ(s.warnings.size(), 1u);
    const std::string& w = s.warnings[0];
    EXPECT_NE(w.find("MS_PROFILE_OP "), std::string::npos) << w;
    for (const ms::SwitchInfo& i : ms::kSwitchTable) EXPECT_NE(w.find(i.name), std::string::npos) << i.name;
    EXPECT_FALSE(s.profile_ops);
    EXPECT_TRUE(s.defer_ops);
    EXPECT_EQ(s.set, std::vector<std::string>{"MS_DEFER_OPS=1"});
}

TEST(Switches, TheScriptsVariablesAreKnown) {
    const ms::Switches s = parse({"MS_JOBS=4", "MS_CUDA_ARCH=90", "MS_GPU_CHECK_BUDGET=600"});
    EXPECT_TRUE(s.warnings.empty());
    EXPECT_TRUE(s.set.empty());
}

TEST(Switches, OnOffValuesOtherThan0Or1AreRefused) {
    user_error([] { parse({"MS_DEFER_OPS=yes"}); }, {"MS_DEFER_OPS='yes'", "must be 1 (on) or 0 (off)"});
    user_error([] { parse({"MS_CHECK_ALLOCS=true"}); }, {"MS_CHECK_ALLOCS='true'"});
    EXPECT_FALSE(parse({"MS_PROFILE_OPS="}).profile_ops);  // set but empty: off
}

// The switches that changed numerics are config keys now: a run that sets one is refused with the key's name.
TEST(Switches, TheRetiredCudaSwitchesAreRefusedNamingTheirConfigKey) {
    user_error([] { parse({"MS_CUDA_TF32=1"}); }, {"MS_CUDA_TF32=1", "debug.cuda_tf32", "config hash"});
    user_error([] { parse({"MS_CUDA_GELU_EPILOGUE=0"}); }, {"MS_CUDA_GELU_EPILOGUE", "debug.cuda_gelu_epilogue"});
    user_error([] { parse({"MS_CUDA_ATTENTION=scalar"}); }, {"MS_CUDA_ATTENTION", "debug.cuda_attention: scalar"});
    user_error([] { parse({"MS_CUDA_ATTENTION_BWD=split"}); }, {"MS_CUDA_ATTENTION_BWD", "debug.cuda_attention_bwd"});
    // even set to the old default: the variable no longer does anything
    user_error([] { parse({"MS_CUDA_TF32=0"}); }, {"debug.cuda_tf32"});
}

TEST(Switches, TheTableNamesAreUniqueMsNames) {
    std::vector<std::string> names;
    for (const ms::SwitchInfo& i : ms::kSwitchTable) {
        EXPECT_TRUE(i.name.starts_with("MS_")) << i.name;
        EXPECT_FALSE(i.meaning.empty()) << i.name;
        for (const std::string& n : names) EXPECT_NE(n, i.name);
        for (const ms::RetiredSwitch& r : ms::kRetiredSwitches) EXPECT_NE(r.name, i.name);
        names.emplace_back(i.name);
    }
}

// ---- the debug: section ----

TEST(DebugConfig, DefaultsAreTheProductionPathAndRoundTrip) {
    const ms::Config cfg = load();
    EXPECT_FALSE(cfg.debug.cuda_tf32);
    EXPECT_TRUE(cfg.debug.cuda_gelu_epilogue);
    EXPECT_EQ(cfg.debug.cuda_attention, "tensor_cores");
    EXPECT_EQ(cfg.debug.cuda_attention_bwd, "fused");
    const ms::CudaDebugOptions o = ms::cuda_debug_options(cfg.debug), def;
    EXPECT_EQ(o.fp32_gemm, def.fp32_gemm);
    EXPECT_EQ(o.gelu, def.gelu);
    EXPECT_EQ(o.attention, def.attention);
    EXPECT_EQ(o.attention_backward, def.attention_backward);

    const std::string yaml = ms::config_to_yaml(cfg);
    EXPECT_NE(yaml.find("debug:"), std::string::npos) << yaml;
    const ms::Config set = load({"debug.cuda_tf32=true", "debug.cuda_gelu_epilogue=false",
                                 "debug.cuda_attention=scalar", "debug.cuda_attention_bwd=split"});
    const ms::Config again = ms::load_config_text(ms::config_to_yaml(set), "resolved.yaml", {});
    EXPECT_EQ(ms::config_to_yaml(again), ms::config_to_yaml(set));
    const ms::CudaDebugOptions s = ms::cuda_debug_options(again.debug);
    EXPECT_EQ(s.fp32_gemm, ms::CudaFp32Gemm::kTf32);
    EXPECT_EQ(s.gelu, ms::CudaGelu::kKernels);
    EXPECT_EQ(s.attention, ms::CudaAttention::kScalar);
    EXPECT_EQ(s.attention_backward, ms::CudaAttentionBackward::kSplit);
}

// Each key that changes numerics changes the hash every rank checks and the run records; all four hashes differ.
TEST(DebugConfig, EveryDebugKeyIsPartOfTheConfigHash) {
    const uint64_t base = ms::config_hash(load());
    EXPECT_EQ(ms::config_hash(load()), base);
    std::vector<uint64_t> seen{base};
    for (const char* set : {"debug.cuda_tf32=true", "debug.cuda_gelu_epilogue=false", "debug.cuda_attention=scalar",
                            "debug.cuda_attention_bwd=split", "model.init_method_std=0.01"}) {
        const uint64_t h = ms::config_hash(load({set}));
        for (uint64_t other : seen) EXPECT_NE(h, other) << set;
        seen.push_back(h);
    }
}

TEST(DebugConfig, BadValuesAreSentencesNamingTheKey) {
    user_error([] { load({"debug.cuda_attention=flash"}); },
               {"debug.cuda_attention", "'flash'", "must be one of: tensor_cores, scalar"});
    user_error([] { load({"debug.cuda_attention_bwd=fast"}); },
               {"debug.cuda_attention_bwd", "must be one of: fused, split"});
    user_error([] { load({"debug.cuda_tf32=maybe"}); }, {"debug.cuda_tf32"});
    user_error([] { load({"debug.cuda_tf3=true"}); }, {"debug.cuda_tf3", "debug.cuda_tf32"});
}

// On the CPU backend nothing reads them: a changed value is refused rather than silently ignored.
TEST(DebugConfig, ChangedOnTheCpuBackendIsRefused) {
    ms::Config cfg = load({"debug.cuda_attention_bwd=split", "model.vocab_size=256"});
    user_error([&] { ms::validate_config(cfg, 1); },
               {"debug.cuda_attention_bwd is set but run.backend = 'cpu'", "only the CUDA backend reads it"});
    cfg.debug.cuda_attention_bwd = "fused";
    EXPECT_NO_THROW(ms::validate_config(cfg, 1));
}

}  // namespace
