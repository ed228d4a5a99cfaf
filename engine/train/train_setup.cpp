// train_setup.cpp: the phases of run_train before its first step (see train_setup.h).
#include "engine/train/train_setup.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>

#include "comm/comm_engine.h"
#include "comm/flight_recorder.h"
#include "comm/hierarchical_communicator.h"
#include "comm/link_model_communicator.h"
#include "comm/synchronizing_communicator.h"
#include "engine/backends/cpu/probe.h"
#include "engine/backends/deferred_backend.h"
#include "engine/core/log.h"
#include "engine/core/philox.h"
#include "engine/train/device_peak.h"
#include "engine/train/metrics_log.h"
#include "engine/train/run_end.h"

namespace ms {
namespace {

std::string human_bytes(double b) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, ++u;
    return fmt::format("{:.2f} {}", b, units[u]);
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

// Every group counted into the communication matrix and, with link_model.enabled, delayed by the link model
// (comm/link_model_communicator.h); the nodes from run.ranks_per_node (comm/nodes.h). Collective over world.
void meter_groups(TrainRun& r) {
    const Config& cfg = r.cfg;
    std::vector<std::string> hosts;
    for (int rank = 0; rank < r.world.size(); ++rank) hosts.push_back(r.mpi.host_of(rank));
    NodeLayout nodes = make_node_layout(cfg.run.ranks_per_node, hosts);
    const std::string described = nodes.describe();
    r.comm_matrix = std::make_unique<CommMatrix>(r.world.rank(), std::move(nodes));
    const LinkModelConfig& lm = cfg.link_model;
    if (lm.enabled) {
        r.link_model = std::make_unique<LinkModel>(
            LinkModel{.intra = {lm.intra_node_latency_us * 1e-6, lm.intra_node_bandwidth_gbps * 1e9},
                      .inter = {lm.inter_node_latency_us * 1e-6, lm.inter_node_bandwidth_gbps * 1e9},
                      .occupancy = lm.contention ? std::make_shared<LinkOccupancy>() : nullptr});
        log_info(
            "link model: every communication delayed to its modelled time: intra-node {} us + bytes / {} GB/s, "
            "inter-node {} us + bytes / {} GB/s{}; {}",
            lm.intra_node_latency_us, lm.intra_node_bandwidth_gbps, lm.inter_node_latency_us,
            lm.inter_node_bandwidth_gbps, lm.contention ? ", one transfer at a time per link (contention)" : "",
            described);
        if (nodes_by_host(hosts).num_nodes > 1) {
            log_warn(
                "link model: the ranks run on more than one host, whose clocks the modelled point-to-point times "
                "compare; the link model is meant for ranks on one machine");
        }
    } else {
        log_info("comm: nodes: {}", described);
    }
    model_links(*r.groups, *r.comm_matrix, r.link_model.get());
    log_info("{}", use_hierarchical_dp(*r.groups, r.comm_matrix->nodes(), r.layout.hierarchical_dp));
}

// parallel.comm_engine: tp, pp, dp, mp and embd through one progress thread (comm/comm_engine.h), outside the link
// model's decorators, so that the model delays what the engine issues, when it issues it.
void schedule_communication(TrainRun& r) {
    const ParallelConfig& p = r.cfg.parallel;
    if (!r.mpi.thread_multiple()) {
        throw UserError(
            "parallel.comm_engine calls MPI from a progress thread beside the main thread, which needs "
            "MPI_THREAD_MULTIPLE, and this MPI library does not provide it; hint: set comm_engine: false, or use an "
            "MPI built with thread support (Debian's Open MPI has it)");
    }
    CommMatrix* matrix = r.comm_matrix.get();
    r.comm_engine = schedule_groups(*r.groups, {.chunk_bytes = p.comm_chunk_bytes,
                                                .timeout_s = r.cfg.reliability.collective_timeout_s,
                                                .on_queued = [matrix](std::string_view group, double seconds) {
                                                    matrix->add_op_seconds(CommMatrix::group_index(group), seconds);
                                                }});
    r.mpi.add_trace_section("comm_engine", [engine = std::weak_ptr<CommEngine>(r.comm_engine)] {
        const std::shared_ptr<CommEngine> e = engine.lock();
        return e ? e->queue_json() : nlohmann::ordered_json(nullptr);
    });
    log_info(
        "comm engine: a progress thread issues the tp, pp, dp, mp and embd communication by priority, the critical "
        "(tp, pp) at once and the data-parallel in pieces of at most {} bytes, one piece in flight at a time",
        p.comm_chunk_bytes);
}

// The data and layout lines of the start-up log.
void log_inputs(const TrainRun& r) {
    const Config& cfg = r.cfg;
    log_info("mindspeed-train {} | backend {} | threads {} | {}", MS_VERSION, cfg.run.backend,
             cfg.run.num_threads > 0 ? cfg.run.num_threads : 0, r.mpi.describe());
    log_info("data: {}", r.source->describe());
    const double entropy = r.source->entropy_rate();
    if (std::isfinite(entropy)) {
        log_info("data: entropy rate of the source {:.4f} nats/token: the lowest loss any model can reach", entropy);
    }
    log_info("data: {} training samples of {} tokens per epoch{}", r.train_sampler->num_samples(),
             r.layout.seq_length(),
             r.valid_sampler ? fmt::format(", {} validation samples", r.valid_sampler->num_samples()) : "");
    log_derived(r.layout, cfg);
}

// logging.trace_dir: this rank's timeline (engine/train/trace.h), fed by the communication matrix (here), the
// backend's op timer (wrap_backend) and the pipeline (run_train). Collective over world.
void open_trace(TrainRun& r) {
    const LoggingConfig& lc = r.cfg.logging;
    if (lc.trace_dir.empty()) return;
    // rank 0's realtime clock is every rank's zero; a double travels as two int32 words
    std::array<int32_t, 2> origin{};
    const double unix_now = unix_seconds();
    std::memcpy(origin.data(), &unix_now, sizeof(unix_now));
    r.world.broadcast(std::span<int32_t>(origin), 0).wait();
    double zero = 0;
    std::memcpy(&zero, origin.data(), sizeof(zero));
    const RunLayout& l = r.layout;
    const ProcessGroups& g = *r.groups;
    // a first guess at one iteration's events (Trace grows what does not fit): per layer and micro-batch a few dozen
    // ops and, with tp, a few collectives
    const size_t layers = static_cast<size_t>(l.layers_per_chunk * l.virtual_stages);
    const size_t m = static_cast<size_t>(l.num_microbatches), v = static_cast<size_t>(l.virtual_stages);
    const Trace::Capacity capacity{
        .ops = 64 * layers * m + 4096, .comms = 8 * layers * m + 8 * v * m + 1024, .pipeline = 6 * v * m};
    const TraceRank rank{.world_rank = r.world.rank(),
                         .world_size = r.world.size(),
                         .tp_rank = g.tp_rank,
                         .pp_rank = g.pp_rank,
                         .dp_rank = g.dp_rank,
                         .pp_size = g.pp_size,
                         .virtual_stages = l.virtual_stages};
    const TraceSteps steps = *parse_trace_steps(lc.trace_steps);  // validated with the config
    on_every_rank_or_none(r.world, "open logging.trace_dir", [&] {
        r.trace = std::make_unique<Trace>(lc.trace_dir, steps, r.cfg.training.train_iters, rank, zero, capacity);
    });
    r.comm_matrix->set_listener(r.trace.get());
    log_info(
        "trace: iterations {} to {} on a timeline per rank in {} (every op timed alone, as MS_PROFILE_OPS does, so "
        "traced iterations run slower), merged into {}/trace.json for ui.perfetto.dev",
        steps.first, r.trace->last_step(), lc.trace_dir, lc.trace_dir);
}

// MS_DEFER_OPS and MS_PROFILE_OPS wrap the backend (deferred_backend.h, profiling_backend.h), and so does
// logging.trace_dir, whose timeline gets each op (without MS_PROFILE_OPS, only in the traced iterations).
void wrap_backend(TrainRun& r) {
    if (r.env.defer_ops) {
        r.backend = std::make_unique<DeferredBackend>(std::move(r.backend));
        log_info(
            "MS_DEFER_OPS=1: ops run only when the host synchronizes (deferred_backend.h), so a missing "
            "synchronization changes the results; a checking mode, not for speed");
    }
    if (r.env.profile_ops || r.trace) {
        auto wrapped = std::make_unique<ProfilingBackend>(
            std::move(r.backend), r.env.profile_ops ? ProfilingBackend::Totals::kOn : ProfilingBackend::Totals::kOff);
        wrapped->set_timeline(r.trace.get());
        if (r.env.profile_ops) r.profiler = wrapped.get();
        r.backend = std::move(wrapped);
    }
    if (r.env.profile_ops) {
        log_info(
            "MS_PROFILE_OPS=1: every op is timed on its own (a synchronisation around each), so steps are slower "
            "than without it; the table comes at the end");
    }
}

// The start-up lines on what the model, optimizer and loss scaler hold.
void log_model_memory(const TrainRun& r) {
    // what the plan says this rank holds (setup_model checks the arena against it)
    const StagePlan& st = r.stages[static_cast<size_t>(r.groups->pp_rank)];
    const DType dtype = r.layout.dtype;
    const std::string_view grads = dtype_name(r.layout.graph.grads);
    const auto b = [](int64_t bytes) { return human_bytes(static_cast<double>(bytes)); };
    if (dtype == DType::kF32) {
        log_info("memory per rank: parameters {} | gradients {} | optimizer state {} (zero_stage {})",
                 b(st.param_bytes), b(st.all_grad_bytes()), b(st.optimizer_bytes()), r.layout.zero_stage);
    } else if (st.optimizer.master > 0) {
        log_info(
            "memory per rank: {} weights {} | {} gradients {} | fp32 master weights {} (sharded over dp {}) | "
            "optimizer state {} (zero_stage {})",
            dtype_name(dtype), b(st.weight_bytes), grads, b(st.all_grad_bytes()), b(st.optimizer.master),
            r.layout.topology.dp, b(st.optimizer_bytes() - st.optimizer.master), r.layout.zero_stage);
    } else {
        log_info(
            "memory per rank: {} weights {} | fp32 master weights {} | {} gradients {} | optimizer state {} "
            "(zero_stage {})",
            dtype_name(dtype), b(st.weight_bytes), b(st.param_bytes), grads, b(st.all_grad_bytes()),
            b(st.optimizer_bytes()), r.layout.zero_stage);
    }
    const LossScaler& scaler = *r.scaler;
    const MixedPrecisionConfig& mp = r.cfg.mixed_precision;
    if (scaler.enabled()) {
        log_info("fp16: {} loss scale {}{}", scaler.dynamic() ? "dynamic" : "constant", scaler.scale(),
                 scaler.dynamic() ? fmt::format(" (min {}, window {}, hysteresis {}); steps whose gradients "
                                                "overflow are skipped",
                                                mp.min_loss_scale, mp.loss_scale_window, mp.hysteresis)
                                  : std::string());
    }
}

}  // namespace

// Each failing rank's sentence names it and its host, since only it saw the problem. The lowest failing rank's
// sentence and exit code go to every rank, so that whichever rank writes exit_status.json names it, its host and the
// cause. Every rank prints and records before a barrier that the others must pass before throwing: mpirun kills
// every rank as soon as one exits non-zero, so a rank that printed only on its way out could be killed before saying
// why.
void on_every_rank_or_none(Communicator& world, const std::string& what, const std::function<void()>& step) {
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

void setup_inputs(TrainRun& r, const Config& cfg_in) {
    Communicator& world = r.world;
    // From here on every failure leaves exit_status.json (engine/train/reliability.h), the input checks' too.
    std::vector<std::string> hosts;
    for (int rank = 0; rank < world.size(); ++rank) hosts.push_back(r.mpi.host_of(rank));
    arm_exit_record(cfg_in.run.output_dir, world.rank(), std::move(hosts));
    // Stop signals (reliability.h "Signals"): from here to the first step, stop points between setup's phases, and
    // the setup watch for a phase that runs long.
    install_signal_handlers();
    r.setup_watch.emplace();
    // Everything that can be wrong with the input is checked before any large allocation. The ranks agree on the
    // outcome before the first collective that could otherwise wait forever for a rank that failed alone (a data
    // file missing on one node): every rank fails with exit code 2, the failing ones with their own sentence.
    on_every_rank_or_none(world, "pass its input checks", [&] {
        r.source = open_token_source(cfg_in.data, cfg_in.model.vocab_size);
        r.cfg = resolve_vocab(cfg_in, *r.source);
        // parallel.auto: the layout keys chosen here, before anything reads them (every rank the same choice)
        r.cfg = resolve_auto_layout(r.cfg, world.size(),
                                    r.cfg.run.ranks_per_node > 0 ? r.cfg.run.ranks_per_node : r.mpi.local_size(),
                                    r.mpi.local_rank());
        // MS_INJECT wins over reliability.inject; the resolved config (and its hash) records the one that applies
        r.cfg.reliability.inject =
            resolve_fault_injection(r.cfg.reliability, world.size(), r.cfg.training.train_iters).spec;
        r.layout = make_run_layout(r.cfg, world.size());
    });
    const Config& cfg = r.cfg;
    check_same_config(r.mpi, config_hash(cfg));
    r.groups.emplace(make_process_groups(world, r.layout.topology,
                                         {.comm = r.layout.comm,
                                          .backend = r.layout.backend,
                                          .local_rank = r.mpi.local_rank(),
                                          .local_size = r.mpi.local_size()}));
    meter_groups(r);
    if (cfg.parallel.comm_engine) schedule_communication(r);
    // Stop signals, the NaN policy, fault injection, collective timeouts with flight recorders, and the run's
    // exit_status.json / events.jsonl (engine/train/reliability.h).
    r.reliability = std::make_unique<Reliability>(cfg, *r.groups, r.mpi.hostname());
    r.mpi.set_collective_watch(r.reliability->watch_options());
    r.reliability->start(world, config_hash(cfg));
    r.reliability->stop_point(world);
    const int T = r.layout.seq_length();
    r.train_sampler = std::make_unique<Sampler>(*r.source, cfg.data.split, Split::kTrain, T, cfg.run.seed);
    if (cfg.eval.eval_interval > 0) {
        r.valid_sampler = std::make_unique<Sampler>(*r.source, cfg.data.split, Split::kValid, T, cfg.run.seed);
        r.cfg.eval.eval_iters = bound_eval_iters(cfg.eval.eval_iters, "eval.eval_iters", r.valid_sampler->num_samples(),
                                                 r.layout.global_batch);
    }
    log_inputs(r);
}

void setup_backend(TrainRun& r) {
    // Memory: the plan (engine/train/plan.h) says what every rank allocates; check it fits, then carve everything a
    // step uses -- parameters, gradients, optimizer state, activations, scratch, communication buffers -- out of one
    // arena per rank (setup_model).
    r.stages = plan_stages(r.layout.shape, plan_shape(r.layout));
    r.planned = static_cast<size_t>(r.stages[static_cast<size_t>(r.groups->pp_rank)].total_bytes());
    if (const std::string w = sharded_grads_warning(r.stages, plan_shape(r.layout)); !w.empty()) log_warn("{}", w);
    // The backend before any large allocation: CUDA selects this rank's device (local rank % devices) in its
    // constructor, and the arena's memory comes from it (managed memory on that device; host memory on the CPU). So
    // the plan is checked against the device's memory when there is one: managed memory would let a larger arena be
    // allocated and then page between host and device all run long.
    BackendOptions bo;
    bo.kind = r.layout.backend;
    bo.num_threads = r.cfg.run.num_threads;
    bo.local_rank = r.mpi.local_rank();
    bo.local_size = r.mpi.local_size();
    bo.cuda = cuda_debug_options(r.cfg.debug);
    on_every_rank_or_none(r.world, "start its backend", [&] { r.backend = make_backend(bo); });
    check_memory_fits(r.cfg, r.stages, r.world, r.mpi.local_size(), r.backend->device_memory());
    r.reliability->stop_point(r.world);
    open_trace(r);
    wrap_backend(r);
    if (r.backend->asynchronous()) {
        // Kernels run behind the host (backend.h): every collective first waits for them. The host reads and writes
        // of arena memory in the model and the pipeline synchronize themselves (engine/model/gpt.h); so must any
        // new host access (a checkpoint reading the parameters, say).
        synchronize_before_collectives(*r.groups, [b = r.backend.get()] { b->synchronize(); });
    }
    if (!r.backend->device_name().empty()) {
        log_info("device: {} | backend {} (rank 0; each rank takes local rank % devices)", r.backend->device_name(),
                 r.backend->name());
    }
    r.gpu_metrics = open_gpu_metrics(r.layout.backend, r.backend->pci_bus_id());
}

void setup_model(TrainRun& r) {
    // The arena's blocks are packed (memory/buddy_allocator.h, BlockFit::kPacked), so its capacity is the plan
    // rounded up to 256 bytes per allocation; a dry run of the allocator over the planned allocations checks it.
    const StagePlan& stage_plan = r.stages[static_cast<size_t>(r.groups->pp_rank)];
    constexpr size_t kArenaMinBlock = 256, kArenaPackAll = 0;  // every allocation packed, not a power of two
    const size_t arena_bytes =
        arena_capacity_for(stage_plan.allocations(), kArenaMinBlock, kArenaPackAll, BlockFit::kPacked);
    std::unique_ptr<ArenaMemory> arena_memory;  // nullptr: host memory
    on_every_rank_or_none(r.world, "allocate its arena",
                          [&] { arena_memory = r.backend->make_arena_memory(arena_bytes); });
    r.arena =
        std::make_unique<Arena>(arena_bytes, kArenaMinBlock, kArenaPackAll, BlockFit::kPacked, std::move(arena_memory));
    Arena& arena = *r.arena;
    log_info("memory: arena of {} per rank in {} for a plan of {} ({:.3f}% rounding slack)",
             format_bytes(arena.capacity()), arena.memory().describe(), format_bytes(r.planned),
             100.0 * (static_cast<double>(arena.capacity()) / static_cast<double>(r.planned) - 1.0));

    const RunLayout& l = r.layout;
    const ProcessGroups& groups = *r.groups;
    r.model = std::make_unique<PipelineModel>(l.shape, *r.backend, groups, l.micro_batch, l.schedule,
                                              l.num_microbatches, l.virtual_stages, l.sequence_parallel, &arena,
                                              l.dtype, l.graph, shards_master_weights(l.zero_stage, l.dtype),
                                              l.zero_stage == 2 ? l.grad_bucket_elems : 0);
    PipelineModel& model = *r.model;
    model.init_weights(r.cfg.run.seed, r.cfg.model.init_method_std);
    // With sharded master weights the optimizer takes its shard of the initial parameters here.
    r.optimizer = std::make_unique<DistributedOptimizer>(
        model.params_info(), model.flat_size(), model.params(), model.grads(), r.cfg.optimizer, l.zero_stage,
        *r.backend, *groups.dp, *groups.mp, groups.tp_rank, &arena, l.dtype == DType::kF32 ? nullptr : model.weights(),
        l.dtype, model.grad_dtype());
    if (const ShardedGrads* sharded = model.sharded_grads()) {
        r.optimizer->use_sharded_grads(sharded);
        const ShardedGradLayout& g = sharded->layout();
        log_info(
            "data parallel: zero_stage 2 -- the gradients in {} buckets of at least {} elements in {} rotating slots "
            "of {} elements, each reduced into the dp shards' owners as every micro-batch's backward finishes it; {} "
            "elements kept whole for the step (written twice, or reduced per step)",
            g.buckets.size(), l.grad_bucket_elems, g.slots, g.slot_elems, g.kept_elems);
    } else if (l.grad_bucket_elems > 0) {
        GradBuckets& buckets = r.optimizer->overlap_grad_reduce(l.grad_bucket_elems, model.params_info());
        model.set_grad_buckets(&buckets);
        log_info(
            "data parallel: the gradients in {} buckets of at least {} elements, each {} over dp as soon as the last "
            "micro-batch's backward has finished it (parallel.overlap_grad_reduce)",
            buckets.num_buckets(), l.grad_bucket_elems,
            l.zero_stage == 0 ? "all-reduced" : "reduced into the dp shards' owners");
        if (buckets.tied())
            log_info(
                "data parallel: the tied embedding's gradient in two parts, each reduced as soon as it is final: the "
                "output layer's after the last micro-batch's head, the lookup's as the rows some dp rank looked up");
    }
    if (l.param_gather_overlap) {
        model.set_param_gather(&r.optimizer->overlap_param_gather(l.grad_bucket_elems, model.params_info()));
        log_info(
            "data parallel: the updated parameters gathered in the same buckets after each step, each waited when "
            "the next forward first reads it (parallel.overlap_param_gather)");
    }
    r.scaler = std::make_unique<LossScaler>(r.cfg.mixed_precision);
    r.reliability->stop_point(r.world);
    log_model_memory(r);
    // Equal by construction (the plan calls the functions the model and optimizer allocate by); every training run
    // in the test suite checks it.
    MS_CHECK(arena.stats().live_bytes == r.planned,
             "memory: the arena holds {} B but the plan says {} B: engine/train/plan.cpp no longer mirrors the "
             "trainer's allocations\n{}",
             arena.stats().live_bytes, r.planned, arena.report());
    // From here on an arena allocation is a bug (a first-touch stall inside a step): fatal (memory/arena.h).
    // tests/model/test_gpt_arena.cpp and tests/e2e/test_memory.cpp run steps frozen. Not arena memory, so not
    // covered: each collective's small control state (MPI requests, a Handle), the MPI communicator's staging
    // pool (grown once, in the first step, by reduce-scatters whose per-rank block exceeds its chunk size, e.g.
    // ZeRO-1 of a >8M-element shard at dp 2), OpenBLAS's and MPI's own buffers, and per log interval the log line
    // and metrics record (MS_DUMP_GRADS's gather buffers at step 1, in tests only).
    arena.set_frozen(true);
}

void setup_checkpoint(TrainRun& r) {
    // Checkpoints (engine/ckpt/checkpoint.h): checkpoint.save writable with room, locked for the run and cleared of
    // crashed saves' leftovers; then resume from checkpoint.load when it holds a committed checkpoint, in whatever
    // layout saved it (the whole data state is the consumed-sample count); then no save of this run may replace a
    // committed checkpoint. Each found here, not at the first save, with every rank agreeing.
    const Config& cfg = r.cfg;
    PipelineModel& model = *r.model;
    r.ckpt.reset(new CheckpointContext{cfg, checkpoint_model(r.layout.shape), *r.groups, model.params_info(),
                                       model.params(), *r.optimizer});
    on_every_rank_or_none(r.world, "use checkpoint.save", [&] { r.save_lock = open_save_dir(*r.ckpt); });
    r.data_id = data_fingerprint(r.source->fingerprint(), cfg.data, r.layout.seq_length(), cfg.run.seed);
    r.resumed = load_checkpoint(*r.ckpt, r.data_id);
    on_every_rank_or_none(r.world, "use checkpoint.save",
                          [&] { check_no_newer_checkpoint(*r.ckpt, r.resumed ? r.resumed->iteration : 0); });
    r.reliability->stop_point(r.world);
    r.setup_watch.reset();  // from here the step boundaries agree on a stop signal
    r.first_it = r.resumed ? r.resumed->iteration + 1 : 1;
    if (r.resumed) {
        model.refresh_weights();  // the loaded master weights, rounded into the 16-bit ones (no-op in fp32)
        if (r.scaler->dynamic()) r.scaler->set_state(r.resumed->loss_scaler);
        r.reliability->event("checkpoint_loaded", {{"iteration", r.resumed->iteration}});
    }
    if (r.first_it > cfg.training.train_iters) {
        log_info("training: the checkpoint is at iteration {}, training.train_iters is {}: nothing left to train",
                 r.first_it - 1, cfg.training.train_iters);
    }
}

void open_run_files(TrainRun& r) {
    const Config& cfg = r.cfg;
    // The host initialised the weights: move the whole arena to the device before the first step (no-op on the CPU).
    r.arena->memory().prefetch_to_device();
    r.peak_flops = mfu_peak(cfg, *r.backend);
    r.flops_per_token = gpt_train_flops_per_token(r.layout.shape, r.layout.seq_length());

    r.writer = r.world.rank() == 0;
    if (r.writer) {
        std::filesystem::create_directories(cfg.run.output_dir);
        std::ofstream(std::filesystem::path(cfg.run.output_dir) / "config.resolved.yaml") << config_to_yaml(cfg);
        if (r.resumed) {  // a resume continues the file, without the lines the interrupted run logged past it
            const MetricsTrim trim = trim_metrics_log(cfg.logging.metrics_file, r.resumed->iteration);
            if (trim.dropped > 0) {
                log_info("metrics: dropped {} line(s) of {} logged after iteration {} (they are trained again)",
                         trim.dropped, cfg.logging.metrics_file, r.resumed->iteration);
            }
        }
        r.metrics.open(cfg.logging.metrics_file, r.resumed ? std::ios::app : std::ios::trunc);
    }
    if (r.writer && !r.metrics) {
        throw UserError(
            fmt::format("cannot open logging.metrics_file '{}' for writing\n---> HINT: check the "
                        "directory exists and is writable",
                        cfg.logging.metrics_file));
    }
    if (!cfg.logging.tensorboard_dir.empty()) {  // on every rank: a directory the writer cannot use ends them all
        on_every_rank_or_none(r.world, "open logging.tensorboard_dir", [&] {
            if (r.writer) r.tensorboard = std::make_unique<TensorBoardWriter>(cfg.logging.tensorboard_dir, r.first_it);
        });
    }
    if (r.tensorboard) log_info("tensorboard: {}", r.tensorboard->path());
}

}  // namespace ms
