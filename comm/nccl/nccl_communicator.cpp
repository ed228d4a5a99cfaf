#include "comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/byte_ranges.h"
#include "comm/mpi/collective_watch.h"
#include "comm/mpi/mpi_check.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/nccl/comm_choice.h"
#include "comm/nccl/nccl_check.h"
#include "engine/core/check.h"
#include "engine/core/half.h"
#include "engine/core/timer.h"

namespace ms {

// The communicators split from one create_world(): a timeout in any of them ends them all (nccl_communicator.h).
struct NcclFamily {
    bool aborted = false;
    std::string abort_message;
    std::vector<NcclCommunicator*> members;
};

namespace {

enum class Memory : uint8_t { kHost, kDevice };

// Device and managed memory go through NCCL; anything else (pageable or pinned host memory) through MPI.
Memory memory_of(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();  // older runtimes fail on plain host pointers: clear the sticky-free error
        return Memory::kHost;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? Memory::kDevice : Memory::kHost;
}

// Both buffers of a call in the same kind of memory (a null buffer of an empty call counts as the other's kind).
Memory memory_of(std::string_view comm, std::string_view op, const void* in, const void* out) {
    const Memory a = memory_of(in), b = memory_of(out);
    MS_CHECK(a == b,
             "{}: {} mixes host and device buffers (input on the {}, output on the {}); the NCCL communicator "
             "takes both on the device (NCCL) or both on the host (MPI)",
             comm, op, a == Memory::kHost ? "host" : "device", b == Memory::kHost ? "host" : "device");
    return a;
}

ncclDataType_t nccl_type(DType t) {
    switch (t) {
        case DType::kF32:
            return ncclFloat32;
        case DType::kI32:
            return ncclInt32;
        case DType::kBF16:
            return ncclBfloat16;
        case DType::kF16:
            return ncclFloat16;
        case DType::kU16:
            break;
    }
    MS_UNREACHABLE("dtype {} has no NCCL reduction type", dtype_name(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
    switch (op) {
        case ReduceOp::kSum:
            return ncclSum;
        case ReduceOp::kAvg:
            return ncclAvg;
        case ReduceOp::kMax:
            return ncclMax;
    }
    MS_UNREACHABLE("reduce op {}", static_cast<int>(op));
}

void check_reducible(std::string_view comm, DType t) {
    MS_CHECK(t != DType::kU16, "{}: the NCCL communicator reduces fp32, int32, bf16 and fp16, not {}", comm,
             dtype_name(t));
}

// Calls fn(std::type_identity<T>{}) with the storage type of t, for the host path's typed calls (uint16 moves as
// bf16: the same 16 bits).
template <class Fn>
Handle as_typed(DType t, Fn&& fn) {
    switch (t) {
        case DType::kF32:
            return fn(std::type_identity<float>{});
        case DType::kI32:
            return fn(std::type_identity<int32_t>{});
        case DType::kBF16:
        case DType::kU16:
            return fn(std::type_identity<bf16>{});
        case DType::kF16:
            return fn(std::type_identity<fp16>{});
    }
    MS_UNREACHABLE("dtype {}", static_cast<int>(t));
}

}  // namespace

// Completed operation states kept for reuse, each with its event (as MpiOpStatePool in mpi_communicator.cpp).
class NcclOpStatePool {
  public:
    ~NcclOpStatePool();
    std::vector<Handle::State*> free;
};

namespace {

// One issued NCCL call: the event recorded behind it on the communicator's stream.
class NcclOpState final : public Handle::State {
  public:
    using Ptr = std::unique_ptr<NcclOpState, Handle::Recycle>;
    static Ptr acquire(const std::shared_ptr<NcclOpStatePool>& pool) {
        NcclOpState* s = nullptr;
        if (!pool->free.empty()) {
            s = static_cast<NcclOpState*>(pool->free.back());
            pool->free.pop_back();
        } else {
            s = new NcclOpState;
            MS_NCCL_CUDA_CHECK(cudaEventCreateWithFlags(&s->event, cudaEventDisableTiming));
        }
        s->pool_ = pool;
        s->done_ = false;
        return Ptr(s);
    }
    // Back to the pool when finished; an abandoned operation (its wait threw) is deleted, never reused.
    void recycle() override {
        std::shared_ptr<NcclOpStatePool> pool = std::move(pool_);
        if (!done_ || !pool) {
            delete this;
            return;
        }
        comm = nullptr;
        seq = 0;
        if (pool->free.size() == pool->free.capacity()) pool->free.reserve(2 * pool->free.size() + 8);
        pool->free.push_back(this);
    }
    ~NcclOpState() override {
        try {
            wait();
        } catch (const std::exception&) {
        }
        if (event) (void)cudaEventDestroy(event);  // may run at exit, after the runtime is gone: nothing to report
    }
    void wait() override {
        if (done_) return;
        if (comm) comm->wait_event(event, seq);
        done_ = true;
    }
    bool test() override {
        if (!done_ && comm && comm->test_event(event, seq)) done_ = true;
        return done_;
    }

    cudaEvent_t event = nullptr;
    NcclCommunicator* comm = nullptr;
    uint64_t seq = 0;

  private:
    bool done_ = false;
    std::shared_ptr<NcclOpStatePool> pool_;
};

}  // namespace

NcclOpStatePool::~NcclOpStatePool() {
    for (Handle::State* s : free) delete s;
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create_world(Communicator& world, int device,
                                                                 SingleRank single_rank) {
    auto* mpi_world = dynamic_cast<MpiCommunicator*>(&world);
    MS_CHECK(mpi_world != nullptr, "NCCL bootstraps through MPI: communicator '{}' is not an MpiCommunicator",
             world.name());
    MS_NCCL_CUDA_CHECK(cudaSetDevice(device));
    // The host communicator: the same ranks in the same order, sharing world's CollectiveWatch.
    std::unique_ptr<Communicator> host = mpi_world->split(0, world.rank(), std::string(world.name()));
    auto* mpi_host = static_cast<MpiCommunicator*>(host.get());  // MpiCommunicator::split makes MpiCommunicators
    ncclUniqueId id{};
    if (mpi_host->rank() == 0) MS_NCCL_CHECK(ncclGetUniqueId(&id));
    MS_MPI_CHECK(MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, mpi_host->comm()));
    ncclComm_t comm = nullptr;
    MS_NCCL_CHECK(ncclCommInitRank(&comm, mpi_host->size(), id, mpi_host->rank()));
    host.release();
    return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::unique_ptr<MpiCommunicator>(mpi_host), comm,
                                                                  device, single_rank, std::make_shared<NcclFamily>()));
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<MpiCommunicator> host, ncclComm* comm, int device,
                                   SingleRank single_rank, std::shared_ptr<NcclFamily> family)
    : host_(std::move(host)),
      comm_(comm),
      name_(host_->name()),
      rank_(host_->rank()),
      size_(host_->size()),
      device_(device),
      single_rank_(single_rank),
      recorder_(name_ + "/nccl", rank_, size_),
      family_(std::move(family)),
      states_(std::make_shared<NcclOpStatePool>()) {
    int nccl_rank = -1, nccl_size = 0;
    MS_NCCL_CHECK(ncclCommUserRank(comm_, &nccl_rank));
    MS_NCCL_CHECK(ncclCommCount(comm_, &nccl_size));
    MS_CHECK(nccl_rank == rank_ && nccl_size == size_, "{}: the NCCL communicator has rank {} of {}, MPI rank {} of {}",
             name_, nccl_rank, nccl_size, rank_, size_);
    MS_NCCL_CUDA_CHECK(cudaSetDevice(device_));
    int least = 0, greatest = 0;
    MS_NCCL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    MS_NCCL_CUDA_CHECK(cudaStreamCreateWithPriority(&streams_[0], cudaStreamNonBlocking, greatest));
    MS_NCCL_CUDA_CHECK(cudaStreamCreateWithPriority(&streams_[1], cudaStreamNonBlocking, least));
    MS_NCCL_CUDA_CHECK(cudaEventCreateWithFlags(&order_event_, cudaEventDisableTiming));
    std::vector<int> world_ranks(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) world_ranks[static_cast<size_t>(r)] = host_->flight_recorder().world_rank_of(r);
    recorder_.set_world_ranks(std::move(world_ranks));
    host_->watch().add(&recorder_);
    family_->members.push_back(this);
}

NcclCommunicator::~NcclCommunicator() {
    host_->watch().remove(&recorder_);
    auto& members = family_->members;
    members.erase(std::remove(members.begin(), members.end(), this), members.end());
    if (comm_) {
        if (family_->aborted || host_->watch().aborted()) {
            (void)ncclCommAbort(comm_);  // peers may be gone: destroying would wait for their operations
        } else {
            for (cudaStream_t s : streams_) MS_NCCL_CUDA_CHECK(cudaStreamSynchronize(s));
            MS_NCCL_CHECK(ncclCommDestroy(comm_));
        }
    }
    for (cudaStream_t s : streams_)
        if (s) (void)cudaStreamDestroy(s);
    if (order_event_) (void)cudaEventDestroy(order_event_);
}

cudaStream_t NcclCommunicator::stream_for(Priority p) {
    const size_t s = p == Priority::kLow ? 1 : 0;
    if (s != last_stream_) {
        MS_NCCL_CUDA_CHECK(cudaEventRecord(order_event_, streams_[last_stream_]));
        MS_NCCL_CUDA_CHECK(cudaStreamWaitEvent(streams_[s], order_event_, 0));
        last_stream_ = s;
    }
    return streams_[s];
}

Handle NcclCommunicator::issued(CommOp op, size_t count, DType t, int peer, int tag, int messages, bool mixed_p2p) {
    NcclOpState::Ptr s = NcclOpState::acquire(states_);
    MS_NCCL_CUDA_CHECK(cudaEventRecord(s->event, streams_[last_stream_]));
    s->comm = this;
    s->seq = recorder_.posted(op, count, t, peer, tag, messages, mixed_p2p);
    return Handle(Handle::StatePtr(s.release()));
}

void NcclCommunicator::wait_event(cudaEvent_t event, uint64_t seq) {
    if (family_->aborted) throw CollectiveTimeoutError(family_->abort_message);
    CollectiveWatch& watch = host_->watch();
    if (watch.aborted())
        throw CollectiveTimeoutError(
            fmt::format("collective timeout error: an MPI collective of this rank timed out "
                        "before, so {} is not waited for",
                        recorder_.describe(seq)));
    recorder_.wait_started(seq);
    const double t0 = now_seconds();
    const double timeout = watch.options().collective_timeout_s;
    while (true) {
        const cudaError_t rc = cudaEventQuery(event);
        if (rc == cudaSuccess) {
            recorder_.completed(seq);
            return;
        }
        if (rc != cudaErrorNotReady) MS_NCCL_CUDA_CHECK(rc);
        ncclResult_t async = ncclSuccess;
        MS_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
        if (async != ncclSuccess && async != ncclInProgress)
            fatal("ncclCommGetAsyncError", __FILE__, __LINE__, __func__,
                  fmt::format("{} while waiting for {}", nccl_error_message(async), recorder_.describe(seq)));
        if (timeout > 0) {
            const double waited = now_seconds() - t0;
            if (waited >= timeout) timed_out(seq, waited, timeout);
        }
    }
}

bool NcclCommunicator::test_event(cudaEvent_t event, uint64_t seq) {
    if (family_->aborted) throw CollectiveTimeoutError(family_->abort_message);
    const cudaError_t rc = cudaEventQuery(event);
    if (rc == cudaErrorNotReady) return false;
    MS_NCCL_CUDA_CHECK(rc);
    recorder_.completed(seq);
    return true;
}

void NcclCommunicator::timed_out(uint64_t seq, double waited_s, double timeout_s) {
    CollectiveWatch& watch = host_->watch();
    recorder_.timed_out(seq);
    std::string message = fmt::format(
        "collective timeout error: world rank {} waited {:.1f} s for {}, longer than "
        "reliability.collective_timeout_s = {}: a rank of that group is hung, dead, or waiting in a different "
        "collective",
        recorder_.world_rank_of(rank_), waited_s, recorder_.describe(seq), timeout_s);
    const std::string path = watch.dump(message);
    if (!path.empty()) message += fmt::format("\n    flight recorder: {}", path);
    message +=
        "\n---> HINT: compare comm_traces/rank_*.json of every rank: on the group that timed out, the rank whose "
        "last seq is lower never posted the collective the others wait in. NCCL timeouts are not announced to the "
        "other ranks: each stops at its own deadline. If steps legitimately take longer, raise "
        "reliability.collective_timeout_s (0 disables the timeout)";
    family_->aborted = true;
    family_->abort_message = message;
    for (NcclCommunicator* m : family_->members) {
        if (m->comm_) (void)ncclCommAbort(m->comm_);  // ends the kernels still waiting for peers
        m->comm_ = nullptr;
    }
    if (watch.options().on_fault) {
        try {
            watch.options().on_fault(kExitCollectiveTimeout, message, {});
        } catch (const std::exception&) {
            // the exit record is best effort: the exception reports the timeout either way
        }
    }
    throw CollectiveTimeoutError(message);
}

Handle NcclCommunicator::all_reduce_impl(void* buf, size_t count, DType t, ReduceOp op, Priority p) {
    check_reducible(name_, t);
    this->count(CommOp::kAllReduce, size_ == 1 ? 0 : count * dtype_size(t));
    if (count == 0) return {};
    if (memory_of(buf) == Memory::kHost)
        return as_typed(t, [&]<class T>(std::type_identity<T>) {
            return host_->all_reduce(std::span<T>(static_cast<T*>(buf), count), op);
        });
    if (family_->aborted) throw CollectiveTimeoutError(family_->abort_message);
    if (shortcut()) return {};
    MS_NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(t), nccl_op(op), comm_, stream_for(p)));
    ++nccl_calls_;
    return issued(CommOp::kAllReduce, count, t);
}

Handle NcclCommunicator::reduce_scatter_impl(const void* in, void* out, size_t out_count, size_t in_count, DType t,
                                             ReduceOp op, Priority p) {
    check_reducible(name_, t);
    MS_CHECK(in_count == out_count * static_cast<size_t>(size_),
             "{}: reduce_scatter input has {} elements, but {} ranks x {} output elements = {}", name_, in_count, size_,
             out_count, out_count * static_cast<size_t>(size_));
    const size_t es = dtype_size(t);
    count(CommOp::kReduceScatter, size_ == 1 ? 0 : in_count * es);
    if (out_count == 0) return {};
    if (memory_of(name_, "reduce_scatter", in, out) == Memory::kHost)
        return as_typed(t, [&]<class T>(std::type_identity<T>) {
            return host_->reduce_scatter(std::span<const T>(static_cast<const T*>(in), in_count),
                                         std::span<T>(static_cast<T*>(out), out_count), op);
        });
    if (family_->aborted) throw CollectiveTimeoutError(family_->abort_message);
    const bool into_own_block = out == at(in, static_cast<size_t>(rank_) * out_count, es);
    MS_CHECK(into_own_block || !overlaps(in, in_count * es, out, out_count * es),
             "{}: reduce_scatter output overlaps the input but is not this rank's block of it", name_);
    if (shortcut()) {
        if (in == out) return {};
        MS_NCCL_CUDA_CHECK(cudaMemcpyAsync(out, in, out_count * es, cudaMemcpyDefault, stream_for(p)));
    } else {
        MS_NCCL_CHECK(ncclReduceScatter(in, out, out_count, nccl_type(t), nccl_op(op), comm_, stream_for(p)));
    }
    ++nccl_calls_;
    return issued(CommOp::kReduceScatter, in_count, t);
}

Handle NcclCommunicator::all_gather_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t,
                                         Priority p) {
    MS_CHECK(out_count == in_count * static_cast<size_t>(size_),
             "{}: all_gather output has {} elements, but {} ranks x {} input elements = {}", name_, out_count, size_,
             in_count, in_count * static_cast<size_t>(size_));
    const size_t es = dtype_size(t);
    count(CommOp::kAllGather, size_ == 1 ? 0 : in_count * es);
    if (in_count == 0) return {};
    if (memory_of(name_, "all_gather", in, out) == Memory::kHost)
        return as_typed(t, [&]<class T>(std::type_identity<T>) {
            return host_->all_gather(std::span<const T>(static_cast<const T*>(in), in_count),
                                     std::span<T>(static_cast<T*>(out), out_count));
        });
    if (family_->aborted) throw CollectiveTimeoutError(family_->abort_message);
    const bool in_place = in == at(out, static_cast<size_t>(rank_) * in_count, es);
    MS_CHECK(in_place || !overlaps(in, in_count * es, out, out_count * es),
             "{}: all_gather input overlaps the output but is not this rank's block", name_);
    if (shortcut()) {
        if (in == out) return {};
        MS_NCCL_CUDA_CHECK(cudaMemcpyAsync(out, in, in_count * es, cudaMemcpyDefault, stream_for(p)));
    } else {
        // Moved as bytes: a gather does no arithmetic, so every dtype (uint16 too) travels bit for bit.
        MS_NCCL_CHECK(ncclAllGather(in, out, in_count * es, ncclUint8, comm_, stream_for(p)));
    }
    ++nccl_calls_;
    return issued(CommOp::kAllGather, in_count, t);
}

Handle NcclCommunicator::broadcast_impl(void* buf, size_t count, DType t, int root, Priority p) {
    MS_CHECK(root >= 0 && root < size_, "{}: broadcast root {} is outside [0, {})", name_, root, size_);
    const size_t es = dtype_size(t);
    this->count(CommOp::kBroadcast, size_ > 1 && rank_ == root ? count * es : 0);
    if (count == 0) return {};
    if (memory_of(buf) == Memory::kHost)
        return as_typed(t, [&]<class T>(std::type_identity<T>) {
            return host_->broadcast(std::span<T>(static_cast<T*>(buf), count), root);
        });
    if (family_->aborted) throw CollectiveTimeoutError(family_->abort_message);
    if (shortcut()) return {};
    MS_NCCL_CHECK(ncclBroadcast(buf, buf, count * es, ncclUint8, root, comm_, stream_for(p)));
    ++nccl_calls_;
    return issued(CommOp::kBroadcast, count, t, root);
}

Handle NcclCommunicator::reduce_impl(void* buf, size_t count, DType t, int root, ReduceOp op, Priority p) {
    check_reducible(name_, t);
    MS_CHECK(root >= 0 && root < size_, "{}: reduce root {} is outside [0, {})", name_, root, size_);
    this->count(CommOp::kReduce, size_ == 1 ? 0 : count * dtype_size(t));
    if (count == 0) return {};
    if (memory_of(buf) == Memory::kHost)
        return as_typed(t, [&]<class T>(std::type_identity<T>) {
            return host_->reduce(std::span<T>(static_cast<T*>(buf), count), root, op);
        });
    if (family_->aborted) throw CollectiveTimeoutError(family_->abort_message);
    if (shortcut()) return {};
    MS_NCCL_CHECK(ncclReduce(buf, buf, count, nccl_type(t), nccl_op(op), root, comm_, stream_for(p)));
    ++nccl_calls_;
    return issued(CommOp::kReduce, count, t, root);
}

Handle NcclCommunicator::all_to_all_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t,
                                         Priority p) {
    MS_CHECK(in_count == out_count && in_count % static_cast<size_t>(size_) == 0,
             "{}: all_to_all needs equal input and output sizes divisible by {} ranks, got {} and {}", name_, size_,
             in_count, out_count);
    const size_t es = dtype_size(t);
    count(CommOp::kAllToAll, size_ == 1 ? 0 : in_count * es);
    const size_t n = in_count / static_cast<size_t>(size_);  // block per rank
    if (n == 0) return {};
    if (memory_of(name_, "all_to_all", in, out) == Memory::kHost)
        return as_typed(t, [&]<class T>(std::type_identity<T>) {
            return host_->all_to_all(std::span<const T>(static_cast<const T*>(in), in_count),
                                     std::span<T>(static_cast<T*>(out), out_count));
        });
    if (family_->aborted) throw CollectiveTimeoutError(family_->abort_message);
    if (shortcut() && in == out) return {};
    MS_CHECK(!overlaps(in, in_count * es, out, out_count * es),
             "{}: the NCCL communicator's all_to_all on device memory is not in place (its send/receive pairs would "
             "overwrite blocks not yet sent); give it separate input and output buffers",
             name_);
    const cudaStream_t stream = stream_for(p);
    if (shortcut()) {
        MS_NCCL_CUDA_CHECK(cudaMemcpyAsync(out, in, in_count * es, cudaMemcpyDefault, stream));
    } else {
        MS_NCCL_CHECK(ncclGroupStart());
        for (int r = 0; r < size_; ++r) {
            const size_t off = static_cast<size_t>(r) * n;
            MS_NCCL_CHECK(ncclSend(at(in, off, es), n * es, ncclUint8, r, comm_, stream));
            MS_NCCL_CHECK(ncclRecv(at(out, off, es), n * es, ncclUint8, r, comm_, stream));
        }
        MS_NCCL_CHECK(ncclGroupEnd());
    }
    ++nccl_calls_;
    return issued(CommOp::kAllToAll, in_count, t);
}

Handle NcclCommunicator::batch_send_recv_impl(std::span<const P2POp> ops, Priority p) {
    bool any = false;
    Memory memory = Memory::kDevice;
    for (const P2POp& op : ops) {
        MS_CHECK(op.peer >= 0 && op.peer < size_, "{}: point-to-point peer {} is outside [0, {})", name_, op.peer,
                 size_);
        MS_CHECK(op.tag >= 0, "{}: point-to-point tag {} is negative", name_, op.tag);
        const bool send = op.kind == P2POp::Kind::kSend;
        count(send ? CommOp::kSend : CommOp::kRecv, send && size_ > 1 ? op.count * dtype_size(op.dtype) : 0);
        if (op.count == 0) continue;
        const Memory m = memory_of(op.data);
        MS_CHECK(!any || m == memory,
                 "{}: a point-to-point batch mixes host and device buffers; the NCCL "
                 "communicator takes all of them on the device (NCCL) or all on the host (MPI)",
                 name_);
        memory = m;
        any = true;
    }
    if (!any) return {};
    if (memory == Memory::kHost) return host_->batch_send_recv(ops, p);
    if (family_->aborted) throw CollectiveTimeoutError(family_->abort_message);
    const cudaStream_t stream = stream_for(p);
    MS_NCCL_CHECK(ncclGroupStart());
    for (const P2POp& op : ops) {
        const size_t bytes = op.count * dtype_size(op.dtype);  // moved as bytes, bit for bit
        if (op.kind == P2POp::Kind::kSend)
            MS_NCCL_CHECK(ncclSend(op.data, bytes, ncclUint8, op.peer, comm_, stream));
        else
            MS_NCCL_CHECK(ncclRecv(op.data, bytes, ncclUint8, op.peer, comm_, stream));
    }
    MS_NCCL_CHECK(ncclGroupEnd());
    ++nccl_calls_;
    const P2POp& first = ops.front();
    const bool mixed = std::any_of(ops.begin(), ops.end(), [&](const P2POp& o) { return o.kind != first.kind; });
    return issued(first.kind == P2POp::Kind::kSend ? CommOp::kSend : CommOp::kRecv, first.count, first.dtype,
                  first.peer, first.tag, static_cast<int>(ops.size()), mixed);
}

void NcclCommunicator::barrier() {
    count(CommOp::kBarrier, 0);
    host_->barrier();
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, std::string name) {
    MS_CHECK(!family_->aborted, "{}: split after a collective timeout", name_);
    // Both splits are collective over this group, in the same order on every rank; same color and key, so the NCCL
    // child's ranks are the MPI child's (checked by the constructor).
    std::unique_ptr<Communicator> host = host_->split(color, key, name);
    ncclComm_t child = nullptr;
    MS_NCCL_CHECK(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, nullptr));
    if (color < 0) {
        MS_CHECK(host == nullptr && child == nullptr, "{}: split without a color made a communicator", name_);
        return nullptr;
    }
    auto* mpi_host = static_cast<MpiCommunicator*>(host.release());  // MpiCommunicator::split makes MpiCommunicators
    return std::unique_ptr<Communicator>(
        new NcclCommunicator(std::unique_ptr<MpiCommunicator>(mpi_host), child, device_, single_rank_, family_));
}

namespace {

int visible_devices() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

std::unique_ptr<Communicator> make_nccl_world(Communicator& world, int device) {
    return NcclCommunicator::create_world(world, device);
}

}  // namespace

void install_nccl_communicator() {
    static std::string version;  // outlives the registration, which keeps a pointer to it
    int v = 0;
    MS_NCCL_CHECK(ncclGetVersion(&v));
    version = fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
    register_nccl_communicator({version.c_str(), visible_devices, make_nccl_world});
}

}  // namespace ms
