// trace.cpp: Trace and merge_traces (trace.h).
#include "engine/train/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "comm/flight_recorder.h"
#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/core/timer.h"

namespace ms {
namespace {

using Json = nlohmann::ordered_json;

// The thread rows of a rank (tid); communication rows are kComm, kComm + 1, ... (one per overlapping operation).
constexpr int kPipelineRow = 1, kOpsRow = 2, kCommRow = 3;
// What closes a file's JSON; written after every iteration, so that a file is complete whenever a run stops.
constexpr const char* kFooter = "\n],\"displayTimeUnit\":\"ms\"}\n";
constexpr int kClockPairs = 8;  // steady/realtime reads taken to line the clocks up

std::string rank_file(const std::string& dir, int rank) {
    return (std::filesystem::path(dir) / fmt::format("rank_{:05d}.json", rank)).string();
}

std::optional<int64_t> parse_iteration(std::string_view s) {
    int64_t v = 0;
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || p != s.data() + s.size() || v < 1) return std::nullopt;
    return v;
}

double rounded(double us) { return std::round(us * 1e3) / 1e3; }  // nanoseconds are the clocks' resolution

Json metadata(const char* name, int pid, int tid, Json args) {
    Json e = {{"name", name}, {"ph", "M"}, {"pid", pid}};
    if (tid >= 0) e["tid"] = tid;
    e["args"] = std::move(args);
    return e;
}

}  // namespace

std::optional<TraceSteps> parse_trace_steps(std::string_view text) {
    const size_t colon = text.find(':');
    const std::optional<int64_t> first = parse_iteration(text.substr(0, colon));
    const std::optional<int64_t> last =
        colon == std::string_view::npos ? first : parse_iteration(text.substr(colon + 1));
    if (!first || !last || *last < *first) return std::nullopt;
    return TraceSteps{*first, *last};
}

Trace::Trace(const std::string& dir, TraceSteps steps, int64_t train_iters, TraceRank rank, double origin,
             Capacity capacity)
    : dir_(dir),
      path_(rank_file(dir, rank.world_rank)),
      steps_(steps),
      last_(std::min(steps.last, train_iters)),
      rank_(rank) {
    // The two clocks read together: the realtime read between two steady reads, the closest of a few pairs (a
    // rank preempted between its reads would shift all its events); then this machine's steady reading at rank 0's
    // realtime origin.
    double best = std::numeric_limits<double>::infinity();
    for (int i = 0; i < kClockPairs; ++i) {
        const double s0 = now_seconds(), unix_now = unix_seconds(), s1 = now_seconds();
        if (s1 - s0 < best) {
            best = s1 - s0;
            steady_zero_ = 0.5 * (s0 + s1) - (unix_now - origin);
        }
    }
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    file_ = std::fopen(path_.c_str(), "w");
    if (file_ == nullptr) {
        throw UserError(fmt::format(
            "cannot write the timeline {} in logging.trace_dir '{}'\n---> HINT: check the directory is writable, or "
            "leave logging.trace_dir empty (no timeline)",
            path_, dir));
    }
    ops_.reserve(capacity.ops);
    comms_.reserve(capacity.comms);
    pipeline_.reserve(capacity.pipeline);
    std::fputs("{\"traceEvents\":[", file_);
    write_metadata();
    write_footer();
}

Trace::~Trace() {
    if (file_ != nullptr) std::fclose(file_);
}

template <class E>
void Trace::add(std::vector<E>& events, const E& e, int64_t& dropped) {
    if (events.size() < events.capacity()) {
        events.push_back(e);
    } else {
        ++dropped;
    }
}

void Trace::begin_step(int64_t it) {
    if (file_ == nullptr || !steps_.contains(it)) return;
    iteration_begin_ = now_seconds();
    recording_.store(true, std::memory_order_relaxed);
}

void Trace::end_step(int64_t it) {
    if (!recording()) return;
    recording_.store(false, std::memory_order_relaxed);
    iteration_end_ = now_seconds();
    write_step(it);
}

void Trace::op(const OpKey& key, double begin, double end) {
    if (recording()) add(ops_, OpEvent{key, begin, end}, dropped_ops_);
}

void Trace::operation(const CommRecord& r) {
    if (!recording()) return;
    CommEvent e{r, {}};
    const size_t n = std::min(r.group.size(), e.group.size() - 1);
    std::copy_n(r.group.data(), n, e.group.data());
    e.record.group = {};
    const std::lock_guard<std::mutex> lock(comm_mu_);
    add(comms_, e, dropped_comms_);
}

void Trace::compute(const Action& a, double begin, double end) {
    if (!recording()) return;
    PipelineEvent e{.kind = PipelineEvent::Kind::kCompute, .begin = begin, .end = end};
    e.actions[0] = a;
    add(pipeline_, e, dropped_pipeline_);
}

void Trace::p2p_batch(const std::vector<Action>& actions, size_t last, double begin, double end) {
    if (!recording()) return;
    size_t first = last;
    while (first > 0 && is_p2p(actions[first - 1].kind)) --first;
    PipelineEvent e{.kind = PipelineEvent::Kind::kBatch, .begin = begin, .end = end};
    for (size_t i = first; i <= last; ++i) {
        if (e.messages < e.actions.size()) {
            e.actions[e.messages++] = actions[i];
        } else {
            ++e.extra_messages;
        }
    }
    add(pipeline_, e, dropped_pipeline_);
}

std::string Trace::pipeline_name(const PipelineEvent& e) const {
    if (e.kind == PipelineEvent::Kind::kCompute) {
        const Action& a = e.actions[0];
        return rank_.virtual_stages == 1 ? fmt::format("{}{}", to_string(a.kind), a.microbatch)
                                         : fmt::format("{}{} chunk {}", to_string(a.kind), a.microbatch, a.chunk);
    }
    std::string name;
    for (uint8_t i = 0; i < e.messages; ++i) {
        name += fmt::format("{}{} {}", i > 0 ? " + " : "", to_string(e.actions[i].kind), e.actions[i].microbatch);
    }
    return name;
}

uint64_t Trace::flow_id(int64_t it, const Action& a) const {
    // The message's model-chunk edge and direction, as the pipeline tags it (PipelineModel::tag): an activation
    // leaves chunk k over edge k, a gradient enters chunk k - 1 over edge k - 1. Each field in its own bits.
    const int k = a.chunk * rank_.pp_size + rank_.pp_rank;
    const bool activation = a.kind == Action::Kind::kSendActivation || a.kind == Action::Kind::kRecvActivation;
    const bool sent_from_here = a.kind == Action::Kind::kSendActivation || a.kind == Action::Kind::kSendGrad;
    const int edge = activation ? (sent_from_here ? k : k - 1) : (sent_from_here ? k - 1 : k);
    uint64_t id = static_cast<uint64_t>(it) & 0xfffff;
    for (const auto& [value, bits] :
         {std::pair{rank_.tp_rank, 8}, {rank_.dp_rank, 12}, {a.microbatch, 12}, {edge, 10}}) {
        id = (id << bits) | (static_cast<uint64_t>(value) & ((uint64_t{1} << bits) - 1));
    }
    return (id << 1) | (activation ? 0 : 1);
}

void Trace::write_event(const std::string& json) {
    std::fputs(first_event_ ? "\n" : ",\n", file_);
    std::fputs(json.c_str(), file_);
    first_event_ = false;
}

void Trace::write_footer() {
    std::fputs(kFooter, file_);
    std::fflush(file_);
    std::fseek(file_, -static_cast<long>(std::strlen(kFooter)), SEEK_CUR);  // the next events overwrite it
}

void Trace::write_metadata() {
    const int pid = rank_.world_rank;
    write_event(metadata("process_name", pid, -1,
                         {{"name", fmt::format("rank {} (tp {}, pp {}, dp {})", rank_.world_rank, rank_.tp_rank,
                                               rank_.pp_rank, rank_.dp_rank)}})
                    .dump());
    write_event(metadata("process_sort_index", pid, -1, {{"sort_index", pid}}).dump());
    for (const auto& [tid, name] :
         {std::pair{kPipelineRow, "pipeline"}, {kOpsRow, "ops"}, {kCommRow, "communication"}}) {
        write_event(metadata("thread_name", pid, tid, {{"name", name}}).dump());
        write_event(metadata("thread_sort_index", pid, tid, {{"sort_index", tid}}).dump());
    }
}

void Trace::write_step(int64_t it) {
    const int pid = rank_.world_rank;
    const auto complete = [&](std::string name, const char* cat, int tid, double begin, double end, Json args) {
        args["iteration"] = it;
        write_event(Json{{"name", std::move(name)},
                         {"cat", cat},
                         {"ph", "X"},
                         {"pid", pid},
                         {"tid", tid},
                         {"ts", rounded(us(begin))},
                         {"dur", rounded(std::max(0.0, (end - begin) * 1e6))},
                         {"args", std::move(args)}}
                        .dump());
    };
    complete(fmt::format("iteration {}", it), "iteration", kPipelineRow, iteration_begin_, iteration_end_,
             Json::object());
    for (const PipelineEvent& e : pipeline_) {
        Json args = Json::object();
        if (e.kind == PipelineEvent::Kind::kCompute) {
            const Action& a = e.actions[0];
            args = {{"microbatch", a.microbatch},
                    {"chunk", a.chunk},
                    {"model_chunk", a.chunk * rank_.pp_size + rank_.pp_rank}};
        } else if (e.kind == PipelineEvent::Kind::kBatch) {
            Json messages = Json::array();
            for (uint8_t i = 0; i < e.messages; ++i) {
                const Action& a = e.actions[i];
                messages.push_back({{"kind", to_string(a.kind)},
                                    {"microbatch", a.microbatch},
                                    {"chunk", a.chunk},
                                    {"peer_stage", a.peer_stage}});
            }
            args = {{"messages", std::move(messages)}};
            if (e.extra_messages > 0) args["more_messages"] = e.extra_messages;
        }
        const char* cat = e.kind == PipelineEvent::Kind::kCompute ? "compute" : "p2p";
        complete(pipeline_name(e), cat, kPipelineRow, e.begin, e.end, std::move(args));
        // an arrow from each send to its receive on the peer's row, bound to the batches' slices at their middle
        for (uint8_t i = 0; e.kind == PipelineEvent::Kind::kBatch && i < e.messages; ++i) {
            const Action& a = e.actions[i];
            const bool send = a.kind == Action::Kind::kSendActivation || a.kind == Action::Kind::kSendGrad;
            const bool activation = a.kind == Action::Kind::kSendActivation || a.kind == Action::Kind::kRecvActivation;
            Json flow = {{"name", activation ? "activation" : "gradient"},
                         {"cat", "p2p"},
                         {"ph", send ? "s" : "f"},
                         {"id", flow_id(it, a)},
                         {"pid", pid},
                         {"tid", kPipelineRow},
                         {"ts", rounded(us(0.5 * (e.begin + e.end)))}};
            if (!send) flow["bp"] = "e";
            write_event(flow.dump());
        }
    }
    for (const OpEvent& e : ops_) complete(e.key.describe(), "op", kOpsRow, e.begin, e.end, Json::object());
    {
        const std::lock_guard<std::mutex> lock(comm_mu_);
        std::sort(comms_.begin(), comms_.end(),
                  [](const CommEvent& a, const CommEvent& b) { return a.record.issued < b.record.issued; });
        lane_end_.clear();
        for (const CommEvent& e : comms_) {
            const CommRecord& r = e.record;
            // the first row free at its issue: operations in flight together get rows of their own
            size_t lane = 0;
            while (lane < lane_end_.size() && lane_end_[lane] > r.issued) ++lane;
            if (lane == lane_end_.size()) lane_end_.push_back(0);
            lane_end_[lane] = r.completed;
            const int tid = kCommRow + static_cast<int>(lane);
            if (static_cast<int>(lane) >= comm_lanes_) {
                comm_lanes_ = static_cast<int>(lane) + 1;
                write_event(
                    metadata("thread_name", pid, tid, {{"name", fmt::format("communication {}", lane + 1)}}).dump());
                write_event(metadata("thread_sort_index", pid, tid, {{"sort_index", tid}}).dump());
            }
            const std::string group(e.group.data());
            const char* op = r.mixed_p2p ? "send_recv" : comm_op_name(r.op);
            const double waited = r.wait_began > 0 ? r.completed - r.wait_began : 0.0;
            complete(fmt::format("{} {}", group, op), "comm", tid, r.issued, r.completed,
                     {{"group", group},
                      {"op", op},
                      {"bytes", r.bytes},
                      {"priority", priority_name(r.priority)},
                      {"waited_us", rounded(waited * 1e6)}});
            if (r.wait_began > 0) complete("wait", "comm_wait", tid, r.wait_began, r.completed, Json::object());
        }
        comms_.clear();
    }
    write_footer();
    if (dropped_ops_ + dropped_comms_ + dropped_pipeline_ > 0) {
        log_warn(
            "trace: iteration {} had more events than the buffers hold: {} op, {} communication and {} pipeline "
            "events are missing from {}; the buffers grow for the next traced iteration",
            it, dropped_ops_, dropped_comms_, dropped_pipeline_, path_);
        ops_.reserve(ops_.capacity() + 2 * static_cast<size_t>(dropped_ops_));
        pipeline_.reserve(pipeline_.capacity() + 2 * static_cast<size_t>(dropped_pipeline_));
        const std::lock_guard<std::mutex> lock(comm_mu_);
        comms_.reserve(comms_.capacity() + 2 * static_cast<size_t>(dropped_comms_));
        dropped_ops_ = dropped_comms_ = dropped_pipeline_ = 0;
    }
    ops_.clear();
    pipeline_.clear();
}

std::string Trace::finish(Communicator& world) {
    if (file_ == nullptr) return {};
    recording_.store(false, std::memory_order_relaxed);
    const bool ok = std::fclose(file_) == 0;  // it ends with the footer
    file_ = nullptr;
    if (!ok) log_warn("trace: could not finish writing {}", path_);
    world.barrier();  // every rank's file is complete
    if (world.rank() != 0) return {};
    const std::string merged = merge_traces(dir_, world.size());
    log_info("trace: iterations {} to {} of every rank in {} (open it in ui.perfetto.dev)", steps_.first, last_,
             merged);
    return merged;
}

std::string merge_traces(const std::string& dir, int world_size) {
    Json events = Json::array();
    for (int r = 0; r < world_size; ++r) {
        const std::string path = rank_file(dir, r);
        std::ifstream f(path);
        Json one = Json::parse(f, nullptr, /*allow_exceptions=*/false);
        if (!one.is_object() || !one.contains("traceEvents")) {
            log_warn("trace: {} is missing or not a complete trace; the merged timeline has no rank {}", path, r);
            continue;
        }
        for (Json& e : one["traceEvents"]) events.push_back(std::move(e));
    }
    const std::filesystem::path out = std::filesystem::path(dir) / "trace.json";
    const std::filesystem::path tmp = std::filesystem::path(dir) / "trace.json.tmp";
    {
        std::ofstream f(tmp, std::ios::trunc);
        f << Json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump() << '\n';
    }
    std::filesystem::rename(tmp, out);
    return out.string();
}

}  // namespace ms
