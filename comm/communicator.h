// communicator.h: the typed collective interface every parallel axis talks to (docs/design.md §4).
//
// One Communicator is one process group (world, tp, pp, dp, mp, embd). Implementations: MPI on host buffers
// (comm/mpi/), NCCL later (comm/nccl/). A group of size 1 is a real object whose collectives are no-ops, so one
// code path serves every layout. Calls are typed: element count and datatype come from the span, never from a
// separate argument (llm.c once passed sizeof(float) as a count). Every call returns a Handle; wait() completes
// it. Calls on one communicator must be issued in the same order on every member rank (as in MPI and NCCL).
// Buffers must stay alive and untouched until the handle completes.
#pragma once

#include <array>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "engine/core/check.h"
#include "engine/core/dtype.h"
#include "engine/core/timer.h"

namespace ms {

enum class ReduceOp : uint8_t { kSum, kAvg, kMax };
// Scheduling hint for a later priority scheduler (critical TP/PP traffic ahead of background DP buckets).
enum class Priority : uint8_t { kLow, kNormal, kHigh };
enum class CommOp : uint8_t {
    kAllReduce,
    kReduceScatter,
    kAllGather,
    kBroadcast,
    kSend,
    kRecv,
    kAllToAll,
    kBarrier,
    kReduce,
    kCount
};

// Per-communicator counters, by op kind: calls issued and payload bytes this rank contributed (sent).
struct CommStats {
    std::array<int64_t, static_cast<size_t>(CommOp::kCount)> ops{};
    std::array<int64_t, static_cast<size_t>(CommOp::kCount)> bytes{};
    double wait_seconds = 0;  // time spent issuing calls and waiting on their handles: communication not hidden
    int64_t total_bytes() const {
        int64_t s = 0;
        for (int64_t b : bytes) s += b;
        return s;
    }
};

// Thrown by Handle::wait() when a collective does not complete within the configured timeout (comm/mpi/
// collective_watch.h), or when another rank reported one: exit code 18. Once thrown, every later wait on this
// process's communicators throws it again at once: the job is over, and nothing waits for a peer again.
class CollectiveTimeoutError : public RunError {
  public:
    explicit CollectiveTimeoutError(const std::string& what) : RunError(what, kExitCollectiveTimeout) {}
};

// Completion of one asynchronous call. Default-constructed handles are already complete.
class Handle {
  public:
    struct State {
        virtual ~State() = default;
        virtual void wait() = 0;
        virtual bool test() = 0;
        // Called instead of `delete` once the handle is done with the state: an implementation that pools its states
        // (so that a collective allocates nothing: memory/alloc_guard.h) returns it to its pool here.
        virtual void recycle() { delete this; }
    };
    struct Recycle {
        void operator()(State* s) const { s->recycle(); }
    };
    using StatePtr = std::unique_ptr<State, Recycle>;
    Handle() = default;
    explicit Handle(StatePtr s) : state_(std::move(s)) {}
    explicit Handle(std::unique_ptr<State> s) : state_(s.release()) {}
    Handle(Handle&& o) noexcept : state_(std::move(o.state_)), waited_(o.waited_) {}
    // Completes the operation this handle held before taking the other's (a defaulted move would drop it in flight).
    // Not noexcept: that wait may throw CollectiveTimeoutError.
    Handle& operator=(Handle&& o) {
        if (this != &o) {
            wait();
            state_ = std::move(o.state_);
            waited_ = o.waited_;
        }
        return *this;
    }
    // Never leaves an operation in flight on a buffer about to die. A wait that fails here (a collective timeout,
    // while an exception already unwinds or a later explicit wait will report it) is not thrown from a destructor.
    ~Handle() {
        try {
            wait();
        } catch (const std::exception&) {
        }
    }
    void wait() {
        if (!state_) return;
        const double t0 = now_seconds();
        state_->wait();
        if (waited_) *waited_ += now_seconds() - t0;
        state_.reset();
    }
    // Adds the time spent in wait() to *seconds (the communicator's CommStats::wait_seconds).
    Handle&& track(double* seconds) && {
        waited_ = seconds;
        return std::move(*this);
    }
    bool test() {
        if (state_ && state_->test()) state_.reset();
        return !state_;
    }

  private:
    StatePtr state_;
    double* waited_ = nullptr;
};

// One side of a point-to-point exchange for batch_send_recv().
struct P2POp {
    enum class Kind : uint8_t { kSend, kRecv } kind;
    int peer;      // rank within this communicator
    void* data;    // buffer
    size_t count;  // elements
    DType dtype;
    int tag = 0;

    template <typename T>
    static P2POp send(std::span<const T> buf, int peer, int tag = 0) {
        return {Kind::kSend, peer, const_cast<T*>(buf.data()), buf.size(), dtype_of<T>(), tag};
    }
    template <typename T>
    static P2POp recv(std::span<T> buf, int peer, int tag = 0) {
        return {Kind::kRecv, peer, buf.data(), buf.size(), dtype_of<T>(), tag};
    }
};

class Communicator {
  public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual std::string_view name() const = 0;  // "world", "tp", "dp", ...
    const CommStats& stats() const { return stats_; }
    void reset_stats() { stats_ = {}; }

    // in place: buf = op over ranks of buf
    template <typename T>
    Handle all_reduce(std::span<T> buf, ReduceOp op, Priority p = Priority::kNormal) {
        const double t0 = now_seconds();
        return timed(all_reduce_impl(buf.data(), buf.size(), dtype_of<T>(), op, p), t0);
    }
    // out (n) = op over ranks of in[rank * n, (rank + 1) * n); in has size() * n elements
    template <typename T>
    Handle reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op, Priority p = Priority::kNormal) {
        const double t0 = now_seconds();
        return timed(reduce_scatter_impl(in.data(), out.data(), out.size(), in.size(), dtype_of<T>(), op, p), t0);
    }
    // out[r * n, (r + 1) * n) = in of rank r; in has n elements, out size() * n
    template <typename T>
    Handle all_gather(std::span<const T> in, std::span<T> out, Priority p = Priority::kNormal) {
        return all_gather(in.data(), out.data(), in.size(), out.size(), dtype_of<T>(), p);
    }
    template <typename T>
    Handle broadcast(std::span<T> buf, int root, Priority p = Priority::kNormal) {
        return broadcast(buf.data(), buf.size(), dtype_of<T>(), root, p);
    }
    // The same for buffers whose element type is known only at run time (the 16-bit weights: bf16 or fp16; the
    // gradients: fp32, or 16-bit without mixed_precision.grad_reduce_in_fp32).
    Handle all_reduce(void* buf, size_t count, DType t, ReduceOp op, Priority p = Priority::kNormal) {
        const double t0 = now_seconds();
        return timed(all_reduce_impl(buf, count, t, op, p), t0);
    }
    Handle reduce_scatter(const void* in, void* out, size_t out_count, size_t in_count, DType t, ReduceOp op,
                          Priority p = Priority::kNormal) {
        const double t0 = now_seconds();
        return timed(reduce_scatter_impl(in, out, out_count, in_count, t, op, p), t0);
    }
    Handle reduce(void* buf, size_t count, DType t, int root, ReduceOp op, Priority p = Priority::kNormal) {
        const double t0 = now_seconds();
        return timed(reduce_impl(buf, count, t, root, op, p), t0);
    }
    Handle broadcast(void* buf, size_t count, DType t, int root, Priority p = Priority::kNormal) {
        const double t0 = now_seconds();
        return timed(broadcast_impl(buf, count, t, root, p), t0);
    }
    Handle all_gather(const void* in, void* out, size_t in_count, size_t out_count, DType t,
                      Priority p = Priority::kNormal) {
        const double t0 = now_seconds();
        return timed(all_gather_impl(in, out, in_count, out_count, t, p), t0);
    }
    // in place on root: buf = op over ranks of buf; the other ranks' buf is their input, left as it was or (a
    // communicator that falls back to all_reduce) the same result
    template <typename T>
    Handle reduce(std::span<T> buf, int root, ReduceOp op, Priority p = Priority::kNormal) {
        const double t0 = now_seconds();
        return timed(reduce_impl(buf.data(), buf.size(), dtype_of<T>(), root, op, p), t0);
    }
    // out[r * n, (r + 1) * n) = block `rank` of rank r's in; in and out both have size() * n elements
    template <typename T>
    Handle all_to_all(std::span<const T> in, std::span<T> out, Priority p = Priority::kNormal) {
        const double t0 = now_seconds();
        return timed(all_to_all_impl(in.data(), out.data(), in.size(), out.size(), dtype_of<T>(), p), t0);
    }
    // all sends and receives posted together (no ordering deadlock), completed by one handle
    Handle batch_send_recv(std::span<const P2POp> ops, Priority p = Priority::kNormal) {
        const double t0 = now_seconds();
        return timed(batch_send_recv_impl(ops, p), t0);
    }
    virtual void barrier() = 0;
    // A sub-group of the ranks passing the same color, ordered by key (MPI_Comm_split). Collective over this group.
    virtual std::unique_ptr<Communicator> split(int color, int key, std::string name) = 0;

  protected:
    virtual Handle batch_send_recv_impl(std::span<const P2POp> ops, Priority p) = 0;
    virtual Handle all_reduce_impl(void* buf, size_t count, DType t, ReduceOp op, Priority p) = 0;
    virtual Handle reduce_scatter_impl(const void* in, void* out, size_t out_count, size_t in_count, DType t,
                                       ReduceOp op, Priority p) = 0;
    virtual Handle all_gather_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t,
                                   Priority p) = 0;
    virtual Handle broadcast_impl(void* buf, size_t count, DType t, int root, Priority p) = 0;
    // A communicator without a reduce of its own (a decorator that has not learned it) all-reduces: the root's
    // result is the same, and the other ranks' buffers hold it too, which the contract of reduce() allows.
    virtual Handle reduce_impl(void* buf, size_t count, DType t, int root, ReduceOp op, Priority p) {
        MS_CHECK(root >= 0 && root < size(), "{}: reduce root {} is outside [0, {})", name(), root, size());
        return all_reduce_impl(buf, count, t, op, p);
    }
    virtual Handle all_to_all_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t,
                                   Priority p) = 0;
    Handle timed(Handle h, double t0) {
        stats_.wait_seconds += now_seconds() - t0;
        return std::move(h).track(&stats_.wait_seconds);
    }
    void count(CommOp op, size_t bytes) {
        stats_.ops[static_cast<size_t>(op)] += 1;
        stats_.bytes[static_cast<size_t>(op)] += static_cast<int64_t>(bytes);
    }
    // For decorators (comm/synchronizing_communicator.h), which report their inner communicator's counters.
    CommStats& mutable_stats() { return stats_; }
    // For decorators: runs call() (an operation on `inner`) and adds the ops and bytes inner counted for it to this
    // communicator's counters.
    template <class Call>
    Handle count_through(const Communicator& inner, Call&& call) {
        const CommStats before = inner.stats();
        Handle h = call();
        const CommStats& after = inner.stats();
        for (size_t i = 0; i < stats_.ops.size(); ++i) {
            stats_.ops[i] += after.ops[i] - before.ops[i];
            stats_.bytes[i] += after.bytes[i] - before.bytes[i];
        }
        return h;
    }

  private:
    CommStats stats_;
};

}  // namespace ms
