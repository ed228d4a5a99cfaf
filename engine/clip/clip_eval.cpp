// clip_eval.cpp: the image-text data of a CLIP run, its held-out evaluation, and `eval` for a CLIP checkpoint
// (clip_eval.h).
#include "engine/clip/clip_eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "comm/process_groups.h"
#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/clip/clip_checkpoint.h"
#include "engine/clip/clip_layout.h"
#include "engine/core/check.h"
#include "engine/core/log.h"

namespace ms {
namespace {

// The size of the drawn shapes' training split: more samples than any run consumes, so none repeats (a drawn sample
// is a pure function of the seed, the split and its index). The count is part of the source's fingerprint, so of the
// training order and of the checkpoints' data identity.
constexpr int64_t kShapesTrainSamples = int64_t{1} << 30;

// The checkpoint's model must be the config's. The manifests clip_checkpoint_model writes for the two shapes are the
// resolved clip: sections (clip_checkpoint.h), so each key that differs is named as the clip: key it is.
void check_same_clip_model(const CheckpointReader& reader, const ClipShape& saved, const ClipShape& configured,
                           const std::string& config_name) {
    const nlohmann::json theirs = clip_checkpoint_model(saved).manifest,
                         mine = clip_checkpoint_model(configured).manifest;
    const auto text = [](const nlohmann::json& v) {
        return v.is_number_float() ? fmt::format("{}", v.get<float>()) : v.dump();
    };
    std::vector<std::string> differences, sets;
    for (const auto& [key, value] : mine.items()) {
        const nlohmann::json& saved_value = theirs.at(key);
        if (saved_value == value) continue;
        differences.push_back(
            fmt::format("clip.{} is {} in the config but {} in the checkpoint", key, text(value), text(saved_value)));
        sets.push_back(fmt::format("--set clip.{}={}", key, text(saved_value)));
    }
    if (differences.empty()) return;
    throw UserError(fmt::format(
        "config error: the config {} describes another CLIP model than '{}' holds: {}\n---> HINT: evaluate it with the "
        "config of the run that saved it (--config {}/{}), or give the config the checkpoint's clip: settings ({}), "
        "or pass a checkpoint of the model the config describes",
        config_name, reader.dir(), fmt::join(differences, "; "), reader.dir(), kResolvedConfigFile,
        fmt::join(sets, " ")));
}

}  // namespace

std::unique_ptr<ImageTextSource> open_clip_source(const Config& cfg, const ClipShape& shape, ClipSplit split) {
    const bool held_out = split == ClipSplit::kHeldOut;
    if (cfg.data.source == "shapes")
        return open_synthetic_shapes(cfg.data.synthetic.seed, held_out ? cfg.clip.eval_samples : kShapesTrainSamples,
                                     held_out ? 1 : 0);
    const std::vector<std::string>& paths = held_out ? cfg.clip.eval_data_path : cfg.data.data_path;
    if (paths.empty())
        throw UserError(
            held_out ? "config error: data.source webdataset needs clip.eval_data_path: the held-out shards zero-shot "
                       "accuracy and recall are measured on"
                     : "config error: data.source webdataset needs data.data_path: the training shards (.tar)");
    return open_webdataset(paths, {.min_side = shape.vision.patch, .skip_bad_samples = cfg.clip.skip_bad_samples});
}

void read_clip_sample(const ImageTextSource& source, int64_t index, int S, ImageTextSample& out) {
    for (int64_t k = 0; k < source.size(); ++k)
        if (source.read((index + k) % source.size(), S, out)) return;
    throw UserError(fmt::format("data: every sample of {} is bad", source.describe()));
}

ClipBatch empty_clip_batch(const ClipShape& shape, int b) {
    const int S = shape.image_size();
    ClipBatch batch;
    batch.b = b;
    batch.pixels.assign(static_cast<size_t>(b) * 3 * S * S, 0.0f);
    batch.tokens.assign(static_cast<size_t>(b) * shape.text.T, kClipPad);
    batch.end_of_text.assign(static_cast<size_t>(b), 0);
    return batch;
}

void add_to_clip_batch(ClipBatch& batch, int i, const ImageTextSample& s, const ClipShape& shape) {
    const int S = shape.image_size(), T = shape.text.T;
    std::copy(s.pixels.begin(), s.pixels.end(), batch.pixels.begin() + static_cast<int64_t>(i) * 3 * S * S);
    batch.end_of_text[static_cast<size_t>(i)] =
        clip_tokenize(s.caption, T, batch.tokens.data() + static_cast<int64_t>(i) * T);
}

ClipHeldOut evaluate_held_out(ClipModel& model, const ImageTextSource& held_out, const ClipConfig& cc, int b) {
    const ClipShape& shape = model.shape();
    const int64_t n = std::min<int64_t>(cc.eval_samples, held_out.size()), D = shape.embed_dim;
    std::vector<float> image(static_cast<size_t>(n * D)), text(static_cast<size_t>(n * D)), fi, ft;
    std::vector<int32_t> labels(static_cast<size_t>(n), -1);
    clip::ItmLossResult matching;  // sums over the whole batches
    int64_t matched_batches = 0;
    ImageTextSample s;
    for (int64_t first = 0; first < n; first += b) {
        ClipBatch batch = empty_clip_batch(shape, b);
        const int64_t count = std::min<int64_t>(b, n - first);
        for (int64_t i = 0; i < count; ++i) {
            read_clip_sample(held_out, first + i, shape.image_size(), s);
            add_to_clip_batch(batch, static_cast<int>(i), s, shape);
            labels[static_cast<size_t>(first + i)] = s.label;
        }
        model.encode(batch, fi, ft);
        std::copy_n(fi.begin(), count * D, image.begin() + first * D);
        std::copy_n(ft.begin(), count * D, text.begin() + first * D);
        if (shape.cross_modal() && count == b) {
            const clip::ItmLossResult m = model.evaluate_matching(batch, fi, ft, {.first_sample = first});
            matching.loss += m.loss;
            matching.accuracy += m.accuracy;
            ++matched_batches;
        }
    }
    ClipHeldOut h;
    h.samples = n;
    if (matched_batches > 0) {
        h.matching = {.loss = matching.loss / static_cast<float>(matched_batches),
                      .accuracy = matching.accuracy / static_cast<float>(matched_batches)};
        h.matching_pairs = 3 * int64_t{b} * matched_batches;
    }
    const std::vector<int64_t> ks = {1, 5};
    h.recall = clip::recall_at_k(image, text, n, D, ks);
    const std::vector<std::string>& classes = held_out.classes();
    if (classes.empty()) return h;
    const int64_t k = static_cast<int64_t>(classes.size()), m = static_cast<int64_t>(cc.templates.size());
    std::vector<float> prompts(static_cast<size_t>(k * m * D));
    ClipBatch batch = empty_clip_batch(shape, b);
    for (int64_t first = 0; first < k * m; first += b) {
        const int64_t count = std::min<int64_t>(b, k * m - first);
        for (int64_t i = 0; i < count; ++i) {
            const int64_t c = (first + i) / m, t = (first + i) % m;
            std::string caption = cc.templates[static_cast<size_t>(t)];
            const size_t at = caption.find("{}");
            if (at != std::string::npos) caption.replace(at, 2, classes[static_cast<size_t>(c)]);
            batch.end_of_text[static_cast<size_t>(i)] =
                clip_tokenize(caption, shape.text.T, batch.tokens.data() + i * shape.text.T);
        }
        model.encode_texts(batch, ft);
        std::copy_n(ft.begin(), count * D, prompts.begin() + first * D);
    }
    const std::vector<float> class_features = clip::ensemble_class_features(prompts, k, m, D);
    h.zero_shot = clip::zero_shot_accuracy(image, labels, class_features, n, k, D);
    return h;
}

std::string describe_held_out(const ClipHeldOut& h) {
    std::string s = fmt::format("held-out {} samples:", h.samples);
    if (h.zero_shot.count > 0) {
        s += fmt::format(" zero-shot top-1 {:.2f}%", 100.0 * h.zero_shot.top1());
        if (const auto top5 = h.zero_shot.top5()) s += fmt::format(" top-5 {:.2f}%", 100.0 * *top5);
        s += fmt::format(" ({} labelled images) |", h.zero_shot.count);
    }
    for (const clip::RetrievalRecall& r : h.recall)
        s += fmt::format(" image->text R@{} {:.2f}% text->image R@{} {:.2f}% |", r.k, 100.0 * r.image_to_text, r.k,
                         100.0 * r.text_to_image);
    if (h.matching_pairs > 0)
        s += fmt::format(" matching accuracy {:.2f}% ({} pairs) |", 100.0 * h.matching.accuracy, h.matching_pairs);
    s.pop_back();
    return s;
}

nlohmann::json held_out_record(const ClipHeldOut& h, int64_t iteration) {
    nlohmann::json j = {{"eval", true}, {"iteration", iteration}, {"samples", h.samples}};
    if (h.zero_shot.count > 0) {
        j["zero_shot_top1"] = h.zero_shot.top1();
        if (const auto top5 = h.zero_shot.top5()) j["zero_shot_top5"] = *top5;
    }
    for (const clip::RetrievalRecall& r : h.recall) {
        j[fmt::format("image_to_text_r{}", r.k)] = r.image_to_text;
        j[fmt::format("text_to_image_r{}", r.k)] = r.text_to_image;
    }
    if (h.matching_pairs > 0) {
        j["itm_accuracy"] = h.matching.accuracy;
        j["itm_loss"] = h.matching.loss;
        j["itm_pairs"] = h.matching_pairs;
    }
    return j;
}

nlohmann::json run_clip_eval(Config cfg, const CheckpointReader& reader, const std::string& config_name) {
    cfg.parallel = ParallelConfig{};     // one rank, the whole model
    cfg.training.global_batch_size = 0;  // one rank's global batch: its micro-batch
    const ClipLayout l = clip_layout(cfg, 1);
    check_same_clip_model(reader, clip_checkpoint_shape(reader), l.shape, config_name);
    const std::unique_ptr<ImageTextSource> held_out = open_clip_source(cfg, l.shape, ClipSplit::kHeldOut);
    log_info("eval: {} (iteration {}), a CLIP model of {} parameters ({}), on held-out {}: {} samples in batches of {}",
             reader.dir(), reader.iteration(), l.num_params, dtype_name(l.dtype), held_out->describe(),
             std::min<int64_t>(cfg.clip.eval_samples, held_out->size()), l.b);

    BackendOptions bo;  // the CPU backend: `eval` is a single-process tool
    bo.num_threads = cfg.run.num_threads;
    const std::unique_ptr<Backend> backend = make_backend(bo);
    SelfCommunicator world("world");
    const ProcessGroups groups = make_process_groups(world, Topology{});
    ClipModel model(l.shape, *backend, groups, l.b, l.dtype, cfg.clip.itm_weight);
    for (const ParamInfo& p : model.params_info())  // tp 1: each parameter is its whole canonical tensor
        reader.read_box(p.name, std::nullopt, shard_box(p, 0, 1), 0, p.numel, model.params() + p.offset);
    model.refresh_weights();  // the fp32 values rounded into the 16-bit weights the ops read, as a resume does

    const ClipHeldOut h = evaluate_held_out(model, *held_out, cfg.clip, l.b);
    log_info("eval: iteration {} | {}", reader.iteration(), describe_held_out(h));
    nlohmann::json record = held_out_record(h, reader.iteration());
    record["checkpoint"] = reader.dir();
    return record;
}

}  // namespace ms
