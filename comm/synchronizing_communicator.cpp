// synchronizing_communicator.cpp: see synchronizing_communicator.h.
#include "comm/synchronizing_communicator.h"

#include <cstdint>
#include <type_traits>
#include <utility>

#include "comm/typed_dispatch.h"
#include "engine/core/check.h"
#include "engine/core/half.h"

namespace ms {

SynchronizingCommunicator::SynchronizingCommunicator(std::unique_ptr<Communicator> inner,
                                                     std::function<void()> synchronize)
    : inner_(std::move(inner)), synchronize_(std::move(synchronize)) {
    MS_CHECK(inner_ != nullptr && synchronize_, "SynchronizingCommunicator needs a communicator and a function");
}

std::unique_ptr<Communicator> SynchronizingCommunicator::split(int color, int key, std::string name) {
    std::unique_ptr<Communicator> child = inner_->split(color, key, std::move(name));
    if (!child) return nullptr;
    return std::make_unique<SynchronizingCommunicator>(std::move(child), synchronize_);
}

void SynchronizingCommunicator::synchronize_if(bool touches_memory) {
    sync_seconds_ = 0;
    if (!touches_memory) return;
    const double t0 = now_seconds();
    synchronize_();
    sync_seconds_ = now_seconds() - t0;
}

template <class Call>
Handle SynchronizingCommunicator::forward(Call&& call) {
    Handle h = count_through(*inner_, std::forward<Call>(call));
    // Communicator::timed() adds this call's whole duration once it returns: take the synchronization out.
    mutable_stats().wait_seconds -= sync_seconds_;
    return h;
}

Handle SynchronizingCommunicator::batch_send_recv_impl(std::span<const P2POp> ops, Priority p) {
    synchronize_if(!ops.empty());
    return forward([&] { return inner_->batch_send_recv(ops, p); });
}

Handle SynchronizingCommunicator::all_reduce_impl(void* buf, size_t count, DType t, ReduceOp op, Priority p) {
    synchronize_if(size() > 1);
    return with_comm_type(t, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        return forward([&] { return inner_->all_reduce(std::span<T>(static_cast<T*>(buf), count), op, p); });
    });
}

Handle SynchronizingCommunicator::reduce_scatter_impl(const void* in, void* out, size_t out_count, size_t in_count,
                                                      DType t, ReduceOp op, Priority p) {
    synchronize_if(true);
    return with_comm_type(t, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        return forward([&] {
            return inner_->reduce_scatter(std::span<const T>(static_cast<const T*>(in), in_count),
                                          std::span<T>(static_cast<T*>(out), out_count), op, p);
        });
    });
}

Handle SynchronizingCommunicator::all_gather_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t,
                                                  Priority p) {
    synchronize_if(true);
    return with_comm_type(t, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        return forward([&] {
            return inner_->all_gather(std::span<const T>(static_cast<const T*>(in), in_count),
                                      std::span<T>(static_cast<T*>(out), out_count), p);
        });
    });
}

Handle SynchronizingCommunicator::broadcast_impl(void* buf, size_t count, DType t, int root, Priority p) {
    synchronize_if(size() > 1);
    return with_comm_type(t, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        return forward([&] { return inner_->broadcast(std::span<T>(static_cast<T*>(buf), count), root, p); });
    });
}

Handle SynchronizingCommunicator::reduce_impl(void* buf, size_t count, DType t, int root, ReduceOp op, Priority p) {
    synchronize_if(size() > 1);
    return with_comm_type(t, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        return forward([&] { return inner_->reduce(std::span<T>(static_cast<T*>(buf), count), root, op, p); });
    });
}

Handle SynchronizingCommunicator::all_to_all_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t,
                                                  Priority p) {
    synchronize_if(true);
    return with_comm_type(t, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        return forward([&] {
            return inner_->all_to_all(std::span<const T>(static_cast<const T*>(in), in_count),
                                      std::span<T>(static_cast<T*>(out), out_count), p);
        });
    });
}

void synchronize_before_collectives(ProcessGroups& groups, const std::function<void()>& synchronize) {
    for (std::unique_ptr<Communicator>* g : groups.groups()) {
        if (*g) *g = std::make_unique<SynchronizingCommunicator>(std::move(*g), synchronize);
    }
}

}  // namespace ms
