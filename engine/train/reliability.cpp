#include "engine/train/reliability.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <mutex>
#include <thread>

#include "comm/flight_recorder.h"
#include "comm/process_groups.h"
#include "engine/backends/backend.h"
#include "engine/core/log.h"
#include "engine/core/switches.h"

namespace ms {
namespace {

namespace fs = std::filesystem;

constexpr int kLossBad = 1, kGradBad = 2, kNaN = 4, kBitsPerRank = 8;

}  // namespace

// ---- fault injection ----

FaultInjection parse_fault_injection(std::string_view spec, std::string_view source, int world_size,
                                     int64_t train_iters) {
    FaultInjection f;
    f.spec = std::string(spec);
    f.source = std::string(source);
    if (spec.empty()) return f;
    const auto bad = [&](const std::string& what) {
        return UserError(fmt::format(
            "config error: {} = '{}': {}\n---> HINT: write <kind>@step=<S>[,rank=<R>] with kind crash, hang, nan or "
            "sigterm, S an iteration in [1, training.train_iters({})] and R a world rank in [0, {}) (0 when "
            "omitted), e.g. crash@step=5,rank=1",
            source, spec, what, train_iters, world_size));
    };
    const size_t at = spec.find('@');
    if (at == std::string_view::npos) throw bad("there is no '@' after the fault kind");
    const std::string_view kind = spec.substr(0, at);
    if (kind == "crash")
        f.kind = FaultKind::kCrash;
    else if (kind == "hang")
        f.kind = FaultKind::kHang;
    else if (kind == "nan")
        f.kind = FaultKind::kNan;
    else if (kind == "sigterm")
        f.kind = FaultKind::kSigterm;
    else
        throw bad(fmt::format("unknown fault kind '{}'", kind));
    bool has_step = false, has_rank = false;
    std::string_view rest = spec.substr(at + 1);
    while (!rest.empty()) {
        const size_t comma = rest.find(',');
        const std::string_view item = rest.substr(0, comma);
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
        const size_t eq = item.find('=');
        const std::string_view key = item.substr(0, eq);
        const std::string_view value = eq == std::string_view::npos ? std::string_view() : item.substr(eq + 1);
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
        if (eq == std::string_view::npos || value.empty() || ec != std::errc() || end != value.data() + value.size()) {
            throw bad(fmt::format("'{}' is not key=<integer>", item));
        }
        if (key == "step" && !has_step) {
            has_step = true;
            f.step = v;
        } else if (key == "rank" && !has_rank) {
            has_rank = true;
            f.rank = static_cast<int>(v);
            if (v < 0 || v >= world_size) throw bad(fmt::format("rank {} is not in [0, {})", v, world_size));
        } else {
            throw bad(fmt::format("'{}' is {}", key, key == "step" || key == "rank" ? "given twice" : "not a key"));
        }
    }
    if (!has_step) throw bad("step=<S> is missing");
    if (f.step < 1 || f.step > train_iters) {
        throw bad(fmt::format("step {} is outside [1, {}]: the fault would never fire", f.step, train_iters));
    }
    return f;
}

FaultInjection resolve_fault_injection(const ReliabilityConfig& cfg, int world_size, int64_t train_iters,
                                       std::string_view env_inject) {
    if (!env_inject.empty()) return parse_fault_injection(env_inject, "MS_INJECT", world_size, train_iters);
    return parse_fault_injection(cfg.inject, "reliability.inject", world_size, train_iters);
}

FaultInjection resolve_fault_injection(const ReliabilityConfig& cfg, int world_size, int64_t train_iters) {
    return resolve_fault_injection(cfg, world_size, train_iters, switches().inject);
}

// ---- Reliability ----

Reliability::Reliability(const Config& cfg, const ProcessGroups& groups, std::string host)
    : cfg_(cfg),
      rank_(groups.world->rank()),
      world_size_(groups.world->size()),
      tp_(groups.tp_size),
      dp_(groups.dp_size),
      pp_stage_(groups.pp_rank),
      last_stage_(groups.is_last_stage()),
      host_(std::move(host)),
      inject_(resolve_fault_injection(cfg.reliability, world_size_, cfg.training.train_iters)) {
    set_exit_layout(cfg.run.output_dir, rank_, host_, tp_, dp_);
}

CollectiveWatchOptions Reliability::watch_options() const {
    CollectiveWatchOptions o;
    o.collective_timeout_s = cfg_.reliability.collective_timeout_s;
    o.trace_dir = (fs::path(cfg_.run.output_dir) / "comm_traces").string();
    o.signal_flag = stop_signal_flag();
    o.tp_size = tp_;
    o.dp_size = dp_;
    o.on_fault = [](int code, const std::string& message, const std::vector<LostRank>& lost) {
        record_event("collective_timeout", {{"message", message}, {"hung_ranks", lost_ranks_json(lost)}},
                     /*local=*/true);
        record_exit(code, message, -1, lost);
    };
    return o;
}

void Reliability::start(Communicator& world, uint64_t config_hash) {
    const fs::path dir(cfg_.run.output_dir);
    if (rank_ == 0) {
        std::error_code ec;
        fs::create_directories(dir, ec);
        fs::remove(dir / "exit_status.json", ec);
        fs::remove_all(dir / "exit_status", ec);
        if (fs::exists(dir / "comm_traces", ec)) {
            fs::remove_all(dir / "comm_traces.prev", ec);
            fs::rename(dir / "comm_traces", dir / "comm_traces.prev", ec);
        }
    }
    world.barrier();  // nobody writes this run's files before they are cleared
    nlohmann::json fields = {{"config_hash", fmt::format("{:016x}", config_hash)},
                             {"world_size", world_size_},
                             {"tp", tp_},
                             {"pp", world_size_ / (tp_ * dp_)},
                             {"dp", dp_},
                             {"nan_policy", cfg_.reliability.nan_policy},
                             {"collective_timeout_s", cfg_.reliability.collective_timeout_s},
                             {"host", host_},
                             {"pid", static_cast<int>(getpid())}};
    if (inject_.kind != FaultKind::kNone) {
        fields["inject"] = {{"spec", inject_.spec}, {"source", inject_.source}};
        log_info("fault injection armed: {} (from {})", inject_.spec, inject_.source);
    }
    event("start", fields);
}

void Reliability::event(const std::string& type, nlohmann::json fields, bool local) const {
    record_event(type, std::move(fields), local);
}

void Reliability::begin_step(int64_t it) {
    set_exit_iteration(it);
    if (inject_.kind == FaultKind::kNone || inject_.step != it || inject_.rank != rank_) return;
    const char* what = inject_.kind == FaultKind::kCrash     ? "crash: SIGKILL to itself"
                       : inject_.kind == FaultKind::kHang    ? "hang: sleeping forever"
                       : inject_.kind == FaultKind::kSigterm ? "sigterm: SIGTERM to itself"
                                                             : nullptr;
    if (!what) return;  // nan fires in step_boundary
    event("fault_injected", {{"iteration", it}, {"kind", inject_.spec}}, /*local=*/true);
    std::fprintf(stderr, "[rank %d] fault injection (%s) at iteration %lld: %s\n", rank_, inject_.source.c_str(),
                 static_cast<long long>(it), what);
    std::fflush(stderr);
    std::fflush(stdout);
    switch (inject_.kind) {
        case FaultKind::kCrash:
            raise(SIGKILL);
            break;
        case FaultKind::kHang:
            while (true) pause();  // a signal handler returns here; only SIGKILL or a second SIGTERM ends it
        case FaultKind::kSigterm:
            raise(SIGTERM);
            break;
        default:
            break;
    }
}

void Reliability::inject_nan(int64_t it, const Tensor& grads, Backend& backend) {
    if (inject_.kind == FaultKind::kNan && inject_.step == it && inject_.rank == rank_ && grads.numel() > 0) {
        backend.synchronize();  // the host writes the gradients
        visit_float(grads.dtype, [&]<class T>(T) {
            static_cast<T*>(grads.data)[0] = from_float<T>(std::numeric_limits<float>::quiet_NaN());
        });
        nan_injected_ = true;  // its event is written outside the allocation guard
    }
}

StepVerdict Reliability::step_boundary(Communicator& world, int64_t it, float loss, double grad_squares,
                                       bool check_grads) {
    const double grad_sq = check_grads ? grad_squares : 0.0;
    int bits = 0;
    if (last_stage_ && !std::isfinite(loss)) bits |= kLossBad | (std::isnan(loss) ? kNaN : 0);
    if (!std::isfinite(grad_sq)) bits |= kGradBad | (std::isnan(grad_sq) ? kNaN : 0);
    local_bits_ = bits;
    // MAX over ranks of: the stop signal; (world - rank) of the lowest rank that has one; (world - rank) of the
    // lowest rank that found a NaN/Inf, with what it found in the low bits.
    const int sig = stop_signal();
    std::array<int32_t, 3> flags = {sig, sig ? world_size_ - rank_ : 0,
                                    bits ? (world_size_ - rank_) * kBitsPerRank + bits : 0};
    world.all_reduce(std::span<int32_t>(flags), ReduceOp::kMax).wait();
    if (nan_injected_ && flags[2] != 0 && cfg_.reliability.nan_policy != "skip") log_injected_nan(it);
    StepVerdict v;
    if (flags[0] != 0) {
        v.stop = true;
        signal_ = flags[0];
        signal_rank_ = world_size_ - flags[1];
    }
    skipped_ = false;
    if (flags[2] == 0) return v;
    bad_rank_ = world_size_ - flags[2] / kBitsPerRank;
    bad_bits_ = flags[2] % kBitsPerRank;
    if (cfg_.reliability.nan_policy == "skip") {
        v.skip_step = true;
        skipped_ = true;
        return v;
    }
    const int bad_stage = bad_rank_ / (tp_ * dp_);  // rank = tp_rank + tp * (dp_rank + dp * pp_rank)
    const std::string head = fmt::format("numerical error: Rank {}, node {}, pipeline stage {}, iteration {}: ", rank_,
                                         host_, pp_stage_, it);
    const std::string found =
        local_bits_ ? fmt::format("found {} before the data-parallel reduction", describe_bad(local_bits_))
                    : fmt::format(
                          "rank {} (pipeline stage {}) found {} before the data-parallel reduction (its "
                          "message names it); this rank's loss and gradients are finite",
                          bad_rank_, bad_stage, describe_bad(bad_bits_));
    const std::string message = head + found +
                                ". reliability.nan_policy = fail stops every rank before the optimizer update "
                                "(exit code 17)\n---> HINT: the run resumes from its last checkpoint; if the loss "
                                "diverged, lower optimizer.lr or lengthen lr_schedule.lr_warmup_iters; "
                                "reliability.nan_policy: skip drops such iterations instead";
    event("nan_fail", {{"iteration", it}, {"found_by", bad_rank_}, {"what", describe_bad(bad_bits_)}},
          /*local=*/local_bits_ != 0);
    record_exit(kExitNumerical, message);
    throw NumericalError(message);
}

void Reliability::log_injected_nan(int64_t it) {
    nan_injected_ = false;
    event("fault_injected", {{"iteration", it}, {"kind", inject_.spec}}, /*local=*/true);
}

void Reliability::after_step(int64_t it) {
    if (nan_injected_) log_injected_nan(it);
    if (skipped_) {
        const int bad_stage = bad_rank_ / (tp_ * dp_);
        if (local_bits_) {
            log_warn(
                "Rank {}, node {}, pipeline stage {}, iteration {}: found {}; reliability.nan_policy = skip: no "
                "rank takes this optimizer step",
                rank_, host_, pp_stage_, it, describe_bad(local_bits_));
        }
        log_info(
            "iteration {}: skipped the optimizer step on every rank: rank {} (pipeline stage {}) found {} "
            "(reliability.nan_policy = skip)",
            it, bad_rank_, bad_stage, describe_bad(bad_bits_));
        event("nan_skip", {{"iteration", it}, {"found_by", bad_rank_}, {"what", describe_bad(bad_bits_)}},
              /*local=*/local_bits_ != 0);
        skipped_ = false;
    }
    if (signal_ != 0) log_signal(it, "train");
}

void Reliability::log_signal(int64_t it, std::string_view phase) {
    if (signal_logged_) return;
    signal_logged_ = true;
    event("signal",
          {{"iteration", it}, {"signal", signal_name(signal_)}, {"first_rank", signal_rank_}, {"phase", phase}});
}

bool Reliability::poll_stop(Communicator& world) {
    const int sig = stop_signal();
    std::array<int32_t, 2> flags = {sig, sig ? world_size_ - rank_ : 0};
    world.all_reduce(std::span<int32_t>(flags), ReduceOp::kMax).wait();
    if (flags[0] == 0) return false;
    signal_ = flags[0];
    signal_rank_ = world_size_ - flags[1];
    return true;
}

void Reliability::stop_point(Communicator& world) {
    if (!poll_stop(world)) return;
    const int64_t it = exit_iteration();
    log_signal(it, "setup");
    const std::string reason =
        fmt::format("{} received (rank {} first) during setup: stopped before the first training step; nothing to save",
                    signal_name(signal_), signal_rank_);
    log_info("exit: {} (exit code 3: requeue to resume)", reason);
    record_exit(kExitSignal, reason);
    throw SignalStop(reason);
}

int Reliability::exit_on_signal(int64_t it, const std::string& checkpoint_dir, std::string_view phase) {
    log_signal(it, phase.empty() ? "train" : phase);
    const std::string saved = checkpoint_dir.empty() ? "checkpoint.save is not set, so nothing was saved"
                                                     : fmt::format("checkpoint saved to {}", checkpoint_dir);
    const std::string reason =
        phase.empty() ? fmt::format("{} received (rank {} first): stopped after iteration {}; {}", signal_name(signal_),
                                    signal_rank_, it, saved)
                      : fmt::format("{} received (rank {} first) during {}: stopped after iteration {}; {}",
                                    signal_name(signal_), signal_rank_, phase, it, saved);
    log_info("exit: {} (exit code 3: requeue to resume)", reason);
    record_exit(kExitSignal, reason);
    return kExitSignal;
}

int Reliability::finish(int64_t iterations) {
    set_exit_iteration(iterations);
    record_exit(kExitOk, fmt::format("done: trained to iteration {}", iterations));
    return kExitOk;
}

std::string Reliability::describe_bad(int bits) const {
    const char* kind = bits & kNaN ? "NaN" : "Inf";
    if ((bits & kLossBad) && (bits & kGradBad)) return fmt::format("{} in local loss and local grad norm", kind);
    return fmt::format("{} in local {}", kind, bits & kLossBad ? "loss" : "grad norm");
}

// ---- the setup watch ----

struct SetupStopWatch::State {
    std::mutex mutex;
    std::condition_variable wake;
    bool done = false;
    std::thread thread;
};

SetupStopWatch::SetupStopWatch() : state_(std::make_unique<State>()) {
    state_->thread = std::thread([s = state_.get()] {
        constexpr auto kPoll = std::chrono::milliseconds(20);
        std::chrono::steady_clock::time_point seen{};
        std::unique_lock<std::mutex> lock(s->mutex);
        while (!s->wake.wait_for(lock, kPoll, [s] { return s->done; })) {
            const int sig = stop_signal();
            if (sig == 0) continue;
            const auto now = std::chrono::steady_clock::now();
            if (seen == std::chrono::steady_clock::time_point{}) seen = now;
            if (std::chrono::duration<double>(now - seen).count() < kSetupStopGraceS) continue;
            const std::string reason = fmt::format(
                "{} received during setup: setup was still running {:.1f} s later, so this process exited "
                "without waiting for it or for other ranks; nothing to save (no step has run)",
                signal_name(sig), kSetupStopGraceS);
            if (recorded_exit_code()) return;  // the main thread is already ending the run
            record_event("signal", {{"signal", signal_name(sig)}, {"phase", "setup"}}, /*local=*/false);
            log_info("exit: {} (exit code 3: requeue to resume)", reason);
            record_exit(kExitSignal, reason);
            std::fflush(stdout);
            std::fflush(stderr);
            // 3, or the code of an end the main thread recorded first
            _exit(recorded_exit_code().value_or(kExitSignal));
        }
    });
}

SetupStopWatch::~SetupStopWatch() {
    {
        std::lock_guard<std::mutex> lock(state_->mutex);
        state_->done = true;
    }
    state_->wake.notify_one();
    state_->thread.join();
}

}  // namespace ms
