// test_clip_cli.cpp: `train`, `eval` and `plan` for model.arch: clip as a user runs them: WebDataset shards written
// here (one of them with a bad sample) train or stop with a sentence naming the shard and the key; layouts CLIP cannot
// run are refused with a sentence; eval of a saved checkpoint gives the trainer's held-out numbers, and a config of
// another model is refused naming what differs; plan prints the presets' sizes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <array>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/common/image_files.h"
#include "tests/common/temp_dir.h"
#include "tests/e2e/run_cli.h"

namespace ms::test {
namespace {

// A tiny CLIP on 16x16 images in 4-pixel patches, 2 samples per step.
const std::string kTiny =
    " --set model.arch=clip --set clip.preset=none --set clip.embed_dim=8 --set clip.image_size=16"
    " --set clip.patch_size=4 --set clip.vision_layers=1 --set clip.vision_width=16 --set clip.vision_heads=2"
    " --set clip.context_length=16 --set clip.text_layers=1 --set clip.text_width=16 --set clip.text_heads=2"
    " --set training.micro_batch_size=2 --set training.train_iters=3 --set logging.log_interval=1"
    " --set clip.eval_samples=4";

std::string colour_png(uint8_t r, uint8_t g, uint8_t b, int side) {
    Bytes rows(static_cast<size_t>(side) * side * 3);
    for (size_t i = 0; i < rows.size(); i += 3) {
        rows[i] = r;
        rows[i + 1] = g;
        rows[i + 2] = b;
    }
    return png_bytes(side, side, 8, 2, rows);
}

// Shards in dir: train.tar (6 samples, `bad` replacing sample 0003's members when given) and valid.tar (4 samples).
struct Shards {
    TempDir dir{"ms_clip_cli"};
    std::string train, valid;
    explicit Shards(const std::vector<TarFile>& bad = {}) {
        std::vector<TarFile> files;
        for (int i = 0; i < 6; ++i) {
            const std::string key = "000" + std::to_string(i);
            if (i == 3 && !bad.empty()) {
                files.insert(files.end(), bad.begin(), bad.end());
                continue;
            }
            files.push_back({key + ".png", colour_png(static_cast<uint8_t>(40 * i), 90, 200, 16)});
            files.push_back({key + ".txt", "a colour number " + std::to_string(i)});
        }
        train = dir / "train.tar";
        write_file(train, tar_bytes(files));
        files.clear();
        for (int i = 0; i < 4; ++i) {
            files.push_back({"v" + std::to_string(i) + ".png", colour_png(200, static_cast<uint8_t>(50 * i), 30, 16)});
            files.push_back({"v" + std::to_string(i) + ".txt", "a valid colour " + std::to_string(i)});
        }
        valid = dir / "valid.tar";
        write_file(valid, tar_bytes(files));
    }
    std::string args(const std::string& extra = "") const {
        return "train" + kTiny + " --set data.source=webdataset --set data.data_path=" + train +
               " --set clip.eval_data_path=" + valid + " --set run.output_dir=" + dir.path() + extra;
    }
};

TEST(ClipCli, TrainsOnWebDatasetShards) {
    const Shards s;
    const CliResult r = run_cli(s.args());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("held-out 4 samples"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("image->text R@1"), std::string::npos) << r.output;
}

TEST(ClipCli, CorruptImageNamesShardAndKeyOrIsCountedWhenSkipped) {
    const Shards s({{"0003.png", "\x89PNG\r\n\x1a\n this is not a png"}, {"0003.txt", "a broken one"}});
    const CliResult stop = run_cli(s.args());
    EXPECT_EQ(stop.exit_code, 2) << stop.output;
    EXPECT_NE(stop.output.find(s.train), std::string::npos) << stop.output;
    EXPECT_NE(stop.output.find("0003"), std::string::npos) << stop.output;
    const CliResult skip = run_cli(s.args(" --set clip.skip_bad_samples=true"));
    ASSERT_EQ(skip.exit_code, 0) << skip.output;
    EXPECT_NE(skip.output.find("skipped"), std::string::npos) << skip.output;
}

TEST(ClipCli, MissingCaptionAndTooSmallImageNameShardAndKey) {
    {
        const Shards s({{"0003.png", colour_png(1, 2, 3, 16)}});
        const CliResult r = run_cli(s.args());
        EXPECT_EQ(r.exit_code, 2) << r.output;
        EXPECT_NE(r.output.find("0003"), std::string::npos) << r.output;
        EXPECT_NE(r.output.find(s.train), std::string::npos) << r.output;
    }
    {
        const Shards s({{"0003.png", colour_png(1, 2, 3, 2)}, {"0003.txt", "a speck"}});
        const CliResult r = run_cli(s.args());
        EXPECT_EQ(r.exit_code, 2) << r.output;
        EXPECT_NE(r.output.find("0003"), std::string::npos) << r.output;
        EXPECT_NE(r.output.find("2 x 2 pixels"), std::string::npos) << r.output;
    }
}

// Towers and cross-modal layers deeper than the memory plan's representative two layers (whose last layer's output
// gradient must carry the name the plan extrapolates from) train.
TEST(ClipCli, TowersOfThreeLayersTrain) {
    const TempDir dir("ms_clip_cli");
    const CliResult r = run_cli("train" + kTiny +
                                " --set data.source=shapes --set clip.vision_layers=3 --set clip.text_layers=3"
                                " --set clip.cross_modal_layers=3 --set training.train_iters=1 --set run.output_dir=" +
                                dir.path());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("iteration       1/      1 | loss"), std::string::npos) << r.output;
}

TEST(ClipCli, LayoutsClipCannotRunAreRefusedWithASentence) {
    const TempDir dir("ms_clip_cli");
    const std::string base = "train" + kTiny + " --set data.source=shapes --set run.output_dir=" + dir.path();
    const std::vector<std::pair<std::string, std::string>> cases = {
        {" --set parallel.pipeline_model_parallel_size=2", "pipeline_model_parallel_size(2)"},
        {" --set training.global_batch_size=8", "global_batch_size(8)"},
        {" --set data.source=synthetic", "image-text pairs"},
        {" --set clip.image_size=18", "clip.image_size(18) is not a multiple of clip.patch_size(4)"},
        {" --set clip.vision_heads=3", "clip.vision_width(16) is not a multiple of clip.vision_heads(3)"},
        {" --set mixed_precision.dtype=fp16", "fp16"},
    };
    for (const auto& [set, words] : cases) {
        const CliResult r = run_cli(base + set);
        EXPECT_EQ(r.exit_code, 2) << set << "\n" << r.output;
        EXPECT_NE(r.output.find(words), std::string::npos) << set << "\n" << r.output;
    }
}

// A tiny CLIP trained 3 iterations on drawn shapes with a large constant learning rate (so that the held-out numbers
// move between iterations), evaluated and saved after each; and a tiny GPT-2 trained one iteration and saved, for
// the checkpoints of the other family. Trained once for the suite.
class ClipEval : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = std::make_unique<TempDir>("ms_clip_eval");
        write_file(*dir_ / "empty.yaml", "");
        write_file(*dir_ / "gpt.yaml",
                   "schema_version: 1\n"
                   "model: {num_layers: 1, hidden_size: 16, num_attention_heads: 2, seq_length: 16}\n"
                   "training: {micro_batch_size: 2, global_batch_size: 2, train_iters: 1}\n"
                   "lr_schedule: {lr_warmup_iters: 0}\n"
                   "data: {source: synthetic, synthetic: {vocab_size: 32, num_tokens: 65536}}\n");
        const CliResult clip = run_cli("train" + clip_config() + " --set run.output_dir=" + dir_->path() +
                                       " --set checkpoint.save=" + clip_ckpt() +
                                       " --set checkpoint.save_interval=1 --set checkpoint.keep_latest_k=0"
                                       " --set eval.eval_interval=1");
        ASSERT_EQ(clip.exit_code, 0) << clip.output;
        clip_log_ = clip.output;
        const CliResult gpt = run_cli("train --config " + gpt_config() + " --set run.output_dir=" + (*dir_ / "gpt") +
                                      " --set checkpoint.save=" + gpt_ckpt());
        ASSERT_EQ(gpt.exit_code, 0) << gpt.output;
    }
    static void TearDownTestSuite() { dir_.reset(); }

    // The config of the CLIP run: the options after the command, for train and eval alike. With a cross-modal
    // layer, so that the held-out matching accuracy is compared too.
    static std::string clip_config() {
        return " --config " + (*dir_ / "empty.yaml") + kTiny +
               " --set data.source=shapes --set clip.eval_samples=32 --set optimizer.lr=0.02"
               " --set clip.cross_modal_layers=1"
               " --set lr_schedule.lr_warmup_iters=0 --set lr_schedule.lr_decay_style=constant";
    }
    static std::string clip_ckpt() { return *dir_ / "ckpt"; }
    static std::string gpt_config() { return *dir_ / "gpt.yaml"; }
    static std::string gpt_ckpt() { return *dir_ / "gpt/ckpt"; }

    // The trainer's eval records (logging.metrics_file), by iteration.
    static std::vector<nlohmann::json> trainer_records() {
        std::vector<nlohmann::json> records;
        std::ifstream f(*dir_ / "metrics.jsonl");
        for (std::string line; std::getline(f, line);) {
            const nlohmann::json j = nlohmann::json::parse(line);
            if (j.contains("eval")) records.push_back(j);
        }
        return records;
    }

    // The line of `log` from "held-out" to its end, after the line's `prefix`.
    static std::string held_out_line(const std::string& log, const std::string& prefix) {
        const size_t at = log.find(prefix + "held-out");
        if (at == std::string::npos) return "";
        const size_t from = at + prefix.size();
        return log.substr(from, log.find('\n', from) - from);
    }

    static std::unique_ptr<TempDir> dir_;
    static std::string clip_log_;
};

std::unique_ptr<TempDir> ClipEval::dir_;
std::string ClipEval::clip_log_;

TEST_F(ClipEval, JsonIsTheTrainersEvalRecordOfEachCheckpoint) {
    const std::vector<nlohmann::json> records = trainer_records();
    ASSERT_EQ(records.size(), 3u);
    for (const nlohmann::json& record : records) {
        const std::string iter_dir = fmt::format("{}/iter_{:07d}", clip_ckpt(), record["iteration"].get<int>());
        const CliStreams r = run_cli_streams("eval" + clip_config() + " --load " + iter_dir + " --json");
        ASSERT_EQ(r.exit_code, 0) << r.errors;
        nlohmann::json j = nlohmann::json::parse(r.output);  // the whole of stdout
        EXPECT_EQ(j["checkpoint"], iter_dir);
        j.erase("checkpoint");
        EXPECT_EQ(j, record);                    // every key and value, exactly: the same model, samples and arithmetic
        EXPECT_EQ(j.value("itm_pairs", 0), 96);  // 16 whole batches of 2 held-out samples, 3 pairs per sample
    }
    // the save directory: its latest checkpoint, and the trainer's line for it
    const CliResult latest = run_cli("eval" + clip_config() + " --load " + clip_ckpt());
    ASSERT_EQ(latest.exit_code, 0) << latest.output;
    const std::string line = held_out_line(latest.output, "eval: iteration 3 | ");
    EXPECT_NE(line, "") << latest.output;
    EXPECT_EQ(line, held_out_line(clip_log_, "iteration       3/      3 | ")) << clip_log_;
}

TEST_F(ClipEval, ConfigOfAnotherClipModelIsRefusedNamingTheKey) {
    const CliResult r =
        run_cli("eval" + clip_config() + " --set clip.vision_layers=3 --set clip.text_width=32 --load " + clip_ckpt());
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("clip.vision_layers is 3 in the config but 1 in the checkpoint"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("clip.text_width is 32 in the config but 16 in the checkpoint"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("--set clip.text_width=16 --set clip.vision_layers=1"), std::string::npos) << r.output;
}

TEST_F(ClipEval, CheckpointOfTheOtherFamilyIsRefusedNamingBoth) {
    const CliResult clip_with_gpt = run_cli("eval --config " + gpt_config() + " --load " + clip_ckpt());
    EXPECT_EQ(clip_with_gpt.exit_code, 2) << clip_with_gpt.output;
    EXPECT_NE(clip_with_gpt.output.find("describes a GPT-2 or Llama model (model.arch gpt)"), std::string::npos)
        << clip_with_gpt.output;
    EXPECT_NE(clip_with_gpt.output.find("holds a CLIP model (model.arch clip)"), std::string::npos)
        << clip_with_gpt.output;
    EXPECT_NE(clip_with_gpt.output.find("iter_0000003/config.resolved.yaml"), std::string::npos)
        << clip_with_gpt.output;

    const CliResult gpt_with_clip = run_cli("eval" + clip_config() + " --load " + gpt_ckpt());
    EXPECT_EQ(gpt_with_clip.exit_code, 2) << gpt_with_clip.output;
    EXPECT_NE(gpt_with_clip.output.find("describes a CLIP model (model.arch clip)"), std::string::npos)
        << gpt_with_clip.output;
    EXPECT_NE(gpt_with_clip.output.find("holds a GPT-2 or Llama model (model.arch gpt)"), std::string::npos)
        << gpt_with_clip.output;
}

TEST_F(ClipEval, LanguageModelFlagsAreRefused) {
    const CliResult r = run_cli("eval" + clip_config() + " --load " + clip_ckpt() + " --split test --iters 2");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("--split and --iters apply to GPT-2 and Llama checkpoints only"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("clip.eval_samples"), std::string::npos) << r.output;
}

// The presets' parameter counts, from the towers' own arithmetic: per block 4 C^2 + 4 C (attention) + 2 C F + F + C
// (MLP) + 4 C (two LayerNorms); the image tower adds the patch weights (C x 3 p^2), the class token, the positions
// ((S/p)^2 + 1 rows), two LayerNorms and the projection; the text tower the byte embedding (257 rows), the positions,
// one LayerNorm and the projection; and logit_scale.
int64_t clip_params(int64_t D, int64_t S, int64_t p, int64_t Lv, int64_t Cv, int64_t Lt, int64_t Ct, int64_t T) {
    const auto block = [](int64_t C) { return 4 * C * C + 4 * C + 2 * C * 4 * C + 4 * C + C + 4 * C; };
    const int64_t vision = Cv * 3 * p * p + Cv + ((S / p) * (S / p) + 1) * Cv + 4 * Cv + Lv * block(Cv) + D * Cv;
    const int64_t text = 257 * Ct + T * Ct + 2 * Ct + Lt * block(Ct) + D * Ct;
    return vision + text + 1;
}

TEST(ClipCli, PlanPrintsThePresetsSizes) {
    const std::vector<std::pair<std::string, int64_t>> presets = {
        {"tiny", clip_params(64, 32, 8, 2, 64, 2, 64, 48)},
        {"vit-b16", clip_params(512, 224, 16, 12, 768, 12, 512, 77)},
        {"vit-h14", clip_params(1024, 224, 14, 32, 1280, 24, 1024, 77)},
    };
    for (const auto& [preset, params] : presets) {
        const CliResult r = run_cli("plan --set model.arch=clip --set data.source=shapes --set clip.preset=" + preset +
                                    " --set parallel.tensor_model_parallel_size=2 --world-size 4");
        ASSERT_EQ(r.exit_code, 0) << r.output;
        // appended piecewise: GCC 12's -Wrestrict misreads " " + std::string here
        const std::string count = std::string(" ").append(std::to_string(params)).append(" parameters");
        EXPECT_NE(r.output.find(count), std::string::npos) << preset << " should have " << params << " parameters:\n"
                                                           << r.output;
        EXPECT_NE(r.output.find("world 4 = tp 2 x dp 2"), std::string::npos) << r.output;
        EXPECT_NE(r.output.find("image tower activations"), std::string::npos) << r.output;
    }
}

}  // namespace
}  // namespace ms::test
