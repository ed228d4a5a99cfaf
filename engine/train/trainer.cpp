// trainer.cpp: run_train -- setup (engine/train/train_setup.h), the step loop with Megatron's log line, validation
// and checkpoints, and the end of the run (sample, op profile, exit record). See trainer.h.
#include "engine/train/trainer.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string_view>

#include "engine/core/log.h"
#include "engine/core/timer.h"
#include "engine/optim/adamw.h"
#include "engine/train/sampling.h"
#include "engine/train/train_setup.h"
#include "memory/alloc_guard.h"

namespace ms {

namespace {

std::string timestamp() {
    const auto now = std::chrono::system_clock::now();
    const std::time_t t = std::chrono::system_clock::to_time_t(now);
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[64];
    std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
    return fmt::format("{}.{:06d}", buf, us);
}

// MS_DUMP_GRADS=PATH: after the first backward, each pipeline stage writes every parameter's full gradient
// (averaged over dp, gathered over tp) to PATH.stage<s> (float32, parameters in table order, each as its global
// row-major tensor) and PATH.stage<s>.json (names, shapes, offsets). For the parallel-equivalence tests; costs an
// extra all-reduce and all-gather. bucketed: the gradients are averaged over dp already (parallel.overlap_grad_reduce):
// all of them with zero_stage 0, each dp shard on its owner with zero_stage 1; zero_stage 2 holds only that shard.
void dump_gradients(PipelineModel& model, const ProcessGroups& groups, const std::string& path, bool bucketed,
                    int zero_stage) {
    if (path.empty()) return;
    const int64_t padded = padded_flat_size(model.flat_size(), groups.dp_size);
    // averaged over dp in the gradients' own dtype, as the optimizer's reduction does, then widened to fp32
    const DType t = model.grad_dtype();
    const size_t es = dtype_size(t);
    std::vector<std::byte> raw(static_cast<size_t>(padded) * es);
    const size_t shard = static_cast<size_t>(padded / groups.dp_size);
    if (zero_stage == 2) {  // only this rank's shard exists, averaged already
        groups.dp->all_gather(model.grads(), raw.data(), shard, static_cast<size_t>(padded), t).wait();
    } else if (std::memcpy(raw.data(), model.grads(), raw.size()); !bucketed) {
        groups.dp->all_reduce(raw.data(), static_cast<size_t>(padded), t, ReduceOp::kAvg).wait();
    } else if (zero_stage == 1) {
        groups.dp
            ->all_gather(raw.data() + static_cast<size_t>(groups.dp_rank) * shard * es, raw.data(), shard,
                         static_cast<size_t>(padded), t)
            .wait();
    }
    std::vector<float> avg(static_cast<size_t>(padded));
    visit_float(t, [&]<class T>(T) {
        const T* g = reinterpret_cast<const T*>(raw.data());
        for (int64_t i = 0; i < padded; ++i) avg[static_cast<size_t>(i)] = to_float(g[i]);
    });
    std::vector<float> all(static_cast<size_t>(padded) * groups.tp_size);
    groups.tp->all_gather(std::span<const float>(avg), std::span<float>(all)).wait();
    if (groups.tp_rank != 0 || groups.dp_rank != 0) return;
    const std::string file = fmt::format("{}.stage{}", path, groups.pp_rank);
    std::ofstream bin(file, std::ios::binary | std::ios::trunc);
    nlohmann::json index = nlohmann::json::array();
    int64_t out_offset = 0;
    for (const ParamInfo& p : model.params_info()) {
        int64_t global_numel = 1;
        for (int64_t dim : p.global_shape) global_numel *= dim;
        std::vector<float> full(static_cast<size_t>(global_numel));
        for (int r = 0; r < groups.tp_size; ++r) {
            const float* src = all.data() + static_cast<size_t>(r) * padded + p.offset;
            for (int64_t i = 0; i < p.numel; ++i) full[p.global_index(i, r, groups.tp_size)] = src[i];
        }
        bin.write(reinterpret_cast<const char*>(full.data()), static_cast<std::streamsize>(full.size() * 4));
        index.push_back({{"name", p.name}, {"shape", p.global_shape}, {"offset", out_offset}});
        out_offset += global_numel;
    }
    std::ofstream(file + ".json") << index.dump(1);
}

// What the loop carries from step to step: the counters train_state.json records, the log interval's sums and the
// communication accounting per step (time in pipeline receives -- the measured bubble --, time waited in every other
// collective -- exposed communication --, the same collectives' time from issue to completion -- total
// communication, the exposed part and the part hidden behind compute; under the link model, the modelled time --,
// and bytes sent per group).
struct LoopState {
    int64_t consumed = 0, skipped = 0, nan_iters = 0;
    double interval_loss = 0, interval_time = 0, interval_bubble = 0, interval_comm = 0, interval_comm_total = 0;
    int64_t interval_steps = 0;
    double profiled_seconds = 0;  // MS_PROFILE_OPS: the steps after the first, which the op table covers
    int64_t profiled_steps = 0;
    size_t memory_peak = 0;  // the arena's peak of block bytes after the first step
    int64_t step_bytes_tp = 0, step_bytes_pp = 0, step_bytes_dp = 0, step_bytes_cp = 0;
    std::string last_saved;  // the run's latest checkpoint, for a stop after the loop
};

// What a step leaves for its log line.
struct StepOutcome {
    float loss = 0;  // averaged over dp
    float lr = 0;
    double grad_norm = 0;
    bool stop = false;  // a stop signal, agreed at the step boundary
};

// What train_state.json records at the end of iteration `it` (save_checkpoint adds the optimizer's step count and
// the schedule's inputs).
TrainState train_state(const TrainRun& r, const LoopState& s, int64_t it) {
    TrainState t;
    t.iteration = it;
    t.consumed_samples = s.consumed;
    t.skipped_iterations = s.skipped;
    t.nan_iterations = s.nan_iters;
    t.last_lr = learning_rate(r.cfg.optimizer, r.cfg.lr_schedule, r.cfg.training.train_iters, it);
    t.seed = r.cfg.run.seed;
    t.data_fingerprint = r.data_id;
    t.data_describe = r.source->describe();
    t.loss_scaler = r.scaler->state();
    return t;
}

// Seconds waited in the collectives of every group but pp and world.
double other_wait(const ProcessGroups& g) {
    double w = g.tp->stats().wait_seconds + g.dp->stats().wait_seconds + g.mp->stats().wait_seconds;
    if (g.embd) w += g.embd->stats().wait_seconds;
    if (g.cp) w += g.cp->stats().wait_seconds;
    return w;
}

// Seconds from issue to completion of the operations of the groups other_wait() counts (the matrix's totals).
double other_total(const CommMatrix& m) {
    double s = 0;
    for (std::string_view g : {"tp", "dp", "mp", "embd", "cp"}) s += m.op_seconds(CommMatrix::group_index(g));
    return s;
}

// After the first step every buffer of a step has been used once: the arena's peak against the plan, on all ranks.
void log_memory_peak(TrainRun& r, LoopState& s) {
    s.memory_peak = r.arena->stats().peak_block_bytes;
    const float ratio = static_cast<float>(s.memory_peak) / static_cast<float>(r.planned);
    std::array<float, 2> range = {ratio, -ratio};  // max, -min over ranks
    r.world.all_reduce(std::span<float>(range), ReduceOp::kMax).wait();
    log_info(
        "memory: planned {} ({} B), arena peak {} ({} B) ({:.2f}% of planned) | all ranks: "
        "{:.2f}% to {:.2f}% of their plans",
        format_bytes(r.planned), r.planned, format_bytes(s.memory_peak), s.memory_peak, 100.0 * ratio,
        -100.0 * range[1], 100.0 * range[0]);
}

// Forward, backward, the step boundary's agreement, the optimizer step and the step's accounting.
StepOutcome run_step(TrainRun& r, LoopState& s, int64_t it) {
    const ProcessGroups& groups = *r.groups;
    Backend& backend = *r.backend;
    LossScaler& scaler = *r.scaler;
    const double t0 = now_seconds();
    const double pp_wait0 = groups.pp->stats().wait_seconds, other_wait0 = other_wait(groups),
                 other_total0 = other_total(*r.comm_matrix);
    const int64_t tp_bytes0 = groups.tp->stats().total_bytes(), pp_bytes0 = groups.pp->stats().total_bytes(),
                  dp_bytes0 = groups.dp->stats().total_bytes(), cp_bytes0 = groups.cp->stats().total_bytes();
    r.reliability->begin_step(it);  // MS_INJECT crash, hang, sigterm
    // MS_CHECK_ALLOCS=1: from this run's third step on, a step allocates nothing. The first two warm up what is
    // sized on first use: the communicators' pools of operation states reach their peak in the second, the first
    // step that begins with pipeline sends of the previous one still in flight.
    StepAllocGuard alloc_guard(it, /*arm=*/it > r.first_it + 1);
    if (r.trace) r.trace->begin_step(it);
    // Megatron's sampler: micro-batch mb of the step is samples [mb * dp + dp_rank] * mbs onwards, so the step
    // covers the same global samples under every data-parallel size.
    const float loss_scale = scaler.scale();
    StepOutcome out;
    out.loss = r.model->train_step(*r.train_sampler, s.consumed, r.layout.seq_length(), loss_scale);
    // Every rank's NaN/Inf check and stop signal, agreed before the data-parallel reduction spreads a NaN. With
    // fp16 loss scaling, gradients that overflow are the scaler's business (the step is skipped, the scale
    // lowered): only the loss is checked.
    // The gradients' sums of squares are taken once: for that check and, when no reduction changes the gradients
    // (dp 1), for the norm.
    const bool check_grads = !scaler.enabled();
    r.reliability->inject_nan(it, r.model->grads_tensor(), backend);
    const GradSquares squares = check_grads ? r.optimizer->local_grad_squares() : GradSquares{};
    const StepVerdict verdict = r.reliability->step_boundary(*groups.world, it, out.loss, squares.all, check_grads);
    out.stop = verdict.stop;
    groups.dp->all_reduce(std::span<float>(&out.loss, 1), ReduceOp::kAvg).wait();
    if (it == 1 && !r.env.dump_grads.empty()) {
        backend.synchronize();  // the host reads the gradients
        dump_gradients(*r.model, groups, r.env.dump_grads, /*bucketed=*/r.layout.grad_bucket_elems > 0,
                       r.layout.zero_stage);
    }
    out.lr = learning_rate(r.cfg.optimizer, r.cfg.lr_schedule, r.cfg.training.train_iters, it);
    const OptimizerStepResult step =
        verdict.skip_step
            ? OptimizerStepResult{std::numeric_limits<double>::quiet_NaN(), false}
            : r.optimizer->step(out.lr, r.cfg.training.clip_grad, 1.0f / loss_scale, check_grads ? &squares : nullptr);
    const bool overflow = scaler.enabled() && !verdict.skip_step && !step.stepped;
    scaler.update(overflow);
    // The step's kernels complete inside its time, and what the host reads after it (logs, checkpoints) is its.
    backend.synchronize();
    alloc_guard.check();
    r.reliability->after_step(it);
    if (r.profiler != nullptr && it == r.first_it) {
        r.profiler->reset();  // the first step's one-off costs (GEMM heuristics, first touches) are not the profile
    } else if (r.profiler != nullptr) {
        s.profiled_seconds += now_seconds() - t0;
        ++s.profiled_steps;
    }
    out.grad_norm = step.grad_norm;
    if (it == r.first_it) log_memory_peak(r, s);
    // A step is stepped only with a finite loss, and an fp16 overflow only happens with one (step_boundary).
    if (step.stepped || overflow) {  // an overflowing step's forward was fine: its loss counts
        s.interval_loss += out.loss;
        ++s.interval_steps;
    }
    if (!step.stepped) {
        ++s.skipped;
        if (!overflow) ++s.nan_iters;  // Megatron counts an fp16 overflow as skipped, not as NaN
    }
    s.consumed += r.layout.global_batch;
    s.interval_time += now_seconds() - t0;
    s.interval_bubble += groups.pp->stats().wait_seconds - pp_wait0;
    s.interval_comm += other_wait(groups) - other_wait0;
    s.interval_comm_total += other_total(*r.comm_matrix) - other_total0;
    s.step_bytes_tp = groups.tp->stats().total_bytes() - tp_bytes0;
    s.step_bytes_pp = groups.pp->stats().total_bytes() - pp_bytes0;
    s.step_bytes_dp = groups.dp->stats().total_bytes() - dp_bytes0;
    s.step_bytes_cp = groups.cp->stats().total_bytes() - cp_bytes0;
    return out;
}

// Megatron's log line and the metrics.jsonl record of the log interval that ends at `it`; resets the interval.
void log_interval(TrainRun& r, LoopState& s, int64_t it, const StepOutcome& step) {
    const Config& cfg = r.cfg;
    const int world_size = r.world.size();
    const int64_t n_iter = cfg.logging.log_interval == 0 ? 1 : (it - 1) % cfg.logging.log_interval + 1;
    const double ms_per_iter = 1e3 * s.interval_time / static_cast<double>(n_iter);
    const double tokens_per_s = static_cast<double>(r.layout.tokens_per_step()) / (ms_per_iter / 1e3);
    // per-rank MFU (Megatron's "per GPU"): the whole job's model FLOP/s over the ranks' summed peak
    const double mfu = 100.0 * r.flops_per_token * tokens_per_s / (r.peak_flops * world_size);
    const double loss = s.interval_steps > 0 ? s.interval_loss / static_cast<double>(s.interval_steps)
                                             : std::numeric_limits<double>::quiet_NaN();
    // fractions of the step, averaged over all ranks
    std::array<float, 3> shares = {static_cast<float>(s.interval_bubble / s.interval_time),
                                   static_cast<float>(s.interval_comm / s.interval_time),
                                   static_cast<float>(s.interval_comm_total / s.interval_time)};
    r.world.all_reduce(std::span<float>(shares), ReduceOp::kSum).wait();
    const double bubble_pct = 100.0 * shares[0] / world_size, comm_pct = 100.0 * shares[1] / world_size,
                 comm_total_pct = 100.0 * shares[2] / world_size;
    const LossScaler& scaler = *r.scaler;
    const int64_t global_batch = r.layout.global_batch;
    log_info(
        " [{}] iteration {:8d}/{:8d} | consumed samples: {:12d} | elapsed time per iteration (ms): {:.1f} "
        "| learning rate: {:.6E} | global batch size: {:5d} | lm loss: {:.6E} | {}grad norm: {:.3f} | "
        "number of skipped iterations: {:3d} | number of nan iterations: {:3d} | tokens/s: {:.0f} | "
        "MFU: {:.1f}% |{}",
        timestamp(), it, cfg.training.train_iters, s.consumed, ms_per_iter, step.lr, global_batch, loss,
        scaler.enabled() ? fmt::format("loss scale: {:.1f} | ", scaler.scale()) : std::string(), step.grad_norm,
        s.skipped, s.nan_iters, tokens_per_s, mfu,
        world_size == 1
            ? std::string()
            : fmt::format(" pipeline bubble: {:.1f}% | exposed comm: {:.1f}% | total comm: {:.1f}% | "
                          "bytes sent per step (rank 0): tp {} pp {} dp {}{} |",
                          bubble_pct, comm_pct, comm_total_pct, s.step_bytes_tp, s.step_bytes_pp, s.step_bytes_dp,
                          r.layout.cp() > 1 ? fmt::format(" cp {}", s.step_bytes_cp) : std::string()));
    nlohmann::json j = {
        {"iteration", it},
        {"consumed_samples", s.consumed},
        {"time", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
        {"learning-rate", step.lr},
        {"batch-size", global_batch},
        {"grad-norm", std::isfinite(step.grad_norm) ? nlohmann::json(step.grad_norm) : nullptr},
        {"skipped_iterations", s.skipped},
        {"nan_iterations", s.nan_iters},
        {"iteration-time", ms_per_iter / 1e3},
        {"tokens_per_sec", tokens_per_s},
        {"mfu", mfu / 100.0},
        {"pipeline_bubble", bubble_pct / 100.0},
        {"exposed_comm", comm_pct / 100.0},
        {"total_comm", comm_total_pct / 100.0},
        {"bytes_per_step",
         {{"tp", s.step_bytes_tp}, {"pp", s.step_bytes_pp}, {"dp", s.step_bytes_dp}, {"cp", s.step_bytes_cp}}},
        {"memory_planned_bytes", r.planned},
        {"memory_peak_bytes", s.memory_peak}};
    j["lm loss"] = std::isfinite(loss) ? nlohmann::json(loss) : nlohmann::json(nullptr);
    if (scaler.enabled()) j["loss-scale"] = scaler.scale();
    if (r.gpu_metrics) {  // on every rank of a CUDA run: the gather is collective
        if (nlohmann::json gpu = r.gpu_metrics->gather(r.world); !gpu.is_null()) j["gpu"] = std::move(gpu);
    }
    if (r.writer) r.metrics << j.dump() << '\n' << std::flush;
    if (r.tensorboard) r.tensorboard->add_record(j);
    s.interval_loss = s.interval_time = s.interval_bubble = s.interval_comm = s.interval_comm_total = 0;
    s.interval_steps = 0;
}

// The validation loss at iteration `it`, logged and recorded. False when a stop signal ended it.
bool run_validation(TrainRun& r, const LoopState& s, int64_t it, const std::function<bool()>& stop_requested) {
    const std::optional<float> local = r.model->evaluate(
        *r.valid_sampler, r.cfg.eval.eval_iters * r.layout.num_microbatches, r.layout.seq_length(), stop_requested);
    if (!local) return false;
    float vloss = *local;
    r.groups->dp->all_reduce(std::span<float>(&vloss, 1), ReduceOp::kAvg).wait();
    log_info(" validation loss at iteration {} | lm loss value: {:.6E} | lm loss PPL: {:.6E} |", it, vloss,
             std::exp(vloss));
    const nlohmann::json j = {{"iteration", it}, {"consumed_samples", s.consumed}, {"validation lm loss", vloss}};
    if (r.writer) r.metrics << j.dump() << '\n' << std::flush;
    if (r.tensorboard) r.tensorboard->add_record(j);
    return true;
}

// The steps from first_it to training.train_iters, each with its log interval, validation and checkpoint. Returns
// the exit code when a stop signal ended the run early (reliability.h "Signals"), nullopt when every step ran.
std::optional<int> train_loop(TrainRun& r, LoopState& s, const std::function<bool()>& stop_requested) {
    const Config& cfg = r.cfg;
    log_info("training: {} iterations, log every {}", cfg.training.train_iters, cfg.logging.log_interval);
    for (int64_t it = r.first_it; it <= cfg.training.train_iters; ++it) {
        const StepOutcome step = run_step(r, s, it);
        if (r.trace) {  // the iteration's events written out (allocating), outside the step's time and alloc guard
            r.trace->end_step(it);
            if (it == r.trace->last_step()) r.trace->finish(r.world);
        }
        if (it % cfg.logging.log_interval == 0 || it == cfg.training.train_iters) log_interval(r, s, it, step);
        // A stop signal ends the run after this iteration: agreed at its step boundary, or during its validation or
        // save. Validation changes no state, so iteration `it` is what a stop saves.
        bool stop = step.stop;
        std::string_view stopped_in;  // the phase a signal interrupted; "" for the step itself
        if (!stop && r.valid_sampler && (it % cfg.eval.eval_interval == 0 || it == cfg.training.train_iters) &&
            !run_validation(r, s, it, stop_requested)) {
            stop = true;
            stopped_in = "validation";
        }
        // Megatron saves every save_interval iterations and, when checkpoint.save is set, at the end -- and when a
        // stop signal arrived (then exits 3). A signal during a save lets it complete, then stops.
        std::string saved;
        if (!cfg.checkpoint.save.empty() &&
            ((cfg.checkpoint.save_interval > 0 && it % cfg.checkpoint.save_interval == 0) ||
             it == cfg.training.train_iters || stop)) {
            saved = save_checkpoint(*r.ckpt, train_state(r, s, it));
            s.last_saved = saved;
            r.reliability->event("checkpoint_saved", {{"iteration", it}, {"dir", saved}});
            if (!stop && r.reliability->poll_stop(r.world)) {
                stop = true;
                stopped_in = "the checkpoint save";
            }
        }
        if (stop) {
            r.backend->synchronize();
            return r.reliability->exit_on_signal(it, saved, stopped_in);
        }
    }
    return std::nullopt;
}

// eval.sample_tokens: a sample from the trained model, when the whole model is on this rank. Returns the exit code
// when a stop signal ended it.
std::optional<int> sample_text(TrainRun& r, const LoopState& s, const std::function<bool()>& stop_requested) {
    const Config& cfg = r.cfg;
    if (cfg.eval.sample_tokens <= 0) return std::nullopt;
    if (r.groups->cp_size > 1) {
        log_info("sample: skipped (sampling runs whole sequences on one rank; this run splits them over cp = {})",
                 r.groups->cp_size);
        return std::nullopt;
    }
    if (!r.model->whole_model()) {
        log_info("sample: skipped (sampling runs the whole model on one pipeline stage; this run has pp = {})",
                 r.groups->pp_size);
        return std::nullopt;
    }
    const int T = r.layout.seq_length();
    std::vector<int32_t> context;
    if (!cfg.eval.sample_prompt.empty() && r.layout.shape.V >= 256) {
        context = byte_encode(cfg.eval.sample_prompt);
    } else {
        std::vector<int32_t> inputs(static_cast<size_t>(r.layout.micro_batch) * T), targets(inputs.size());
        const Sampler& sampler = r.valid_sampler ? *r.valid_sampler : *r.train_sampler;
        sampler.fill(0, 1, inputs.data(), targets.data());
        context.assign(inputs.begin(), inputs.begin() + std::min(T, 8));
    }
    const size_t prompt_len = context.size();
    bool stopped = false;
    const std::vector<int32_t> out =
        generate(*r.model->whole_model(), *r.groups->tp, context, cfg.eval.sample_tokens, cfg.eval.sample_temperature,
                 cfg.eval.sample_top_k, cfg.run.seed, [&] { return stopped = stop_requested(); });
    if (stopped) {
        r.backend->synchronize();
        return r.reliability->exit_on_signal(cfg.training.train_iters, s.last_saved, "the end-of-run sample");
    }
    const auto split = out.begin() + static_cast<long>(prompt_len);
    log_info("sample (temperature {}, top-k {}), prompt in [brackets]:\n[{}]{}", cfg.eval.sample_temperature,
             cfg.eval.sample_top_k, r.source->decode(std::vector<int32_t>(out.begin(), split)),
             r.source->decode(std::vector<int32_t>(split, out.end())));
    return std::nullopt;
}

// comm_matrix.json in run.output_dir and its busiest pairs in the log (rank 0): what every rank sent, by pair, group
// and link class (comm/comm_matrix.h). Collective over world, which is not counted.
void write_comm_matrix(TrainRun& r) {
    nlohmann::json m = r.comm_matrix->gather(r.world);
    if (!r.writer) return;
    const LinkModelConfig& lm = r.cfg.link_model;
    m["link_model"] = {{"enabled", lm.enabled},
                       {"intra_node_latency_us", lm.intra_node_latency_us},
                       {"intra_node_bandwidth_gbps", lm.intra_node_bandwidth_gbps},
                       {"inter_node_latency_us", lm.inter_node_latency_us},
                       {"inter_node_bandwidth_gbps", lm.inter_node_bandwidth_gbps}};
    std::ofstream(std::filesystem::path(r.cfg.run.output_dir) / "comm_matrix.json") << m.dump(1) << '\n';
    if (r.world.size() == 1) return;
    for (const std::string& line : comm_matrix_table(m, 8)) log_info("{}", line);
}

// After the last step: the sample, the op profile (MS_PROFILE_OPS), the communication matrix, the closing line and
// the exit record.
int end_of_run(TrainRun& r, const LoopState& s, const std::function<bool()>& stop_requested, double t_start) {
    const Config& cfg = r.cfg;
    if (const std::optional<int> code = sample_text(r, s, stop_requested)) return *code;
    r.backend->synchronize();               // nothing may run on the arena once it is freed
    if (r.trace) r.trace->finish(r.world);  // a run resumed past the traced iterations: the header only
    write_comm_matrix(r);
    if (r.profiler != nullptr && s.profiled_steps > 0) {
        // every rank writes its own (pipeline stages differ); the logging rank also prints its table
        const std::vector<std::string> table = r.profiler->table(s.profiled_seconds, s.profiled_steps);
        std::ofstream f(std::filesystem::path(cfg.run.output_dir) /
                        fmt::format("op_profile_rank{}.txt", r.world.rank()));
        for (const std::string& line : table) {
            log_info("{}", line);
            f << line << '\n';
        }
    }
    log_info("done: {} iterations in {:.1f} s; metrics in {}", cfg.training.train_iters, now_seconds() - t_start,
             cfg.logging.metrics_file);
    return r.reliability->finish(cfg.training.train_iters);
}

// Before MPI_Init, on every rank: the environment MPI needs for the backend.
void prepare_mpi_environment(BackendKind backend) {
    if (backend != BackendKind::kCUDA) return;
    // MPI moves the arena's managed memory from the host. Open MPI's single-copy shared-memory transports (CMA,
    // XPMEM, KNEM) pin the peer's pages, which fails for pages resident on a GPU ("process_vm_readv: Bad
    // address"); copy-in/copy-out through the shared segment works for any. A value the user set wins.
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);  // Open MPI 4
    setenv("OMPI_MCA_smsc", "^cma,knem,xpmem", 0);                  // Open MPI 5
}

}  // namespace

int run_train(const Config& cfg_in) {
    const double t_start = now_seconds();
    prepare_mpi_environment(parse_backend_kind(cfg_in.run.backend));
    MpiRuntime mpi;
    TrainRun run(mpi);
    run.env = switches();  // before any thread starts (switches.h)
    if (const std::string set = describe_switches(run.env); !set.empty()) log_info("{}", set);
    setup_inputs(run, cfg_in);
    setup_backend(run);
    setup_model(run);
    if (run.trace) run.model->set_trace(run.trace.get());
    setup_checkpoint(run);
    open_run_files(run);

    LoopState state;
    if (run.resumed) {
        state.consumed = run.resumed->consumed_samples;
        state.skipped = run.resumed->skipped_iterations;
        state.nan_iters = run.resumed->nan_iterations;
    }
    // Validation and sampling agree on a stop signal as they go (one all-reduce per micro-batch or token).
    const std::function<bool()> stop_requested = [&] { return run.reliability->poll_stop(run.world); };
    if (const std::optional<int> code = train_loop(run, state, stop_requested)) return *code;
    return end_of_run(run, state, stop_requested, t_start);
}

}  // namespace ms
