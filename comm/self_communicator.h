// self_communicator.h: the communicator of a group of one rank, without MPI.
//
// Every collective is the identity (reduce_scatter / all_gather / all_to_all copy in to out), so single-rank code
// and tests run the same code path as any parallel layout (docs/design.md §4: size-1 groups are real objects).
#pragma once

#include <cstring>
#include <string>

#include "comm/communicator.h"
#include "engine/core/check.h"

namespace ms {

class SelfCommunicator final : public Communicator {
  public:
    explicit SelfCommunicator(std::string name = "self") : name_(std::move(name)) {}
    int rank() const override { return 0; }
    int size() const override { return 1; }
    std::string_view name() const override { return name_; }

    Handle batch_send_recv_impl(std::span<const P2POp> ops, Priority) override {
        MS_CHECK(ops.empty(), "{}: point-to-point with a group of one rank", name_);
        return {};
    }
    void barrier() override {}
    std::unique_ptr<Communicator> split(int, int, std::string name) override {
        return std::make_unique<SelfCommunicator>(std::move(name));
    }

  protected:
    Handle all_reduce_impl(void*, size_t, DType, ReduceOp, Priority) override { return {}; }
    Handle reduce_scatter_impl(const void* in, void* out, size_t out_count, size_t in_count, DType t, ReduceOp,
                               Priority) override {
        return copy(in, out, out_count, in_count, t);
    }
    Handle all_gather_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t, Priority) override {
        return copy(in, out, out_count, in_count, t);
    }
    Handle broadcast_impl(void*, size_t, DType, int root, Priority) override {
        MS_CHECK(root == 0, "{}: broadcast root {} in a group of one rank", name_, root);
        return {};
    }
    Handle all_to_all_impl(const void* in, void* out, size_t in_count, size_t out_count, DType t, Priority) override {
        return copy(in, out, out_count, in_count, t);
    }
    Handle reduce_impl(void*, size_t, DType, int root, ReduceOp, Priority) override {
        MS_CHECK(root == 0, "{}: reduce root {} in a group of one rank", name_, root);
        return {};
    }

  private:
    Handle copy(const void* in, void* out, size_t out_count, size_t in_count, DType t) {
        MS_CHECK(in_count == out_count, "{}: {} elements in, {} out, in a group of one rank", name_, in_count,
                 out_count);
        if (in != out) std::memmove(out, in, in_count * dtype_size(t));
        return {};
    }
    std::string name_;
};

}  // namespace ms
