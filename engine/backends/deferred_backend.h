// deferred_backend.h: a Backend decorator that runs every op as late as an asynchronous backend may, for checking on
// the CPU that the host orders its accesses to device memory the way a GPU needs (the trainer wraps its backend in
// one under MS_DEFER_OPS=1).
//
// On a GPU an op runs some time after its call returns: the host must synchronize() before it reads an op's output,
// before it writes a buffer an earlier op may still read, and before a collective touches either (backend.h). A
// missing synchronize() is a race there -- usually won by the kernel, so it shows up rarely and only on a GPU -- and
// invisible on the CPU backend and the CUDA emulation, whose ops complete inside their calls. This decorator turns
// the race into a deterministic loss: each op's arguments are queued (they are views: pointers and sizes) and the
// queue runs, in call order, only at synchronize() or at sum_squares() (which returns a value to the host, so it
// completes everything before it, as the CUDA backend's does). Between two synchronizations the host sees the memory
// as it was before the queued ops, and an op sees what the host wrote after its call. A run with the decorator
// therefore gives the same bits as one without it exactly when every host access is synchronized; tests/e2e/
// test_train_deferred.cpp compares the two across the trainer's paths (parallel layouts, mixed precision, pipeline
// schedules, checkpoints).
//
// It reports asynchronous() = true, so the trainer installs the collectives' synchronization as it does for CUDA.
// The queue keeps its capacity, so steady-state steps allocate nothing (MS_CHECK_ALLOCS stays valid).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/backends/backend.h"

namespace ms {

class DeferredBackend final : public Backend {
  public:
    explicit DeferredBackend(std::unique_ptr<Backend> inner);

    // Ops called and not yet run.
    size_t pending() const { return queue_.size(); }

    std::string_view name() const override { return inner_->name(); }
    bool supports(OpKind op, DType dtype) const override { return inner_->supports(op, dtype); }
    void synchronize() override;
    bool asynchronous() const override { return true; }
    std::string device_name() const override { return inner_->device_name(); }
    DeviceMemory device_memory() const override { return inner_->device_memory(); }
    std::string pci_bus_id() const override { return inner_->pci_bus_id(); }
    std::unique_ptr<ArenaMemory> make_arena_memory(size_t bytes) override;

    void embedding_forward(const EmbeddingForwardArgs& a) override { queue_.emplace_back(a); }
    void embedding_backward(const EmbeddingBackwardArgs& a) override { queue_.emplace_back(a); }
    void layernorm_forward(const LayerNormForwardArgs& a) override { queue_.emplace_back(a); }
    void layernorm_backward(const LayerNormBackwardArgs& a) override { queue_.emplace_back(a); }
    void matmul_forward(const MatmulForwardArgs& a) override { queue_.emplace_back(a); }
    void matmul_backward(const MatmulBackwardArgs& a) override { queue_.emplace_back(a); }
    void attention_forward(const AttentionForwardArgs& a) override { queue_.emplace_back(a); }
    void attention_backward(const AttentionBackwardArgs& a) override { queue_.emplace_back(a); }
    void gelu_forward(const GeluForwardArgs& a) override { queue_.emplace_back(a); }
    void gelu_backward(const GeluBackwardArgs& a) override { queue_.emplace_back(a); }
    void residual_forward(const ResidualForwardArgs& a) override { queue_.emplace_back(a); }
    void cross_entropy_forward(const CrossEntropyForwardArgs& a) override { queue_.emplace_back(a); }
    void cross_entropy_backward(const CrossEntropyBackwardArgs& a) override { queue_.emplace_back(a); }
    void lm_head_loss(const LmHeadLossArgs& a) override { queue_.emplace_back(a); }
    void adamw(const AdamWArgs& a) override { queue_.emplace_back(a); }
    double sum_squares(const Tensor& x) override;
    void cast(const CastArgs& a) override { queue_.emplace_back(a); }
    void rmsnorm_forward(const RmsNormForwardArgs& a) override { queue_.emplace_back(a); }
    void rmsnorm_backward(const RmsNormBackwardArgs& a) override { queue_.emplace_back(a); }
    void rope(const RopeArgs& a) override { queue_.emplace_back(a); }
    void swiglu_forward(const SwiGluForwardArgs& a) override { queue_.emplace_back(a); }
    void swiglu_backward(const SwiGluBackwardArgs& a) override { queue_.emplace_back(a); }
    void attention_block_forward(const AttentionBlockForwardArgs& a) override { queue_.emplace_back(a); }
    void attention_block_backward(const AttentionBlockBackwardArgs& a) override { queue_.emplace_back(a); }
    void copy_columns(const CopyColumnsArgs& a) override { queue_.emplace_back(a); }
    void zero(const Tensor& x) override { queue_.emplace_back(Zero{x}); }

  private:
    struct Zero {
        Tensor x;
    };
    using Op = std::variant<EmbeddingForwardArgs, EmbeddingBackwardArgs, LayerNormForwardArgs, LayerNormBackwardArgs,
                            MatmulForwardArgs, MatmulBackwardArgs, AttentionForwardArgs, AttentionBackwardArgs,
                            GeluForwardArgs, GeluBackwardArgs, ResidualForwardArgs, CrossEntropyForwardArgs,
                            CrossEntropyBackwardArgs, LmHeadLossArgs, AdamWArgs, CastArgs, RmsNormForwardArgs,
                            RmsNormBackwardArgs, RopeArgs, SwiGluForwardArgs, SwiGluBackwardArgs,
                            AttentionBlockForwardArgs, AttentionBlockBackwardArgs, CopyColumnsArgs, Zero>;
    // Runs the queue on inner_, in call order, and empties it (keeping its capacity).
    void run_queue();

    std::unique_ptr<Backend> inner_;
    std::vector<Op> queue_;
};

}  // namespace ms
