// reliability.h: how a run ends -- stop signals, the NaN policy, fault injection, and the run files that say what
// happened (docs/formats.md; README "Exit codes"). Collective timeouts, the
// flight recorder and the roll call that names a hung or dead rank live in comm/mpi/collective_watch.h; Reliability
// configures them (with the layout, so that a lost rank is named by its coordinates too).
//
// Signals. install_signal_handlers() makes SIGTERM, SIGUSR1 and SIGINT set a flag and nothing else; the run acts
// on it at the next point where every rank can agree, in every phase:
//   setup     stop points between its phases (one int32[2] all-reduce over world each): every rank exits 3, nothing
//             to save. A phase that runs long (planning, building or initialising a large model, reading a
//             checkpoint) is not waited for: SetupStopWatch ends the process with exit code 3 and its exit record
//             kSetupStopGraceS after the signal, without waiting for the other ranks (the launcher ends them, or
//             they get the signal too).
//   train     step_boundary() all-reduces (MAX) every rank's flag with the NaN verdict, so all ranks make the same
//             decision: finish the iteration, save a checkpoint when checkpoint.save is set, exit 3.
//   validate  poll_stop() after every micro-batch: the iteration before it is complete and the evaluation changes
//             no state, so that iteration is saved; the partial validation loss is dropped (a resume does not
//             repeat it).
//   save      a save in progress completes (it is the checkpoint the requeue resumes from), then poll_stop()
//             agrees and the run exits 3 without another step.
//   sample    poll_stop() before every sampled token: the run's training and its final save are done; exit 3.
// A second stop signal ends the process at once, killed by that signal (status 128 + n in a shell), saving nothing:
// its handler writes the exit record (code 128 + n) from a prepared buffer with open/write/rename only, unless the
// run already recorded one -- then it exits with that code, so that the status and the process agree.
// Under Open MPI 4, mpirun turns a SIGTERM or SIGINT it receives into a job kill -- SIGCONT, SIGTERM 1 s later,
// SIGKILL after another 1 s (odls_base_sigkill_timeout) -- and then exits 1 whatever the ranks reported; it
// forwards SIGUSR1 and SIGUSR2 to every rank untouched, and returns the ranks' 3. So under mpirun, stop a run with
// SIGUSR1 (`kill -USR1 <mpirun pid>`; Slurm: scancel --signal=USR1 --batch or sbatch --signal=B:USR1@300 with the
// batch script passing it on to mpirun; README "Exit codes"). srun delivers SIGTERM to every task itself.
//
// NaN policy. After the backward of a step and before the data-parallel reduction, every rank checks its own
// gradients (sum of squares of its flat buffer) and the last pipeline stage also its own loss: the rank that
// produced a NaN/Inf is named before the reduction spreads it (Megatron's rule). The same all-reduce carries the
// verdict to every rank:
//   fail  every rank throws NumericalError (exit 17) before the optimizer update. The rank that found it says
//         "Rank 1, node h, pipeline stage 0, iteration 5: found NaN in local grad norm ..." (Megatron's wording);
//         the others name that rank and stage.
//   skip  no rank takes the optimizer step (the step's gradients are dropped); the iteration counts in "number of
//         nan iterations" (and "skipped iterations") of the log line, and in events.jsonl.
//
// Fault injection. reliability.inject, or the environment variable MS_INJECT, which wins when set and non-empty
// (a test or a launcher injects into an unchanged config; the applied spec goes into the resolved config, the
// config hash every rank must share, and the start event). One "<kind>@step=S[,rank=R]", R = 0 when omitted:
//   crash    SIGKILL to itself at the start of iteration S (what a segfault or the OOM killer leaves behind)
//   hang     sleeps forever at the start of iteration S, before its first collective of that step
//   nan      a NaN into its first gradient element after the backward of iteration S
//   sigterm  SIGTERM to itself at the start of iteration S
//
// Run files in run.output_dir (events.jsonl, exit_status.json, ...): engine/train/run_end.h.
#pragma once

#include <csignal>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/watch_options.h"
#include "engine/config/config.h"
#include "engine/core/check.h"
#include "engine/core/tensor.h"
#include "engine/train/run_end.h"

namespace ms {

class Backend;
class Communicator;
struct ProcessGroups;

// NaN or Inf in a loss or gradient with reliability.nan_policy = fail: exit code 17.
class NumericalError : public RunError {
  public:
    explicit NumericalError(const std::string& what) : RunError(what, kExitNumerical) {}
};

// ---- fault injection ----

enum class FaultKind : uint8_t { kNone, kCrash, kHang, kNan, kSigterm };

struct FaultInjection {
    FaultKind kind = FaultKind::kNone;
    int64_t step = 0;
    int rank = 0;
    std::string spec;    // as written ("" for none)
    std::string source;  // "MS_INJECT" or "reliability.inject"
};

// Parses one spec (empty: kNone). Throws UserError naming `source`, the spec, what is wrong and the grammar.
FaultInjection parse_fault_injection(std::string_view spec, std::string_view source, int world_size,
                                     int64_t train_iters);
// The spec that applies: MS_INJECT (switches().inject, engine/core/switches.h) when non-empty, else cfg.inject.
FaultInjection resolve_fault_injection(const ReliabilityConfig& cfg, int world_size, int64_t train_iters);
// The same with MS_INJECT's value given (tests).
FaultInjection resolve_fault_injection(const ReliabilityConfig& cfg, int world_size, int64_t train_iters,
                                       std::string_view env_inject);

// A stop signal ended the run outside a step boundary (setup; the trainer's other phases return exit_on_signal()'s
// code): exit code 3, already logged and recorded.
class SignalStop : public RunError {
  public:
    explicit SignalStop(const std::string& what) : RunError(what, kExitSignal) { set_reported(); }
};

// How long setup may run on after a stop signal before SetupStopWatch ends the process: the stop points between
// setup's phases act within it when the phases are short, so the ranks agree and MPI finalizes.
inline constexpr double kSetupStopGraceS = 0.5;

// Alive while the trainer sets up (from its exit record being armed to the first step): a stop signal that no stop
// point has acted on within kSetupStopGraceS records exit code 3 ("during setup") and ends the process with it.
// Nothing is lost: no step has run. One thread that polls the flag; it calls no MPI.
class SetupStopWatch {
  public:
    SetupStopWatch();
    ~SetupStopWatch();
    SetupStopWatch(const SetupStopWatch&) = delete;
    SetupStopWatch& operator=(const SetupStopWatch&) = delete;

  private:
    struct State;
    std::unique_ptr<State> state_;
};

struct StepVerdict {
    bool skip_step = false;  // a NaN/Inf somewhere, nan_policy skip: no rank steps the optimizer
    bool stop = false;       // a stop signal on some rank: finish this iteration, then exit_on_signal()
};

// One rank's reliability state for one run.
class Reliability {
  public:
    // Resolves the injection, arms record_exit() for this run. No collective.
    Reliability(const Config& cfg, const ProcessGroups& groups, std::string host);

    // For MpiRuntime::set_collective_watch: the timeout, <output_dir>/comm_traces, the signal flag, and a fault
    // hook that writes the collective_timeout event and the exit record.
    CollectiveWatchOptions watch_options() const;
    // Rank 0 clears the previous run's exit files; a barrier; the start event. Collective over world.
    void start(Communicator& world, uint64_t config_hash);
    // Appends one event: on rank 0 to events.jsonl; on other ranks only when `local` (to events/rank_XXXXX.jsonl).
    void event(const std::string& type, nlohmann::json fields = nlohmann::json::object(), bool local = false) const;

    // At the start of iteration `it`, before anything of the step: fires crash, hang and sigterm injections.
    void begin_step(int64_t it);
    // After the backward of `it`, before the gradients are read: fires a nan injection of this rank and step (a
    // NaN written into the first gradient).
    void inject_nan(int64_t it, const Tensor& grads, Backend& backend);
    // After the backward of `it`, before any data-parallel reduction: checks this rank's loss (last pipeline stage;
    // pass the step's loss everywhere, others ignore it) and the sum of squares of its gradients (grad_squares:
    // DistributedOptimizer::local_grad_squares().all), and agrees with every rank on NaNs and signals (one int32[3]
    // all-reduce over world). Throws NumericalError with nan_policy fail. Allocates nothing unless it throws.
    // check_grads = false (fp16 loss scaling, whose overflows the loss scaler handles): only the loss is checked.
    StepVerdict step_boundary(Communicator& world, int64_t it, float loss, double grad_squares, bool check_grads);
    // After the step (outside the allocation guard): logs and records what step_boundary found.
    void after_step(int64_t it);
    // Whether some rank has a stop signal: one int32[2] all-reduce (MAX) over world, so every rank answers the same.
    // For the phases outside the step (validation, after a save, sampling): call it at the same point on every rank.
    bool poll_stop(Communicator& world);
    // A setup stop point: when poll_stop() says so, logs, records exit code 3 and throws SignalStop.
    void stop_point(Communicator& world);
    // The signal stop after iteration `it`: logs, records exit code 3 and returns it. checkpoint_dir: what was saved
    // ("" for nothing). phase: what the signal interrupted ("" for the training step itself).
    int exit_on_signal(int64_t it, const std::string& checkpoint_dir, std::string_view phase = {});
    // Training finished: records exit code 0 and returns it.
    int finish(int64_t iterations);

    const FaultInjection& injection() const { return inject_; }

  private:
    std::string describe_bad(int bits) const;             // "NaN in local grad norm", ...
    void log_injected_nan(int64_t it);                    // the fault_injected event of a nan injection
    void log_signal(int64_t it, std::string_view phase);  // the signal event, once

    const Config& cfg_;
    int rank_, world_size_, tp_, dp_, pp_stage_;
    bool last_stage_;
    std::string host_;
    FaultInjection inject_;
    // what step_boundary found, for after_step
    int local_bits_ = 0, bad_rank_ = -1, bad_bits_ = 0, signal_ = 0, signal_rank_ = -1;
    bool skipped_ = false, signal_logged_ = false, nan_injected_ = false;
};

}  // namespace ms
