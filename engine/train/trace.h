// trace.h: logging.trace_dir -- a timeline of chosen iterations (logging.trace_steps) in the Chrome trace format
// ({"traceEvents": [...]}, which ui.perfetto.dev and chrome://tracing open), one file per rank merged into one
// (docs/observability.md).
//
// What a traced iteration records, each from the mechanism that already measures it:
//   ops            every backend op, timed by the ProfilingBackend decorator (engine/backends/profiling_backend.h)
//                  with a synchronisation before and after it, as MS_PROFILE_OPS times ops;
//   communication  every operation of every group from issue to completion, with its group, op, bytes, priority
//                  and the time a wait() spent on it, as LinkModelCommunicator counts it into the communication
//                  matrix (comm/comm_matrix.h CommListener); on the comm engine's thread too;
//   pipeline       the iteration, each forward and backward of micro-batch m on local chunk c and each batch of
//                  sends and receives (PipelineModel::train_step), in the schedule's order.
// In the file: pid = world rank, one thread row per kind (pipeline 1, ops 2, communication 3 and, for operations
// that overlap one still in flight, 4, 5, ...); ts and dur in microseconds; and a flow arrow from each pipeline
// send to its receive on the peer rank.
//
// Clock: events are taken on the steady clock (now_seconds()) and shifted once per rank onto CLOCK_REALTIME (both
// read together at start-up), relative to rank 0's CLOCK_REALTIME at that moment: ranks on one machine share both
// clocks, so their events line up to the clock reads' resolution; ranks on several hosts line up as far as their
// clocks agree (NTP).
//
// Memory: the events of one iteration go to preallocated buffers (a traced step allocates nothing, so
// MS_CHECK_ALLOCS holds), which are written out after the step. Events past a buffer's capacity are dropped and
// counted; the buffer then grows for the next traced iteration and the log says how many were lost. With
// logging.trace_dir empty there is no Trace and the hooks are null pointers.
//
// Files: <trace_dir>/rank_XXXXX.json per rank, a complete JSON file after each traced iteration; after the last one
// every rank closes its file, the world meets at a barrier and rank 0 merges them into <trace_dir>/trace.json (so the
// directory must be one that rank 0 can read: one machine, or a shared file system, like run.output_dir). The merge
// is part of the run, not a later command, so that the one file to open is there when the run ends.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/comm_matrix.h"
#include "engine/backends/profiling_backend.h"
#include "engine/parallel/schedule.h"

namespace ms {

// logging.trace_steps: the iterations traced, "N" or "FIRST:LAST" (inclusive, numbered as the log numbers them).
struct TraceSteps {
    int64_t first = 0, last = 0;
    bool contains(int64_t it) const { return it >= first && it <= last; }
};
// nullopt when `text` is neither "N" nor "FIRST:LAST" with 1 <= FIRST <= LAST.
std::optional<TraceSteps> parse_trace_steps(std::string_view text);
// What a valid value is, for the config error.
inline constexpr const char* kTraceStepsPhrase =
    "must be an iteration N or a range FIRST:LAST of iterations (1-based, inclusive, FIRST <= LAST)";

// Where this rank sits, for the process row's name.
struct TraceRank {
    int world_rank = 0, world_size = 1;
    int tp_rank = 0, pp_rank = 0, dp_rank = 0;
    int pp_size = 1;         // model chunk of local chunk c: c * pp_size + pp_rank
    int virtual_stages = 1;  // > 1: the pipeline row names each forward and backward's chunk
};

class Trace final : public OpTimeline, public CommListener {
  public:
    // Room for one iteration's events of each kind before any is dropped.
    struct Capacity {
        size_t ops = 0, comms = 0, pipeline = 0;
    };
    // Opens <dir>/rank_XXXXX.json (a UserError when it cannot). origin: rank 0's CLOCK_REALTIME (unix seconds), the
    // zero of every rank's timestamps.
    Trace(const std::string& dir, TraceSteps steps, int64_t train_iters, TraceRank rank, double origin,
          Capacity capacity);
    ~Trace() override;
    Trace(const Trace&) = delete;
    Trace& operator=(const Trace&) = delete;

    const TraceSteps& steps() const { return steps_; }
    // The last iteration traced: trace_steps' last, or training.train_iters when that comes first.
    int64_t last_step() const { return last_; }
    const std::string& dir() const { return dir_; }

    // Around one training iteration: begin_step starts recording when `it` is traced; end_step stops it and, with
    // the iteration's span on the pipeline row, writes the events out (outside the step: it allocates).
    void begin_step(int64_t it);
    void end_step(int64_t it);
    // After the last traced iteration (or at the end of a run that stopped before it): closes this rank's file;
    // collective over `world` (a barrier), then rank 0 writes <dir>/trace.json. Returns its path on rank 0, else "".
    std::string finish(Communicator& world);
    bool finished() const { return file_ == nullptr; }

    // The hooks.
    bool recording() const override { return recording_.load(std::memory_order_relaxed); }
    void op(const OpKey& key, double begin, double end) override;
    void operation(const CommRecord& r) override;
    // A forward or backward of the pipeline (a.kind), from begin to end.
    void compute(const Action& a, double begin, double end);
    // The batch of sends and receives that ends at actions[last] (the run of p2p actions before it), issued at begin
    // and complete at end.
    void p2p_batch(const std::vector<Action>& actions, size_t last, double begin, double end);

  private:
    struct OpEvent {
        OpKey key;
        double begin, end;
    };
    struct PipelineEvent {
        enum class Kind : uint8_t { kCompute, kBatch } kind;
        double begin, end;
        uint8_t messages = 0;
        std::array<Action, 4> actions{};  // kCompute: [0]; kBatch: the messages (a batch has at most four)
        int extra_messages = 0;           // a batch's messages past four (not expected from make_schedule)
    };
    struct CommEvent {
        CommRecord record;
        std::array<char, 24> group{};  // the group's name, copied (a record's view may not outlive the group)
    };
    template <class E>
    static void add(std::vector<E>& events, const E& e, int64_t& dropped);
    double us(double steady_seconds) const { return (steady_seconds - steady_zero_) * 1e6; }
    void write_step(int64_t it);
    void write_event(const std::string& json);
    void write_metadata();
    void write_footer();
    std::string pipeline_name(const PipelineEvent& e) const;
    // The same on the sending and the receiving rank's flow events (the arrows between them).
    uint64_t flow_id(int64_t it, const Action& a) const;

    std::string dir_, path_;
    TraceSteps steps_;
    int64_t last_;
    TraceRank rank_;
    double steady_zero_ = 0;  // the steady clock's reading at rank 0's origin, on this machine
    std::FILE* file_ = nullptr;
    bool first_event_ = true;
    int comm_lanes_ = 1;  // communication rows named so far
    std::atomic<bool> recording_{false};
    double iteration_begin_ = 0, iteration_end_ = 0;
    std::vector<OpEvent> ops_;
    std::vector<PipelineEvent> pipeline_;
    std::mutex comm_mu_;  // the comm engine's thread completes operations beside the main thread
    std::vector<CommEvent> comms_;
    int64_t dropped_ops_ = 0, dropped_comms_ = 0, dropped_pipeline_ = 0;
    std::vector<double> lane_end_;  // write_step's scratch: when each communication row is free again
};

// Merges the per-rank files rank_00000.json .. of `dir` (world_size of them) into <dir>/trace.json; returns its path.
std::string merge_traces(const std::string& dir, int world_size);

}  // namespace ms
