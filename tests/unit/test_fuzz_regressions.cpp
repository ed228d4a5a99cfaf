// test_fuzz_regressions.cpp: inputs the fuzz targets (fuzz/) found to crash or misbehave, each reduced to the
// config or file that shows it, and the UserError it must give instead. Run under ASan + UBSan in CI
// (scripts/test-sanitizers.sh), where the unfixed code fails with a sanitizer report rather than a wrong value.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/core/check.h"

namespace {

// Runs f, expects a UserError with exit code 2 whose message contains every one of `parts`.
void expect_user_error(const std::function<void()>& f, std::initializer_list<std::string> parts) {
    try {
        f();
    } catch (const ms::UserError& e) {
        const std::string msg = e.what();
        EXPECT_EQ(e.exit_code(), ms::kExitConfigError) << msg;
        for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
        return;
    }
    ADD_FAILURE() << "no UserError thrown; expected one mentioning '" << *parts.begin() << "'";
}

void validate_error(const std::string& yaml, int world_size, std::initializer_list<std::string> parts) {
    const ms::Config cfg = ms::load_config_text(yaml, "fuzz.yaml", {});
    expect_user_error([&] { ms::validate_config(cfg, world_size); }, parts);
}

using ms::Config;

const std::string kSmall =
    "model:\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 4\n  seq_length: 32\n  vocab_size: 100\n";

// ---- validate_config: products of two keys overflowed int (UB; tp * pp = 65536^2 wrapped to 0 and the
// world-size check divided by it: SIGFPE instead of a config error) ----

TEST(FuzzRegression, TensorTimesPipelineParallelDoesNotOverflow) {
    validate_error(kSmall + "parallel:\n  tensor_model_parallel_size: 65536\n  pipeline_model_parallel_size: 65536\n",
                   8,
                   {"tensor_model_parallel_size(65536) * pipeline_model_parallel_size(65536) = 4294967296 does not "
                    "divide the world size 8"});
}

TEST(FuzzRegression, PipelineTimesVirtualStagesDoesNotOverflow) {
    validate_error(
        "model:\n  num_layers: 2\n  num_attention_heads: 1\n  hidden_size: 64\n  vocab_size: 100\n"
        "parallel:\n  pipeline_model_parallel_size: 65536\n  pipeline_schedule: interleaved_1f1b\n"
        "  virtual_pipeline_model_parallel_size: 65536\n",
        65536, {"= 4294967296"});
}

TEST(FuzzRegression, DefaultFfnOfAHugeHiddenSizeIsRefused) {
    validate_error("model:\n  num_layers: 12\n  hidden_size: 1000000000\n  num_attention_heads: 1\n  vocab_size: 100\n",
                   1,
                   {"model.ffn_hidden_size = 4 * hidden_size(1000000000) = 4000000000 is more than a 32-bit size "
                    "holds"});
}

TEST(FuzzRegression, DefaultGlobalBatchOfAHugeMicroBatchIsRefused) {
    validate_error(kSmall + "training:\n  micro_batch_size: 2147483647\n", 2,
                   {"micro_batch_size(2147483647) * data-parallel size(2) = 4294967294 is more than a 32-bit"});
    // an explicit global batch is an int key: the product is only a divisor
    validate_error(kSmall + "training:\n  micro_batch_size: 2147483647\n  global_batch_size: 64\n", 2,
                   {"training.global_batch_size(64) is not divisible by training.micro_batch_size(2147483647) * "
                    "data-parallel size(2) = 4294967294"});
}

TEST(FuzzRegression, PaddedVocabularyBeyondInt32IsRefused) {
    validate_error(
        "model:\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 4\n  seq_length: 32\n"
        "  vocab_size: 2147483000\n  make_vocab_size_divisible_by: 1024\n",
        1, {"is 2147483648, more than a 32-bit token id holds"});
    validate_error(
        "model:\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 4\n  seq_length: 32\n"
        "  vocab_size: 100\n  make_vocab_size_divisible_by: 2147483647\n"
        "parallel:\n  tensor_model_parallel_size: 4\n",
        4, {"= 8589934588 is 8589934588"});
}

TEST(FuzzRegression, ParameterCountBeyondInt64IsRefused) {
    // about 4 * C^2 * L with C = 2^30 and L = 2^20: 2^82 = 4.8e24
    validate_error(
        "model:\n  num_layers: 1048576\n  hidden_size: 1073741824\n  ffn_hidden_size: 1\n"
        "  num_attention_heads: 1\n  vocab_size: 100\n",
        1, {"hidden_size(1073741824)", "make 4.84e+24 parameters, more than 64-bit element counts hold"});
}

TEST(FuzzRegression, LargeButRepresentableModelsStillValidate) {
    // ~1.2e18 parameters: fits int64, so the count is exact (no estimate leaks into DerivedConfig)
    const ms::Config cfg = ms::load_config_text(
        "model:\n  num_layers: 1\n  hidden_size: 300000000\n  ffn_hidden_size: 1\n  num_attention_heads: 1\n"
        "  vocab_size: 128\n  seq_length: 8\n",
        "fuzz.yaml", {});
    const ms::DerivedConfig d = ms::validate_config(cfg, 1);
    const int64_t C = 300000000, F = 1, V = 128, P = 8;
    const int64_t per_layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (F * C + F) + (C * F + C);
    EXPECT_EQ(d.num_parameters, V * C + P * C + per_layer + 2 * C);
    EXPECT_EQ(d.padded_vocab, 128);
}

// ---- load_config: ${...} references of references grew exponentially (a 3 KB config took over 20 s and 1 GB
// before failing on something else; a few more levels exhaust memory) ----

std::string repeated_reference(const std::string& key, int times) {
    std::string value = "\"";
    for (int i = 0; i < times; ++i) value += "${" + key + "}";
    return value + "\"";
}

TEST(FuzzRegression, ExponentialReferenceExpansionIsRefused) {
    // 40^4 copies of a 64-character prompt: 164 MB for run.name
    const std::string yaml = "run:\n  name: " + repeated_reference("logging.metrics_file", 40) +
                             "\nlogging:\n  metrics_file: " + repeated_reference("checkpoint.save", 40) +
                             "\ncheckpoint:\n  save: " + repeated_reference("checkpoint.load", 40) +
                             "\n  load: " + repeated_reference("eval.sample_prompt", 40) +
                             "\neval:\n  sample_prompt: " + std::string(64, 'x') + "\n";
    expect_user_error([&] { ms::load_config_text(yaml, "bomb.yaml", {}); },
                      {"bomb.yaml:", "the value expands to more than 1048576 characters", "hint:"});
    // long but linear values are fine: 40 references to a 10 KB prompt
    const Config cfg = ms::load_config_text(kSmall + "run:\n  name: " + repeated_reference("eval.sample_prompt", 40) +
                                                "\neval:\n  sample_prompt: " + std::string(10000, 'y') + "\n",
                                            "long.yaml", {});
    EXPECT_EQ(cfg.run.name, std::string(400000, 'y'));
}

// ---- load_config_text: the same loader as load_config, for text ----

TEST(FuzzRegression, LoadConfigTextMatchesLoadConfigAndNamesItsSource) {
    const ms::Config cfg = ms::load_config_text("model:\n  num_layers: 3\n  num_attention_heads: 2\n", "mem.yaml",
                                                {"model.hidden_size=96"});
    EXPECT_EQ(cfg.model.num_layers, 3);
    EXPECT_EQ(cfg.model.hidden_size, 96);
    const std::vector<std::string> model = {"model.num_layers=2", "model.hidden_size=64",
                                            "model.num_attention_heads=4"};
    EXPECT_EQ(ms::config_to_yaml(ms::load_config_text("", "empty.yaml", model)),
              ms::config_to_yaml(ms::load_config("", model)));
    expect_user_error([] { ms::load_config_text("", "empty.yaml", {}); },
                      {"config file 'empty.yaml' sets nothing", "a config must name its model"});
    expect_user_error([] { ms::load_config_text("model:\n  num_layer: 3\n", "mem.yaml", {}); },
                      {"mem.yaml:2:3", "unknown key 'model.num_layer'"});
    expect_user_error([] { ms::load_config_text("model: [\n", "mem.yaml", {}); }, {"mem.yaml:", "YAML syntax error"});
}

}  // namespace
