// clip_train.cpp: `train` for model.arch: clip (clip_train.h): the layout, the data, the checkpoints, the step loop and
// the held-out evaluation.
#include "engine/clip/clip_train.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "comm/bootstrap.h"
#include "comm/process_groups.h"
#include "engine/backends/backend.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/clip/clip_checkpoint.h"
#include "engine/clip/clip_layout.h"
#include "engine/clip/clip_model.h"
#include "engine/clip/retrieval.h"
#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/core/timer.h"
#include "engine/data/image_text.h"
#include "engine/optim/adamw.h"
#include "engine/optim/distributed_optimizer.h"
#include "engine/train/metrics_log.h"
#include "engine/train/run_layout.h"
#include "engine/train/train_setup.h"

namespace ms {
namespace {

// The held-out samples a synthetic source draws (a fixed set, apart from the training stream).
constexpr int64_t kShapesTrainSamples = int64_t{1} << 30;

[[noreturn]] void refuse(const std::string& msg) { throw UserError("config error: " + msg); }

std::unique_ptr<ImageTextSource> open_source(const Config& cfg, const ClipShape& shape, bool held_out) {
    if (cfg.data.source == "shapes")
        return open_synthetic_shapes(cfg.data.synthetic.seed, held_out ? cfg.clip.eval_samples : kShapesTrainSamples,
                                     held_out ? 1 : 0);
    const std::vector<std::string>& paths = held_out ? cfg.clip.eval_data_path : cfg.data.data_path;
    if (paths.empty())
        refuse(held_out
                   ? "data.source webdataset needs clip.eval_data_path: the held-out shards zero-shot accuracy and "
                     "recall are measured on"
                   : "data.source webdataset needs data.data_path: the training shards (.tar)");
    return open_webdataset(paths, {.min_side = shape.vision.patch, .skip_bad_samples = cfg.clip.skip_bad_samples});
}

// Sample `index` of `source`, or the ones after it while a bad sample is skipped (skip_bad_samples): the order stays a
// function of the data and the index.
void read_sample(const ImageTextSource& source, int64_t index, int S, ImageTextSample& out) {
    for (int64_t k = 0; k < source.size(); ++k)
        if (source.read((index + k) % source.size(), S, out)) return;
    throw UserError(fmt::format("data: every sample of {} is bad", source.describe()));
}

void add_to_batch(ClipBatch& batch, int i, const ImageTextSample& s, const ClipShape& shape) {
    const int S = shape.image_size(), T = shape.text.T;
    std::copy(s.pixels.begin(), s.pixels.end(), batch.pixels.begin() + static_cast<int64_t>(i) * 3 * S * S);
    batch.end_of_text[static_cast<size_t>(i)] =
        clip_tokenize(s.caption, T, batch.tokens.data() + static_cast<int64_t>(i) * T);
}

ClipBatch empty_batch(const ClipShape& shape, int b) {
    const int S = shape.image_size();
    ClipBatch batch;
    batch.b = b;
    batch.pixels.assign(static_cast<size_t>(b) * 3 * S * S, 0.0f);
    batch.tokens.assign(static_cast<size_t>(b) * shape.text.T, kClipPad);
    batch.end_of_text.assign(static_cast<size_t>(b), 0);
    return batch;
}

struct HeldOut {
    clip::ZeroShotAccuracy zero_shot;
    std::vector<clip::RetrievalRecall> recall;  // @1, @5
    int64_t samples = 0;
};

// Zero-shot accuracy and recall on the held-out samples. Every data-parallel replica computes all of it (the set is
// small), so no rank waits for another's features.
HeldOut evaluate(ClipModel& model, const ImageTextSource& held_out, const ClipConfig& cc, int b) {
    const ClipShape& shape = model.shape();
    const int64_t n = std::min<int64_t>(cc.eval_samples, held_out.size()), D = shape.embed_dim;
    std::vector<float> image(static_cast<size_t>(n * D)), text(static_cast<size_t>(n * D)), fi, ft;
    std::vector<int32_t> labels(static_cast<size_t>(n), -1);
    ImageTextSample s;
    for (int64_t first = 0; first < n; first += b) {
        ClipBatch batch = empty_batch(shape, b);
        const int64_t count = std::min<int64_t>(b, n - first);
        for (int64_t i = 0; i < count; ++i) {
            read_sample(held_out, first + i, shape.image_size(), s);
            add_to_batch(batch, static_cast<int>(i), s, shape);
            labels[static_cast<size_t>(first + i)] = s.label;
        }
        model.encode(batch, fi, ft);
        std::copy_n(fi.begin(), count * D, image.begin() + first * D);
        std::copy_n(ft.begin(), count * D, text.begin() + first * D);
    }
    HeldOut h;
    h.samples = n;
    const std::vector<int64_t> ks = {1, 5};
    h.recall = clip::recall_at_k(image, text, n, D, ks);
    const std::vector<std::string>& classes = held_out.classes();
    if (classes.empty()) return h;
    const int64_t k = static_cast<int64_t>(classes.size()), m = static_cast<int64_t>(cc.templates.size());
    std::vector<float> prompts(static_cast<size_t>(k * m * D));
    ClipBatch batch = empty_batch(shape, b);
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

std::string describe(const HeldOut& h) {
    std::string s = fmt::format("held-out {} samples:", h.samples);
    if (h.zero_shot.count > 0) {
        s += fmt::format(" zero-shot top-1 {:.2f}%", 100.0 * h.zero_shot.top1());
        if (const auto top5 = h.zero_shot.top5()) s += fmt::format(" top-5 {:.2f}%", 100.0 * *top5);
        s += fmt::format(" ({} labelled images) |", h.zero_shot.count);
    }
    for (const clip::RetrievalRecall& r : h.recall)
        s += fmt::format(" image->text R@{} {:.2f}% text->image R@{} {:.2f}% |", r.k, 100.0 * r.image_to_text, r.k,
                         100.0 * r.text_to_image);
    s.pop_back();
    return s;
}

nlohmann::json to_json(const HeldOut& h) {
    nlohmann::json j = {{"samples", h.samples}};
    if (h.zero_shot.count > 0) {
        j["zero_shot_top1"] = h.zero_shot.top1();
        if (const auto top5 = h.zero_shot.top5()) j["zero_shot_top5"] = *top5;
    }
    for (const clip::RetrievalRecall& r : h.recall) {
        j[fmt::format("image_to_text_r{}", r.k)] = r.image_to_text;
        j[fmt::format("text_to_image_r{}", r.k)] = r.text_to_image;
    }
    return j;
}

// What train_state.json records at the end of iteration `it`, `consumed` samples in (save_checkpoint adds the
// optimizer's step count and the schedule's inputs). A CLIP step is never skipped: a non-finite loss ends the run.
TrainState train_state(const Config& cfg, int64_t it, int64_t consumed, const std::string& data_id,
                       const ImageTextSource& source) {
    TrainState t;
    t.iteration = it;
    t.consumed_samples = consumed;
    t.last_lr = learning_rate(cfg.optimizer, cfg.lr_schedule, cfg.training.train_iters, it);
    t.seed = cfg.run.seed;
    t.data_fingerprint = data_id;
    t.data_describe = source.describe();
    return t;
}

// Checkpoints as the GPT trainer's setup_checkpoint opens them: checkpoint.save writable with room, locked for the run
// and cleared of crashed saves' leftovers; then the resume from checkpoint.load in whatever layout saved it (the
// whole data state is the consumed-sample count: ImageTextOrder is a pure function of the global sample index); then
// no save of this run may replace a committed checkpoint. Every rank agrees on each.
struct ClipCheckpoints {
    std::unique_ptr<SaveDirLock> save_lock;  // held until the run ends
    std::optional<TrainState> resumed;       // what checkpoint.load held
};

ClipCheckpoints open_checkpoints(const CheckpointContext& ckpt, Communicator& world, ClipModel& model,
                                 const std::string& data_id) {
    ClipCheckpoints c;
    on_every_rank_or_none(world, "use checkpoint.save", [&] { c.save_lock = open_save_dir(ckpt); });
    c.resumed = load_checkpoint(ckpt, data_id);
    on_every_rank_or_none(world, "use checkpoint.save",
                          [&] { check_no_newer_checkpoint(ckpt, c.resumed ? c.resumed->iteration : 0); });
    if (c.resumed) model.refresh_weights();  // the loaded master weights, rounded into the 16-bit ones (no-op in fp32)
    return c;
}

// logging.metrics_file on the writing rank: a resume continues it, without the lines logged past the checkpoint.
std::ofstream open_metrics(const Config& cfg, const std::optional<TrainState>& resumed) {
    std::ofstream metrics;
    const std::filesystem::path path(cfg.logging.metrics_file);
    if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
    if (resumed) {
        const MetricsTrim trim = trim_metrics_log(path.string(), resumed->iteration);
        if (trim.dropped > 0)
            log_info("metrics: dropped {} line(s) of {} logged after iteration {} (they are trained again)",
                     trim.dropped, path.string(), resumed->iteration);
    }
    metrics.open(path, resumed ? std::ios::app : std::ios::trunc);
    if (!metrics) throw UserError(fmt::format("cannot write logging.metrics_file '{}'", path.string()));
    return metrics;
}

}  // namespace

int run_clip_train(const Config& cfg) {
    const double t_start = now_seconds();
    MpiRuntime mpi;
    Communicator& world = mpi.world();
    const ClipLayout l = clip_layout(cfg, world.size());
    if (cfg.run.backend != "cpu")
        refuse(
            "model.arch: clip runs on run.backend: cpu (its image patches are written from the host into memory "
            "the CUDA backend does not map); hint: set run.backend: cpu");
    ProcessGroups groups = make_process_groups(world, Topology{.tp = l.tp, .dp = l.dp, .pp = 1});
    BackendOptions bo;
    bo.num_threads = cfg.run.num_threads;
    bo.local_rank = mpi.local_rank();
    std::unique_ptr<Backend> backend = make_backend(bo);

    const std::unique_ptr<ImageTextSource> train = open_source(cfg, l.shape, false);
    const std::unique_ptr<ImageTextSource> held_out = open_source(cfg, l.shape, true);
    const ImageTextOrder order(*train, cfg.run.seed);
    ClipModel model(l.shape, *backend, groups, l.b, l.dtype);
    model.init_weights(cfg.run.seed, cfg.model.init_method_std);
    DistributedOptimizer optimizer(model.params_info(), model.flat_size(), model.params(), model.grads(), cfg.optimizer,
                                   cfg.parallel.zero_stage, *backend, *groups.dp, *groups.mp, groups.tp_rank, nullptr,
                                   l.dtype == DType::kF32 ? nullptr : model.weights(), l.dtype, DType::kF32);
    log_clip_layout(l);
    log_info("clip: data {}; held-out {}", train->describe(), held_out->describe());

    const CheckpointContext ckpt{.cfg = cfg,
                                 .model = clip_checkpoint_model(l.shape),
                                 .groups = groups,
                                 .params_info = model.params_info(),
                                 .params = model.params(),
                                 .optimizer = optimizer};
    // the captions' tokens stand for a language model's sequence length in the data identity
    const std::string data_id = data_fingerprint(train->fingerprint(), cfg.data, l.shape.text.T, cfg.run.seed);
    const ClipCheckpoints checkpoints = open_checkpoints(ckpt, world, model, data_id);
    const std::optional<TrainState>& resumed = checkpoints.resumed;

    const bool writer = world.rank() == 0;
    std::ofstream metrics;
    if (writer && !cfg.logging.metrics_file.empty()) metrics = open_metrics(cfg, resumed);
    ClipBatch batch = empty_batch(l.shape, l.b);
    ImageTextSample sample;
    const int64_t iters = cfg.training.train_iters;
    const int64_t first_it = resumed ? resumed->iteration + 1 : 1;
    int64_t consumed = resumed ? resumed->consumed_samples : 0;  // samples of the global batches trained
    if (first_it > iters)
        log_info("training: the checkpoint is at iteration {}, training.train_iters is {}: nothing left to train",
                 first_it - 1, iters);
    double interval_start = now_seconds();
    int64_t interval_steps = 0;
    for (int64_t it = first_it; it <= iters; ++it) {
        const int64_t first = consumed + int64_t{groups.dp_rank} * l.b;
        consumed += l.global_batch;
        // each rank reads its own samples: a bad one stops every rank with its sentence, none waits for it
        on_every_rank_or_none(world, "read its samples", [&] {
            for (int i = 0; i < l.b; ++i) {
                read_sample(*train, order.sample_at(first + i), l.shape.image_size(), sample);
                add_to_batch(batch, i, sample, l.shape);
            }
        });
        const ClipStepResult r = model.train_step(batch);
        const float lr = learning_rate(cfg.optimizer, cfg.lr_schedule, iters, it);
        const OptimizerStepResult step = optimizer.step(lr, cfg.training.clip_grad);
        if (!std::isfinite(r.loss.loss) || !step.stepped)
            throw RunError(fmt::format("iteration {}: the loss ({}) or the gradient norm ({}) is not finite", it,
                                       r.loss.loss, step.grad_norm),
                           kExitNumerical);
        if (writer && metrics.is_open()) {
            metrics << nlohmann::json({{"iteration", it},
                                       {"contrastive loss", r.loss.loss},
                                       {"logit-scale", r.loss.logit_scale},
                                       {"image-text accuracy", r.loss.i2t_accuracy},
                                       {"grad-norm", step.grad_norm},
                                       {"learning-rate", lr}})
                           .dump()
                    << '\n';
        }
        ++interval_steps;
        if (it % cfg.logging.log_interval == 0 || it == iters) {
            const double now = now_seconds();
            const double ms = 1000.0 * (now - interval_start) / static_cast<double>(interval_steps);
            interval_start = now;
            interval_steps = 0;
            log_info(
                " iteration {:>7}/{:>7} | loss {:.6f} | logit scale {:.2f} | batch image->text accuracy {:.1f}% "
                "| grad norm {:.3f} | lr {:.3e} | {:.1f} ms/iter | {:.1f} samples/s",
                it, iters, r.loss.loss, r.loss.logit_scale, 100.0 * r.loss.i2t_accuracy, step.grad_norm, lr, ms,
                1000.0 * static_cast<double>(l.global_batch) / ms);
        }
        const bool eval_now = (cfg.eval.eval_interval > 0 && it % cfg.eval.eval_interval == 0) || it == iters;
        if (eval_now) {
            const HeldOut h = evaluate(model, *held_out, cfg.clip, l.b);
            log_info(" iteration {:>7}/{:>7} | {}", it, iters, describe(h));
            if (writer && metrics.is_open()) {
                nlohmann::json j = to_json(h);
                j["iteration"] = it;
                j["eval"] = true;
                metrics << j.dump() << '\n';
            }
        }
        // As the GPT trainer: every save_interval iterations and, when checkpoint.save is set, at the end.
        if (!cfg.checkpoint.save.empty() &&
            ((cfg.checkpoint.save_interval > 0 && it % cfg.checkpoint.save_interval == 0) || it == iters)) {
            if (metrics.is_open()) metrics.flush();  // the lines up to the checkpoint survive a crash after it
            save_checkpoint(ckpt, train_state(cfg, it, consumed, data_id, *train));
        }
    }
    if (train->skipped() > 0)
        log_warn("data: {} bad training samples skipped (clip.skip_bad_samples)", train->skipped());
    log_info("done: {} iterations in {:.1f} s; metrics in {}", iters, now_seconds() - t_start,
             cfg.logging.metrics_file);
    return kExitOk;
}

}  // namespace ms
