#include "comm/mpi/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/byte_ranges.h"
#include "comm/mpi/collective_watch.h"
#include "comm/mpi/mpi_check.h"
#include "comm/typed_dispatch.h"
#include "engine/core/check.h"
#include "engine/core/half.h"

namespace ms {
namespace {

MPI_Datatype mpi_type(DType t) {
    switch (t) {
        case DType::kF32:
            return MPI_FLOAT;
        case DType::kI32:
            return MPI_INT32_T;
        // 16-bit floats travel as their bits; reductions on them use the user ops of half_op() below.
        case DType::kBF16:
        case DType::kF16:
        case DType::kU16:
            return MPI_UINT16_T;
    }
    MS_UNREACHABLE("dtype {}", static_cast<int>(t));
}

// MPI has no bf16 / fp16 arithmetic: sum and max of 16-bit floats as user ops, each element widened to fp32 and the
// result rounded once (half.h), as NCCL reduces them. Registered on first use, after MPI_Init; never freed
// (MPI_Finalize releases them).
template <class T, bool kMax>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
    const T* a = static_cast<const T*>(in);
    T* b = static_cast<T*>(inout);
    for (int i = 0; i < *len; ++i) {
        const float x = to_float(a[i]), y = to_float(b[i]);
        b[i] = from_float<T>(kMax ? (x > y ? x : y) : x + y);
    }
}
MPI_Op make_op(MPI_User_function* fn) {
    MPI_Op op = MPI_OP_NULL;
    MS_MPI_CHECK(MPI_Op_create(fn, /*commute=*/1, &op));
    return op;
}
MPI_Op half_op(DType t, ReduceOp op) {
    static const MPI_Op bf16_sum = make_op(half_reduce<bf16, false>), bf16_max = make_op(half_reduce<bf16, true>);
    static const MPI_Op fp16_sum = make_op(half_reduce<fp16, false>), fp16_max = make_op(half_reduce<fp16, true>);
    const bool max = op == ReduceOp::kMax;
    return t == DType::kBF16 ? (max ? bf16_max : bf16_sum) : (max ? fp16_max : fp16_sum);
}

MPI_Op mpi_op(ReduceOp op, DType t) {
    if (t == DType::kBF16 || t == DType::kF16) return half_op(t, op);
    switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
            return MPI_SUM;  // kAvg divides on completion
        case ReduceOp::kMax:
            return MPI_MAX;
    }
    MS_UNREACHABLE("reduce op {}", static_cast<int>(op));
}

void check_reducible(std::string_view comm, DType t) {
    MS_CHECK(t != DType::kU16, "{}: the MPI communicator reduces fp32, bf16, fp16 and int32, not {}", comm,
             dtype_name(t));
}

// Calls fn(off, len) for the pieces [off, off + len) that cover [0, n) in steps of `chunk`.
template <typename Fn>
void for_each_chunk(size_t n, size_t chunk, Fn&& fn) {
    for (size_t off = 0; off < n; off += chunk) fn(off, std::min(chunk, n - off));
}

int as_int(size_t n) { return static_cast<int>(n); }  // callers keep n <= chunk_elems <= INT_MAX

template <typename T>
void divide(void* buf, size_t count, int divisor) {
    divide_elements(std::span<T>(static_cast<T*>(buf), count), divisor);
}

class MpiOpState;

}  // namespace

// Completed operation states kept for reuse: a collective takes one (with the capacity its vectors grew to) instead
// of allocating, so steady-state training makes no allocation per collective (memory/alloc_guard.h). Shared with
// the states it hands out, so a handle that outlives its communicator still has a pool to return to.
class MpiOpStatePool {
  public:
    ~MpiOpStatePool();
    std::vector<MpiOpState*> free;
};

namespace {

// The MPI requests of one call, plus what has to happen when they complete.
class MpiOpState final : public Handle::State {
  public:
    using Ptr = std::unique_ptr<MpiOpState, Handle::Recycle>;
    // A cleared state from `pool` (or a new one when the pool is empty).
    static Ptr acquire(const std::shared_ptr<MpiOpStatePool>& pool) {
        MpiOpState* s = nullptr;
        if (!pool->free.empty()) {
            s = pool->free.back();
            pool->free.pop_back();
        } else {
            s = new MpiOpState;
        }
        s->pool_ = pool;
        s->done_ = false;
        return Ptr(s);
    }
    // Puts n finished states with room for a few requests in `pool`: made at construction, so that a step with more
    // operations in flight at once than any step before (overlapped buckets: the count depends on timing) takes them
    // instead of allocating (memory/alloc_guard.h).
    static void prefill(MpiOpStatePool& pool, size_t n) {
        for (size_t i = 0; i < n; ++i) {
            auto* s = new MpiOpState;
            s->done_ = true;
            s->requests.reserve(4);
            pool.free.push_back(s);
        }
    }
    // Back to the pool when finished; an abandoned operation (its wait threw) is deleted, never reused.
    void recycle() override {
        std::shared_ptr<MpiOpStatePool> pool = std::move(pool_);
        if (!done_ || !pool) {
            delete this;
            return;
        }
        requests.clear();  // the vectors keep their capacity
        block_types.clear();
        avg_buf = nullptr;
        avg_count = 0;
        avg_dtype = DType::kF32;
        avg_divisor = 1;
        watch = nullptr;
        recorder = nullptr;
        seq = 0;  // done_ stays true while pooled: deleting a pooled state waits for nothing
        if (pool->free.size() == pool->free.capacity()) pool->free.reserve(2 * pool->free.size() + 8);
        pool->free.push_back(this);
    }

    std::vector<MPI_Request> requests;
    std::vector<std::pair<size_t, MPI_Datatype>> block_types;  // by chunk length; freed on completion
    // kAvg: divide avg_count elements at avg_buf by avg_divisor on completion
    void* avg_buf = nullptr;
    size_t avg_count = 0;
    DType avg_dtype = DType::kF32;
    int avg_divisor = 1;
    // Set by to_handle once requests are posted: waits go through the watch (bounded, recorded).
    CollectiveWatch* watch = nullptr;
    FlightRecorder* recorder = nullptr;
    uint64_t seq = 0;

    // A wait that throws (collective timeout) leaves the operation abandoned: not finished, nothing freed.
    ~MpiOpState() override {
        try {
            wait();
        } catch (const std::exception&) {
        }
    }
    void wait() override {
        if (done_) return;
        if (watch)
            watch->wait(as_int(requests.size()), requests.data(), *recorder, seq);
        else
            MS_MPI_CHECK(MPI_Waitall(as_int(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
        finish();
    }
    bool test() override {
        if (done_) return true;
        int flag = 0;
        MS_MPI_CHECK(MPI_Testall(as_int(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE));
        if (flag && recorder) recorder->completed(seq);
        if (flag) finish();
        return flag != 0;
    }

    // `len` elements of `base` with the extent of `stride` elements: one piece of every rank block at once.
    MPI_Datatype block_type(MPI_Datatype base, size_t len, size_t stride, size_t elem_size) {
        for (const auto& [l, type] : block_types)
            if (l == len) return type;
        MPI_Datatype contiguous = MPI_DATATYPE_NULL, resized = MPI_DATATYPE_NULL;
        MS_MPI_CHECK(MPI_Type_contiguous(as_int(len), base, &contiguous));
        MS_MPI_CHECK(MPI_Type_create_resized(contiguous, 0, static_cast<MPI_Aint>(stride * elem_size), &resized));
        MS_MPI_CHECK(MPI_Type_free(&contiguous));
        MS_MPI_CHECK(MPI_Type_commit(&resized));
        block_types.emplace_back(len, resized);
        return resized;
    }

  private:
    void finish() {
        done_ = true;
        // Freed only now: some MPI libraries keep a raw reference in pending non-blocking collectives.
        for (auto& [len, type] : block_types) MS_MPI_CHECK(MPI_Type_free(&type));
        block_types.clear();
        if (avg_buf == nullptr || avg_divisor == 1) return;
        switch (avg_dtype) {
            case DType::kF32:
                return divide<float>(avg_buf, avg_count, avg_divisor);
            case DType::kBF16:
                return divide<bf16>(avg_buf, avg_count, avg_divisor);
            case DType::kF16:
                return divide<fp16>(avg_buf, avg_count, avg_divisor);
            default:
                return divide<int32_t>(avg_buf, avg_count, avg_divisor);  // C++ integer division: toward zero
        }
    }
    bool done_ = false;
    std::shared_ptr<MpiOpStatePool> pool_;
};

// What the flight recorder keeps of an operation (flight_recorder.h).
struct OpInfo {
    CommOp op;
    size_t count;
    DType dtype;
    int peer = -1, tag = -1, messages = 0;
    bool mixed_p2p = false;
};

Handle to_handle(MpiOpState::Ptr s, CollectiveWatch& watch, FlightRecorder& recorder, const OpInfo& i) {
    if (s->requests.empty()) {
        s->wait();  // nothing in flight: finish now
        return {};
    }
    s->watch = &watch;
    s->recorder = &recorder;
    s->seq = recorder.posted(i.op, i.count, i.dtype, i.peer, i.tag, i.messages, i.mixed_p2p);
    return Handle(Handle::StatePtr(s.release()));
}

}  // namespace

MpiOpStatePool::~MpiOpStatePool() {
    for (MpiOpState* s : free) delete s;
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, size_t chunk_elems,
                                 std::shared_ptr<CollectiveWatch> watch)
    : comm_(comm),
      name_(std::move(name)),
      chunk_elems_(0),
      watch_(std::move(watch)),
      states_(std::make_shared<MpiOpStatePool>()) {
    MS_CHECK(comm_ != MPI_COMM_NULL, "{}: MpiCommunicator over MPI_COMM_NULL", name_);
    MS_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MS_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    set_chunk_elems(chunk_elems);
    if (!watch_) {
        int world_rank = 0;
        MS_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
        watch_ = std::make_shared<CollectiveWatch>(world_rank, "");
    }
    recorder_ = std::make_unique<FlightRecorder>(name_, rank_, size_);
    states_->free.reserve(2 * kPooledStates);
    MpiOpState::prefill(*states_, kPooledStates);
    MPI_Group group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
    MS_MPI_CHECK(MPI_Comm_group(comm_, &group));
    MS_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
    std::vector<int> ranks(static_cast<size_t>(size_)), world_ranks(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) ranks[static_cast<size_t>(r)] = r;
    MS_MPI_CHECK(MPI_Group_translate_ranks(group, size_, ranks.data(), world_group, world_ranks.data()));
    MS_MPI_CHECK(MPI_Group_free(&group));
    MS_MPI_CHECK(MPI_Group_free(&world_group));
    recorder_->set_world_ranks(std::move(world_ranks));
    watch_->add(recorder_.get());
}

MpiCommunicator::~MpiCommunicator() {
    watch_->remove(recorder_.get());
    if (watch_->aborted()) return;  // peers may be gone: freeing would wait for them (collective_watch.h)
    if (comm_ == MPI_COMM_WORLD || comm_ == MPI_COMM_SELF || comm_ == MPI_COMM_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MS_MPI_CHECK(MPI_Comm_free(&comm_));  // after MPI_Finalize there is nothing left to free
}

void MpiCommunicator::set_chunk_elems(size_t n) {
    MS_CHECK(n >= 1 && n <= static_cast<size_t>(INT_MAX), "{}: chunk size {} elements is outside [1, {}]", name_, n,
             INT_MAX);
    chunk_elems_ = n;
}

size_t MpiCommunicator::block_chunk() const { return std::max<size_t>(1, chunk_elems_ / static_cast<size_t>(size_)); }

Handle MpiCommunicator::all_reduce_impl(void* buf, size_t count, DType t, ReduceOp op, Priority) {
    check_reducible(name_, t);
    const size_t es = dtype_size(t);
    this->count(CommOp::kAllReduce, size_ == 1 ? 0 : count * es);
    if (size_ == 1 || count == 0) return {};
    MpiOpState::Ptr s = MpiOpState::acquire(states_);
    for_each_chunk(count, chunk_elems_, [&](size_t off, size_t len) {
        MPI_Request& r = s->requests.emplace_back(MPI_REQUEST_NULL);
        MS_MPI_CHECK(
            MPI_Iallreduce(MPI_IN_PLACE, at(buf, off, es), as_int(len), mpi_type(t), mpi_op(op, t), comm_, &r));
        ++mpi_calls_;
    });
    if (op == ReduceOp::kAvg) {
        s->avg_buf = buf;
        s->avg_count = count;
        s->avg_dtype = t;
        s->avg_divisor = size_;
    }
    return to_handle(std::move(s), *watch_, *recorder_, {CommOp::kAllReduce, count, t});
}

Handle MpiCommunicator::reduce_scatter_impl(const void* in, void* out, size_t out_count, size_t in_count, DType t,
                                            ReduceOp op, Priority) {
    check_reducible(name_, t);
    MS_CHECK(in_count == out_count * static_cast<size_t>(size_),
             "{}: reduce_scatter input has {} elements, but {} ranks x {} output elements = {}", name_, in_count, size_,
             out_count, out_count * static_cast<size_t>(size_));
    const size_t es = dtype_size(t);
    count(CommOp::kReduceScatter, size_ == 1 ? 0 : in_count * es);
    if (size_ == 1) {
        if (in != out) std::memmove(out, in, out_count * es);
        return {};
    }
    if (out_count == 0) return {};
    const bool into_own_block = out == at(in, static_cast<size_t>(rank_) * out_count, es);
    MS_CHECK(into_own_block || !overlaps(in, in_count * es, out, out_count * es),
             "{}: reduce_scatter output overlaps the input but is not this rank's block of it", name_);
    MpiOpState::Ptr s = MpiOpState::acquire(states_);
    const MPI_Datatype type = mpi_type(t);
    if (out_count <= block_chunk() && !into_own_block) {
        MPI_Request& r = s->requests.emplace_back(MPI_REQUEST_NULL);
        MS_MPI_CHECK(MPI_Ireduce_scatter_block(in, out, as_int(out_count), type, mpi_op(op, t), comm_, &r));
        ++mpi_calls_;
    } else {
        // One reduce per destination rank and piece: block r of every rank's input, summed into rank r's output.
        // Each piece is contiguous in the input, so nothing is repacked and no buffer is needed (a single
        // reduce-scatter of a piece would need every rank's piece side by side). Into this rank's own block, the
        // root's input is already in place.
        for (int root = 0; root < size_; ++root) {
            for_each_chunk(out_count, chunk_elems_, [&](size_t off, size_t len) {
                const void* send = at(in, static_cast<size_t>(root) * out_count + off, es);
                if (root == rank_ && into_own_block) send = MPI_IN_PLACE;
                MPI_Request& r = s->requests.emplace_back(MPI_REQUEST_NULL);
                MS_MPI_CHECK(MPI_Ireduce(send, at(out, off, es), as_int(len), type, mpi_op(op, t), root, comm_, &r));
                ++mpi_calls_;
            });
        }
    }
    if (op == ReduceOp::kAvg) {
        s->avg_buf = out;
        s->avg_count = out_count;
        s->avg_dtype = t;
        s->avg_divisor = size_;
    }
    return to_handle(std::move(s), *watch_, *recorder_, {CommOp::kReduceScatter, in_count, t});
}

Handle MpiCommunicator::all_gather_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t,
                                        Priority) {
    MS_CHECK(out_count == in_count * static_cast<size_t>(size_),
             "{}: all_gather output has {} elements, but {} ranks x {} input elements = {}", name_, out_count, size_,
             in_count, in_count * static_cast<size_t>(size_));
    const size_t es = dtype_size(t);
    count(CommOp::kAllGather, size_ == 1 ? 0 : in_count * es);
    if (size_ == 1) {
        if (in != out) std::memmove(out, in, in_count * es);
        return {};
    }
    if (in_count == 0) return {};
    const bool in_place = in == at(out, static_cast<size_t>(rank_) * in_count, es);
    MS_CHECK(in_place || !overlaps(in, in_count * es, out, out_count * es),
             "{}: all_gather input overlaps the output but is not this rank's block", name_);
    MpiOpState::Ptr s = MpiOpState::acquire(states_);
    const size_t chunk = block_chunk();
    const MPI_Datatype type = mpi_type(t);
    if (in_count <= chunk) {
        MPI_Request& r = s->requests.emplace_back(MPI_REQUEST_NULL);
        MS_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : in, as_int(in_count), type, out, as_int(in_count), type,
                                    comm_, &r));
        ++mpi_calls_;
    } else {
        // Piece [off, off + len) of every rank block: the receive side is one strided element per rank.
        for_each_chunk(in_count, chunk, [&](size_t off, size_t len) {
            const MPI_Datatype block = s->block_type(type, len, in_count, es);
            MPI_Request& r = s->requests.emplace_back(MPI_REQUEST_NULL);
            MS_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : at(in, off, es), as_int(len), type, at(out, off, es),
                                        1, block, comm_, &r));
            ++mpi_calls_;
        });
    }
    return to_handle(std::move(s), *watch_, *recorder_, {CommOp::kAllGather, in_count, t});
}

Handle MpiCommunicator::broadcast_impl(void* buf, size_t count, DType t, int root, Priority) {
    MS_CHECK(root >= 0 && root < size_, "{}: broadcast root {} is outside [0, {})", name_, root, size_);
    const size_t es = dtype_size(t);
    this->count(CommOp::kBroadcast, size_ > 1 && rank_ == root ? count * es : 0);
    if (size_ == 1 || count == 0) return {};
    MpiOpState::Ptr s = MpiOpState::acquire(states_);
    for_each_chunk(count, chunk_elems_, [&](size_t off, size_t len) {
        MPI_Request& r = s->requests.emplace_back(MPI_REQUEST_NULL);
        MS_MPI_CHECK(MPI_Ibcast(at(buf, off, es), as_int(len), mpi_type(t), root, comm_, &r));
        ++mpi_calls_;
    });
    return to_handle(std::move(s), *watch_, *recorder_, {CommOp::kBroadcast, count, t, root});
}

Handle MpiCommunicator::reduce_impl(void* buf, size_t count, DType t, int root, ReduceOp op, Priority) {
    check_reducible(name_, t);
    MS_CHECK(root >= 0 && root < size_, "{}: reduce root {} is outside [0, {})", name_, root, size_);
    const size_t es = dtype_size(t);
    this->count(CommOp::kReduce, size_ == 1 ? 0 : count * es);
    if (size_ == 1 || count == 0) return {};
    MpiOpState::Ptr s = MpiOpState::acquire(states_);
    const bool is_root = rank_ == root;
    for_each_chunk(count, chunk_elems_, [&](size_t off, size_t len) {
        MPI_Request& r = s->requests.emplace_back(MPI_REQUEST_NULL);
        void* piece = at(buf, off, es);
        MS_MPI_CHECK(MPI_Ireduce(is_root ? MPI_IN_PLACE : piece, is_root ? piece : nullptr, as_int(len), mpi_type(t),
                                 mpi_op(op, t), root, comm_, &r));
        ++mpi_calls_;
    });
    if (op == ReduceOp::kAvg && is_root) {
        s->avg_buf = buf;
        s->avg_count = count;
        s->avg_dtype = t;
        s->avg_divisor = size_;
    }
    return to_handle(std::move(s), *watch_, *recorder_, {CommOp::kReduce, count, t, root});
}

Handle MpiCommunicator::all_to_all_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t,
                                        Priority) {
    MS_CHECK(in_count == out_count && in_count % static_cast<size_t>(size_) == 0,
             "{}: all_to_all needs equal input and output sizes divisible by {} ranks, got {} and {}", name_, size_,
             in_count, out_count);
    const size_t es = dtype_size(t);
    count(CommOp::kAllToAll, size_ == 1 ? 0 : in_count * es);
    if (size_ == 1) {
        if (in != out) std::memmove(out, in, in_count * es);
        return {};
    }
    const size_t n = in_count / static_cast<size_t>(size_);  // block per rank
    if (n == 0) return {};
    const bool in_place = in == out;
    MS_CHECK(in_place || !overlaps(in, in_count * es, out, out_count * es),
             "{}: all_to_all input and output overlap without being the same buffer", name_);
    MpiOpState::Ptr s = MpiOpState::acquire(states_);
    const size_t chunk = block_chunk();
    const MPI_Datatype type = mpi_type(t);
    if (n <= chunk) {
        MPI_Request& r = s->requests.emplace_back(MPI_REQUEST_NULL);
        MS_MPI_CHECK(MPI_Ialltoall(in_place ? MPI_IN_PLACE : in, as_int(n), type, out, as_int(n), type, comm_, &r));
        ++mpi_calls_;
    } else {
        for_each_chunk(n, chunk, [&](size_t off, size_t len) {
            const MPI_Datatype block = s->block_type(type, len, n, es);
            MPI_Request& r = s->requests.emplace_back(MPI_REQUEST_NULL);
            MS_MPI_CHECK(MPI_Ialltoall(in_place ? MPI_IN_PLACE : at(in, off, es), 1, block, at(out, off, es), 1, block,
                                       comm_, &r));
            ++mpi_calls_;
        });
    }
    return to_handle(std::move(s), *watch_, *recorder_, {CommOp::kAllToAll, in_count, t});
}

Handle MpiCommunicator::batch_send_recv_impl(std::span<const P2POp> ops, Priority) {
    MpiOpState::Ptr s = MpiOpState::acquire(states_);
    for (const P2POp& op : ops) {
        MS_CHECK(op.peer >= 0 && op.peer < size_, "{}: point-to-point peer {} is outside [0, {})", name_, op.peer,
                 size_);
        MS_CHECK(op.tag >= 0, "{}: point-to-point tag {} is negative", name_, op.tag);
        const size_t es = dtype_size(op.dtype);
        const bool send = op.kind == P2POp::Kind::kSend;
        count(send ? CommOp::kSend : CommOp::kRecv, send && size_ > 1 ? op.count * es : 0);
        // Pieces of one message share (peer, tag); MPI's non-overtaking rule matches them in order.
        const MPI_Datatype type = mpi_type(op.dtype);
        for_each_chunk(op.count, chunk_elems_, [&](size_t off, size_t len) {
            MPI_Request& r = s->requests.emplace_back(MPI_REQUEST_NULL);
            if (send)
                MS_MPI_CHECK(MPI_Isend(at(op.data, off, es), as_int(len), type, op.peer, op.tag, comm_, &r));
            else
                MS_MPI_CHECK(MPI_Irecv(at(op.data, off, es), as_int(len), type, op.peer, op.tag, comm_, &r));
            ++mpi_calls_;
        });
    }
    if (ops.empty()) return to_handle(std::move(s), *watch_, *recorder_, {CommOp::kSend, 0, DType::kF32});
    const P2POp& first = ops.front();
    const bool mixed = std::any_of(ops.begin(), ops.end(), [&](const P2POp& o) { return o.kind != first.kind; });
    return to_handle(std::move(s), *watch_, *recorder_,
                     {first.kind == P2POp::Kind::kSend ? CommOp::kSend : CommOp::kRecv, first.count, first.dtype,
                      first.peer, first.tag, static_cast<int>(ops.size()), mixed});
}

// Non-blocking underneath, so the wait is bounded like every other (collective_watch.h).
void MpiCommunicator::barrier() {
    count(CommOp::kBarrier, 0);
    if (size_ == 1) return;
    MPI_Request r = MPI_REQUEST_NULL;
    MS_MPI_CHECK(MPI_Ibarrier(comm_, &r));
    ++mpi_calls_;
    watch_->wait(1, &r, *recorder_, recorder_->posted(CommOp::kBarrier, 0, DType::kF32));
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, std::string name) {
    MPI_Comm child = MPI_COMM_NULL;
    MS_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child));
    if (child == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(child, std::move(name), chunk_elems_, watch_);
}

}  // namespace ms
