// test_config.cpp: load_config / validate_config / config_to_yaml (engine/config/).
//
// Errors are checked by the exact substrings a user would read: the location, the key path, the value, the
// constraint and the suggestion. Every error must be an ms::UserError with exit code 2.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/core/check.h"
#include "tests/common/temp_dir.h"

namespace {

using ms::Config;
using ms::load_config;
using ms::validate_config;

// Writes `text` to a fresh file in this process's temp dir (removed at exit) and returns its path.
std::string write_yaml(const std::string& text) {
    static const ms::test::TempDir dir("ms_config_test");
    static int counter = 0;
    const std::string path = dir / (std::to_string(counter++) + ".yaml");
    std::ofstream(path) << text;
    return path;
}

// Runs f, expects a UserError with exit code 2 whose message contains every one of `parts`; returns the message.
std::string expect_user_error(const std::function<void()>& f, std::initializer_list<std::string> parts) {
    try {
        f();
    } catch (const ms::UserError& e) {
        const std::string msg = e.what();
        EXPECT_EQ(e.exit_code(), ms::kExitConfigError) << msg;
        for (const std::string& p : parts)
            EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
        return msg;
    }
    ADD_FAILURE() << "no UserError thrown";
    return "";
}

std::string file_error(const std::string& yaml, std::initializer_list<std::string> parts) {
    const std::string path = write_yaml(yaml);
    return expect_user_error([&] { load_config(path, {}); }, parts);
}

std::string set_error(const std::vector<std::string>& sets, std::initializer_list<std::string> parts) {
    return expect_user_error([&] { load_config("", sets); }, parts);
}

std::string validate_error(const std::vector<std::string>& sets, int world_size,
                           std::initializer_list<std::string> parts) {
    const Config cfg = load_config("", sets);
    return expect_user_error([&] { validate_config(cfg, world_size); }, parts);
}

// The keys every loaded config must set (a config names its model), then `extra`: for tests of other keys.
std::vector<std::string> named(std::vector<std::string> extra = {}) {
    std::vector<std::string> s = {"model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=4"};
    s.insert(s.end(), extra.begin(), extra.end());
    return s;
}

// A small valid model so that validation tests change one thing at a time.
std::vector<std::string> small(std::vector<std::string> extra = {}) {
    std::vector<std::string> s = named(
        {"model.seq_length=32", "model.vocab_size=100", "training.micro_batch_size=2", "training.train_iters=10"});
    s.insert(s.end(), extra.begin(), extra.end());
    return s;
}

// ---- defaults and plain loading ----

TEST(ConfigTest, NoFileGivesTheDefaultsWithReferencesResolved) {
    const Config cfg = load_config("", named());
    EXPECT_EQ(cfg.schema_version, 1);
    EXPECT_EQ(cfg.model.num_layers, 2);
    EXPECT_EQ(cfg.model.seq_length, 1024);
    EXPECT_EQ(cfg.run.output_dir, "runs/run");
    EXPECT_EQ(cfg.logging.metrics_file, "runs/run/metrics.jsonl");
}

TEST(ConfigTest, EmptySectionsAreDefaults) {
    EXPECT_EQ(load_config(write_yaml("model:\neval:\n"), named()).model.seq_length, 1024);
    EXPECT_EQ(load_config(write_yaml("eval:\n"), named()).eval.eval_iters, 10);
}

// An empty or model-less config would otherwise train the default 86M-parameter model without a word.
TEST(ConfigTest, AConfigMustNameItsModel) {
    const std::string empty = write_yaml("");
    expect_user_error([&] { load_config(empty, {}); }, {"config file '" + empty + "' sets nothing",
                                                        "a config must name its model", "configs/demo.yaml"});
    expect_user_error([&] { load_config(write_yaml("# only a comment\n"), {}); }, {"sets nothing"});
    expect_user_error([] { load_config("", {}); }, {"no config file was given", "configs/"});
    file_error("model:\neval:\n", {"sets nothing", "a config must name its model"});
    file_error("training:\n  train_iters: 5\n", {"model.num_layers, model.hidden_size, model.num_attention_heads are"});
    file_error("model:\n  num_layers: 2\n  hidden_size: 64\n",
               {"model.num_attention_heads is not set", "--set model.num_attention_heads=..."});
    // --set names it as well as the file does; a value error is reported before what is missing
    EXPECT_EQ(
        load_config(write_yaml("model:\n  num_layers: 2\n"), {"model.hidden_size=64", "model.num_attention_heads=4"})
            .model.hidden_size,
        64);
    set_error({"model.num_layers=0"}, {"model.num_layers = 0 must be >= 1"});
}

TEST(ConfigTest, FileValuesOfEveryType) {
    const Config cfg = load_config(write_yaml("run:\n  name: x\n  seed: 18446744073709551615\n"
                                              "model:\n  num_layers: 3\n  hidden_size: 8\n  num_attention_heads: 2\n"
                                              "  layernorm_epsilon: 1e-6\n"
                                              "  untie_embeddings_and_output_weights: false\n"
                                              "training:\n  train_iters: 5000000000\n"
                                              "optimizer:\n  lr: 3.0e-4\n"
                                              "logging:\n  peak_flops: 1.5e12\n"),
                                   {});
    EXPECT_EQ(cfg.run.name, "x");
    EXPECT_EQ(cfg.run.seed, UINT64_MAX);
    EXPECT_EQ(cfg.model.num_layers, 3);
    EXPECT_EQ(cfg.model.layernorm_epsilon, 1e-6f);
    EXPECT_EQ(cfg.training.train_iters, 5000000000LL);
    EXPECT_EQ(cfg.optimizer.lr, 3e-4f);
    EXPECT_EQ(cfg.logging.peak_flops, 1.5e12);
    EXPECT_EQ(cfg.run.output_dir, "runs/x");
}

TEST(ConfigTest, NullOrAutoMeansDerivedForDerivedKeys) {
    const Config cfg = load_config(
        write_yaml("model:\n  ffn_hidden_size: null\n  vocab_size: ~\nparallel:\n  data_parallel_size: auto\n"),
        named());
    EXPECT_EQ(cfg.model.ffn_hidden_size, 0);
    EXPECT_EQ(cfg.model.vocab_size, 0);
    EXPECT_EQ(cfg.parallel.data_parallel_size, 0);
    file_error("model:\n  num_layers: null\n", {"model.num_layers: expected an integer, got null"});
}

TEST(ConfigTest, DataPathIsAStringOrAListOfStrings) {
    EXPECT_EQ(load_config(write_yaml("data:\n  data_path: a/b\n"), named()).data.data_path,
              std::vector<std::string>{"a/b"});
    EXPECT_EQ(load_config(write_yaml("data:\n  data_path: [a, b]\n"), named()).data.data_path,
              (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(load_config("", named({"data.data_path=[x, y, z]"})).data.data_path.size(), 3u);
    file_error("data:\n  data_path: [a, {b: c}]\n", {"data.data_path", "a list containing a mapping"});
}

// ---- strictness: unknown keys ----

TEST(ConfigTest, UnknownKeySaysWhereAndDidYouMean) {
    const std::string path = write_yaml("model:\n  num_layer: 12\n");
    expect_user_error([&] { load_config(path, {}); },
                      {path + ":2:3", "unknown key 'model.num_layer'", "did you mean 'num_layers'?"});
}

TEST(ConfigTest, UnknownSectionDidYouMean) {
    file_error("trainig:\n  micro_batch_size: 2\n", {":1:1", "unknown section 'trainig'", "did you mean 'training'?"});
}

TEST(ConfigTest, UnknownNestedKeyDidYouMean) {
    file_error("data:\n  synthetic:\n    branchng: 3\n",
               {":3:5", "data.synthetic.branchng", "did you mean 'branching'?"});
}

TEST(ConfigTest, UnknownKeyWithNoCloseMatchListsTheValidKeys) {
    file_error("mixed_precision:\n  zzzzzzzz: 1\n",
               {"unknown key 'mixed_precision.zzzzzzzz'", "valid keys in 'mixed_precision': dtype"});
}

TEST(ConfigTest, MisplacedKeyNamesItsSection) {
    file_error("training:\n  lr: 0.1\n",
               {"unknown key 'training.lr'", "belongs in section 'optimizer' (optimizer.lr)"});
    file_error("micro_batch_size: 3\n", {"unknown top-level key 'micro_batch_size'", "section 'training'"});
    file_error("model:\n  seed: 3\n", {"'run' (run.seed)", "'data.synthetic' (data.synthetic.seed)"});
    file_error("model:\n  parallel:\n    zero_stage: 1\n", {"'parallel' is a top-level section, not a key of 'model'"});
}

TEST(ConfigTest, DuplicateKeyIsAnError) {
    file_error("model:\n  num_layers: 2\n  num_layers: 3\n", {":3:3", "duplicate key 'model.num_layers'", "line 2"});
}

TEST(ConfigTest, SectionMustBeAMapping) {
    file_error("model: 12\n", {"'model' is a section: expected a mapping of keys, got '12'"});
    file_error("- a\n- b\n", {"the top level must be a mapping"});
}

TEST(ConfigTest, YamlSyntaxErrorAndMissingFile) {
    file_error("model:\n  num_layers: [1, 2\n", {"YAML syntax error"});
    expect_user_error([] { load_config("/nonexistent/dir/x.yaml", {}); },
                      {"cannot read config file '/nonexistent/dir/x.yaml'", "no such file"});
    expect_user_error([] { load_config(testing::TempDir(), {}); }, {"it is a directory"});
}

// ---- strictness: types ----

TEST(ConfigTest, WrongTypesNameKeyValueAndExpectedType) {
    file_error("model:\n  num_layers: abc\n", {":2:15", "model.num_layers: expected an integer, got 'abc'"});
    file_error("model:\n  num_layers: 1.5\n", {"model.num_layers: expected an integer, got '1.5'"});
    file_error("model:\n  hidden_size: [1, 2]\n", {"model.hidden_size: expected an integer, got a list"});
    file_error("optimizer:\n  lr: fast\n", {"optimizer.lr: expected a number, got 'fast'"});
    file_error("parallel:\n  sequence_parallel: 2\n",
               {"parallel.sequence_parallel: expected a boolean (true or false), got '2'"});
    file_error("run:\n  name: {a: b}\n", {"run.name: expected a string, got a mapping"});
    file_error("run:\n  seed: -1\n", {"run.seed: expected a non-negative integer, got '-1'"});
    file_error("model:\n  num_layers: 99999999999\n", {"model.num_layers: 99999999999 is out of range"});
}

// ---- strictness: impossible values ----

TEST(ConfigTest, ImpossibleValuesNameKeyValueAndConstraint) {
    file_error("lr_schedule:\n  lr_decay_style: foo\n",
               {":2:19", "lr_schedule.lr_decay_style = 'foo' must be one of: constant, linear, cosine"});
    file_error("parallel:\n  zero_stage: 3\n", {"parallel.zero_stage = 3 is not supported (0, 1 or 2)"});
    set_error({"parallel.zero_stage=-1"}, {"--set", "parallel.zero_stage = -1 is not supported (0, 1 or 2)"});
    set_error({"mixed_precision.dtype=fp8"}, {"mixed_precision.dtype = 'fp8' must be one of: fp32, bf16, fp16"});
    set_error({"run.backend=tpu"}, {"run.backend = 'tpu' must be one of: cpu, cuda"});
    set_error({"model.num_layers=-1"}, {"model.num_layers = -1 must be >= 1"});
    set_error({"training.micro_batch_size=0"}, {"training.micro_batch_size = 0 must be >= 1"});
    set_error({"optimizer.lr=-0.1"}, {"optimizer.lr = -0.1 must be >= 0"});
    set_error({"optimizer.adam_beta1=1.0"}, {"optimizer.adam_beta1 = 1.0 must be in [0, 1)"});
    set_error({"optimizer.adam_beta2=-0.5"}, {"optimizer.adam_beta2 = -0.5 must be in [0, 1)"});
    set_error({"data.source=hdf5"}, {"data.source = 'hdf5' must be one of: synthetic, megatron, llmc, nanogpt"});
    set_error({"data.split=1,2,3,4"}, {"data.split = '1,2,3,4' must be 1 to 3 comma-separated"});
    set_error({"schema_version=2"}, {"schema_version = 2 is not supported by this build"});
    set_error({"logging.log_interval=0"}, {"logging.log_interval = 0 must be >= 1"});
}

// ---- overrides ----

TEST(ConfigTest, OverridesApplyAfterTheFile) {
    const std::string path = write_yaml(
        "model:\n  num_layers: 4\n  hidden_size: 8\n  num_attention_heads: 2\ntraining:\n  train_iters: 7\n");
    const Config cfg =
        load_config(path, {"model.num_layers=6", "data.synthetic.seed=3", "optimizer.lr=1e-3", "run.name=abc"});
    EXPECT_EQ(cfg.model.num_layers, 6);
    EXPECT_EQ(cfg.training.train_iters, 7);
    EXPECT_EQ(cfg.data.synthetic.seed, 3u);
    EXPECT_EQ(cfg.optimizer.lr, 1e-3f);
    EXPECT_EQ(cfg.run.output_dir, "runs/abc");
    EXPECT_EQ(load_config("", named({"model.num_layers=5"})).model.num_layers, 5);  // last wins
    EXPECT_EQ(load_config("", named({"checkpoint.save="})).checkpoint.save, "");
}

TEST(ConfigTest, OverrideErrorsAreAsStrict) {
    set_error({"model.num_layers"}, {"--set", "'model.num_layers' has no '='"});
    set_error({"model.hiden_size=3"}, {"--set", "unknown key 'model.hiden_size'", "did you mean 'model.hidden_size'?"});
    set_error({"lr=0.1"}, {"--set", "'lr' belongs in section 'optimizer'"});
    set_error({"model=3"}, {"'model' is a section, not a key"});
    set_error({"model.num_layers=abc"}, {"--set: model.num_layers: expected an integer, got 'abc'"});
}

// ---- interpolation ----

TEST(ConfigTest, EnvironmentInterpolation) {
    setenv("MS_CONFIG_TEST_DIR", "/scratch/u", 1);
    setenv("MS_CONFIG_TEST_ITERS", "42", 1);
    unsetenv("MS_CONFIG_TEST_UNSET");
    const Config cfg =
        load_config(write_yaml("run:\n  output_dir: ${MS_CONFIG_TEST_DIR}/runs/${run.name}\n"
                               "data:\n  data_path: ${MS_CONFIG_TEST_UNSET:-data/default_text_document}\n"
                               "training:\n  train_iters: ${MS_CONFIG_TEST_ITERS:-7}\n"
                               "eval:\n  sample_prompt: cost $$5 and $${NOT_EXPANDED}\n"),
                    named({"run.name=n1"}));
    EXPECT_EQ(cfg.run.output_dir, "/scratch/u/runs/n1");
    EXPECT_EQ(cfg.logging.metrics_file, "/scratch/u/runs/n1/metrics.jsonl");
    EXPECT_EQ(cfg.data.data_path, std::vector<std::string>{"data/default_text_document"});
    EXPECT_EQ(cfg.training.train_iters, 42);
    EXPECT_EQ(cfg.eval.sample_prompt, "cost $$5 and ${NOT_EXPANDED}");
    EXPECT_EQ(load_config("", named({"run.name=${MS_CONFIG_TEST_UNSET:-${MS_CONFIG_TEST_ITERS}}"})).run.name, "42");
}

TEST(ConfigTest, UndefinedEnvironmentVariableNamesKeyAndVariable) {
    unsetenv("MS_CONFIG_TEST_UNSET");
    file_error("checkpoint:\n  save: ${MS_CONFIG_TEST_UNSET}/ckpt\n",
               {":2:9", "checkpoint.save: environment variable MS_CONFIG_TEST_UNSET is not set"});
}

TEST(ConfigTest, ConfigReferences) {
    const Config cfg = load_config("", named({"run.name=r${run.seed}", "logging.metrics_file=${run.output_dir}/m.jsonl",
                                              "run.seed=9", "eval.sample_prompt=${model.num_layers} layers"}));
    EXPECT_EQ(cfg.run.name, "r9");
    EXPECT_EQ(cfg.run.output_dir, "runs/r9");
    EXPECT_EQ(cfg.logging.metrics_file, "runs/r9/m.jsonl");
    EXPECT_EQ(cfg.eval.sample_prompt, "2 layers");
    set_error({"run.output_dir=${run.nme}"},
              {"run.output_dir: '${run.nme}' refers to no config key", "did you mean '${run.name}'?"});
    set_error({"run.name=${run.output_dir}"}, {"circular ${} reference: run.name -> run.output_dir -> run.name"});
    set_error({"run.name=${run.name"}, {"unterminated '${'"});
}

// ---- aliases ----

TEST(ConfigTest, Aliases) {
    EXPECT_EQ(load_config(write_yaml("parallel:\n  use_distributed_optimizer: true\n"), named()).parallel.zero_stage,
              1);
    EXPECT_EQ(load_config(write_yaml("parallel:\n  use_distributed_optimizer: false\n"), named()).parallel.zero_stage,
              0);
    EXPECT_EQ(load_config(write_yaml("mixed_precision:\n  bf16: true\n"), named()).mixed_precision.dtype, "bf16");
    EXPECT_EQ(load_config(write_yaml("mixed_precision:\n  fp16: true\n  bf16: false\n"), named()).mixed_precision.dtype,
              "fp16");
    EXPECT_EQ(load_config(write_yaml("mixed_precision:\n  bf16: true\n  dtype: bf16\n"), named()).mixed_precision.dtype,
              "bf16");
    // --set replaces what the file said, alias or not.
    EXPECT_EQ(load_config(write_yaml("mixed_precision:\n  bf16: true\n"), named({"mixed_precision.dtype=fp32"}))
                  .mixed_precision.dtype,
              "fp32");
    EXPECT_EQ(load_config(write_yaml("mixed_precision:\n  bf16: true\n"), named({"mixed_precision.bf16=false"}))
                  .mixed_precision.dtype,
              "fp32");
    file_error("mixed_precision:\n  bf16: true\n  fp16: true\n",
               {"mixed_precision.bf16 and mixed_precision.fp16 are both true"});
    file_error("parallel:\n  zero_stage: 0\n  use_distributed_optimizer: true\n",
               {"parallel.use_distributed_optimizer sets parallel.zero_stage to '1'", "parallel.zero_stage ("});
    file_error("mixed_precision:\n  bf16: maybe\n", {"mixed_precision.bf16: expected a boolean"});
}

// ---- validation ----

TEST(ConfigTest, ValidationSentences) {
    validate_error(small({"parallel.tensor_model_parallel_size=2", "parallel.pipeline_model_parallel_size=2"}), 6,
                   {"config error: parallel.tensor_model_parallel_size(2) * pipeline_model_parallel_size(2) = 4 does "
                    "not divide the world size 6",
                    "hint:"});
    validate_error(small({"parallel.data_parallel_size=3"}), 2,
                   {"parallel.data_parallel_size(3) does not match world size 2", "= 2"});
    validate_error(small({"parallel.overlap_param_gather=true", "parallel.overlap_grad_reduce=true"}), 2,
                   {"parallel.overlap_param_gather needs parallel.zero_stage 1 with parallel.overlap_grad_reduce, or "
                    "zero_stage 2 (got zero_stage 0, overlap_grad_reduce true)",
                    "hint:"});
    validate_error(small({"parallel.overlap_param_gather=true", "parallel.zero_stage=1"}), 2,
                   {"(got zero_stage 1, overlap_grad_reduce false)", "hint:"});
    set_error({"parallel.bucket_size=-1"}, {"parallel.bucket_size"});
    validate_error(small({"parallel.pipeline_schedule=interleaved_1f1b",
                          "parallel.virtual_pipeline_model_parallel_size=2", "model.num_layers=2"}),
                   1, {"'interleaved_1f1b' needs parallel.pipeline_model_parallel_size > 1 (got 1)", "hint:"});
    validate_error(small({"parallel.comm_engine=true", "run.backend=cuda"}), 1,
                   {"parallel.comm_engine runs MPI from a progress thread, for run.backend: cpu",
                    "(got backend cuda, comm auto)", "hint: set comm_engine: false"});
    set_error({"parallel.comm_chunk_bytes=100"}, {"parallel.comm_chunk_bytes"});
    // onebit_adam: nothing to compress on one dp rank; a warm-up that never ends; gradient buckets it does not use
    validate_error(small({"optimizer.type=onebit_adam", "optimizer.freeze_step=2"}), 1,
                   {"optimizer.type onebit_adam compresses the data-parallel average of the momentum",
                    "one data-parallel rank (world 1 = tp 1 x pp 1)", "hint: use optimizer.type: adamw"});
    validate_error(small({"optimizer.type=onebit_adam", "optimizer.freeze_step=10"}), 2,
                   {"optimizer.freeze_step(10) must be at least 1 and less than training.train_iters(10)",
                    "--set optimizer.freeze_step=2"});
    validate_error(small({"optimizer.type=onebit_adam"}), 2, {"optimizer.freeze_step(0) must be at least 1"});
    validate_error(
        small({"optimizer.type=onebit_adam", "optimizer.freeze_step=2", "parallel.overlap_grad_reduce=true"}), 2,
        {"parallel.overlap_grad_reduce's gradient buckets have nothing to reduce", "hint:"});
    validate_error(small({"optimizer.type=onebit_adam", "optimizer.freeze_step=2", "mixed_precision.dtype=bf16",
                          "mixed_precision.grad_reduce_in_fp32=false"}),
                   2, {"mixed_precision.grad_reduce_in_fp32 = false keeps them in bf16", "hint:"});
    // zero_stage 2: nothing to shard on one dp rank; onebit_adam's whole momenta
    validate_error(small({"parallel.zero_stage=2"}), 1,
                   {"parallel.zero_stage 2 shards the gradients over the data-parallel ranks, and this layout has one "
                    "(world 1 = tp 1 x pp 1)",
                    "hint: set zero_stage: 0"});
    validate_error(small({"parallel.zero_stage=2", "optimizer.type=onebit_adam", "optimizer.freeze_step=2"}), 2,
                   {"onebit_adam keeps every rank's whole momentum", "they do not compose", "hint:"});
    // 16-bit gradients need a 16-bit model
    validate_error(small({"mixed_precision.grad_reduce_in_fp32=false"}), 1,
                   {"mixed_precision.grad_reduce_in_fp32 = false asks for 16-bit gradients",
                    "mixed_precision.dtype = 'fp32'", "hint: set mixed_precision.dtype: bf16"});
    set_error({"optimizer.onebit_chunk_size=8"}, {"optimizer.onebit_chunk_size"});
    set_error({"optimizer.type=lamb"}, {"optimizer.type", "onebit_adam"});
    validate_error(small({"model.num_attention_heads=4", "parallel.tensor_model_parallel_size=3"}), 3,
                   {"model.num_attention_heads(4) is not divisible by parallel.tensor_model_parallel_size(3)"});
    validate_error(small({"model.num_attention_heads=5"}), 1,
                   {"model.hidden_size(64) is not divisible by model.num_attention_heads(5)"});
    validate_error(small({"model.ffn_hidden_size=250", "parallel.tensor_model_parallel_size=4"}), 4,
                   {"model.ffn_hidden_size(250) is not divisible by parallel.tensor_model_parallel_size(4)"});
    validate_error(small({"model.num_layers=3", "parallel.pipeline_model_parallel_size=2"}), 2,
                   {"model.num_layers(3) is not divisible by parallel.pipeline_model_parallel_size(2) * "
                    "virtual_pipeline_model_parallel_size(1) = 2"});
    validate_error(small({"training.micro_batch_size=3", "training.global_batch_size=8"}), 1,
                   {"training.global_batch_size(8) is not divisible by training.micro_batch_size(3) * data-parallel "
                    "size(1) = 3",
                    "e.g. 6 or 9"});
    // below the first multiple, only the one above is a suggestion
    EXPECT_EQ(validate_error(small({"training.global_batch_size=8", "training.micro_batch_size=2"}), 8,
                             {"= 16; hint: use a multiple of 16, e.g. 16"})
                  .find(" or "),
              std::string::npos);
    validate_error(small({"model.max_position_embeddings=16"}), 1,
                   {"model.seq_length(32) is larger than model.max_position_embeddings(16)"});
    validate_error(small({"model.vocab_size=0"}), 1, {"model.vocab_size is 0"});
    // an untied output layer adds its padded vocabulary x hidden weights (GPT: 128 x 64)
    EXPECT_EQ(
        validate_config(load_config("", small({"model.untie_embeddings_and_output_weights=true"})), 1).num_parameters -
            validate_config(load_config("", small()), 1).num_parameters,
        128 * 64);
    // Llama: an untied output layer, groups dividing heads and tp, an even head size for the rotation
    const auto llama = [](std::vector<std::string> extra) {
        std::vector<std::string> s =
            small({"model.arch=llama", "model.untie_embeddings_and_output_weights=true", "model.num_query_groups=2"});
        s.insert(s.end(), extra.begin(), extra.end());
        return s;
    };
    EXPECT_EQ(validate_config(load_config("", llama({})), 1).num_parameters,
              2 * 128 * 64 + 2 * (2 * 64 + 2 * 64 * 64 + 2 * 32 * 64 + 3 * 256 * 64) + 64);
    EXPECT_EQ(
        validate_config(load_config("", llama({"model.untie_embeddings_and_output_weights=false"})), 1).num_parameters,
        128 * 64 + 2 * (2 * 64 + 2 * 64 * 64 + 2 * 32 * 64 + 3 * 256 * 64) + 64);
    validate_error(llama({"model.num_query_groups=3"}), 1,
                   {"model.num_query_groups(3) does not divide model.num_attention_heads(4)", "pick a divisor of 4"});
    validate_error(llama({"parallel.tensor_model_parallel_size=4"}), 4,
                   {"model.num_query_groups(2) is not divisible by parallel.tensor_model_parallel_size(4)"});
    validate_error(
        llama({"model.hidden_size=72", "model.num_attention_heads=8", "model.num_query_groups=0"}), 1,
        {"model.hidden_size(72) / num_attention_heads(8) = 9 is an odd head size", "hint: an even head size"});
    validate_error(small({"model.num_query_groups=2"}), 1,
                   {"model.num_query_groups(2), rotary_base(10000) and rope_scaling_factor(0) are Llama's",
                    "model.arch is 'gpt'", "set model.arch: llama"});
    // context parallelism: 2 cp chunks per rank of seq_length, the ranks part of dp, Llama only
    {
        const ms::DerivedConfig d = validate_config(
            load_config("", llama({"parallel.context_parallel_size=2", "training.global_batch_size=8"})), 8);
        EXPECT_EQ(d.dp, 8);  // every rank holds the whole model: gradients are averaged over all 8
        EXPECT_EQ(d.cp, 2);
        EXPECT_EQ(d.replicas(), 4);
        EXPECT_EQ(d.num_microbatches, 1);  // 8 samples = micro batch 2 x 4 replicas
    }
    validate_error(llama({"parallel.context_parallel_size=3"}), 3,
                   {"parallel.context_parallel_size(3) cuts each sequence into 2 * cp = 6 chunks",
                    "model.seq_length(32) is not divisible by 6", "a seq_length that is a multiple of 6"});
    validate_error(small({"parallel.context_parallel_size=2"}), 2,
                   {"parallel.context_parallel_size(2) splits each sequence over ranks", "model.arch 'gpt'",
                    "set context_parallel_size: 1, or model.arch: llama"});
    validate_error(llama({"parallel.context_parallel_size=2", "parallel.tensor_model_parallel_size=2"}), 6,
                   {"context_parallel_size(2) = 4 does not divide the world size 6"});
    validate_error(llama({"parallel.context_parallel_size=2", "parallel.data_parallel_size=2"}), 2,
                   {"parallel.data_parallel_size(2) does not match world size 2 /", "context_parallel_size(2)) = 1"});
    validate_error(llama({"model.rope_scaling_factor=8", "model.rope_low_freq_factor=4"}), 1,
                   {"model.rope_high_freq_factor(4) must exceed model.rope_low_freq_factor(4)"});
    set_error({"model.arch=mamba"}, {"model.arch", "llama"});
    validate_error(small({"model.hidden_dropout=0.1"}), 1, {"not supported on this backend yet"});
    validate_error(small({"training.recompute_granularity=full", "training.recompute_num_layers=2"}), 1,
                   {"training.recompute_num_layers = 2 with recompute_method 'uniform'", "recompute_method 'block'"});
    validate_error(small({"mixed_precision.bf16=true", "mixed_precision.loss_scale=128"}), 1,
                   {"mixed_precision.loss_scale = 128 is set but mixed_precision.dtype = 'bf16'", "fp16 only"});
    validate_error(small({"mixed_precision.fp16=true", "mixed_precision.min_loss_scale=8",
                          "mixed_precision.initial_loss_scale=4"}),
                   1, {"mixed_precision.min_loss_scale = 8 exceeds mixed_precision.initial_loss_scale = 4"});
    // test_unit registers no CUDA backend, like a binary built without one
    validate_error(small({"run.backend=cuda"}), 1,
                   {"run.backend = 'cuda' but this binary was built without the CUDA backend", "-DMS_ENABLE_CUDA=ON"});
    validate_error(small({"lr_schedule.lr_warmup_iters=11"}), 1,
                   {"lr_schedule.lr_warmup_iters(11) is larger than training.train_iters(10)"});
    validate_error(small({"optimizer.min_lr=0.1", "optimizer.lr=0.01"}), 1,
                   {"optimizer.min_lr(0.1) is larger than optimizer.lr(0.01)"});
    validate_error(small({"data.source=megatron"}), 1, {"data.source = 'megatron' needs data.data_path"});
    validate_error(small({"checkpoint.save_interval=5"}), 1, {"checkpoint.save is empty"});
    validate_error(small(), 0, {"the world size must be >= 1"});
}

TEST(ConfigTest, SequenceParallelNeedsRowsDivisibleByTp) {
    validate_error(small({"parallel.sequence_parallel=true", "parallel.tensor_model_parallel_size=4",
                          "training.micro_batch_size=1", "model.seq_length=30"}),
                   4, {"micro_batch_size(1) * seq_length(30) = 30 rows", "does not divide them"});
}

// The end-of-run sample slides its context window, up to 16 windows: 2e9 tokens would never finish.
TEST(ConfigTest, SampleTokensAreBoundedByTheContext) {
    validate_error(small({"eval.sample_tokens=2000000000"}), 1,
                   {"eval.sample_tokens(2000000000) is more than 16 context windows of "
                    "model.max_position_embeddings(32) tokens = 512",
                    "hint: at most 512, or 0 to skip sampling"});
    validate_error(small({"eval.sample_tokens=1025", "model.max_position_embeddings=64"}), 1, {"= 1024"});
    EXPECT_NO_THROW(validate_config(load_config("", small({"eval.sample_tokens=512"})), 1));
}

TEST(ConfigTest, TensorPipelineAndDataParallelLayoutsValidate) {
    const Config cfg = load_config("", small({"parallel.tensor_model_parallel_size=2"}));
    EXPECT_EQ(validate_config(cfg, 2).dp, 1);
    EXPECT_EQ(validate_config(load_config("", small()), 2).dp, 2);
    EXPECT_EQ(validate_config(load_config("", small({"parallel.pipeline_model_parallel_size=2"})), 4).dp, 2);
}

TEST(ConfigTest, ValidateChecksSingleValuesOfAProgrammaticConfig) {
    Config cfg = load_config("", small());
    cfg.optimizer.adam_beta1 = 1.5f;
    expect_user_error([&] { validate_config(cfg, 1); }, {"optimizer.adam_beta1 = 1.5 must be in [0, 1)"});
}

TEST(ConfigTest, DerivedValuesOfGpt2Small) {
    setenv("DATA_PREFIX", "/data/x_text_document", 1);
    const Config cfg = load_config(std::string(MS_SOURCE_DIR) + "/configs/gpt2-124m.yaml", {});
    unsetenv("DATA_PREFIX");
    EXPECT_EQ(cfg.data.data_path, std::vector<std::string>{"/data/x_text_document"});
    const ms::DerivedConfig d = validate_config(cfg, 1);
    EXPECT_EQ(d.world_size, 1);
    EXPECT_EQ(d.dp, 1);
    EXPECT_EQ(d.padded_vocab, 50304);
    EXPECT_EQ(d.ffn_hidden, 3072);
    EXPECT_EQ(d.num_microbatches, 128);
    EXPECT_EQ(d.tokens_per_step, 512 * 1024);
    // V_p*C + T*C + L*(12*C*C + 13*C) + 2*C with C = 768, T = 1024, L = 12: nanoGPT's count for the padded vocab.
    EXPECT_EQ(d.num_parameters, 124475904);
}

TEST(ConfigTest, DerivedDefaults) {
    const ms::DerivedConfig d = validate_config(load_config("", small({"model.vocab_size=129"})), 1);
    EXPECT_EQ(d.padded_vocab, 256);    // ceil(129 / 128) * 128
    EXPECT_EQ(d.ffn_hidden, 256);      // 4 * 64
    EXPECT_EQ(d.num_microbatches, 1);  // global_batch_size 0 -> micro_batch_size * dp
    EXPECT_EQ(d.tokens_per_step, 2 * 32);
    // General formula with max_position_embeddings = seq_length = 32, F = 256.
    const int64_t C = 64, F = 256, L = 2;
    EXPECT_EQ(d.num_parameters,
              256 * C + 32 * C + L * (2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C) + 2 * C);
}

// ---- config_to_yaml ----

TEST(ConfigTest, RoundTripIsExact) {
    setenv("MS_CONFIG_TEST_DIR", "/scratch/u", 1);
    const Config a = load_config(
        write_yaml("run:\n  name: 'odd: name # with $${} chars'\n  output_dir: ${MS_CONFIG_TEST_DIR}/${run.name}\n"
                   "  seed: 18446744073709551615\n"
                   "optimizer:\n  lr: 3e-4\n  adam_eps: 1.0e-8\n  weight_decay: 0.1\n"
                   "model:\n  layernorm_epsilon: 1.0e-5\n  init_method_std: 0.0123456789\n"
                   "logging:\n  peak_flops: 1.2345678901234e+13\n"
                   "data:\n  data_path: [a, 'b c', '']\n  split: '98,2,0'\n"
                   "eval:\n  sample_prompt: \"line1\\nline2 $${X} 'q' \\\"dq\\\"\"\n"
                   "checkpoint:\n  save: 'null'\n"),
        named({"parallel.use_distributed_optimizer=true", "data.synthetic.seed=3"}));
    const std::string yaml = ms::config_to_yaml(a);
    const Config b = load_config(write_yaml(yaml), {});
    EXPECT_EQ(ms::config_to_yaml(b), yaml);
    // Spot checks on values whose text form could lose information.
    EXPECT_EQ(b.run.name, a.run.name);
    EXPECT_EQ(b.run.output_dir, "/scratch/u/odd: name # with ${} chars");
    EXPECT_EQ(b.run.seed, UINT64_MAX);
    EXPECT_EQ(b.optimizer.lr, a.optimizer.lr);
    EXPECT_EQ(b.optimizer.adam_eps, a.optimizer.adam_eps);
    EXPECT_EQ(b.model.init_method_std, a.model.init_method_std);
    EXPECT_EQ(b.logging.peak_flops, a.logging.peak_flops);
    EXPECT_EQ(b.data.data_path, (std::vector<std::string>{"a", "b c", ""}));
    EXPECT_EQ(b.eval.sample_prompt, "line1\nline2 ${X} 'q' \"dq\"");
    EXPECT_EQ(b.checkpoint.save, "null");
    EXPECT_EQ(b.parallel.zero_stage, 1);
    EXPECT_EQ(b.data.synthetic.seed, 3u);
}

TEST(ConfigTest, YamlHasEverySectionAndKey) {
    const std::string yaml = ms::config_to_yaml(load_config("", named({"model.num_attention_heads=12"})));
    for (const char* s : {"schema_version: 1", "\nrun:", "\nmodel:", "\nparallel:", "\ntraining:", "\nmixed_precision:",
                          "\noptimizer:", "\nlr_schedule:", "\ndata:", "\n  synthetic:", "\ncheckpoint:", "\nlogging:",
                          "\neval:", "num_attention_heads: 12", "lr_decay_style: cosine", "sample_prompt: \"\""}) {
        EXPECT_NE(yaml.find(s), std::string::npos) << s << "\n" << yaml;
    }
}

TEST(ConfigTest, ShippedConfigsLoadAndValidate) {
    for (const char* name : {"demo.yaml", "gpt2-124m.yaml"}) {
        Config cfg = load_config(std::string(MS_SOURCE_DIR) + "/configs/" + name, {});
        if (cfg.model.vocab_size == 0) cfg.model.vocab_size = cfg.data.synthetic.vocab_size;  // as the trainer does
        EXPECT_NO_THROW(validate_config(cfg, 1)) << name;
    }
}

}  // namespace
