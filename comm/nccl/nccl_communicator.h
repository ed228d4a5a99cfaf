// nccl_communicator.h: the Communicator over an NCCL communicator, on device memory (docs/design.md §4).
//
// Bootstrap through MPI: every NcclCommunicator has an MpiCommunicator over the same ranks in the same order (its
// host communicator). The first one (create_world) gets its NCCL communicator from rank 0's ncclGetUniqueId,
// MPI_Bcast over that MPI communicator and ncclCommInitRank; split() makes both children with the same color and
// key (MPI_Comm_split, ncclCommSplit), so a group's NCCL rank is its MPI rank (checked).
//
// Contracts beyond communicator.h:
// - Which buffers: device and managed memory (cudaPointerGetAttributes) go through NCCL; plain host memory goes
//   through the host communicator (the trainer's host-side scalars: the loss, the grad-norm partials), with that
//   communicator's semantics (mpi_communicator.h: reductions on fp32 and int32 only). A call whose buffers mix the
//   two kinds is a programming error. The two paths are each issued in program order on every rank, and NCCL calls
//   never block the host, so mixing them across calls cannot deadlock.
// - Streams: each communicator owns two non-blocking streams on its device, created with it: critical operations
//   (Priority::kHigh and kNormal: tensor- and sequence-parallel collectives, pipeline send/recv) go on one with the
//   device's greatest stream priority, background ones (kLow: data-parallel buckets, ZeRO gathers) on one with its
//   least, so the GPU schedules a critical NCCL kernel's blocks ahead of background kernels and of compute (whose
//   stream has the default, least priority). A call that changes stream first makes the new stream wait for an event
//   recorded behind the other one, so the communicator's operations still run in issue order (NCCL needs the same
//   order on every rank); priority orders operations of different communicators. Every NCCL call records a pooled
//   event behind it. Nothing orders it after the compute stream: the
//   caller finishes the work that writes or reads the buffers first (the trainer wraps every group in a
//   SynchronizingCommunicator, which synchronizes the CUDA backend's stream before each collective), and
//   Handle::wait() returns once the event has completed, so the host -- and any kernel launched after -- sees the
//   result. test() queries the event.
// - dtypes: reductions on fp32, int32, bf16 (ncclBfloat16) and fp16 (ncclFloat16), summed in that type by NCCL;
//   kAvg is ncclAvg (int32: NCCL's integer division). uint16 moves as bytes (gather, broadcast, all-to-all, p2p).
// - Sizes: no chunking (NCCL counts are size_t). In place: all_reduce, reduce and broadcast always; reduce_scatter
//   when the output is this rank's block of the input; all_gather when the input is this rank's block of the output;
//   all_to_all never (it is grouped send/recv pairs, which would overwrite blocks not yet sent).
// - Point-to-point: ncclSend / ncclRecv inside one ncclGroupStart/End per batch. NCCL has no tags: messages between
//   two ranks match in issue order, whatever their tags, and a send may not complete before its receive is posted
//   (so a rank that posts a send and then waits on a receive from the same peer needs the peer to do the same in
//   one batch). The pipeline batches its sends and receives that way (engine/parallel/schedule.h).
// - Size-1 groups: with SingleRank::kShortcut (the default) all_reduce, reduce, broadcast and barrier do nothing and
//   reduce_scatter, all_gather, all_to_all copy in to out on the communicator's stream (cudaMemcpyAsync), as the
//   MPI communicator does on the host. kCallNccl sends them through NCCL anyway (tests/gpu/test_nccl.cpp, so a
//   one-GPU machine exercises every NCCL call).
// - split(color < 0, ...) returns nullptr (NCCL_SPLIT_NOCOLOR). barrier() is the host communicator's.
// - No allocation per call in steady state (memory/alloc_guard.h): handle states and their events are pooled, as
//   in the MPI communicator; NCCL's own host allocations are C mallocs, which the guard does not count.
// - Errors: every NCCL call through MS_NCCL_CHECK (the call, ncclGetErrorString, ncclGetLastError, file:line),
//   CUDA calls through MS_NCCL_CUDA_CHECK; both end the job through ms::fatal (MPI_Abort).
// - Waits poll cudaEventQuery and ncclCommGetAsyncError: an asynchronous NCCL error is fatal (as above). With
//   reliability.collective_timeout_s = t > 0 (the host communicator's CollectiveWatch options), a wait that is not
//   complete after t seconds marks the operation timed_out in this communicator's flight recorder (registered with
//   the watch, so every dump lists the NCCL groups too, as "<name>/nccl"), dumps every recorder, calls the watch's
//   on_fault(18, message), aborts this process's NCCL communicators (ncclCommAbort) and throws
//   CollectiveTimeoutError; every later NCCL wait throws it again at once, as does a wait after the MPI watch
//   aborted. Gap against the MPI waits: the MPI watch's notice channel is private to it, so an NCCL timeout does
//   not tell the other ranks (each one reaches its own deadline), notices from others end MPI waits only, and
//   MpiRuntime still calls MPI_Finalize after an NCCL-only timeout. A stop signal during an NCCL wait does not dump.
// - A Handle must complete before its communicator is destroyed. The destructor destroys the NCCL communicator
//   (ncclCommAbort after a timeout: peers may be gone).
//
// Stats (CommStats): as the MPI communicator's table (mpi_communicator.h), whichever path a call takes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/flight_recorder.h"

struct ncclComm;     // ncclComm_t is ncclComm* (nccl.h)
struct CUstream_st;  // cudaStream_t
struct CUevent_st;   // cudaEvent_t

namespace ms {

class MpiCommunicator;
class NcclOpStatePool;
struct NcclFamily;

class NcclCommunicator final : public Communicator {
  public:
    enum class SingleRank : uint8_t { kShortcut, kCallNccl };

    // The NCCL communicator over the ranks of `world` (an MpiCommunicator), on CUDA device `device`, which it makes
    // current. Collective over world: duplicates its MPI communicator for the host path and bootstraps NCCL on it.
    static std::unique_ptr<NcclCommunicator> create_world(Communicator& world, int device,
                                                          SingleRank single_rank = SingleRank::kShortcut);
    ~NcclCommunicator() override;
    NcclCommunicator(const NcclCommunicator&) = delete;
    NcclCommunicator& operator=(const NcclCommunicator&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string_view name() const override { return name_; }
    void barrier() override;
    std::unique_ptr<Communicator> split(int color, int key, std::string name) override;

    int device() const { return device_; }
    MpiCommunicator& host() { return *host_; }
    const FlightRecorder& flight_recorder() const { return recorder_; }
    int64_t nccl_calls() const { return nccl_calls_; }  // NCCL operations (and size-1 copies) issued so far

    // For this communicator's handles: completes `event` of operation `seq` (bounded, see the top of this file).
    void wait_event(CUevent_st* event, uint64_t seq);
    bool test_event(CUevent_st* event, uint64_t seq);

  protected:
    Handle batch_send_recv_impl(std::span<const P2POp> ops, Priority p) override;
    Handle all_reduce_impl(void* buf, size_t count, DType t, ReduceOp op, Priority p) override;
    Handle reduce_scatter_impl(const void* in, void* out, size_t out_count, size_t in_count, DType t, ReduceOp op,
                               Priority p) override;
    Handle all_gather_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t, Priority p) override;
    Handle broadcast_impl(void* buf, size_t count, DType t, int root, Priority p) override;
    Handle reduce_impl(void* buf, size_t count, DType t, int root, ReduceOp op, Priority p) override;
    Handle all_to_all_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t, Priority p) override;

  private:
    NcclCommunicator(std::unique_ptr<MpiCommunicator> host, ncclComm* comm, int device, SingleRank single_rank,
                     std::shared_ptr<NcclFamily> family);
    // Records an event behind the work just issued and returns the handle that waits for it.
    Handle issued(CommOp op, size_t count, DType t, int peer = -1, int tag = -1, int messages = 0,
                  bool mixed_p2p = false);
    bool shortcut() const { return size_ == 1 && single_rank_ == SingleRank::kShortcut; }
    // The stream an operation of priority p is issued on, ordered after everything issued before (see the top).
    CUstream_st* stream_for(Priority p);
    [[noreturn]] void timed_out(uint64_t seq, double waited_s, double timeout_s);

    std::unique_ptr<MpiCommunicator> host_;  // same ranks, same order: bootstrap, host buffers, barrier
    ncclComm* comm_ = nullptr;
    std::string name_;
    int rank_ = 0;
    int size_ = 1;
    int device_ = 0;
    SingleRank single_rank_;
    // owned: [0] critical operations, the device's greatest stream priority; [1] background ones, its least
    std::array<CUstream_st*, 2> streams_{};
    size_t last_stream_ = 0;             // the stream of the last operation issued
    CUevent_st* order_event_ = nullptr;  // owned: recorded behind one stream for the other to wait on
    int64_t nccl_calls_ = 0;
    FlightRecorder recorder_;                  // "<name>/nccl", registered with the host communicator's watch
    std::shared_ptr<NcclFamily> family_;       // shared with every communicator split from the same world
    std::shared_ptr<NcclOpStatePool> states_;  // completed operation states, reused
};

// Registers NcclCommunicator::create_world with make_process_groups (comm/nccl/comm_choice.h). Call it once at the
// top of main(), before any other thread exists.
void install_nccl_communicator();

}  // namespace ms
