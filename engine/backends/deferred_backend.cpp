// deferred_backend.cpp: DeferredBackend (deferred_backend.h).
#include "engine/backends/deferred_backend.h"

#include <utility>

#include "memory/arena_memory.h"

namespace ms {

namespace {

template <class... F>
struct Overloaded : F... {
    using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

}  // namespace

DeferredBackend::DeferredBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {
    queue_.reserve(256);  // a GPT layer's ops and more; it grows during the first step if need be
}

std::unique_ptr<ArenaMemory> DeferredBackend::make_arena_memory(size_t bytes) {
    return inner_->make_arena_memory(bytes);
}

void DeferredBackend::run_queue() {
    Backend& b = *inner_;
    const auto run = Overloaded{
        [&](const EmbeddingForwardArgs& a) { b.embedding_forward(a); },
        [&](const EmbeddingBackwardArgs& a) { b.embedding_backward(a); },
        [&](const LayerNormForwardArgs& a) { b.layernorm_forward(a); },
        [&](const LayerNormBackwardArgs& a) { b.layernorm_backward(a); },
        [&](const MatmulForwardArgs& a) { b.matmul_forward(a); },
        [&](const MatmulBackwardArgs& a) { b.matmul_backward(a); },
        [&](const AttentionForwardArgs& a) { b.attention_forward(a); },
        [&](const AttentionBackwardArgs& a) { b.attention_backward(a); },
        [&](const GeluForwardArgs& a) { b.gelu_forward(a); },
        [&](const GeluBackwardArgs& a) { b.gelu_backward(a); },
        [&](const ResidualForwardArgs& a) { b.residual_forward(a); },
        [&](const CrossEntropyForwardArgs& a) { b.cross_entropy_forward(a); },
        [&](const CrossEntropyBackwardArgs& a) { b.cross_entropy_backward(a); },
        [&](const LmHeadLossArgs& a) { b.lm_head_loss(a); },
        [&](const AdamWArgs& a) { b.adamw(a); },
        [&](const CastArgs& a) { b.cast(a); },
        [&](const RmsNormForwardArgs& a) { b.rmsnorm_forward(a); },
        [&](const RmsNormBackwardArgs& a) { b.rmsnorm_backward(a); },
        [&](const RopeArgs& a) { b.rope(a); },
        [&](const SwiGluForwardArgs& a) { b.swiglu_forward(a); },
        [&](const SwiGluBackwardArgs& a) { b.swiglu_backward(a); },
        [&](const AttentionBlockForwardArgs& a) { b.attention_block_forward(a); },
        [&](const AttentionBlockBackwardArgs& a) { b.attention_block_backward(a); },
        [&](const CopyColumnsArgs& a) { b.copy_columns(a); },
        [&](const Zero& z) { b.zero(z.x); },
    };
    for (const Op& op : queue_) std::visit(run, op);
    queue_.clear();
}

void DeferredBackend::synchronize() {
    run_queue();
    inner_->synchronize();
}

double DeferredBackend::sum_squares(const Tensor& x) {
    run_queue();
    return inner_->sum_squares(x);
}

}  // namespace ms
