// synchronizing_communicator.h: a Communicator decorator that completes an asynchronous backend's queued work
// before a collective touches memory.
//
// With an asynchronous backend (Backend::asynchronous(): CudaBackend launches kernels on a stream and returns),
// the MPI communicator reads and writes buffers from the host (CUDA managed memory) while kernels may still be
// writing them or reading their old contents. So before each collective that touches memory, the decorator calls
// the given synchronize function (the backend's). Host writes made before a kernel launch are visible to that
// kernel, so nothing is needed after a collective completes. The trainer wraps every group of its ProcessGroups
// (synchronize_before_collectives) only when the backend is asynchronous: the CPU path is unchanged.
//
// When it synchronizes:
//   all_reduce, broadcast                    when size() > 1 (a group of one touches no memory: communicator.h)
//   reduce_scatter, all_gather, all_to_all   always (a group of one copies in to out on the host)
//   batch_send_recv                          when it has ops
//   barrier                                  never (no data)
// split() returns a decorated child (nullptr stays nullptr). Stats: the inner communicator's op and byte counters;
// the wait time excludes the synchronization, which is the host waiting for compute, not for communication.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/process_groups.h"

namespace ms {

class SynchronizingCommunicator final : public Communicator {
  public:
    SynchronizingCommunicator(std::unique_ptr<Communicator> inner, std::function<void()> synchronize);

    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    std::string_view name() const override { return inner_->name(); }
    void barrier() override { inner_->barrier(); }
    std::unique_ptr<Communicator> split(int color, int key, std::string name) override;
    Communicator& inner() { return *inner_; }

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
    void synchronize_if(bool touches_memory);
    // Runs the inner call, then mirrors the inner counters' increase into this communicator's.
    template <class Call>
    Handle forward(Call&& call);

    std::unique_ptr<Communicator> inner_;
    std::function<void()> synchronize_;
    double sync_seconds_ = 0;  // of the current call, subtracted from the wait time
};

// Wraps tp, pp, dp, mp and embd (world is not owned and stays as it is) so that each synchronizes first.
void synchronize_before_collectives(ProcessGroups& groups, const std::function<void()>& synchronize);

}  // namespace ms
