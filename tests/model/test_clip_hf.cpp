// test_clip_hf.cpp: the Hugging Face CLIPModel export (engine/clip/hf_clip.h) of a tiny CLIP model on one rank: the
// file's names, shapes and bytes; the features and loss of a pure-PyTorch CLIPModel read from the export
// (tests/e2e/hf_clip_reference.py, float64) against ClipModel::encode and clip::ContrastiveLoss; and the refusal of
// a table that is not the clip shape's.
//
// Files in the test's directory: hf/ (the export), pixels.bin float32 (b, 3, S, S), tokens.bin int32 (b, T); the
// script writes image_features.bin, text_features.bin float64 (b, D) and loss.txt.
//
// Every LayerNorm and bias is moved off its constant init and the logit scale off the config's, so that a tensor
// exported under the wrong name (pre_layrnorm for post_layernorm, one bias for another) changes the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "engine/ckpt/safetensors.h"
#include "engine/clip/clip_model.h"
#include "engine/clip/hf_clip.h"
#include "engine/core/check.h"
#include "engine/core/philox.h"
#include "tests/common/binary_files.h"
#include "tests/common/temp_dir.h"
#include "tests/common/tiny_clip.h"
#include "tests/e2e/hf_checks.h"
#include "tests/ops/op_test_util.h"

namespace ms {
namespace {

namespace fs = std::filesystem;

constexpr int kB = 4;
constexpr uint64_t kSeed = 21;
constexpr float kInitStd = 0.15f;
// Below log(max_logit_scale) = log(100), where our loss clamps the scale and transformers' does not.
constexpr float kLogitScale = 3.1f;

// Two layers per tower; heads of 8 (image) and 4 (text) columns; MLP widths that are not 4 * width (so
// intermediate_size is read, not assumed); a 3 x 3 grid of 4 x 4 patches; projections of 12 columns.
constexpr test::TinyClipSizes kSizes{.embed_dim = 12,
                                     .image_size = 12,
                                     .vision_width = 24,
                                     .vision_heads = 3,
                                     .vision_mlp = 40,
                                     .context_length = 12,
                                     .text_heads = 4,
                                     .text_mlp = 36};

// Pixels ~ N(0, 1); captions of 1, 4, 7 and 15 bytes (the last cut to context - 1, its end-of-text the last row).
ClipBatch random_batch(const ClipShape& s) {
    const int lengths[kB] = {1, 4, 7, 15};
    std::vector<std::string> captions(kB);
    for (int i = 0; i < kB; ++i)
        for (int k = 0; k < lengths[i]; ++k) captions[i] += static_cast<char>(' ' + (7 * i + 13 * k) % 95);
    return test::clip_batch(s, kSeed, captions);
}

struct TinyClip : test::OneRankClip {
    // LayerNorm gains 1 + 0.1 n, biases 0.05 n (n ~ N(0, 1), a stream per tensor), logit_scale kLogitScale.
    TinyClip() : OneRankClip(test::tiny_clip_shape(kSizes), kB) {
        model.init_weights(kSeed, kInitStd);
        for (const ParamInfo& p : model.params_info()) {
            float* w = model.params() + p.offset;
            if (p.name == "logit_scale") {
                w[0] = kLogitScale;
            } else if (p.init == InitKind::kConstant) {
                const float amp = p.init_value == 1.0f ? 0.1f : 0.05f;
                for (int64_t i = 0; i < p.numel; ++i) w[i] += amp * philox_normal(kSeed, name_hash(p.name) ^ 7u, i);
            }
        }
    }
};

const ParamInfo& find(const std::vector<ParamInfo>& table, const std::string& name) {
    const auto it = std::find_if(table.begin(), table.end(), [&](const ParamInfo& p) { return p.name == name; });
    MS_CHECK(it != table.end(), "no parameter '{}'", name);
    return *it;
}

TEST(ClipHf, WritesEveryTensorUnderItsClipModelNameAndShape) {
    TinyClip c;
    const test::TempDir dir("ms_clip_hf");
    const std::vector<ParamInfo>& table = c.model.params_info();
    const HfExport out = write_hf_clip(c.shape, table, clip_flat_tensors(c.model.params()), dir / "hf");
    EXPECT_EQ(out.files, (std::vector<std::string>{"model.safetensors", "config.json"}));

    const SafetensorsFile f = SafetensorsFile::open(dir / "hf/model.safetensors");
    EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
    ASSERT_EQ(f.names().size(), table.size());  // no position_ids buffers
    const int64_t C = c.shape.vision.C, p = c.shape.vision.patch;
    EXPECT_EQ(f.info("vision_model.embeddings.class_embedding").shape, (std::vector<int64_t>{C}));
    EXPECT_EQ(f.info("vision_model.embeddings.patch_embedding.weight").shape, (std::vector<int64_t>{C, 3, p, p}));
    EXPECT_EQ(f.info("logit_scale").shape, std::vector<int64_t>{});
    EXPECT_EQ(f.info("text_model.encoder.layers.1.mlp.fc1.weight").shape, (std::vector<int64_t>{36, 16}));
    int64_t params = 0;
    for (const ParamInfo& q : table) {
        ASSERT_TRUE(f.contains(q.name)) << q.name;
        ASSERT_EQ(f.info(q.name).dtype_name, "F32") << q.name;
        ASSERT_EQ(f.info(q.name).numel(), q.numel) << q.name;
        EXPECT_EQ(std::memcmp(f.data(q.name), c.model.params() + q.offset, static_cast<size_t>(q.numel) * 4), 0)
            << q.name << ": the file's bytes are not the model's";
        params += q.numel;
    }
    EXPECT_EQ(out.params, params);

    std::ifstream config_file(dir / "hf/config.json");
    const nlohmann::json config = nlohmann::json::parse(config_file);
    EXPECT_EQ(config["model_type"], "clip");
    EXPECT_EQ(config["projection_dim"], 12);
    EXPECT_EQ(config["logit_scale_init_value"].get<double>(), 2.65926);  // the config's init, as set
    EXPECT_EQ(config["text_config"]["eos_token_id"], kClipEndOfText);
    EXPECT_EQ(config["text_config"]["vocab_size"], kClipTextVocab);
    EXPECT_EQ(config["text_config"]["intermediate_size"], 36);
    EXPECT_EQ(config["text_config"]["layer_norm_eps"].get<double>(), 1e-5);
    EXPECT_EQ(config["vision_config"]["hidden_act"], "gelu_new");
    EXPECT_EQ(config["vision_config"]["image_size"], 12);
}

// Measured over seeds 1..5 and 21 (kSeed: weights, pixels; OMP_NUM_THREADS=2; this shape and batch): the fp32
// features were at most 2.6e-7 of the largest feature from the float64 reference (image) and 2.4e-7 (text), the loss
// at most 2.4e-7 of itself (losses of 2.5 to 5.0, where that is about 2.5 float32 ulps). The tolerances are ~8x
// that. Mistakes in the mapping sit far above them: the exact (erf) GELU
// in place of the tanh one moves the features by 8e-5 and 3e-4, a transposed patch kernel, the wrong pooled row or
// norm by 1e-1 and more.
constexpr double kTolImage = 2e-6;  // max |d feature| / max |feature|
constexpr double kTolText = 2e-6;
constexpr double kTolLoss = 2e-6;  // |d loss| / loss

TEST(ClipHf, TorchClipModelFromTheExportMatchesFeaturesAndLoss) {
    const std::string python = MS_SYSTEM_PYTHON;
    if (python.empty() || python.find("NOTFOUND") != std::string::npos)
        GTEST_SKIP() << "no system python3 was found at configure time (MS_SYSTEM_PYTHON)";
    TinyClip c;
    const ClipShape& s = c.shape;
    const ClipBatch batch = random_batch(s);
    std::vector<float> image, text;
    c.model.encode(batch, image, text);
    SelfCommunicator dp("dp");
    clip::ContrastiveLoss loss_fn(kB, s.embed_dim, dp, s.max_logit_scale);
    const clip::ContrastiveLossResult loss = loss_fn.forward(image, text, c.model.logit_scale_param());
    ASSERT_FALSE(loss.logit_scale_clamped);

    const test::TempDir dir("ms_clip_hf");
    write_hf_clip(s, c.model.params_info(), clip_flat_tensors(c.model.params()), dir / "hf");
    test::write_bin(dir / "pixels.bin", batch.pixels);
    test::write_bin(dir / "tokens.bin", batch.tokens);
    const int rc = test::run_python(python, test::quoted(MS_SOURCE_DIR "/tests/e2e/hf_clip_reference.py") + " " +
                                                test::quoted(dir / "hf") + " " + test::quoted(dir.path()));
    if (rc == 77) GTEST_SKIP() << "PyTorch and numpy are not importable by " << python << " (install python3-torch)";
    ASSERT_EQ(rc, 0) << "hf_clip_reference.py failed (its output is above)";

    const size_t n = static_cast<size_t>(kB) * s.embed_dim;
    const std::vector<double> ref_image = test::read_bin<double>(dir / "image_features.bin", n);
    const std::vector<double> ref_text = test::read_bin<double>(dir / "text_features.bin", n);
    double ref_loss = 0;
    std::ifstream(dir / "loss.txt") >> ref_loss;
    const double e_image = test::max_rel_error(image, ref_image), e_text = test::max_rel_error(text, ref_text);
    const double e_loss = std::abs(loss.loss - ref_loss) / ref_loss;
    std::printf("ClipHf vs float64 torch: image %.2e, text %.2e (of the largest feature), loss %.2e (of %.6f)\n",
                e_image, e_text, e_loss, ref_loss);
    EXPECT_LT(e_image, kTolImage);
    EXPECT_LT(e_text, kTolText);
    EXPECT_LT(e_loss, kTolLoss);
}

// Exports `table` against `shape` and returns the UserError's message (empty when nothing is thrown); the tensors
// must not be read and the directory must not be made.
std::string refusal(const ClipShape& shape, const std::vector<ParamInfo>& table) {
    const test::TempDir dir("ms_clip_hf");
    const ClipTensorSource never = [](const ParamInfo& p) {
        ADD_FAILURE() << "read '" << p.name << "' of a refused table";
        return std::vector<float>();
    };
    std::string message;
    try {
        write_hf_clip(shape, table, never, dir / "hf");
    } catch (const UserError& e) {
        message = e.what();
    }
    EXPECT_FALSE(fs::exists(dir / "hf"));
    return message;
}

TEST(ClipHf, RefusesATableThatIsNotTheClipShapes) {
    TinyClip c;
    const std::vector<ParamInfo>& table = c.model.params_info();

    test::TinyClipSizes wider = kSizes;  // the tiny shape with a wider image MLP
    wider.vision_mlp = 48;
    const std::string shape_error = refusal(test::tiny_clip_shape(wider), table);
    EXPECT_NE(shape_error.find("config error: the model to export is not the CLIP model the clip section describes "
                               "(embed_dim 12; image tower: 2 layers of width 24, 3 heads, MLP 48"),
              std::string::npos)
        << shape_error;
    EXPECT_NE(shape_error.find("its tensor 'vision_model.encoder.layers.0.mlp.fc1.weight' has shape [40,24] where "
                               "that model's has [48,24]"),
              std::string::npos)
        << shape_error;
    EXPECT_NE(shape_error.find("HINT: export with the clip section the model was trained with"), std::string::npos);

    std::vector<ParamInfo> missing = table;
    missing.pop_back();
    EXPECT_NE(refusal(c.shape, missing).find("it lacks the tensor 'logit_scale' (shape [1])"), std::string::npos);

    std::vector<ParamInfo> renamed = table;
    renamed[0].name = "vision_model.embeddings.class_embeddings";
    EXPECT_NE(
        refusal(c.shape, renamed)
            .find("it holds the tensor 'vision_model.embeddings.class_embeddings', which that model does not have"),
        std::string::npos);

    std::vector<ParamInfo> twice = table;
    twice.push_back(find(table, "text_projection.weight"));
    EXPECT_NE(refusal(c.shape, twice).find("it holds the tensor 'text_projection.weight' twice"), std::string::npos);
}

}  // namespace
}  // namespace ms
