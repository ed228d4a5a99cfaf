// test_eval_generate.cpp: what `eval` and `generate` print, through the binary, on a crafted checkpoint whose
// output is known exactly: every weight zero except ln_f.bias[0] = 1 and wte[256][0] = 1, so at every position the
// final LayerNorm gives e_0 and the logits are 1 for the byte tokenizer's end of document (256) and 0 for every other
// id of the 257. Hence
//   - generate at temperature 0 draws 256 first: it stops there, unless --ignore-eod;
//   - eval's loss on data of ids < 32 is log(256 + e) for every token;
//   - `eval --json` and `generate` keep stdout for their result (JSON, text or ids), the log on stderr;
//   - a --config whose hyper-parameters the tensors do not show (heads, LayerNorm epsilon) differ from the
//     checkpoint's is refused, naming the key and both values.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/checkpoint_model.h"
#include "engine/config/config.h"
#include "engine/data/dataset.h"
#include "engine/model/gpt.h"
#include "engine/train/run_layout.h"
#include "tests/common/temp_dir.h"
#include "tests/e2e/run_cli.h"

namespace ms {
namespace {

using nlohmann::json;
using test::run_cli_streams;

constexpr const char* kConfigYaml = R"(schema_version: 1
run: {name: eod, seed: 1234}
model: {num_layers: 1, hidden_size: 16, num_attention_heads: 2, seq_length: 16, vocab_size: 257}
training: {micro_batch_size: 2, global_batch_size: 2, train_iters: 1}
data: {source: synthetic, split: "969,30,1", synthetic: {vocab_size: 32, branching: 4, seed: 7, num_tokens: 65536}}
eval: {eval_iters: 2}
)";

class EvalGenerate : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = std::make_unique<test::TempDir>("ms_eval_generate");
        std::ofstream(*dir_ / "config.yaml") << kConfigYaml;
        const Config cfg = load_config_text(kConfigYaml, "config.yaml", {});
        const GptShape s = make_run_layout(cfg, 1).shape;
        const std::vector<ParamInfo> table = gpt_param_table(s);
        int64_t size = 0;
        for (const ParamInfo& p : table) size = std::max(size, p.offset + p.numel);
        std::vector<float> flat(static_cast<size_t>(size), 0.0f);
        for (const ParamInfo& p : table) {
            if (p.name == "ln_f.bias") flat[p.offset] = 1.0f;
            if (p.name == "wte.weight") flat[p.offset + static_cast<int64_t>(kByteEod) * s.C] = 1.0f;
        }
        write_model_checkpoint(*dir_ / "ckpt", cfg, s, flat.data(), TrainState{}, json::object());
    }
    static void TearDownTestSuite() { dir_.reset(); }

    static std::string config() { return *dir_ / "config.yaml"; }
    static std::string ckpt() { return *dir_ / "ckpt"; }

    // The whitespace-separated integers of `out`; fails on anything else.
    static std::vector<int> integers(const std::string& out) {
        std::vector<int> ids;
        std::istringstream in(out);
        for (std::string word; in >> word;) {
            size_t used = 0;
            ids.push_back(std::stoi(word, &used));
            EXPECT_EQ(used, word.size()) << "not an integer: '" << word << "' in " << out;
        }
        return ids;
    }

    static std::unique_ptr<test::TempDir> dir_;
};

std::unique_ptr<test::TempDir> EvalGenerate::dir_;

TEST_F(EvalGenerate, GenerateStopsAtTheEndOfDocumentAndPrintsOnlyTheText) {
    const auto r = run_cli_streams("generate --load " + ckpt() + " --prompt hi --temperature 0 --tokens 10");
    ASSERT_EQ(r.exit_code, 0) << r.errors;
    EXPECT_EQ(r.output, "hi\n");  // the end-of-document token is not text
    EXPECT_NE(r.errors.find("generate: end of document (token 256) after 1 of 10 tokens"), std::string::npos)
        << r.errors;
    EXPECT_NE(r.errors.find("byte-level tokenizer"), std::string::npos) << r.errors;  // the log, on stderr
}

TEST_F(EvalGenerate, IdsArePrintedAsIntegersAndIgnoreEodSamplesPastTheEnd) {
    const std::string base = "generate --load " + ckpt() + " --prompt hi --temperature 0 --tokens 10 --ids";
    const auto r = run_cli_streams(base);
    ASSERT_EQ(r.exit_code, 0) << r.errors;
    EXPECT_EQ(integers(r.output), (std::vector<int>{'h', 'i', kByteEod}));

    const auto all = run_cli_streams(base + " --ignore-eod");
    ASSERT_EQ(all.exit_code, 0) << all.errors;
    std::vector<int> want = {'h', 'i'};
    want.resize(12, kByteEod);
    EXPECT_EQ(integers(all.output), want);
    EXPECT_EQ(all.errors.find("end of document"), std::string::npos) << all.errors;

    const auto text =
        run_cli_streams("generate --load " + ckpt() + " --prompt hi --temperature 0 --tokens 3 " + "--ignore-eod");
    ASSERT_EQ(text.exit_code, 0) << text.errors;
    EXPECT_EQ(text.output, "hi\n\n\n\n");  // byte_decode writes an end of document inside the text as a newline
}

TEST_F(EvalGenerate, EvalJsonIsAloneOnStdout) {
    const auto r = run_cli_streams("eval --config " + config() + " --load " + ckpt() + " --iters 2 --json");
    ASSERT_EQ(r.exit_code, 0) << r.errors;
    const json j = json::parse(r.output);  // the whole of stdout: what `| jq .` reads
    EXPECT_EQ(j["samples"], 4);
    EXPECT_EQ(j["split"], "valid");
    // logsumexp of 256 zeros and one 1, minus the target's 0; float arithmetic, well inside 1e-5
    EXPECT_NEAR(j["eval loss"].get<double>(), std::log(256.0 + std::exp(1.0)), 1e-5);
    EXPECT_NE(r.errors.find("eval loss: "), std::string::npos) << r.errors;  // the log line, on stderr

    const auto plain = run_cli_streams("eval --config " + config() + " --load " + ckpt() + " --iters 2");
    ASSERT_EQ(plain.exit_code, 0) << plain.errors;
    EXPECT_NE(plain.output.find("eval loss: "), std::string::npos) << plain.output;  // without --json: stdout
}

TEST_F(EvalGenerate, AConfigWhoseHyperParametersDifferFromTheCheckpointsIsRefused) {
    auto r = run_cli_streams("eval --config " + config() + " --set model.layernorm_epsilon=1e-6 --load " + ckpt());
    EXPECT_EQ(r.exit_code, 2) << r.errors;
    EXPECT_NE(r.errors.find("model.layernorm_epsilon is 1e-06 in the config " + config() +
                            " but 1e-05 in the "
                            "checkpoint"),
              std::string::npos)
        << r.errors;
    EXPECT_NE(r.errors.find("HINT"), std::string::npos) << r.errors;

    r = run_cli_streams("generate --config " + config() + " --set model.num_attention_heads=4 --load " + ckpt() +
                        " --prompt hi");
    EXPECT_EQ(r.exit_code, 2) << r.errors;
    EXPECT_NE(r.errors.find("model.num_attention_heads is 4 in the config " + config() + " but 2 in the checkpoint"),
              std::string::npos)
        << r.errors;

    r = run_cli_streams("eval --config " + config() + " --set model.layernorm_epsilon=1e-5 --load " + ckpt() +
                        " --iters 1");
    EXPECT_EQ(r.exit_code, 0) << r.errors;  // the same value is fine
}

}  // namespace
}  // namespace ms
