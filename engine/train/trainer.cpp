// trainer.cpp: the single-rank training loop, validation, metrics and sampling (see trainer.h).
#include "engine/train/trainer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <span>
#include <string_view>

#include "comm/bootstrap.h"
#include "comm/process_groups.h"
#include "comm/synchronizing_communicator.h"
#include "engine/backends/backend.h"
#include "engine/backends/cpu/probe.h"
#include "engine/backends/deferred_backend.h"
#include "engine/backends/profiling_backend.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/core/log.h"
#include "engine/core/philox.h"
#include "engine/core/timer.h"
#include "engine/data/dataset.h"
#include "engine/model/gpt.h"
#include "engine/optim/adamw.h"
#include "engine/optim/distributed_optimizer.h"
#include "engine/optim/loss_scaler.h"
#include "engine/parallel/schedule.h"
#include "engine/train/device_peak.h"
#include "engine/train/metrics_log.h"
#include "engine/train/pipeline.h"
#include "engine/train/plan.h"
#include "engine/train/reliability.h"
#include "engine/train/sampling.h"
#include "memory/alloc_guard.h"
#include "memory/arena.h"

namespace ms {
namespace {

// The vocabulary comes from the config when set (and must hold every token), else from the data.
Config resolve_vocab(Config cfg, const TokenSource& source) {
    if (cfg.model.vocab_size == 0) {
        cfg.model.vocab_size = source.vocab_size();
    } else if (source.vocab_size() > cfg.model.vocab_size) {
        throw UserError(fmt::format(
            "config error: model.vocab_size({}) is smaller than the data's largest token id + 1 ({}) in {}\n"
            "---> HINT: set model.vocab_size to at least {} (or 0 to take it from the data)",
            cfg.model.vocab_size, source.vocab_size(), source.describe(), source.vocab_size()));
    }
    return cfg;
}

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

std::string human_bytes(double b) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, ++u;
    return fmt::format("{:.2f} {}", b, units[u]);
}

void print_derived(const Config& cfg, const DerivedConfig& d) {
    log_info(
        "derived: world size {} = tp {} x pp {} x dp {} | padded vocab {} (vocab {}, multiple of {}) | "
        "ffn hidden {}",
        d.world_size, cfg.parallel.tensor_model_parallel_size, cfg.parallel.pipeline_model_parallel_size, d.dp,
        d.padded_vocab, cfg.model.vocab_size, cfg.model.make_vocab_size_divisible_by, d.ffn_hidden);
    log_info(
        "derived: global batch {} = micro batch {} x {} micro-batches x dp {} | tokens per step {} | "
        "parameters {} ({:.2f} M)",
        cfg.training.global_batch_size > 0 ? cfg.training.global_batch_size : cfg.training.micro_batch_size * d.dp,
        cfg.training.micro_batch_size, d.num_microbatches, d.dp, d.tokens_per_step, d.num_parameters,
        static_cast<double>(d.num_parameters) / 1e6);
}

// MS_DUMP_GRADS=PATH: after the first backward, each pipeline stage writes every parameter's full gradient
// (averaged over dp, gathered over tp) to PATH.stage<s> (float32, parameters in table order, each as its global
// row-major tensor) and PATH.stage<s>.json (names, shapes, offsets). For the parallel-equivalence tests; costs an
// extra all-reduce and all-gather.
void dump_gradients(PipelineModel& model, const ProcessGroups& groups, int dp) {
    const char* path = std::getenv("MS_DUMP_GRADS");
    if (!path || !*path) return;
    const int64_t padded = padded_flat_size(model.flat_size(), dp);
    std::vector<float> avg(model.grads(), model.grads() + padded);
    groups.dp->all_reduce(std::span<float>(avg), ReduceOp::kAvg).wait();
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

// Every rank checks the largest stage's planned total against its own budget; one all-reduce makes the verdict
// common, so all ranks throw together (or none does) before anything large is allocated.
void check_memory_fits(const Config& cfg, const std::vector<StagePlan>& stages, Communicator& world, int ranks_on_node,
                       const DeviceMemory& device) {
    const size_t largest = largest_stage(stages);
    const double need = static_cast<double>(stages[largest].total_bytes());
    const double budget = memory_budget_bytes(cfg, ranks_on_node, device);
    // The budget is a node's: the first rank short of memory names it, and its host, on every rank.
    int32_t short_of_memory = need > budget ? world.size() - world.rank() : 0;  // MAX: the lowest short rank
    world.all_reduce(std::span<int32_t>(&short_of_memory, 1), ReduceOp::kMax).wait();
    if (!short_of_memory) return;
    const int first = world.size() - short_of_memory;
    std::string table;
    for (const std::string& line : stage_table(stages)) table += "\n    " + line;
    const std::string verdict =
        need > budget ? fmt::format("but {} is available per rank ({}){}", format_bytes(static_cast<size_t>(budget)),
                                    memory_budget_source(cfg, ranks_on_node, device),
                                    world.size() > 1 ? " on " + describe_rank(world.rank()) : std::string())
                      : fmt::format("more than the ranks of {}'s node have available", describe_rank(first));
    UserError e(fmt::format(
        "memory error: pipeline stage {} needs {} per rank, {}\n"
        "memory per rank by pipeline stage (zero_stage {}):{}\n"
        "---> HINT: lower training.micro_batch_size (activations scale with it); raise "
        "parallel.pipeline_model_parallel_size (each stage holds fewer layers); set parallel.zero_stage: 1 (divides "
        "the optimizer state by the data-parallel size); activation recomputation is not available yet",
        largest, format_bytes(static_cast<size_t>(need)), verdict, cfg.parallel.zero_stage, table));
    e.set_failed_rank(first);
    throw e;
}

// Runs `step` on every rank. When it throws a UserError on some rank (a data file missing on one node, no GPU visible
// on another), every rank throws -- the failing ones their own sentence, the others one pointing at it -- instead of
// the others waiting forever in the next collective for a rank that has left. Each failing rank's sentence names it
// and its host, since only it saw the problem. The lowest failing rank's sentence and exit code go to every rank, so
// that whichever rank writes exit_status.json names it, its host and the cause. Every rank prints and records before
// a barrier that the others must pass before throwing: mpirun kills every rank as soon as one exits non-zero, so a
// rank that printed only on its way out could be killed before saying why.
template <class Step>
void on_every_rank_or_none(Communicator& world, const std::string& what, Step&& step) {
    std::optional<UserError> error;
    try {
        step();
    } catch (const UserError& e) {
        // A run on one rank has nobody to tell apart.
        error = world.size() == 1 ? e : UserError(error_at(e.what(), describe_rank(world.rank())), e.exit_code());
    }
    int32_t failed = error ? world.size() - world.rank() : 0;  // MAX: the lowest failing rank
    world.all_reduce(std::span<int32_t>(&failed, 1), ReduceOp::kMax).wait();
    if (!failed) return;
    const int first = world.size() - failed;
    // The first failing rank's exit code and sentence, as int32 words (the typed API has no chars).
    std::array<int32_t, 2> head = {error ? error->exit_code() : 0, 0};
    std::string cause = error ? error->what() : std::string();
    head[1] = static_cast<int32_t>(cause.size());
    world.broadcast(std::span<int32_t>(head), first).wait();
    std::vector<int32_t> words((static_cast<size_t>(head[1]) + 3) / 4);
    if (world.rank() == first) std::memcpy(words.data(), cause.data(), cause.size());
    world.broadcast(std::span<int32_t>(words), first).wait();
    cause.assign(reinterpret_cast<const char*>(words.data()), static_cast<size_t>(head[1]));
    UserError stop = error ? *error
                           : UserError(fmt::format("{} stops: {} could not {} (its error is printed above); nothing "
                                                   "was run",
                                                   describe_rank(world.rank()), describe_rank(first), what),
                                       head[0]);
    std::fflush(stdout);
    std::fprintf(stderr, "%s\n", user_error_line(stop.what()).c_str());
    std::fflush(stderr);
    stop.set_reported();
    stop.set_failed_rank(first);
    record_exit(stop.exit_code(), error ? std::string(error->what()) : cause + "\n" + user_error_line(stop.what()),
                first);
    world.barrier();
    throw stop;
}

// The MFU denominator: logging.peak_flops when set; on the CPU an sgemm probe; on a GPU the device's dense fp32
// (non-tensor) peak from engine/train/device_peak.cpp, since the CUDA kernels compute in fp32 without tensor cores.
// NaN (MFU printed as nan, null in metrics.jsonl) for a device the table does not know, with a loud warning.
double mfu_peak(const Config& cfg, const Backend& backend) {
    if (cfg.logging.peak_flops > 0) {
        log_info("peak: {:.1f} GFLOP/s fp32 (logging.peak_flops) is the MFU denominator", cfg.logging.peak_flops / 1e9);
        return cfg.logging.peak_flops;
    }
    if (backend.device_name().empty()) {
        const double peak = cpu::sgemm_peak_flops();
        log_info("peak: {:.1f} GFLOP/s fp32 (measured by an sgemm probe; OpenBLAS kernel {}) is the MFU denominator",
                 peak / 1e9, cpu::blas_kernel_name());
        if (const std::string w = cpu::blas_kernel_warning(); !w.empty()) log_warn("{}", w);
        return peak;
    }
    if (backend.name() == "cuda-emulated") {
        log_info("peak: none for {} (the CUDA kernels on a CPU emulation): MFU is not reported", backend.name());
        return std::numeric_limits<double>::quiet_NaN();
    }
    if (const DevicePeak* p = find_device_peak(backend.device_name())) {
        log_info(
            "peak: {:.1f} TFLOP/s fp32 without tensor cores ({}: engine/train/device_peak.cpp; dense tf32 {:.1f}, "
            "bf16 {:.1f} TFLOP/s) is the MFU denominator, as the CUDA kernels compute in fp32",
            p->fp32 / 1e12, p->device, p->tf32 / 1e12, p->bf16 / 1e12);
        return p->fp32;
    }
    log_warn(
        "peak: UNKNOWN DEVICE '{}': engine/train/device_peak.cpp has no peak FLOP/s for it, so MFU is reported "
        "as nan; set logging.peak_flops to its dense fp32 FLOP/s (and add it to the table)",
        backend.device_name());
    return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

int run_train(const Config& cfg_in) {
    const double t_start = now_seconds();
    if (cfg_in.run.backend == "cuda") {
        // MPI moves the arena's managed memory from the host. Open MPI's single-copy shared-memory transports (CMA,
        // XPMEM, KNEM) pin the peer's pages, which fails for pages resident on a GPU ("process_vm_readv: Bad
        // address"); copy-in/copy-out through the shared segment works for any. Set before MPI_Init, on every rank;
        // a value the user set wins.
        setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);  // Open MPI 4
        setenv("OMPI_MCA_smsc", "^cma,knem,xpmem", 0);                  // Open MPI 5
    }
    MpiRuntime mpi;
    Communicator& world = mpi.world();
    // From here on every failure leaves exit_status.json (engine/train/reliability.h), the input checks' too.
    std::vector<std::string> hosts;
    for (int r = 0; r < world.size(); ++r) hosts.push_back(mpi.host_of(r));
    arm_exit_record(cfg_in.run.output_dir, world.rank(), std::move(hosts));
    // Stop signals (reliability.h "Signals"): from here to the first step, stop points between setup's phases, and
    // the setup watch for a phase that runs long.
    install_signal_handlers();
    std::optional<SetupStopWatch> setup_watch(std::in_place);
    // Everything that can be wrong with the input is checked before any large allocation. The ranks agree on the
    // outcome before the first collective that could otherwise wait forever for a rank that failed alone (a data
    // file missing on one node): every rank fails with exit code 2, the failing ones with their own sentence.
    std::unique_ptr<TokenSource> source;
    Config cfg;
    DerivedConfig d;
    on_every_rank_or_none(world, "pass its input checks", [&] {
        source = open_token_source(cfg_in.data, cfg_in.model.vocab_size);
        cfg = resolve_vocab(cfg_in, *source);
        // MS_INJECT wins over reliability.inject; the resolved config (and its hash) records the one that applies
        cfg.reliability.inject = resolve_fault_injection(cfg.reliability, world.size(), cfg.training.train_iters).spec;
        d = validate_config(cfg, world.size());
    });
    check_same_config(mpi, name_hash(config_to_yaml(cfg)));
    ProcessGroups groups = make_process_groups(world, cfg.parallel.tensor_model_parallel_size,
                                               cfg.parallel.pipeline_model_parallel_size, d.dp,
                                               {.comm = parse_comm_kind(cfg.run.comm),
                                                .backend = cfg.run.backend,
                                                .local_rank = mpi.local_rank(),
                                                .local_size = mpi.local_size()});
    // Stop signals, the NaN policy, fault injection, collective timeouts with flight recorders, and the run's
    // exit_status.json / events.jsonl (engine/train/reliability.h).
    Reliability reliability(cfg, groups, mpi.hostname());
    mpi.set_collective_watch(reliability.watch_options());
    reliability.start(world, name_hash(config_to_yaml(cfg)));
    reliability.stop_point(world);
    const int T = cfg.model.seq_length;
    const int mbs = cfg.training.micro_batch_size;
    const int num_mb = d.num_microbatches;
    const Sampler train_sampler(*source, cfg.data.split, Split::kTrain, T, cfg.run.seed);
    std::unique_ptr<Sampler> valid_sampler;
    if (cfg.eval.eval_interval > 0) {
        valid_sampler = std::make_unique<Sampler>(*source, cfg.data.split, Split::kValid, T, cfg.run.seed);
        cfg.eval.eval_iters = bound_eval_iters(cfg.eval.eval_iters, "eval.eval_iters", valid_sampler->num_samples(),
                                               int64_t{mbs} * num_mb * d.dp);
    }

    log_info("mindspeed-train {} | backend {} | threads {} | {}", MS_VERSION, cfg.run.backend,
             cfg.run.num_threads > 0 ? cfg.run.num_threads : 0, mpi.describe());
    log_info("data: {}", source->describe());
    const double entropy = source->entropy_rate();
    if (std::isfinite(entropy)) {
        log_info("data: entropy rate of the source {:.4f} nats/token: the lowest loss any model can reach", entropy);
    }
    log_info("data: {} training samples of {} tokens per epoch{}", train_sampler.num_samples(), T,
             valid_sampler ? fmt::format(", {} validation samples", valid_sampler->num_samples()) : "");
    print_derived(cfg, d);

    // Memory: the plan (engine/train/plan.h) says what every rank allocates; check it fits, then carve everything a
    // step uses -- parameters, gradients, optimizer state, activations, scratch, communication buffers -- out of one
    // arena per rank. Its blocks are packed (memory/buddy_allocator.h, BlockFit::kPacked), so its capacity is the
    // plan rounded up to 256 bytes per allocation; a dry run of the allocator over the planned allocations checks it.
    const GptShape shape = gpt_shape(cfg, d);
    const std::vector<StagePlan> stages = plan_stages(shape, plan_shape(cfg, d));
    const StagePlan& stage_plan = stages[static_cast<size_t>(groups.pp_rank)];
    const size_t planned = static_cast<size_t>(stage_plan.total_bytes());

    // The backend before any large allocation: CUDA selects this rank's device (local rank % devices) in its
    // constructor, and the arena's memory comes from it (managed memory on that device; host memory on the CPU). So
    // the plan is checked against the device's memory when there is one: managed memory would let a larger arena be
    // allocated and then page between host and device all run long.
    BackendOptions bo;
    bo.kind = cfg.run.backend == "cuda" ? BackendKind::kCUDA : BackendKind::kCPU;
    bo.num_threads = cfg.run.num_threads;
    bo.local_rank = mpi.local_rank();
    std::unique_ptr<Backend> backend;
    on_every_rank_or_none(world, "start its backend", [&] { backend = make_backend(bo); });
    check_memory_fits(cfg, stages, world, mpi.local_size(), backend->device_memory());
    reliability.stop_point(world);
    if (const char* p = std::getenv("MS_DEFER_OPS"); p != nullptr && std::string_view(p) == "1") {
        backend = std::make_unique<DeferredBackend>(std::move(backend));
        log_info(
            "MS_DEFER_OPS=1: ops run only when the host synchronizes (deferred_backend.h), so a missing "
            "synchronization changes the results; a checking mode, not for speed");
    }
    ProfilingBackend* profiler = nullptr;  // MS_PROFILE_OPS=1: every op timed alone (profiling_backend.h)
    if (const char* p = std::getenv("MS_PROFILE_OPS"); p != nullptr && std::string_view(p) == "1") {
        auto wrapped = std::make_unique<ProfilingBackend>(std::move(backend));
        profiler = wrapped.get();
        backend = std::move(wrapped);
        log_info(
            "MS_PROFILE_OPS=1: every op is timed on its own (a synchronisation around each), so steps are slower "
            "than without it; the table comes at the end");
    }
    if (backend->asynchronous()) {
        // Kernels run behind the host (backend.h): every collective first waits for them. The host reads and writes
        // of arena memory in the model and the pipeline synchronize themselves (engine/model/gpt.h); so must any
        // new host access (a checkpoint reading the parameters, say).
        synchronize_before_collectives(groups, [b = backend.get()] { b->synchronize(); });
    }
    if (!backend->device_name().empty()) {
        log_info("device: {} | backend {} (rank 0; each rank takes local rank % devices)", backend->device_name(),
                 backend->name());
    }
    constexpr size_t kArenaMinBlock = 256, kArenaPackAll = 0;  // every allocation packed, not a power of two
    const size_t arena_bytes =
        arena_capacity_for(stage_plan.allocations(), kArenaMinBlock, kArenaPackAll, BlockFit::kPacked);
    std::unique_ptr<ArenaMemory> arena_memory;  // nullptr: host memory
    on_every_rank_or_none(world, "allocate its arena", [&] { arena_memory = backend->make_arena_memory(arena_bytes); });
    Arena arena(arena_bytes, kArenaMinBlock, kArenaPackAll, BlockFit::kPacked, std::move(arena_memory));
    log_info("memory: arena of {} per rank in {} for a plan of {} ({:.3f}% rounding slack)",
             format_bytes(arena.capacity()), arena.memory().describe(), format_bytes(planned),
             100.0 * (static_cast<double>(arena.capacity()) / static_cast<double>(planned) - 1.0));

    const DType dtype = model_dtype(cfg.mixed_precision);
    PipelineModel model(shape, *backend, groups, mbs, parse_schedule_kind(cfg.parallel.pipeline_schedule), num_mb,
                        cfg.parallel.virtual_pipeline_model_parallel_size, cfg.parallel.sequence_parallel, &arena,
                        dtype);
    model.init_weights(cfg.run.seed);
    const int64_t flat = model.flat_size();
    DistributedOptimizer optimizer(model.params_info(), flat, model.params(), model.grads(), cfg.optimizer,
                                   cfg.parallel.zero_stage, *backend, *groups.dp, *groups.mp, groups.tp_rank, &arena);
    if (dtype != DType::kF32) optimizer.set_weights(model.weights(), dtype);
    LossScaler scaler(cfg.mixed_precision);
    reliability.stop_point(world);
    log_info("memory per rank: parameters {} | gradients {} | optimizer state {} (zero_stage {}){}",
             human_bytes(4.0 * static_cast<double>(flat)), human_bytes(4.0 * static_cast<double>(flat)),
             human_bytes(static_cast<double>(optimizer.state_bytes())), cfg.parallel.zero_stage,
             dtype == DType::kF32
                 ? std::string()
                 : fmt::format(" | {} weights {} (activations in {}; fp32 master weights, gradients, optimizer "
                               "state)",
                               dtype_name(dtype), human_bytes(static_cast<double>(dtype_size(dtype) * flat)),
                               dtype_name(dtype)));
    if (scaler.enabled()) {
        log_info("fp16: {} loss scale {}{}", scaler.dynamic() ? "dynamic" : "constant", scaler.scale(),
                 scaler.dynamic() ? fmt::format(" (min {}, window {}, hysteresis {}); steps whose gradients "
                                                "overflow are skipped",
                                                cfg.mixed_precision.min_loss_scale,
                                                cfg.mixed_precision.loss_scale_window, cfg.mixed_precision.hysteresis)
                                  : std::string());
    }
    // Equal by construction (the plan calls the functions the model and optimizer allocate by); every training run
    // in the test suite checks it.
    MS_CHECK(arena.stats().live_bytes == planned,
             "memory: the arena holds {} B but the plan says {} B: engine/train/plan.cpp no longer mirrors the "
             "trainer's allocations\n{}",
             arena.stats().live_bytes, planned, arena.report());
    // From here on an arena allocation is a bug (a first-touch stall inside a step): fatal (memory/arena.h).
    // tests/model/test_gpt_arena.cpp and tests/e2e/test_memory.cpp run steps frozen. Not arena memory, so not
    // covered: each collective's small control state (MPI requests, a Handle), the MPI communicator's staging
    // pool (grown once, in the first step, by reduce-scatters whose per-rank block exceeds its chunk size, e.g.
    // ZeRO-1 of a >8M-element shard at dp 2), OpenBLAS's and MPI's own buffers, and per log interval the log line
    // and metrics record (MS_DUMP_GRADS's gather buffers at step 1, in tests only).
    arena.set_frozen(true);

    // Checkpoints (engine/ckpt/checkpoint.h): checkpoint.save writable with room, locked for the run and cleared of
    // crashed saves' leftovers; then resume from checkpoint.load when it holds a committed checkpoint, in whatever
    // layout saved it (the whole data state is the consumed-sample count); then no save of this run may replace a
    // committed checkpoint. Each found here, not at the first save, with every rank agreeing.
    const CheckpointContext ckpt{cfg, shape, groups, model.params_info(), model.params(), optimizer};
    std::unique_ptr<SaveDirLock> save_lock;  // held until the run ends
    on_every_rank_or_none(world, "use checkpoint.save", [&] { save_lock = open_save_dir(ckpt); });
    const std::string data_id = data_fingerprint(source->fingerprint(), cfg.data, T, cfg.run.seed);
    const std::optional<TrainState> resumed = load_checkpoint(ckpt, data_id);
    on_every_rank_or_none(world, "use checkpoint.save",
                          [&] { check_no_newer_checkpoint(ckpt, resumed ? resumed->iteration : 0); });
    reliability.stop_point(world);
    setup_watch.reset();  // from here the step boundaries agree on a stop signal
    const int64_t first_it = resumed ? resumed->iteration + 1 : 1;
    if (resumed) {
        model.refresh_weights();  // the loaded master weights, rounded into the 16-bit ones (no-op in fp32)
        if (scaler.dynamic()) scaler.set_state(resumed->loss_scaler);
        reliability.event("checkpoint_loaded", {{"iteration", resumed->iteration}});
    }
    if (first_it > cfg.training.train_iters) {
        log_info("training: the checkpoint is at iteration {}, training.train_iters is {}: nothing left to train",
                 first_it - 1, cfg.training.train_iters);
    }

    // The host initialised the weights: move the whole arena to the device before the first step (no-op on the CPU).
    arena.memory().prefetch_to_device();
    const double peak = mfu_peak(cfg, *backend);
    const double flops_per_token = gpt_train_flops_per_token(shape, T);

    const bool writer = world.rank() == 0;  // the one rank that writes run files
    std::ofstream metrics;
    if (writer) {
        std::filesystem::create_directories(cfg.run.output_dir);
        std::ofstream(std::filesystem::path(cfg.run.output_dir) / "config.resolved.yaml") << config_to_yaml(cfg);
        if (resumed) {  // a resume continues the file, without the lines the interrupted run logged past the checkpoint
            const MetricsTrim trim = trim_metrics_log(cfg.logging.metrics_file, resumed->iteration);
            if (trim.dropped > 0) {
                log_info("metrics: dropped {} line(s) of {} logged after iteration {} (they are trained again)",
                         trim.dropped, cfg.logging.metrics_file, resumed->iteration);
            }
        }
        metrics.open(cfg.logging.metrics_file, resumed ? std::ios::app : std::ios::trunc);
    }
    if (writer && !metrics) {
        throw UserError(
            fmt::format("cannot open logging.metrics_file '{}' for writing\n---> HINT: check the "
                        "directory exists and is writable",
                        cfg.logging.metrics_file));
    }

    std::vector<int32_t> inputs(static_cast<size_t>(mbs) * T), targets(static_cast<size_t>(mbs) * T);
    int64_t consumed = resumed ? resumed->consumed_samples : 0;
    int64_t skipped = resumed ? resumed->skipped_iterations : 0, nan_iters = resumed ? resumed->nan_iterations : 0;
    // What train_state.json records at the end of iteration `it` (save_checkpoint adds the optimizer's step count
    // and the schedule's inputs).
    auto train_state = [&](int64_t it) {
        TrainState s;
        s.iteration = it;
        s.consumed_samples = consumed;
        s.skipped_iterations = skipped;
        s.nan_iterations = nan_iters;
        s.last_lr = learning_rate(cfg.optimizer, cfg.lr_schedule, cfg.training.train_iters, it);
        s.seed = cfg.run.seed;
        s.data_fingerprint = data_id;
        s.data_describe = source->describe();
        s.loss_scaler = scaler.state();
        return s;
    };
    double interval_loss = 0, interval_time = 0;
    int64_t interval_steps = 0;
    const int64_t global_batch = static_cast<int64_t>(mbs) * num_mb * d.dp;
    log_info("training: {} iterations, log every {}", cfg.training.train_iters, cfg.logging.log_interval);

    // Communication accounting per step: time in pipeline receives (the measured bubble), time in every other
    // collective (exposed communication: all of ours is synchronous today), and bytes sent per group.
    std::vector<Communicator*> others = {groups.tp.get(), groups.dp.get(), groups.mp.get()};
    if (groups.embd) others.push_back(groups.embd.get());
    auto other_wait = [&] {
        double w = 0;
        for (Communicator* c : others) w += c->stats().wait_seconds;
        return w;
    };
    double interval_bubble = 0, interval_comm = 0;
    double profiled_seconds = 0;  // MS_PROFILE_OPS: the steps after the first, which the op table covers
    int64_t profiled_steps = 0;
    size_t memory_peak = 0;  // the arena's peak of block bytes after the first step
    int64_t step_bytes_tp = 0, step_bytes_pp = 0, step_bytes_dp = 0;

    // Validation and sampling agree on a stop signal as they go (one all-reduce per micro-batch or token).
    const std::function<bool()> stop_requested = [&] { return reliability.poll_stop(world); };
    std::string last_saved;  // the run's latest checkpoint, for a stop after the loop
    for (int64_t it = first_it; it <= cfg.training.train_iters; ++it) {
        const double t0 = now_seconds();
        const double pp_wait0 = groups.pp->stats().wait_seconds, other_wait0 = other_wait();
        const int64_t tp_bytes0 = groups.tp->stats().total_bytes(), pp_bytes0 = groups.pp->stats().total_bytes(),
                      dp_bytes0 = groups.dp->stats().total_bytes();
        reliability.begin_step(it);  // MS_INJECT crash, hang, sigterm
        // MS_CHECK_ALLOCS=1: from this run's third step on, a step allocates nothing. The first two warm up what is
        // sized on first use: the communicators' pools of operation states reach their peak in the second, the first
        // step that begins with pipeline sends of the previous one still in flight.
        StepAllocGuard alloc_guard(it, /*arm=*/it > first_it + 1);
        // Megatron's sampler: micro-batch mb of the step is samples [mb * dp + dp_rank] * mbs onwards, so the step
        // covers the same global samples under every data-parallel size.
        const float loss_scale = scaler.scale();
        float step_loss = model.train_step(train_sampler, consumed, T, loss_scale);
        // Every rank's NaN/Inf check and stop signal, agreed before the data-parallel reduction spreads a NaN. With
        // fp16 loss scaling, gradients that overflow are the scaler's business (the step is skipped, the scale
        // lowered): only the loss is checked.
        const StepVerdict verdict = reliability.step_boundary(
            world, it, step_loss, std::span<float>(model.grads(), static_cast<size_t>(flat)), *backend,
            /*check_grads=*/!scaler.enabled());
        groups.dp->all_reduce(std::span<float>(&step_loss, 1), ReduceOp::kAvg).wait();
        if (it == 1 && std::getenv("MS_DUMP_GRADS")) {
            backend->synchronize();  // the host reads the gradients
            dump_gradients(model, groups, d.dp);
        }
        const float lr = learning_rate(cfg.optimizer, cfg.lr_schedule, cfg.training.train_iters, it);
        const OptimizerStepResult step = verdict.skip_step
                                             ? OptimizerStepResult{std::numeric_limits<double>::quiet_NaN(), false}
                                             : optimizer.step(lr, cfg.training.clip_grad, 1.0f / loss_scale);
        const bool overflow = scaler.enabled() && !verdict.skip_step && !step.stepped;
        scaler.update(overflow);
        // The step's kernels complete inside its time, and what the host reads after it (logs, checkpoints) is its.
        backend->synchronize();
        alloc_guard.check();
        reliability.after_step(it);
        if (profiler != nullptr && it == first_it) {
            profiler->reset();  // the first step's one-off costs (GEMM heuristics, first touches) are not the profile
        } else if (profiler != nullptr) {
            profiled_seconds += now_seconds() - t0;
            ++profiled_steps;
        }
        const double grad_norm = step.grad_norm;
        if (it == first_it) {  // every buffer of a step has been used once now
            memory_peak = arena.stats().peak_block_bytes;
            const float ratio = static_cast<float>(memory_peak) / static_cast<float>(planned);
            std::array<float, 2> range = {ratio, -ratio};  // max, -min over ranks
            world.all_reduce(std::span<float>(range), ReduceOp::kMax).wait();
            log_info(
                "memory: planned {} ({} B), arena peak {} ({} B) ({:.2f}% of planned) | all ranks: "
                "{:.2f}% to {:.2f}% of their plans",
                format_bytes(planned), planned, format_bytes(memory_peak), memory_peak, 100.0 * ratio,
                -100.0 * range[1], 100.0 * range[0]);
        }
        // A step is stepped only with a finite loss, and an fp16 overflow only happens with one (step_boundary).
        if (step.stepped || overflow) {  // an overflowing step's forward was fine: its loss counts
            interval_loss += step_loss;
            ++interval_steps;
        }
        if (!step.stepped) {
            ++skipped;
            if (!overflow) ++nan_iters;  // Megatron counts an fp16 overflow as skipped, not as NaN
        }
        consumed += global_batch;
        interval_time += now_seconds() - t0;
        interval_bubble += groups.pp->stats().wait_seconds - pp_wait0;
        interval_comm += other_wait() - other_wait0;
        step_bytes_tp = groups.tp->stats().total_bytes() - tp_bytes0;
        step_bytes_pp = groups.pp->stats().total_bytes() - pp_bytes0;
        step_bytes_dp = groups.dp->stats().total_bytes() - dp_bytes0;

        if (it % cfg.logging.log_interval == 0 || it == cfg.training.train_iters) {
            const int64_t n_iter = cfg.logging.log_interval == 0 ? 1 : (it - 1) % cfg.logging.log_interval + 1;
            const double ms_per_iter = 1e3 * interval_time / static_cast<double>(n_iter);
            const double tokens_per_s = static_cast<double>(d.tokens_per_step) / (ms_per_iter / 1e3);
            // per-rank MFU (Megatron's "per GPU"): the whole job's model FLOP/s over the ranks' summed peak
            const double mfu = 100.0 * flops_per_token * tokens_per_s / (peak * world.size());
            const double loss = interval_steps > 0 ? interval_loss / static_cast<double>(interval_steps)
                                                   : std::numeric_limits<double>::quiet_NaN();
            // fractions of the step, averaged over all ranks
            std::array<float, 2> shares = {static_cast<float>(interval_bubble / interval_time),
                                           static_cast<float>(interval_comm / interval_time)};
            world.all_reduce(std::span<float>(shares), ReduceOp::kSum).wait();
            const double bubble_pct = 100.0 * shares[0] / world.size(), comm_pct = 100.0 * shares[1] / world.size();
            log_info(
                " [{}] iteration {:8d}/{:8d} | consumed samples: {:12d} | elapsed time per iteration (ms): {:.1f} "
                "| learning rate: {:.6E} | global batch size: {:5d} | lm loss: {:.6E} | {}grad norm: {:.3f} | "
                "number of skipped iterations: {:3d} | number of nan iterations: {:3d} | tokens/s: {:.0f} | "
                "MFU: {:.1f}% |{}",
                timestamp(), it, cfg.training.train_iters, consumed, ms_per_iter, lr, global_batch, loss,
                scaler.enabled() ? fmt::format("loss scale: {:.1f} | ", scaler.scale()) : std::string(), grad_norm,
                skipped, nan_iters, tokens_per_s, mfu,
                world.size() == 1 ? std::string()
                                  : fmt::format(" pipeline bubble: {:.1f}% | exposed comm: {:.1f}% | bytes sent "
                                                "per step (rank 0): tp {} pp {} dp {} |",
                                                bubble_pct, comm_pct, step_bytes_tp, step_bytes_pp, step_bytes_dp));
            nlohmann::json j = {
                {"iteration", it},
                {"consumed_samples", consumed},
                {"time", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
                {"learning-rate", lr},
                {"batch-size", global_batch},
                {"grad-norm", std::isfinite(grad_norm) ? nlohmann::json(grad_norm) : nullptr},
                {"skipped_iterations", skipped},
                {"nan_iterations", nan_iters},
                {"iteration-time", ms_per_iter / 1e3},
                {"tokens_per_sec", tokens_per_s},
                {"mfu", mfu / 100.0},
                {"pipeline_bubble", bubble_pct / 100.0},
                {"exposed_comm", comm_pct / 100.0},
                {"bytes_per_step", {{"tp", step_bytes_tp}, {"pp", step_bytes_pp}, {"dp", step_bytes_dp}}},
                {"memory_planned_bytes", planned},
                {"memory_peak_bytes", memory_peak}};
            j["lm loss"] = std::isfinite(loss) ? nlohmann::json(loss) : nlohmann::json(nullptr);
            if (scaler.enabled()) j["loss-scale"] = scaler.scale();
            if (writer) metrics << j.dump() << '\n' << std::flush;
            interval_loss = interval_time = interval_bubble = interval_comm = 0;
            interval_steps = 0;
        }
        // A stop signal (reliability.h "Signals") ends the run after this iteration: agreed at its step boundary, or
        // during its validation or save. Validation changes no state, so iteration `it` is what a stop saves.
        bool stop = verdict.stop;
        std::string_view stopped_in;  // the phase a signal interrupted; "" for the step itself
        if (!stop && valid_sampler && (it % cfg.eval.eval_interval == 0 || it == cfg.training.train_iters)) {
            const std::optional<float> local =
                model.evaluate(*valid_sampler, cfg.eval.eval_iters * num_mb, T, stop_requested);
            if (!local) {
                stop = true;
                stopped_in = "validation";
            } else {
                float vloss = *local;
                groups.dp->all_reduce(std::span<float>(&vloss, 1), ReduceOp::kAvg).wait();
                log_info(" validation loss at iteration {} | lm loss value: {:.6E} | lm loss PPL: {:.6E} |", it, vloss,
                         std::exp(vloss));
                if (writer) {
                    metrics << nlohmann::json{{"iteration", it},
                                              {"consumed_samples", consumed},
                                              {"validation lm loss", vloss}}
                                   .dump()
                            << '\n'
                            << std::flush;
                }
            }
        }
        // Megatron saves every save_interval iterations and, when checkpoint.save is set, at the end -- and when a
        // stop signal arrived (then exits 3). A signal during a save lets it complete, then stops.
        std::string saved;
        if (!cfg.checkpoint.save.empty() &&
            ((cfg.checkpoint.save_interval > 0 && it % cfg.checkpoint.save_interval == 0) ||
             it == cfg.training.train_iters || stop)) {
            saved = save_checkpoint(ckpt, train_state(it));
            last_saved = saved;
            reliability.event("checkpoint_saved", {{"iteration", it}, {"dir", saved}});
            if (!stop && reliability.poll_stop(world)) {
                stop = true;
                stopped_in = "the checkpoint save";
            }
        }
        if (stop) {
            backend->synchronize();
            return reliability.exit_on_signal(it, saved, stopped_in);
        }
    }

    if (cfg.eval.sample_tokens > 0 && !model.whole_model()) {
        log_info("sample: skipped (sampling runs the whole model on one pipeline stage; this run has pp = {})",
                 groups.pp_size);
    } else if (cfg.eval.sample_tokens > 0) {
        std::vector<int32_t> context;
        if (!cfg.eval.sample_prompt.empty() && shape.V >= 256) {
            context = byte_encode(cfg.eval.sample_prompt);
        } else {
            const Sampler& s = valid_sampler ? *valid_sampler : train_sampler;
            s.fill(0, 1, inputs.data(), targets.data());
            context.assign(inputs.begin(), inputs.begin() + std::min(T, 8));
        }
        const size_t prompt_len = context.size();
        bool stopped = false;
        const std::vector<int32_t> out =
            generate(*model.whole_model(), *groups.tp, context, cfg.eval.sample_tokens, cfg.eval.sample_temperature,
                     cfg.eval.sample_top_k, cfg.run.seed, [&] { return stopped = stop_requested(); });
        if (stopped) {
            backend->synchronize();
            return reliability.exit_on_signal(cfg.training.train_iters, last_saved, "the end-of-run sample");
        }
        log_info("sample (temperature {}, top-k {}), prompt in [brackets]:\n[{}]{}", cfg.eval.sample_temperature,
                 cfg.eval.sample_top_k,
                 source->decode(std::vector<int32_t>(out.begin(), out.begin() + static_cast<long>(prompt_len))),
                 source->decode(std::vector<int32_t>(out.begin() + static_cast<long>(prompt_len), out.end())));
    }
    backend->synchronize();  // nothing may run on the arena once it is freed
    if (profiler != nullptr && profiled_steps > 0) {
        // every rank writes its own (pipeline stages differ); the logging rank also prints its table
        const std::vector<std::string> table = profiler->table(profiled_seconds, profiled_steps);
        std::ofstream f(std::filesystem::path(cfg.run.output_dir) / fmt::format("op_profile_rank{}.txt", world.rank()));
        for (const std::string& line : table) {
            log_info("{}", line);
            f << line << '\n';
        }
    }
    log_info("done: {} iterations in {:.1f} s; metrics in {}", cfg.training.train_iters, now_seconds() - t_start,
             cfg.logging.metrics_file);
    return reliability.finish(cfg.training.train_iters);
}

}  // namespace ms
