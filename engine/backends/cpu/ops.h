// cpu/ops.h: the CPU implementations of every Backend op, one file per op under cpu/ops/<op>.cpp.
//
// Each op has two paths selected by OpMode:
//   kReference: naive loops, fp32 (double where noted) accumulation, single-threaded: the executable spec;
//   kFast:      OpenBLAS sgemm for the GEMMs, OpenMP over independent rows, no per-call allocation of large
//               buffers (scratch is thread-local and grows once).
// Both follow the accumulation and precision contracts in backends/backend.h: every op computes on an activation
// dtype D of fp32, bf16 or fp16, its loops templated on the storage type (ops/precision.h).
#pragma once

#include "engine/backends/backend.h"

namespace ms::cpu {

void embedding_forward(const EmbeddingForwardArgs& a, OpMode mode);
void embedding_backward(const EmbeddingBackwardArgs& a, OpMode mode);
void layernorm_forward(const LayerNormForwardArgs& a, OpMode mode);
void layernorm_backward(const LayerNormBackwardArgs& a, OpMode mode);
void matmul_forward(const MatmulForwardArgs& a, OpMode mode);
void matmul_backward(const MatmulBackwardArgs& a, OpMode mode);
void attention_forward(const AttentionForwardArgs& a, OpMode mode);
void attention_backward(const AttentionBackwardArgs& a, OpMode mode);
void gelu_forward(const GeluForwardArgs& a, OpMode mode);
void gelu_backward(const GeluBackwardArgs& a, OpMode mode);
void residual_forward(const ResidualForwardArgs& a, OpMode mode);
void cross_entropy_forward(const CrossEntropyForwardArgs& a, OpMode mode);
void cross_entropy_backward(const CrossEntropyBackwardArgs& a, OpMode mode);
void lm_head_loss(const LmHeadLossArgs& a, OpMode mode);
void adamw(const AdamWArgs& a, OpMode mode);
double sum_squares(const Tensor& x, OpMode mode);
void cast(const CastArgs& a, OpMode mode);
void rmsnorm_forward(const RmsNormForwardArgs& a, OpMode mode);
void rmsnorm_backward(const RmsNormBackwardArgs& a, OpMode mode);
void rope(const RopeArgs& a, OpMode mode);
void swiglu_forward(const SwiGluForwardArgs& a, OpMode mode);
void swiglu_backward(const SwiGluBackwardArgs& a, OpMode mode);
void attention_block_forward(const AttentionBlockForwardArgs& a, OpMode mode);
void attention_block_backward(const AttentionBlockBackwardArgs& a, OpMode mode);
void copy_columns(const CopyColumnsArgs& a);

// The CPU Backend in options.mode (cpu_backend.cpp); make_backend() is the public way in.
std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options);

}  // namespace ms::cpu
