// link_model_communicator.cpp: see link_model_communicator.h.
#include "comm/link_model_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <thread>
#include <type_traits>
#include <utility>

#include "comm/typed_dispatch.h"
#include "engine/core/check.h"
#include "engine/core/half.h"

namespace ms {
namespace {

void sleep_until(double deadline) {
    const double left = deadline - now_seconds();
    if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
}

// An issue time travels as the two int32 words of a double (point-to-point moves bits).
constexpr size_t kStampWords = sizeof(double) / sizeof(int32_t);

}  // namespace

// One operation in flight: the inner handle, its modelled deadline and what the matrix gets when it completes.
struct LinkModelCommunicator::Op final : Handle::State {
    LinkModelCommunicator* owner = nullptr;
    Handle inner, stamps;
    double issued = 0, deadline = 0;
    std::vector<double> send_stamp;    // per send: when its transfer starts, which it carries to the receiver
    std::vector<double> recv_stamp;    // per receive: its sender's issue time (filled by `stamps`)
    std::vector<double> recv_seconds;  // per receive: its modelled transfer time
    std::vector<P2POp> stamp_ops;
    std::vector<int> dsts;  // world ranks this operation sends to
    CommRecord record;      // what a CommListener gets (comm_matrix.h)

    // The deadline once the receives' stamps have arrived.
    double modelled_deadline() const {
        double d = deadline;
        for (size_t i = 0; i < recv_stamp.size(); ++i) d = std::max(d, recv_stamp[i] + recv_seconds[i]);
        return d;
    }
    void finish(double completion) {
        const double seconds = completion - issued;
        CommMatrix& m = owner->matrix_;
        m.add_op_seconds(owner->group_, seconds);
        for (int dst : dsts) m.add_send_seconds(owner->group_, dst, seconds);
        if (CommListener* l = m.listener()) {
            record.issued = issued;
            record.completed = completion;
            l->operation(record);
        }
    }
    void wait() override {
        record.wait_began = now_seconds();
        const bool modelled = owner->model_ != nullptr;
        const bool was_complete = modelled && inner.test() && stamps.test();
        inner.wait();
        stamps.wait();
        const double real = now_seconds();
        if (!modelled) return finish(real);
        const double d = modelled_deadline();
        sleep_until(d);
        finish(was_complete ? d : std::max(real, d));
    }
    bool test() override {
        if (!inner.test() || !stamps.test()) return false;
        const double now = now_seconds();
        if (owner->model_ == nullptr) {
            finish(now);
            return true;
        }
        const double d = modelled_deadline();
        if (now < d) return false;
        finish(d);
        return true;
    }
    void recycle() override { owner->free_.push_back(this); }
};

LinkModelCommunicator::LinkModelCommunicator(std::unique_ptr<Communicator> inner, std::vector<int> members,
                                             CommMatrix& matrix, const LinkModel* model)
    : owned_(std::move(inner)), inner_(owned_.get()), members_(std::move(members)), matrix_(matrix), model_(model) {
    init();
}

LinkModelCommunicator::LinkModelCommunicator(Communicator& inner, std::vector<int> members, CommMatrix& matrix,
                                             const LinkModel* model)
    : inner_(&inner), members_(std::move(members)), matrix_(matrix), model_(model) {
    init();
}

LinkModelCommunicator::~LinkModelCommunicator() = default;

void LinkModelCommunicator::init() {
    MS_CHECK(inner_ != nullptr && static_cast<int>(members_.size()) == inner_->size(),
             "the {} group has {} ranks but {} members were given", inner_ ? inner_->name() : "?",
             inner_ ? inner_->size() : 0, members_.size());
    group_ = CommMatrix::group_index(inner_->name());
    ring_class_ = ring_class(matrix_.nodes(), members_);
    if (model_ != nullptr) stamps_ = inner_->split(0, inner_->rank(), std::string(inner_->name()) + ".stamps");
    // The states made up front, with room in their lists, so that a step allocates nothing when more operations are
    // in flight at once than in any step before (overlapped buckets: the count depends on timing; alloc_guard.h).
    const size_t room = static_cast<size_t>(inner_->size());
    for (size_t i = 0; i < kPooledOps; ++i) {
        auto op = std::make_unique<Op>();
        op->dsts.reserve(room);
        op->send_stamp.reserve(2);
        op->recv_stamp.reserve(2);
        op->recv_seconds.reserve(2);
        op->stamp_ops.reserve(4);
        free_.push_back(op.get());
        ops_.push_back(std::move(op));
    }
    sends_.reserve(room);
}

std::unique_ptr<Communicator> LinkModelCommunicator::split(int color, int key, std::string name) {
    std::unique_ptr<Communicator> child = inner_->split(color, key, std::move(name));
    if (!child) return nullptr;
    const int32_t me = members_[static_cast<size_t>(rank())];
    std::vector<int32_t> all(static_cast<size_t>(child->size()));
    child->all_gather(std::span<const int32_t>(&me, 1), std::span<int32_t>(all)).wait();
    return std::make_unique<LinkModelCommunicator>(std::move(child), std::vector<int>(all.begin(), all.end()), matrix_,
                                                   model_);
}

LinkModelCommunicator::Op& LinkModelCommunicator::take_op(double issued) {
    if (free_.empty()) {
        ops_.push_back(std::make_unique<Op>());
        free_.push_back(ops_.back().get());
    }
    Op& op = *free_.back();
    free_.pop_back();
    op.owner = this;
    op.issued = op.deadline = issued;
    op.send_stamp.clear();
    op.recv_stamp.clear();
    op.recv_seconds.clear();
    op.stamp_ops.clear();
    op.dsts.clear();
    op.record = {.group = name()};
    return op;
}

template <class Call>
Handle LinkModelCommunicator::forward(Call&& call) {
    return count_through(*inner_, std::forward<Call>(call));
}

Handle LinkModelCommunicator::collective(CommOp kind, double bytes, int root, Priority p, double issued, Handle inner) {
    Op& op = take_op(issued);
    op.inner = std::move(inner);
    op.record.op = kind;
    op.record.priority = p;
    op.record.bytes = static_cast<int64_t>(bytes);
    sends_.clear();
    ring_sends(kind, static_cast<int64_t>(bytes), size(), rank(), root, sends_);
    for (const RingSend& s : sends_) {
        const int dst = members_[static_cast<size_t>(s.to)];
        matrix_.add_send(group_, dst, s.bytes);
        op.dsts.push_back(dst);
    }
    if (model_ != nullptr)
        op.deadline =
            model_->end_of(ring_class_, issued, collective_seconds(*model_, kind, bytes, size(), ring_class_));
    return Handle(Handle::StatePtr(&op));
}

Handle LinkModelCommunicator::batch_send_recv_impl(std::span<const P2POp> ops, Priority p) {
    const double issued = now_seconds();
    Handle h = forward([&] { return inner_->batch_send_recv(ops, p); });
    Op& op = take_op(issued);
    op.inner = std::move(h);
    const int me = members_[static_cast<size_t>(rank())];
    size_t recvs = 0;
    for (const P2POp& o : ops) {
        recvs += o.kind == P2POp::Kind::kRecv;
        op.record.bytes += static_cast<int64_t>(o.count * dtype_size(o.dtype));
    }
    op.record.op = recvs == ops.size() ? CommOp::kRecv : CommOp::kSend;
    op.record.mixed_p2p = recvs > 0 && recvs < ops.size();
    op.record.priority = p;
    op.recv_stamp.assign(recvs, 0.0);  // sized before any pointer into them is posted
    op.send_stamp.assign(ops.size() - recvs, 0.0);
    for (const P2POp& o : ops) {
        const int peer = members_[static_cast<size_t>(o.peer)];
        const double bytes = static_cast<double>(o.count * dtype_size(o.dtype));
        const double seconds = model_ ? model_->of(pair_class(matrix_.nodes(), me, peer)).seconds(bytes) : 0.0;
        if (o.kind == P2POp::Kind::kSend) {
            matrix_.add_send(group_, peer, static_cast<int64_t>(bytes));
            op.dsts.push_back(peer);
            // the stamp is when the transfer starts: its link may be busy (contention)
            const double end = model_ ? model_->end_of(pair_class(matrix_.nodes(), me, peer), issued, seconds) : issued;
            op.deadline = std::max(op.deadline, end);
            double* stamp = &op.send_stamp[op.dsts.size() - 1];
            *stamp = end - seconds;
            op.stamp_ops.push_back({P2POp::Kind::kSend, o.peer, stamp, kStampWords, DType::kI32, o.tag});
        } else {
            double* stamp = &op.recv_stamp[op.recv_seconds.size()];
            op.recv_seconds.push_back(seconds);
            op.stamp_ops.push_back({P2POp::Kind::kRecv, o.peer, stamp, kStampWords, DType::kI32, o.tag});
        }
    }
    if (model_ != nullptr && !op.stamp_ops.empty()) {
        op.stamps = stamps_->batch_send_recv(std::span<const P2POp>(op.stamp_ops), p);
    } else {
        op.recv_stamp.clear();  // no model: nothing to wait for
        op.recv_seconds.clear();
    }
    return Handle(Handle::StatePtr(&op));
}

Handle LinkModelCommunicator::all_reduce_impl(void* buf, size_t count, DType t, ReduceOp op, Priority p) {
    const double issued = now_seconds();
    Handle h = with_comm_type(t, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        return forward([&] { return inner_->all_reduce(std::span<T>(static_cast<T*>(buf), count), op, p); });
    });
    return collective(CommOp::kAllReduce, static_cast<double>(count * dtype_size(t)), 0, p, issued, std::move(h));
}

Handle LinkModelCommunicator::reduce_scatter_impl(const void* in, void* out, size_t out_count, size_t in_count, DType t,
                                                  ReduceOp op, Priority p) {
    const double issued = now_seconds();
    Handle h = with_comm_type(t, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        return forward([&] {
            return inner_->reduce_scatter(std::span<const T>(static_cast<const T*>(in), in_count),
                                          std::span<T>(static_cast<T*>(out), out_count), op, p);
        });
    });
    return collective(CommOp::kReduceScatter, static_cast<double>(in_count * dtype_size(t)), 0, p, issued,
                      std::move(h));
}

Handle LinkModelCommunicator::all_gather_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t,
                                              Priority p) {
    const double issued = now_seconds();
    Handle h = with_comm_type(t, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        return forward([&] {
            return inner_->all_gather(std::span<const T>(static_cast<const T*>(in), in_count),
                                      std::span<T>(static_cast<T*>(out), out_count), p);
        });
    });
    return collective(CommOp::kAllGather, static_cast<double>(out_count * dtype_size(t)), 0, p, issued, std::move(h));
}

Handle LinkModelCommunicator::broadcast_impl(void* buf, size_t count, DType t, int root, Priority p) {
    const double issued = now_seconds();
    Handle h = with_comm_type(t, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        return forward([&] { return inner_->broadcast(std::span<T>(static_cast<T*>(buf), count), root, p); });
    });
    return collective(CommOp::kBroadcast, static_cast<double>(count * dtype_size(t)), root, p, issued, std::move(h));
}

Handle LinkModelCommunicator::reduce_impl(void* buf, size_t count, DType t, int root, ReduceOp op, Priority p) {
    const double issued = now_seconds();
    Handle h = with_comm_type(t, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        return forward([&] { return inner_->reduce(std::span<T>(static_cast<T*>(buf), count), root, op, p); });
    });
    return collective(CommOp::kReduce, static_cast<double>(count * dtype_size(t)), root, p, issued, std::move(h));
}

Handle LinkModelCommunicator::all_to_all_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t,
                                              Priority p) {
    const double issued = now_seconds();
    Handle h = with_comm_type(t, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        return forward([&] {
            return inner_->all_to_all(std::span<const T>(static_cast<const T*>(in), in_count),
                                      std::span<T>(static_cast<T*>(out), out_count), p);
        });
    });
    return collective(CommOp::kAllToAll, static_cast<double>(in_count * dtype_size(t)), 0, p, issued, std::move(h));
}

void model_links(ProcessGroups& groups, CommMatrix& matrix, const LinkModel* model) {
    const Topology& t = groups.topology;
    const int rank = groups.world->rank();
    std::vector<int> everyone(static_cast<size_t>(groups.world->size()));
    std::iota(everyone.begin(), everyone.end(), 0);
    groups.own_world = std::make_unique<LinkModelCommunicator>(*groups.world, everyone, matrix, model);
    groups.world = groups.own_world.get();
    const auto wrap = [&](std::unique_ptr<Communicator>& g, std::vector<int> members) {
        if (g) g = std::make_unique<LinkModelCommunicator>(std::move(g), std::move(members), matrix, model);
    };
    wrap(groups.tp, t.group_of(rank, Axis::kTP));
    wrap(groups.pp, t.group_of(rank, Axis::kPP));
    wrap(groups.dp, t.group_of(rank, Axis::kDP));
    wrap(groups.mp, t.group_of(rank, Axis::kTP | Axis::kPP));
    wrap(groups.embd, t.embedding_group(rank));
    wrap(groups.cp, t.context_group(rank));
}

}  // namespace ms
