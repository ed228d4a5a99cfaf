// link_model_communicator.h: a Communicator decorator that counts every operation into the communication matrix
// (comm/comm_matrix.h) and, with a link model (comm/link_model.h), makes each one take its modelled time, as an
// asynchronous transfer would (docs/communication.md).
//
// An operation issued at time t completes no earlier than t + its modelled time: Handle::wait() blocks until
// max(real completion, t + model), and test() says false until then. A caller that waits right away pays the whole
// modelled time; one that computes meanwhile and waits later hides it (overlap). The data moves at the inner
// communicator's speed as before, so results are bit for bit those of the run without a model: only time changes.
//
// Point-to-point: a send is issued when its batch is, but a receive may be posted long before the matching send (a
// pipeline stage waiting for its input). So with a model every send also sends its issue time (a second message on a
// duplicate of the group, same peer and tag, matched in the same order), and a receive completes no earlier than the
// sender's issue time (the start of its transfer, later under contention: link_model.h) + the model. The clocks of the
// ranks must agree: the link model is for ranks on one machine (steady_clock is the machine's). Ops of one batch travel
// in parallel (each pair's link is its own).
//
// When an operation is complete: under the model, an operation the inner communicator had completed before the wait
// began completes at its modelled time (the model's premise: the machine's own transfer is negligible next to the
// modelled one); otherwise at the moment the wait saw it complete. The counted time (issue to completion) goes to the
// matrix: the group's total, and each pair the operation sends on (comm_matrix.h); and, when the matrix has a listener
// (a timeline: engine/train/trace.h), the operation itself as a CommRecord, with when a wait() on it began.
//
// Stats: the inner communicator's op and byte counters (the stamps travel on their own communicator, uncounted); the
// wait time is this decorator's, so it includes the modelled delay. barrier() is passed through, not modelled. split()
// returns a decorated child, learning its members' world ranks by an all-gather over the child. Handles must complete
// before the communicator is destroyed (their states are pooled here, so a warm step allocates nothing).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/comm_matrix.h"
#include "comm/communicator.h"
#include "comm/link_model.h"
#include "comm/process_groups.h"

namespace ms {

class LinkModelCommunicator final : public Communicator {
  public:
    // members: the world rank of each rank of `inner`, in its order. model: nullptr counts without delaying (not
    // owned, like matrix; both outlive the communicator). With a model, collective over `inner` (the stamps' split).
    LinkModelCommunicator(std::unique_ptr<Communicator> inner, std::vector<int> members, CommMatrix& matrix,
                          const LinkModel* model);
    // The same over a communicator it does not own (world, which the MpiRuntime owns).
    LinkModelCommunicator(Communicator& inner, std::vector<int> members, CommMatrix& matrix, const LinkModel* model);
    ~LinkModelCommunicator() override;

    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    std::string_view name() const override { return inner_->name(); }
    void barrier() override { inner_->barrier(); }
    std::unique_ptr<Communicator> split(int color, int key, std::string name) override;
    Communicator& inner() { return *inner_; }
    const std::vector<int>& members() const { return members_; }

    struct Op;  // one operation in flight (link_model_communicator.cpp)

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
    friend struct Op;
    void init();                              // the constructors' common part
    static constexpr size_t kPooledOps = 64;  // operation states made at construction
    Op& take_op(double issued);
    // Counts a collective of `bytes` (as link_model.h's table counts them) and wraps the inner handle with its delay.
    Handle collective(CommOp kind, double bytes, int root, Priority p, double issued, Handle inner);
    template <class Call>
    Handle forward(Call&& call);  // runs the inner call and mirrors the inner counters' increase

    std::unique_ptr<Communicator> owned_;  // null when inner_ is not owned
    Communicator* inner_;
    std::unique_ptr<Communicator> stamps_;  // with a model: a duplicate of inner_ for the sends' issue times
    std::vector<int> members_;              // world rank of each group rank
    CommMatrix& matrix_;
    const LinkModel* model_;
    int group_;                             // CommMatrix::group_index(name())
    LinkClass ring_class_;                  // of the group's ring
    std::vector<std::unique_ptr<Op>> ops_;  // every state made; the free ones are in free_
    std::vector<Op*> free_;
    std::vector<RingSend> sends_;  // scratch for ring_sends
};

// Decorates world (ProcessGroups::world then points to the decorated world, which the groups own), tp, pp, dp, mp
// and embd, with their members from the Topology. Collective over world when a model is given.
void model_links(ProcessGroups& groups, CommMatrix& matrix, const LinkModel* model);

}  // namespace ms
