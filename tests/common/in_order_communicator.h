// in_order_communicator.h: a Communicator decorator for tests that gives point-to-point traffic NCCL's semantics on
// top of any communicator (MPI in the tests), and checks that every message pairs the operations it should.
//
// NCCL matches the messages from one rank to another in issue order, with no tags, and a send completes only once
// the peer has posted the matching receive. Here, in batch_send_recv:
//   - every message goes with tag 0 (kDataTag), so MPI's non-overtaking rule matches in issue order per pair of ranks;
//   - each receive also sends the peer its own tag (kAckTag, one int32), and each send also receives that int32 from
//     its peer in the same batch: the batch cannot complete before the peer posted the receive (rendezvous), and
//     the send's tag against the receive's says whether the message is the one the receiver asked for. Tags name
//     what a message is (the pipeline's: micro-batch, chunk edge, direction) and must be >= 0.
// Acknowledgements travel under their own tag, so their order per pair is the order of the data they answer.
// Every collective passes through. A mismatch is counted (mismatches()), not fatal, so a test can assert it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/typed_dispatch.h"

namespace ms::test {

class InOrderCommunicator final : public Communicator {
  public:
    static constexpr int kDataTag = 0;
    static constexpr int kAckTag = 1;

    explicit InOrderCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    std::string_view name() const override { return inner_->name(); }
    void barrier() override { inner_->barrier(); }
    std::unique_ptr<Communicator> split(int color, int key, std::string name) override {
        std::unique_ptr<Communicator> child = inner_->split(color, key, std::move(name));
        return child ? std::make_unique<InOrderCommunicator>(std::move(child)) : nullptr;
    }
    int64_t messages() const { return *messages_; }      // sends checked against their receive's tag
    int64_t mismatches() const { return *mismatches_; }  // of those, sent as another message than received

  protected:
    Handle batch_send_recv_impl(std::span<const P2POp> ops, Priority p) override {
        auto state = std::make_unique<Batch>();
        state->acks.resize(ops.size());
        state->ops.reserve(2 * ops.size());
        for (size_t i = 0; i < ops.size(); ++i) {
            const P2POp& op = ops[i];
            P2POp data = op;
            data.tag = kDataTag;
            state->ops.push_back(data);
            int32_t& ack = state->acks[i];
            if (op.kind == P2POp::Kind::kRecv) {
                ack = op.tag;
                state->ops.push_back(P2POp::send(std::span<const int32_t>(&ack, 1), op.peer, kAckTag));
            } else {
                ack = -1;
                state->expected.push_back({&ack, op.tag});
                state->ops.push_back(P2POp::recv(std::span<int32_t>(&ack, 1), op.peer, kAckTag));
            }
        }
        state->messages = messages_;
        state->mismatches = mismatches_;
        Batch& b = *state;
        b.inner = count_through(*inner_, [&] { return inner_->batch_send_recv(b.ops, p); });
        return Handle(std::unique_ptr<Handle::State>(std::move(state)));
    }
    Handle all_reduce_impl(void* buf, size_t count, DType t, ReduceOp op, Priority p) override {
        return with_comm_type(t, [&]<typename T>(T*) {
            return count_through(*inner_,
                                 [&] { return inner_->all_reduce(std::span(static_cast<T*>(buf), count), op, p); });
        });
    }
    Handle reduce_scatter_impl(const void* in, void* out, size_t out_count, size_t in_count, DType t, ReduceOp op,
                               Priority p) override {
        return with_comm_type(t, [&]<typename T>(T*) {
            return count_through(*inner_, [&] {
                return inner_->reduce_scatter(std::span(static_cast<const T*>(in), in_count),
                                              std::span(static_cast<T*>(out), out_count), op, p);
            });
        });
    }
    Handle all_gather_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t, Priority p) override {
        return with_comm_type(t, [&]<typename T>(T*) {
            return count_through(*inner_, [&] {
                return inner_->all_gather(std::span(static_cast<const T*>(in), in_count),
                                          std::span(static_cast<T*>(out), out_count), p);
            });
        });
    }
    Handle broadcast_impl(void* buf, size_t count, DType t, int root, Priority p) override {
        return with_comm_type(t, [&]<typename T>(T*) {
            return count_through(*inner_,
                                 [&] { return inner_->broadcast(std::span(static_cast<T*>(buf), count), root, p); });
        });
    }
    Handle all_to_all_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t, Priority p) override {
        return with_comm_type(t, [&]<typename T>(T*) {
            return count_through(*inner_, [&] {
                return inner_->all_to_all(std::span(static_cast<const T*>(in), in_count),
                                          std::span(static_cast<T*>(out), out_count), p);
            });
        });
    }

  private:
    struct Batch final : Handle::State {
        std::vector<P2POp> ops;     // the data with kDataTag and the acknowledgements
        std::vector<int32_t> acks;  // (ops) per original op: the tag it sent or received
        struct Expect {
            const int32_t* got;
            int tag;
        };
        std::vector<Expect> expected;  // per send: the peer's receive tag, and the send's own
        Handle inner;
        std::shared_ptr<int64_t> messages, mismatches;
        void check() {
            for (const Expect& e : expected) {
                ++*messages;
                *mismatches += *e.got != e.tag;
            }
            expected.clear();
        }
        void wait() override {
            inner.wait();
            check();
        }
        bool test() override {
            if (!inner.test()) return false;
            check();
            return true;
        }
    };

    std::unique_ptr<Communicator> inner_;
    std::shared_ptr<int64_t> messages_ = std::make_shared<int64_t>(0);
    std::shared_ptr<int64_t> mismatches_ = std::make_shared<int64_t>(0);
};

}  // namespace ms::test
