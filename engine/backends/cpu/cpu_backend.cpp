// cpu_backend.cpp: the CPU Backend: dispatches every op to cpu/ops/<op>.cpp in the configured mode.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "engine/backends/cpu/ops.h"

namespace ms {
namespace {

class CpuBackend final : public Backend {
  public:
    explicit CpuBackend(const BackendOptions& o) : mode_(o.mode) {
        // Ranks of one node that each took every core would oversubscribe it local_size times (torchrun sets
        // OMP_NUM_THREADS=1 for the same reason). OMP_NUM_THREADS is OpenMP's own variable: set, it stands.
        if (o.num_threads > 0) {
            omp_set_num_threads(o.num_threads);
        } else if (o.local_size > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
            omp_set_num_threads(std::max(1, omp_get_num_procs() / o.local_size));
        }
    }
    std::string_view name() const override { return mode_ == OpMode::kFast ? "cpu" : "cpu-reference"; }
    // Every op computes on fp32, bf16 or fp16 (the precision contract in backend.h: parameter gradients are fp32 or
    // the activation dtype; adamw's state is fp32 whatever the activation dtype is).
    bool supports(OpKind, DType dtype) const override { return is_float(dtype); }
    void synchronize() override {}

    void embedding_forward(const EmbeddingForwardArgs& a) override { cpu::embedding_forward(a, mode_); }
    void embedding_backward(const EmbeddingBackwardArgs& a) override { cpu::embedding_backward(a, mode_); }
    void layernorm_forward(const LayerNormForwardArgs& a) override { cpu::layernorm_forward(a, mode_); }
    void layernorm_backward(const LayerNormBackwardArgs& a) override { cpu::layernorm_backward(a, mode_); }
    void matmul_forward(const MatmulForwardArgs& a) override { cpu::matmul_forward(a, mode_); }
    void matmul_backward(const MatmulBackwardArgs& a) override { cpu::matmul_backward(a, mode_); }
    void attention_forward(const AttentionForwardArgs& a) override { cpu::attention_forward(a, mode_); }
    void attention_backward(const AttentionBackwardArgs& a) override { cpu::attention_backward(a, mode_); }
    void gelu_forward(const GeluForwardArgs& a) override { cpu::gelu_forward(a, mode_); }
    void gelu_backward(const GeluBackwardArgs& a) override { cpu::gelu_backward(a, mode_); }
    void residual_forward(const ResidualForwardArgs& a) override { cpu::residual_forward(a, mode_); }
    void cross_entropy_forward(const CrossEntropyForwardArgs& a) override { cpu::cross_entropy_forward(a, mode_); }
    void cross_entropy_backward(const CrossEntropyBackwardArgs& a) override { cpu::cross_entropy_backward(a, mode_); }
    void lm_head_loss(const LmHeadLossArgs& a) override { cpu::lm_head_loss(a, mode_); }
    void adamw(const AdamWArgs& a) override { cpu::adamw(a, mode_); }
    double sum_squares(const Tensor& x) override { return cpu::sum_squares(x, mode_); }
    void cast(const CastArgs& a) override { cpu::cast(a, mode_); }
    void rmsnorm_forward(const RmsNormForwardArgs& a) override { cpu::rmsnorm_forward(a, mode_); }
    void rmsnorm_backward(const RmsNormBackwardArgs& a) override { cpu::rmsnorm_backward(a, mode_); }
    void rope(const RopeArgs& a) override { cpu::rope(a, mode_); }
    void swiglu_forward(const SwiGluForwardArgs& a) override { cpu::swiglu_forward(a, mode_); }
    void swiglu_backward(const SwiGluBackwardArgs& a) override { cpu::swiglu_backward(a, mode_); }
    void attention_block_forward(const AttentionBlockForwardArgs& a) override {
        cpu::attention_block_forward(a, mode_);
    }
    void attention_block_backward(const AttentionBlockBackwardArgs& a) override {
        cpu::attention_block_backward(a, mode_);
    }
    void copy_columns(const CopyColumnsArgs& a) override { cpu::copy_columns(a); }
    void zero(const Tensor& x) override { std::memset(x.data, 0, x.bytes()); }

  private:
    OpMode mode_;
};

}  // namespace

namespace cpu {

// make_backend (engine/backends/backend_registry.cpp) calls this for kCPU.
std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
    MS_CHECK(options.kind == BackendKind::kCPU, "make_cpu_backend for backend kind {}", static_cast<int>(options.kind));
    return std::make_unique<CpuBackend>(options);
}

}  // namespace cpu

}  // namespace ms
