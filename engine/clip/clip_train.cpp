// clip_train.cpp: `train` for model.arch: clip (clip_train.h): the layout, the checkpoints and the step loop, with the
// held-out evaluation of clip_eval.h.
#include "engine/clip/clip_train.h"

#include <fmt/format.h>

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
#include "engine/clip/clip_eval.h"
#include "engine/clip/clip_layout.h"
#include "engine/clip/clip_model.h"
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

[[noreturn]] void refuse(const std::string& msg) { throw UserError("config error: " + msg); }

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
    bo.local_size = mpi.local_size();
    std::unique_ptr<Backend> backend = make_backend(bo);

    const std::unique_ptr<ImageTextSource> train = open_clip_source(cfg, l.shape, ClipSplit::kTrain);
    const std::unique_ptr<ImageTextSource> held_out = open_clip_source(cfg, l.shape, ClipSplit::kHeldOut);
    const ImageTextOrder order(*train, cfg.run.seed);
    ClipModel model(l.shape, *backend, groups, l.b, l.dtype, cfg.clip.itm_weight);
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
    if (writer && !cfg.logging.metrics_file.empty())
        metrics = open_metrics_log(cfg.logging.metrics_file,
                                   resumed ? std::optional<int64_t>(resumed->iteration) : std::nullopt);
    ClipBatch batch = empty_clip_batch(l.shape, l.b);
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
                read_clip_sample(*train, order.sample_at(first + i), l.shape.image_size(), sample);
                add_to_clip_batch(batch, i, sample, l.shape);
            }
        });
        const ClipStepResult r = model.train_step(
            batch, 1.0f, {.seed = cfg.run.seed, .step = static_cast<uint64_t>(it), .first_sample = first});
        const float lr = learning_rate(cfg.optimizer, cfg.lr_schedule, iters, it);
        const OptimizerStepResult step = optimizer.step(lr, cfg.training.clip_grad);
        if (!std::isfinite(r.loss.loss) || !step.stepped)
            throw RunError(fmt::format("iteration {}: the loss ({}) or the gradient norm ({}) is not finite", it,
                                       r.loss.loss, step.grad_norm),
                           kExitNumerical);
        if (writer && metrics.is_open()) {
            nlohmann::json j = {{"iteration", it},
                                {"contrastive loss", r.loss.loss},
                                {"logit-scale", r.loss.logit_scale},
                                {"image-text accuracy", r.loss.i2t_accuracy},
                                {"grad-norm", step.grad_norm},
                                {"learning-rate", lr}};
            if (l.shape.cross_modal()) {
                j["itm loss"] = r.itm.loss;
                j["itm accuracy"] = r.itm.accuracy;
            }
            metrics << j.dump() << '\n';
        }
        ++interval_steps;
        if (it % cfg.logging.log_interval == 0 || it == iters) {
            const double now = now_seconds();
            const double ms = 1000.0 * (now - interval_start) / static_cast<double>(interval_steps);
            interval_start = now;
            interval_steps = 0;
            const std::string itm = l.shape.cross_modal() ? fmt::format(" | itm loss {:.4f} accuracy {:.1f}%",
                                                                        r.itm.loss, 100.0 * r.itm.accuracy)
                                                          : "";
            log_info(
                " iteration {:>7}/{:>7} | loss {:.6f} | logit scale {:.2f} | batch image->text accuracy {:.1f}%{} "
                "| grad norm {:.3f} | lr {:.3e} | {:.1f} ms/iter | {:.1f} samples/s",
                it, iters, r.loss.loss, r.loss.logit_scale, 100.0 * r.loss.i2t_accuracy, itm, step.grad_norm, lr, ms,
                1000.0 * static_cast<double>(l.global_batch) / ms);
        }
        const bool eval_now = (cfg.eval.eval_interval > 0 && it % cfg.eval.eval_interval == 0) || it == iters;
        if (eval_now) {
            const ClipHeldOut h = evaluate_held_out(model, *held_out, cfg.clip, l.b);
            log_info(" iteration {:>7}/{:>7} | {}", it, iters, describe_held_out(h));
            if (writer && metrics.is_open()) metrics << held_out_record(h, it).dump() << '\n';
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
