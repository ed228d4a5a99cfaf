// profiling_backend.h: a Backend decorator that times every op it forwards, for finding where a step's time goes
// (the trainer wraps its backend in one under MS_PROFILE_OPS=1 and prints the table at the end of the run).
//
// Each op is timed on the host clock from before its call to after inner->synchronize(), with a synchronize() first
// too, so an asynchronous backend (CUDA) is measured op by op: the table sums what each op costs on its own, which
// includes one launch-and-wait latency per op (a few microseconds on a GPU) that a step without the decorator
// overlaps. So the profile explains a step, and a profiled step is slower than a plain one; throughput is measured
// without it. Ops are grouped by kind and, for the matmuls and attention, by shape (the Linear layers of a GPT are
// then one row each); a group is created at its first call and found again without allocating, so steady-state
// steps allocate nothing (the trainer's MS_CHECK_ALLOCS guard stays valid).
//
// A timeline (OpTimeline: logging.trace_dir, engine/train/trace.h) gets each op with its start and end, timed the
// same way, while its recording() says so. A ProfilingBackend made for a timeline alone (Totals::kOff) forwards every
// op untimed outside the recorded iterations.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/backend.h"

namespace ms {

// A group of the profile: the op, up to four sizes (0 = none) and flags (which optional parts the call had).
struct OpKey {
    OpKind op;
    std::array<int64_t, 4> dims{};
    uint32_t flags = 0;
    bool operator<(const OpKey& o) const;
    std::string describe() const;  // e.g. "matmul forward N 4096 K 768 M 2304 +bias"
};

// Receives every op, with its start and end on the steady clock (now_seconds()), while recording().
class OpTimeline {
  public:
    virtual ~OpTimeline() = default;
    virtual bool recording() const = 0;
    virtual void op(const OpKey& key, double begin, double end) = 0;
};

class ProfilingBackend final : public Backend {
  public:
    enum class Totals : uint8_t { kOn, kOff };  // kOff: no table, only the timeline's ops are timed
    explicit ProfilingBackend(std::unique_ptr<Backend> inner, Totals totals = Totals::kOn);
    void set_timeline(OpTimeline* timeline) { timeline_ = timeline; }  // not owned; null: none

    struct Row {
        std::string op;     // e.g. "matmul forward N 4096 K 768 M 2304 +bias"
        int64_t calls = 0;  // since the last reset()
        double seconds = 0.0;
    };
    // What was timed since the last reset(), longest first.
    std::vector<Row> rows() const;
    void reset();
    // A table of rows() with each op's share of `step_seconds` (the wall time of the `steps` steps the rows cover),
    // and the rest of the step (host work, communication, waits) as a last row.
    std::vector<std::string> table(double step_seconds, int64_t steps) const;

    std::string_view name() const override { return inner_->name(); }
    bool supports(OpKind op, DType dtype) const override { return inner_->supports(op, dtype); }
    void synchronize() override { inner_->synchronize(); }
    bool asynchronous() const override { return inner_->asynchronous(); }
    std::string device_name() const override { return inner_->device_name(); }
    DeviceMemory device_memory() const override { return inner_->device_memory(); }
    std::string pci_bus_id() const override { return inner_->pci_bus_id(); }
    std::unique_ptr<ArenaMemory> make_arena_memory(size_t bytes) override;

    void embedding_forward(const EmbeddingForwardArgs& a) override;
    void embedding_backward(const EmbeddingBackwardArgs& a) override;
    void layernorm_forward(const LayerNormForwardArgs& a) override;
    void layernorm_backward(const LayerNormBackwardArgs& a) override;
    void matmul_forward(const MatmulForwardArgs& a) override;
    void matmul_backward(const MatmulBackwardArgs& a) override;
    void attention_forward(const AttentionForwardArgs& a) override;
    void attention_backward(const AttentionBackwardArgs& a) override;
    void gelu_forward(const GeluForwardArgs& a) override;
    void gelu_backward(const GeluBackwardArgs& a) override;
    void residual_forward(const ResidualForwardArgs& a) override;
    void cross_entropy_forward(const CrossEntropyForwardArgs& a) override;
    void cross_entropy_backward(const CrossEntropyBackwardArgs& a) override;
    void lm_head_loss(const LmHeadLossArgs& a) override;
    void adamw(const AdamWArgs& a) override;
    double sum_squares(const Tensor& x) override;
    void cast(const CastArgs& a) override;
    void rmsnorm_forward(const RmsNormForwardArgs& a) override;
    void rmsnorm_backward(const RmsNormBackwardArgs& a) override;
    void rope(const RopeArgs& a) override;
    void swiglu_forward(const SwiGluForwardArgs& a) override;
    void swiglu_backward(const SwiGluBackwardArgs& a) override;
    void attention_block_forward(const AttentionBlockForwardArgs& a) override;
    void attention_block_backward(const AttentionBlockBackwardArgs& a) override;
    void copy_columns(const CopyColumnsArgs& a) override;
    void zero(const Tensor& x) override;

  private:
    using Key = OpKey;
    struct Sums {
        int64_t calls = 0;
        double seconds = 0.0;
    };
    template <class F>
    void timed(const Key& key, F&& op);

    std::unique_ptr<Backend> inner_;
    bool totals_on_;
    OpTimeline* timeline_ = nullptr;
    std::map<Key, Sums> totals_;
};

}  // namespace ms
