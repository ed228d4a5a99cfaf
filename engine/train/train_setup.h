// train_setup.h: what run_train (engine/train/trainer.cpp) builds before its first step, and the phases that build
// it. TrainRun holds one rank's run: the resolved config and its RunLayout (engine/train/run_layout.h), the process
// groups split from the layout's Topology, reliability, data, backend, arena, model, optimizer, checkpoints and the
// run files. Members are declared in the order the phases make them, so they are destroyed in the reverse (the
// arena after everything allocated from it, the groups after the reliability that watches them). A TrainRun is
// made in place and never moved: the model, reliability and checkpoint context refer to its other members.
//
// Phases, in order (each collective over world; every input check agreed by all ranks before the first collective
// that could wait for a rank that failed alone):
//   setup_inputs      exit record, stop signals, the input checks (data, vocabulary, config -> RunLayout), the
//                     config hash, process groups (counted, and delayed by the link model), reliability, samplers
//                     and the start-up log
//   setup_backend     the memory plan, the backend (CUDA picks this rank's device), the memory check, NVML for the
//                     device's counters (CUDA), the timeline (logging.trace_dir), the environment switches' and the
//                     timeline's backend wrappers
//   setup_model       the arena, the model and its initial weights, the optimizer, the loss scaler; the arena frozen
//   setup_checkpoint  checkpoint.save's lock, the resume from checkpoint.load, the first iteration
//   open_run_files    the MFU peak, config.resolved.yaml, metrics.jsonl and the TensorBoard event file (rank 0)
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/comm_engine.h"
#include "comm/comm_matrix.h"
#include "comm/link_model.h"
#include "comm/process_groups.h"
#include "engine/backends/backend.h"
#include "engine/backends/profiling_backend.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/config/config.h"
#include "engine/core/switches.h"
#include "engine/data/dataset.h"
#include "engine/optim/distributed_optimizer.h"
#include "engine/optim/loss_scaler.h"
#include "engine/train/gpu_metrics.h"
#include "engine/train/pipeline.h"
#include "engine/train/plan.h"
#include "engine/train/reliability.h"
#include "engine/train/run_layout.h"
#include "engine/train/tensorboard.h"
#include "engine/train/trace.h"
#include "memory/arena.h"

namespace ms {

struct TrainRun {
    explicit TrainRun(MpiRuntime& runtime) : mpi(runtime), world(runtime.world()) {}
    TrainRun(const TrainRun&) = delete;
    TrainRun& operator=(const TrainRun&) = delete;

    MpiRuntime& mpi;
    Communicator& world;
    Switches env;  // the MS_* environment switches (engine/core/switches.h), read once at start-up
    std::optional<SetupStopWatch> setup_watch;  // until the first step (reliability.h "Signals")
    std::unique_ptr<TokenSource> source;
    Config cfg;        // resolved: vocabulary from the data, the fault injection that applies, bounded eval_iters
    RunLayout layout;  // of cfg at this world size
    // logging.trace_dir's timeline (null: none), made in setup_backend; declared before what refers to it (the
    // matrix, the backend, the model), so that it outlives them.
    std::unique_ptr<Trace> trace;
    // What every group sends, and link_model.enabled's delays (docs/communication.md): the groups refer to them.
    std::unique_ptr<CommMatrix> comm_matrix;
    std::unique_ptr<LinkModel> link_model;  // null: communication takes the time it takes
    std::optional<ProcessGroups> groups;
    std::shared_ptr<CommEngine> comm_engine;  // parallel.comm_engine: the groups' progress thread, else null
    std::unique_ptr<Reliability> reliability;
    std::unique_ptr<Sampler> train_sampler, valid_sampler;  // valid_sampler: when eval.eval_interval > 0
    std::vector<StagePlan> stages;                          // (pp) the memory plan
    size_t planned = 0;                                     // this rank's stage's planned bytes
    std::unique_ptr<Backend> backend;
    // A CUDA run's GPU counters (NVML) for each log interval, opened for the backend's device.
    std::optional<GpuMetrics> gpu_metrics;
    ProfilingBackend* profiler = nullptr;  // MS_PROFILE_OPS: the wrapper inside backend; not owned
    std::unique_ptr<Arena> arena;
    std::unique_ptr<PipelineModel> model;
    std::unique_ptr<DistributedOptimizer> optimizer;
    std::unique_ptr<LossScaler> scaler;
    std::unique_ptr<CheckpointContext> ckpt;
    std::unique_ptr<SaveDirLock> save_lock;  // held until the run ends
    std::string data_id;                     // the data's identity in train_state.json
    std::optional<TrainState> resumed;       // what checkpoint.load held
    int64_t first_it = 1;
    double peak_flops = 0;       // the MFU denominator per rank
    double flops_per_token = 0;  // the model's training FLOPs per token
    bool writer = false;         // the one rank that writes run files
    std::ofstream metrics;       // logging.metrics_file (writer only)
    // logging.tensorboard_dir (writer only, when set)
    std::unique_ptr<TensorBoardWriter> tensorboard;
};

// Runs `step` on every rank. When it throws a UserError on some rank, every rank throws -- the failing ones their
// own sentence, the others one pointing at the lowest failing rank -- instead of waiting in the next collective for
// a rank that has left. `what` completes "rank N could not ...".
void on_every_rank_or_none(Communicator& world, const std::string& what, const std::function<void()>& step);

void setup_inputs(TrainRun& run, const Config& cfg_in);
void setup_backend(TrainRun& run);
void setup_model(TrainRun& run);
void setup_checkpoint(TrainRun& run);
void open_run_files(TrainRun& run);

}  // namespace ms
