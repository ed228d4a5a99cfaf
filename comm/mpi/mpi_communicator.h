// mpi_communicator.h: the Communicator over an MPI communicator, on host buffers (docs/design.md §4).
//
// Every call posts non-blocking MPI operations (MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather,
// MPI_Ibcast, MPI_Ireduce, MPI_Ialltoall, MPI_Isend/MPI_Irecv) and returns a Handle that completes them with
// MPI_Waitall / MPI_Testall. Contracts beyond communicator.h:
//
// - Chunking: no single MPI call touches more than chunk_elems() elements of any one buffer (at least one element
//   per rank). all_reduce, reduce and broadcast cut the buffer into contiguous pieces; all_gather, reduce_scatter
//   and all_to_all cut every per-rank block at the same offsets (block length <= chunk_elems / size), so a piece is a
//   strided view (a resized datatype). reduce_scatter, when a block exceeds chunk_elems / size or the output is
//   this rank's own block of the input (in place), becomes one MPI_Ireduce per destination rank and contiguous
//   piece (<= chunk_elems) instead: no staging copy and no buffer of its own. All pieces are posted at call time
//   so the order of MPI calls on the group is the same on every rank. Point-to-point messages are cut the same
//   way, so a recv's count must equal the matching send's count.
// - No call allocates memory proportional to its buffers: the communicator holds no buffers (issue #6: every
//   byte of a step comes from the arena).
// - kAvg: MPI_SUM, then the result (reduce: on the root) is divided by size() when the handle completes. fp32
//   divides exactly for power-of-two sizes; int32 uses C++ integer division (truncation toward zero).
// - Reductions take fp32 and int32 only. 16-bit types may be moved (gather, broadcast, all-to-all, p2p) as bits.
// - Size-1 groups never call MPI for a collective: all_reduce, reduce, broadcast and barrier do nothing,
//   reduce_scatter, all_gather and all_to_all copy in to out. Point-to-point with oneself still goes through MPI.
// - split(color < 0, ...) returns nullptr: this rank joins no group (MPI_UNDEFINED). Children inherit
//   chunk_elems() and the error handler.
// - Priority is accepted and ignored (MPI has no priorities).
// - A Handle must complete before its communicator is destroyed.
// - Waits (Handle::wait, barrier) poll MPI_Testall through the CollectiveWatch: bounded by its timeout, never
//   blocked inside MPI, and every posted operation is kept in this communicator's flight recorder. split() itself
//   (MPI_Comm_split) is blocking and unbounded: it runs at start-up only.
//
// Stats (CommStats, "bytes this rank sends"): per call, ops += 1 and bytes +=
//   all_reduce     count * elemsize          reduce_scatter  in_count * elemsize
//   all_gather     in_count * elemsize       all_to_all      in_count * elemsize
//   broadcast      count * elemsize on the root, 0 elsewhere   reduce  count * elemsize (every rank's input)
//   send           count * elemsize per send (kSend); recv: 0 bytes per recv (kRecv)   barrier: 0 bytes
// A size-1 group sends nothing, so there its calls count ops with 0 bytes.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace ms {

class CollectiveWatch;
class FlightRecorder;
class MpiOpStatePool;

class MpiCommunicator final : public Communicator {
  public:
    // 16M elements (64 MiB of fp32) per MPI call: far below the int count limit and MPI's internal buffers.
    static constexpr size_t kDefaultChunkElems = size_t{1} << 24;
    // Operation states made at construction (reused after; more only when more are in flight at once).
    static constexpr size_t kPooledStates = 32;

    // Takes ownership of `comm` (MPI_Comm_free on destruction unless it is MPI_COMM_WORLD). `watch` bounds and
    // records every wait (comm/mpi/collective_watch.h); split() children share it. Without one the communicator
    // gets its own, with no timeout and no dumps.
    MpiCommunicator(MPI_Comm comm, std::string name, size_t chunk_elems = kDefaultChunkElems,
                    std::shared_ptr<CollectiveWatch> watch = nullptr);
    ~MpiCommunicator() override;
    MpiCommunicator(const MpiCommunicator&) = delete;
    MpiCommunicator& operator=(const MpiCommunicator&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string_view name() const override { return name_; }

    Handle batch_send_recv_impl(std::span<const P2POp> ops, Priority p) override;
    void barrier() override;
    std::unique_ptr<Communicator> split(int color, int key, std::string name) override;

    MPI_Comm comm() const { return comm_; }
    size_t chunk_elems() const { return chunk_elems_; }
    void set_chunk_elems(size_t n);                   // 1 .. INT_MAX; tests use tiny chunks
    int64_t mpi_calls() const { return mpi_calls_; }  // MPI operations posted so far, each chunk counted
    CollectiveWatch& watch() { return *watch_; }
    const FlightRecorder& flight_recorder() const { return *recorder_; }

  protected:
    Handle all_reduce_impl(void* buf, size_t count, DType t, ReduceOp op, Priority p) override;
    Handle reduce_scatter_impl(const void* in, void* out, size_t out_count, size_t in_count, DType t, ReduceOp op,
                               Priority p) override;
    Handle all_gather_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t, Priority p) override;
    Handle broadcast_impl(void* buf, size_t count, DType t, int root, Priority p) override;
    Handle reduce_impl(void* buf, size_t count, DType t, int root, ReduceOp op, Priority p) override;
    Handle all_to_all_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t, Priority p) override;

  private:
    size_t block_chunk() const;  // elements per rank block per MPI call for the block-wise collectives

    MPI_Comm comm_;
    std::string name_;
    int rank_ = 0;
    int size_ = 1;
    size_t chunk_elems_;
    int64_t mpi_calls_ = 0;
    std::shared_ptr<CollectiveWatch> watch_;
    std::unique_ptr<FlightRecorder> recorder_;  // this communicator's last operations (comm/flight_recorder.h)
    std::shared_ptr<MpiOpStatePool> states_;    // completed operation states, reused (mpi_communicator.cpp)
};

}  // namespace ms
