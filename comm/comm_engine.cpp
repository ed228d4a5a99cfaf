// comm_engine.cpp: see comm_engine.h.
#include "comm/comm_engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/flight_recorder.h"
#include "comm/typed_dispatch.h"
#include "engine/core/check.h"

namespace ms {
namespace {

class EngineCommunicator;

bool is_background(Priority p) { return p == Priority::kLow; }

// True on the engine's thread while it holds the engine's lock (queue_json must not take it again there).
thread_local bool t_holds_engine_lock = false;

// The engine's two classes of operation, for its queue dump.
const char* priority_class(Priority p) {
    switch (p) {
        case Priority::kLow:
            return "background";
        case Priority::kNormal:
        case Priority::kHigh:
            return "critical";
    }
    return "?";
}

// One queued operation: its arguments, how far it is issued, and its result. The caller's thread owns it before it
// is queued and after it is done; the engine's thread in between (both under the engine's mutex).
struct EngineOp final : Handle::State {
    EngineCommunicator* owner = nullptr;
    CommOp kind = CommOp::kAllReduce;
    void* buf = nullptr;       // all_reduce, broadcast, reduce; the output of the block-wise ones
    const void* in = nullptr;  // reduce_scatter, all_gather, all_to_all
    size_t count = 0, in_count = 0;
    DType dtype = DType::kF32;
    ReduceOp reduce_op = ReduceOp::kSum;
    int root = 0;
    Priority priority = Priority::kNormal;
    double queued_at = 0;       // unix_seconds(), for the dumps
    double off_wire_since = 0;  // now_seconds() when it was queued or its last piece completed
    double queued_seconds = 0;  // in the engine off the wire so far (CommEngineOptions::on_queued)
    std::vector<P2POp> p2p;     // a batch of sends and receives
    size_t piece_elems = 0;     // elements per piece; the whole op is one piece when it is not cut
    int pieces = 1, issued = 0, completed = 0;
    bool done = false;
    std::exception_ptr error;
    CommStats delta;  // the inner communicator's counters, what this op added

    void wait() override;
    bool test() override;
    void recycle() override;
};

// The operations of one communicator not yet wholly issued, oldest first: a vector and the index of its front,
// emptied when the last leaves, so once it has grown a step allocates nothing (a deque allocates nodes as it moves:
// memory/alloc_guard.h).
class OpFifo {
  public:
    bool empty() const { return head_ == ops_.size(); }
    EngineOp* front() const { return ops_[head_]; }
    void push_back(EngineOp* op) { ops_.push_back(op); }
    void pop_front() {
        if (++head_ == ops_.size()) clear();
    }
    void clear() {
        ops_.clear();  // keeps the capacity
        head_ = 0;
    }
    auto begin() const { return ops_.begin() + static_cast<std::ptrdiff_t>(head_); }
    auto end() const { return ops_.end(); }

  private:
    std::vector<EngineOp*> ops_;
    size_t head_ = 0;
};

}  // namespace

struct CommEngine::Impl {
    struct Piece {
        EngineOp* op;
        Handle handle;
        double issued_at;
    };

    CommEngineOptions options;
    std::mutex mu;
    std::condition_variable work, done;
    std::vector<EngineCommunicator*> lanes;  // the wrapped communicators, in wrapping order
    int queued = 0;                          // ops in the lanes' queues
    uint64_t arrivals = 0;                   // ops queued so far: the thread wakes when it changes
    int background_in_flight = 0;
    size_t next_lane = 0;        // where the search for a background piece starts (round robin)
    std::vector<Piece> flight;   // the engine thread's only
    size_t in_flight_count = 0;  // flight.size() as of the last time the thread held the lock (for the dumps)
    std::exception_ptr failed;
    bool abandoning = false;  // after a failure, while the thread lets go of the pieces that were in flight
    bool stop = false;
    CommEngineStats stats;
    std::thread thread;

    void run();
    void issue_ready();                             // under mu
    void issue_critical(EngineCommunicator& lane);  // under mu: the critical ops at the head of `lane`, at once
    void issue_piece(EngineOp& op);                 // under mu
    void complete(EngineOp& op);                    // under mu: one piece done
    void fail(std::exception_ptr error);            // under mu: every op ends with it
};

namespace {

class EngineCommunicator final : public Communicator {
  public:
    EngineCommunicator(std::shared_ptr<CommEngine> engine, std::unique_ptr<Communicator> inner)
        : engine_(std::move(engine)), e_(*engine_impl(*engine_)), inner_(std::move(inner)) {
        // States made up front, so that a step with more operations queued at once than any step before (the count
        // depends on timing) does not allocate (memory/alloc_guard.h).
        for (size_t i = 0; i < CommEngine::kPooledOps; ++i) {
            free_.push_back(new EngineOp);
            free_.back()->p2p.reserve(2);
        }
        const std::lock_guard<std::mutex> lock(e_.mu);
        e_.lanes.push_back(this);
    }
    ~EngineCommunicator() override {
        drain();
        const std::lock_guard<std::mutex> lock(e_.mu);
        std::erase(e_.lanes, this);
        for (EngineOp* op : free_) delete op;
    }

    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    std::string_view name() const override { return inner_->name(); }
    void barrier() override {
        drain();
        inner_->barrier();
    }
    std::unique_ptr<Communicator> split(int color, int key, std::string name) override {
        drain();
        std::unique_ptr<Communicator> child = inner_->split(color, key, std::move(name));
        if (!child) return nullptr;
        return std::make_unique<EngineCommunicator>(engine_, std::move(child));
    }

    Communicator& inner() { return *inner_; }
    CommEngine::Impl& engine() { return e_; }
    OpFifo queue;         // not yet wholly issued, in the caller's order (under the engine's mutex)
    int outstanding = 0;  // queued or in flight (under the engine's mutex)
    void take_stats(const CommStats& d) {
        CommStats& s = mutable_stats();
        for (size_t i = 0; i < s.ops.size(); ++i) {
            s.ops[i] += d.ops[i];
            s.bytes[i] += d.bytes[i];
        }
    }
    void recycle(EngineOp* op) { free_.push_back(op); }

  protected:
    Handle batch_send_recv_impl(std::span<const P2POp> ops, Priority p) override {
        EngineOp& op = take(ops.front().kind == P2POp::Kind::kSend ? CommOp::kSend : CommOp::kRecv, p);
        op.p2p.assign(ops.begin(), ops.end());
        return queue_op(op, false);
    }
    Handle all_reduce_impl(void* buf, size_t count, DType t, ReduceOp rop, Priority p) override {
        EngineOp& op = take(CommOp::kAllReduce, p);
        op.buf = buf, op.count = count, op.dtype = t, op.reduce_op = rop;
        return queue_op(op, true);
    }
    Handle reduce_scatter_impl(const void* in, void* out, size_t out_count, size_t in_count, DType t, ReduceOp rop,
                               Priority p) override {
        EngineOp& op = take(CommOp::kReduceScatter, p);
        op.in = in, op.buf = out, op.count = out_count, op.in_count = in_count, op.dtype = t, op.reduce_op = rop;
        return queue_op(op, false);
    }
    Handle all_gather_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t, Priority p) override {
        EngineOp& op = take(CommOp::kAllGather, p);
        op.in = in, op.buf = out, op.count = out_count, op.in_count = in_count, op.dtype = t;
        return queue_op(op, false);
    }
    Handle broadcast_impl(void* buf, size_t count, DType t, int root, Priority p) override {
        EngineOp& op = take(CommOp::kBroadcast, p);
        op.buf = buf, op.count = count, op.dtype = t, op.root = root;
        return queue_op(op, true);
    }
    Handle reduce_impl(void* buf, size_t count, DType t, int root, ReduceOp rop, Priority p) override {
        EngineOp& op = take(CommOp::kReduce, p);
        op.buf = buf, op.count = count, op.dtype = t, op.root = root, op.reduce_op = rop;
        return queue_op(op, true);
    }
    Handle all_to_all_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t, Priority p) override {
        EngineOp& op = take(CommOp::kAllToAll, p);
        op.in = in, op.buf = out, op.count = out_count, op.in_count = in_count, op.dtype = t;
        return queue_op(op, false);
    }

  private:
    static CommEngine::Impl* engine_impl(CommEngine& engine);

    EngineOp& take(CommOp kind, Priority p) {
        EngineOp* op = nullptr;
        if (free_.empty()) {
            op = new EngineOp;
        } else {
            op = free_.back();
            free_.pop_back();
        }
        std::vector<P2POp> keep = std::move(op->p2p);  // its capacity: a warm step allocates nothing
        *op = EngineOp{};
        op->p2p = std::move(keep);
        op->p2p.clear();
        op->owner = this;
        op->kind = kind;
        op->priority = p;
        return *op;
    }
    // Queues `op`; a background op of a contiguous buffer (`cuttable`) is cut into pieces of chunk_bytes.
    Handle queue_op(EngineOp& op, bool cuttable) {
        const bool background = is_background(op.priority);
        if (background && cuttable && op.count > 0) {
            const size_t per = std::max<size_t>(1, static_cast<size_t>(e_.options.chunk_bytes) / dtype_size(op.dtype));
            op.piece_elems = std::min(per, op.count);
            op.pieces = static_cast<int>((op.count + op.piece_elems - 1) / op.piece_elems);
        }
        {
            const std::lock_guard<std::mutex> lock(e_.mu);
            if (e_.failed) {
                op.error = e_.failed;
                op.done = true;
            } else {
                op.queued_at = unix_seconds();
                op.off_wire_since = now_seconds();
                queue.push_back(&op);
                ++e_.arrivals;
                ++outstanding;
                ++e_.queued;
                (background ? e_.stats.background_ops : e_.stats.critical_ops) += 1;
            }
        }
        e_.work.notify_one();
        return Handle(Handle::StatePtr(&op));
    }
    // Waits until every operation of this communicator is done (or the engine failed).
    void drain() {
        std::unique_lock<std::mutex> lock(e_.mu);
        e_.done.wait(lock, [&] { return (outstanding == 0 || e_.failed) && !e_.abandoning; });
    }

    std::shared_ptr<CommEngine> engine_;
    CommEngine::Impl& e_;
    std::unique_ptr<Communicator> inner_;
    std::vector<EngineOp*> free_;  // completed ops for reuse (the caller's thread)
};

void EngineOp::wait() {
    CommEngine::Impl& e = owner->engine();
    {
        std::unique_lock<std::mutex> lock(e.mu);
        e.done.wait(lock, [&] { return done; });
    }
    owner->take_stats(delta);
    delta = {};
    if (error) std::rethrow_exception(error);
}

bool EngineOp::test() {
    {
        const std::lock_guard<std::mutex> lock(owner->engine().mu);
        if (!done) return false;
    }
    wait();
    return true;
}

void EngineOp::recycle() {
    // A state whose wait threw may still be queued in a failed engine: done is set for every op then.
    owner->recycle(this);
}

}  // namespace

CommEngine::Impl* EngineCommunicator::engine_impl(CommEngine& engine) { return &engine.impl(); }

void CommEngine::Impl::issue_piece(EngineOp& op) {
    Communicator& c = op.owner->inner();
    const CommStats before = c.stats();
    const size_t off = static_cast<size_t>(op.issued) * op.piece_elems;
    const size_t len = op.piece_elems == 0 ? op.count : std::min(op.piece_elems, op.count - off);
    const Priority p = op.priority;
    Handle h;
    if (op.kind == CommOp::kSend || op.kind == CommOp::kRecv) {
        h = c.batch_send_recv(std::span<const P2POp>(op.p2p), p);
    } else {
        h = with_comm_type(op.dtype, [&](auto* type) {
            using T = std::remove_pointer_t<decltype(type)>;
            T* buf = static_cast<T*>(op.buf);
            const std::span<const T> in(static_cast<const T*>(op.in), op.in_count);
            switch (op.kind) {
                case CommOp::kAllReduce:
                    return c.all_reduce(std::span<T>(buf + off, len), op.reduce_op, p);
                case CommOp::kBroadcast:
                    return c.broadcast(std::span<T>(buf + off, len), op.root, p);
                case CommOp::kReduce:
                    return c.reduce(std::span<T>(buf + off, len), op.root, op.reduce_op, p);
                case CommOp::kReduceScatter:
                    return c.reduce_scatter(in, std::span<T>(buf, op.count), op.reduce_op, p);
                case CommOp::kAllGather:
                    return c.all_gather(in, std::span<T>(buf, op.count), p);
                case CommOp::kAllToAll:
                    return c.all_to_all(in, std::span<T>(buf, op.count), p);
                default:
                    MS_UNREACHABLE("comm engine: op {}", static_cast<int>(op.kind));
            }
        });
    }
    const CommStats& after = c.stats();
    for (size_t i = 0; i < after.ops.size(); ++i) {
        op.delta.ops[i] += after.ops[i] - before.ops[i];
        op.delta.bytes[i] += after.bytes[i] - before.bytes[i];
    }
    ++op.issued;
    if (op.issued == op.completed + 1) op.queued_seconds += now_seconds() - op.off_wire_since;  // first in flight
    const bool background = is_background(p);
    if (background) {
        ++background_in_flight;
        ++stats.background_pieces;
    }
    flight.push_back({&op, std::move(h), now_seconds()});
}

void CommEngine::Impl::issue_critical(EngineCommunicator& lane) {
    while (!lane.queue.empty() && !is_background(lane.queue.front()->priority)) {
        EngineOp& op = *lane.queue.front();
        while (op.issued < op.pieces) issue_piece(op);
        lane.queue.pop_front();
        --queued;
    }
}

void CommEngine::Impl::issue_ready() {
    for (EngineCommunicator* lane : lanes) issue_critical(*lane);
    // Every lane's head is now background, or the lane is empty: one piece, if none is in flight, from the lanes in
    // turn. A background op wholly issued lets the critical ones behind it go at once.
    if (background_in_flight > 0) return;
    for (size_t k = 0; k < lanes.size(); ++k) {
        const size_t i = (next_lane + k) % lanes.size();
        EngineCommunicator& lane = *lanes[i];
        if (lane.queue.empty()) continue;
        next_lane = i + 1;
        EngineOp& op = *lane.queue.front();
        issue_piece(op);
        if (op.issued == op.pieces) {
            lane.queue.pop_front();
            --queued;
            issue_critical(lane);
        }
        return;
    }
}

void CommEngine::Impl::complete(EngineOp& op) {
    ++op.completed;
    op.off_wire_since = now_seconds();
    if (op.completed == op.pieces) {
        if (options.on_queued) options.on_queued(op.owner->name(), op.queued_seconds);
        op.done = true;
        --op.owner->outstanding;
    }
}

void CommEngine::Impl::fail(std::exception_ptr error) {
    failed = error;
    for (Piece& p : flight) {
        if (!p.op->done) {
            p.op->error = error;
            p.op->done = true;
            --p.op->owner->outstanding;
        }
    }
    for (EngineCommunicator* lane : lanes) {
        for (EngineOp* op : lane->queue) {
            if (!op->done) {
                op->error = error;
                op->done = true;
                --lane->outstanding;
            }
        }
        lane->queue.clear();
    }
    queued = 0;
}

void CommEngine::Impl::run() {
    std::unique_lock<std::mutex> lock(mu);
    // held except while the pieces are tested and while the thread sleeps: issuing may fail fatally (and dump)
    struct Holding {
        Holding() { t_holds_engine_lock = true; }
        ~Holding() { t_holds_engine_lock = false; }
    };
    std::optional<Holding> holding(std::in_place);
    std::vector<Piece> finished;
    finished.reserve(kMaxPiecesInFlight);
    while (true) {
        const uint64_t seen = arrivals;
        if (!failed) issue_ready();
        in_flight_count = flight.size();
        if (flight.empty()) {
            if (stop && queued == 0) return;
            work.wait(lock, [&] { return stop || arrivals != seen; });
            continue;
        }
        // Test what is in flight without the lock: the pieces are this thread's, and the caller may queue meanwhile.
        holding.reset();
        lock.unlock();
        std::exception_ptr error;
        for (size_t i = 0; i < flight.size();) {
            bool ready = false;
            try {
                ready = flight[i].handle.test();
                if (!ready && options.timeout_s > 0 && now_seconds() - flight[i].issued_at > options.timeout_s) {
                    flight[i].handle.wait();  // the inner communicator's bounded wait: completes or throws
                    ready = true;
                }
            } catch (...) {
                error = std::current_exception();
                break;
            }
            if (ready) {
                finished.push_back(std::move(flight[i]));
                flight[i] = std::move(flight.back());
                flight.pop_back();
            } else {
                ++i;
            }
        }
        lock.lock();
        holding.emplace();
        for (Piece& p : finished) {
            if (is_background(p.op->priority)) --background_in_flight;
            complete(*p.op);
        }
        finished.clear();
        in_flight_count = flight.size();
        if (error) {
            // Every op ends with the error, and the callers wake; the pieces still in flight are let go of here,
            // before their communicators may be destroyed (drain() waits for that): their waits throw at once once
            // the watch has failed.
            abandoning = true;
            fail(error);
            done.notify_all();
            std::vector<Piece> abandoned = std::move(flight);
            flight.clear();
            lock.unlock();
            abandoned.clear();
            lock.lock();
            abandoning = false;
            done.notify_all();
            continue;
        }
        done.notify_all();
        if (!flight.empty()) {
            work.wait_for(lock, std::chrono::duration<double>(kPollSeconds), [&] { return arrivals != seen || stop; });
        }
    }
}

CommEngine::CommEngine(CommEngineOptions options) : impl_(std::make_unique<Impl>()) {
    MS_CHECK(options.chunk_bytes > 0, "comm engine: chunk_bytes {} (positive)", options.chunk_bytes);
    impl_->options = options;
    // Room for more pieces in flight than a step has (the critical ones the caller has not waited yet, and one
    // background piece), so that a step never grows them (memory/alloc_guard.h).
    impl_->flight.reserve(kMaxPiecesInFlight);
    impl_->thread = std::thread([this] { impl_->run(); });
}

CommEngine::~CommEngine() {
    {
        const std::lock_guard<std::mutex> lock(impl_->mu);
        impl_->stop = true;
    }
    impl_->work.notify_all();
    impl_->thread.join();
}

nlohmann::ordered_json CommEngine::queue_json() const {
    if (t_holds_engine_lock) return {{"queued", "unknown: the engine's own thread failed while issuing"}};
    const std::lock_guard<std::mutex> lock(impl_->mu);
    nlohmann::ordered_json queued = nlohmann::ordered_json::array();
    for (const EngineCommunicator* lane : impl_->lanes) {
        for (const EngineOp* op : lane->queue) {
            queued.push_back({{"comm", lane->name()},
                              {"op", op->p2p.size() > 1 ? "send_recv" : comm_op_name(op->kind)},
                              {"count", op->p2p.empty() ? op->count : op->p2p.front().count},
                              {"dtype", dtype_name(op->p2p.empty() ? op->dtype : op->p2p.front().dtype)},
                              {"priority", priority_class(op->priority)},
                              {"pieces", op->pieces},
                              {"issued", op->issued},
                              {"queued_at", op->queued_at}});
        }
    }
    const CommEngineStats& s = impl_->stats;
    return {{"queued", queued},
            {"pieces_in_flight", impl_->in_flight_count},
            {"background_in_flight", impl_->background_in_flight},
            {"stats",
             {{"critical_ops", s.critical_ops},
              {"background_ops", s.background_ops},
              {"background_pieces", s.background_pieces}}}};
}

CommEngineStats CommEngine::stats() const {
    const std::lock_guard<std::mutex> lock(impl_->mu);
    return impl_->stats;
}

std::unique_ptr<Communicator> CommEngine::wrap(const std::shared_ptr<CommEngine>& engine,
                                               std::unique_ptr<Communicator> inner) {
    if (!inner) return nullptr;
    return std::make_unique<EngineCommunicator>(engine, std::move(inner));
}

std::shared_ptr<CommEngine> schedule_groups(ProcessGroups& groups, const CommEngineOptions& options) {
    auto engine = std::make_shared<CommEngine>(options);
    for (std::unique_ptr<Communicator>* g : groups.groups()) *g = CommEngine::wrap(engine, std::move(*g));
    return engine;
}

}  // namespace ms
