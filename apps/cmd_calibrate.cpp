// cmd_calibrate.cpp: `calibrate --output FILE [--config FILE] [--threads N] [--dtype D] [--world-size N ...] [--quick]`
// -- times every op family (engine/sim/profile.h) over a ladder of shapes, from tiny to GPT-2-124M-sized, on the
// backend at hand (the CPU, or CUDA with run.backend: cuda), and with --world-size every op shape of the config's model
// that the layout search prices on that many ranks, each as itself; and writes the profile the step simulator plans
// with (docs/planner.md "Calibration and profiles").
//
// Each measurement is one op of a one-node graph (graph/graph.h), so its FLOPs and bytes are op_work()'s -- what the
// cost model will count for the same op in a model's graph -- and its time the shortest of a few runs after a warm-up.
// A family's tiny shape gives its overhead; each point's rate is work / (time - overhead), so the profile's formula
// gives each measured time back.
//
// Under mpirun (two ranks or more on one host) every rank first measures the link between ranks 0 and 1
// (engine/sim/link_probe.h) into the profile's intra-node link; then every rank times the same ops at once, and rank 0
// prints and writes them.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/ranges.h>

#include "apps/commands.h"
#include "comm/bootstrap.h"
#include "engine/backends/backend.h"
#include "engine/backends/cpu/probe.h"
#include "engine/config/config.h"
#include "engine/core/check.h"
#include "engine/core/timer.h"
#include "engine/sim/link_probe.h"
#include "engine/sim/profile.h"
#include "engine/train/device_peak.h"
#include "engine/train/plan.h"
#include "engine/train/run_layout.h"
#include "memory/arena_memory.h"

namespace ms::app {
namespace {

using graph::OpCode;
using graph::Role;
using graph::TensorId;
using sim::OpFamily;

struct CalibrateArgs {
    std::string output, config_path, dtype;
    std::vector<std::string> overrides;
    std::vector<int> world_sizes;  // --world-size: also the config's op shapes the search prices at these sizes
    int ranks_per_node = 0;
    int threads = 0;
    bool quick = false;
};

// What one op needs: a one-node graph whose tensors have backing memory the backend can reach.
class OneOp {
  public:
    OneOp(Backend& be, DType act) : be_(be) { g_.act = act; }
    enum class Fill : uint8_t { kValues, kZero, kTokens };
    // A tensor of the graph with memory, filled (kTokens: ids below `vocab`).
    TensorId tensor(const char* name, std::vector<int64_t> shape, DType dtype, Role role = Role::kActivation,
                    Fill fill = Fill::kValues, int64_t vocab = 0) {
        graph::TensorInfo info{.name = name, .shape = std::move(shape), .dtype = dtype, .role = role};
        const size_t bytes = static_cast<size_t>(std::max<int64_t>(info.bytes(), 1));
        std::unique_ptr<ArenaMemory> mem = be_.make_arena_memory(bytes);
        if (!mem) mem = std::make_unique<HostArenaMemory>(bytes);
        fill_memory(mem->data(), info, fill, vocab);
        mem->prefetch_to_device();
        data_.push_back(mem->data());
        memory_.push_back(std::move(mem));
        return g_.add_tensor(std::move(info));
    }
    graph::Node& node(OpCode op, std::vector<TensorId> in, std::vector<TensorId> out) {
        g_.nodes.push_back({.op = op, .in = std::move(in), .out = std::move(out)});
        return g_.nodes.back();
    }
    // Tensor t's memory as a backend tensor of `dims`.
    Tensor view(TensorId t, std::initializer_list<int64_t> dims) const {
        return Tensor(data_.at(static_cast<size_t>(t)), g_.info(t).dtype, dims);
    }
    Tensor flat(TensorId t) const { return view(t, {g_.info(t).numel()}); }
    sim::OpWork work() const { return sim::op_work(g_, g_.nodes.at(0)); }
    std::optional<sim::OpShape> shape() const { return sim::op_shape(g_, g_.nodes.at(0)); }
    DType act() const { return g_.act; }
    Backend& backend() const { return be_; }

  private:
    static void fill_memory(void* p, const graph::TensorInfo& info, Fill fill, int64_t vocab) {
        const int64_t n = info.numel();
        if (fill == Fill::kZero) {
            std::memset(p, 0, static_cast<size_t>(info.bytes()));
            return;
        }
        for (int64_t i = 0; i < n; ++i) {
            const float x = static_cast<float>(i % 23) * 0.02f - 0.2f;  // small values: no overflow, no denormals
            switch (info.dtype) {
                case DType::kF32:
                    static_cast<float*>(p)[i] = x;
                    break;
                case DType::kBF16:
                    static_cast<bf16*>(p)[i] = from_float<bf16>(x);
                    break;
                case DType::kF16:
                    static_cast<fp16*>(p)[i] = from_float<fp16>(x);
                    break;
                default:
                    static_cast<int32_t*>(p)[i] = static_cast<int32_t>((i * 7919) % std::max<int64_t>(vocab, 1));
            }
        }
    }
    Backend& be_;
    graph::Graph g_;
    std::vector<std::unique_ptr<ArenaMemory>> memory_;
    std::vector<void*> data_;
};

// One measurement: a shape, its work, and the op to run (holding its memory); `key`, the op's OpShape::key() where
// it has one.
struct Case {
    std::string shape;
    sim::OpWork work;
    std::function<void()> run;
    std::string key = {};
};
using Builder = std::function<Case(Backend&, DType, const std::vector<int64_t>&)>;

Case make_case(std::shared_ptr<OneOp> op, std::string shape, std::function<void(const OneOp&)> run) {
    const sim::OpWork w = op->work();
    const std::optional<sim::OpShape> s = op->shape();
    return {std::move(shape), w, [op, run = std::move(run)] { run(*op); }, s ? s->key() : std::string()};
}

constexpr DType kF32 = DType::kF32;
constexpr DType kI32 = DType::kI32;

// The optional dimension i of s (a flag of sim::OpShape's), `absent` when s has no such entry.
int64_t dim_or(const std::vector<int64_t>& s, size_t i, int64_t absent) { return s.size() > i ? s[i] : absent; }

// matmul (N, K) x (M, K)^T (+ bias unless s[3] is 0)
Case matmul_fwd(Backend& be, DType D, const std::vector<int64_t>& s) {
    const int64_t N = s[0], K = s[1], M = s[2];
    const bool bias = dim_or(s, 3, 1) != 0;
    auto op = std::make_shared<OneOp>(be, D);
    const TensorId x = op->tensor("x", {N, K}, D), w = op->tensor("w", {M, K}, D, Role::kParameter),
                   b = bias ? op->tensor("b", {M}, D, Role::kParameter) : graph::kNoTensor,
                   y = op->tensor("y", {N, M}, D);
    op->node(OpCode::kMatmul, {x, w, b}, {y});
    return make_case(op, fmt::format("N={} K={} M={}{}", N, K, M, bias ? "" : " nobias"), [=](const OneOp& o) {
        o.backend().matmul_forward(
            {o.view(x, {N, K}), o.view(w, {M, K}), bias ? o.view(b, {M}) : Tensor(), o.view(y, {N, M})});
    });
}

// its backward: dW, and dx and db unless s[3] or s[4] is 0
Case matmul_bwd(Backend& be, DType D, const std::vector<int64_t>& s) {
    const int64_t N = s[0], K = s[1], M = s[2];
    const bool with_dx = dim_or(s, 3, 1) != 0, with_db = dim_or(s, 4, 1) != 0;
    auto op = std::make_shared<OneOp>(be, D);
    const TensorId dy = op->tensor("dy", {N, M}, D), x = op->tensor("x", {N, K}, D),
                   w = op->tensor("w", {M, K}, D, Role::kParameter),
                   dx = with_dx ? op->tensor("dx", {N, K}, D) : graph::kNoTensor,
                   dw = op->tensor("dw", {M, K}, kF32, Role::kGradient, OneOp::Fill::kZero),
                   db = with_db ? op->tensor("db", {M}, kF32, Role::kGradient, OneOp::Fill::kZero) : graph::kNoTensor;
    op->node(OpCode::kMatmulBackward, {dy, x, w}, {dx, dw, db});
    const std::string shape =
        fmt::format("N={} K={} M={}{}{}", N, K, M, with_dx ? "" : " nodx", with_db ? "" : " nodb");
    return make_case(op, shape, [=](const OneOp& o) {
        o.backend().matmul_backward({o.view(dy, {N, M}), o.view(x, {N, K}), o.view(w, {M, K}),
                                     with_dx ? o.view(dx, {N, K}) : Tensor(), o.view(dw, {M, K}),
                                     with_db ? o.view(db, {M}) : Tensor(), Accumulate::kOverwrite});
    });
}

// causal attention of B sequences of T rows, NH query and KV key/value heads of HS; the backward after one forward for
// its inputs
Case attention(Backend& be, DType D, const std::vector<int64_t>& s, bool backward) {
    const int64_t B = s[0], T = s[1], NH = s[2], KV = s[3], HS = s[4], C = NH * HS, QKV = (NH + 2 * KV) * HS;
    auto op = std::make_shared<OneOp>(be, D);
    const TensorId qkv = op->tensor("qkv", {B * T, QKV}, D), y = op->tensor("y", {B * T, C}, D),
                   lse = op->tensor("lse", {B * NH, T}, kF32);
    const AttentionForwardArgs fwd{op->view(qkv, {B, T, QKV}), op->view(y, {B, T, C}), op->view(lse, {B, NH, T}), NH,
                                   KV == NH ? 0 : KV};
    const std::string shape =
        fmt::format("B={} T={} NH={}{} HS={}", B, T, NH, KV == NH ? "" : fmt::format(" KV={}", KV), HS);
    if (!backward) {
        graph::Node& n = op->node(OpCode::kAttention, {qkv}, {y, lse});
        n.B = B, n.T = T, n.NH = NH, n.NKV = fwd.NKV;
        return make_case(op, shape, [fwd](const OneOp& o) { o.backend().attention_forward(fwd); });
    }
    be.attention_forward(fwd);
    be.synchronize();  // before the host fills the backward's tensors
    const TensorId dy = op->tensor("dy", {B * T, C}, D), dqkv = op->tensor("dqkv", {B * T, QKV}, D);
    graph::Node& n = op->node(OpCode::kAttentionBackward, {dy, qkv, y, lse}, {dqkv});
    n.B = B, n.T = T, n.NH = NH, n.NKV = fwd.NKV;
    const AttentionBackwardArgs bwd{op->view(dy, {B, T, C}),     fwd.qkv, fwd.out, fwd.lse,
                                    op->view(dqkv, {B, T, QKV}), NH,      fwd.NKV};
    return make_case(op, shape, [bwd](const OneOp& o) { o.backend().attention_backward(bwd); });
}

// LayerNorm over (N, C); the backward after one forward
Case norm(Backend& be, DType D, const std::vector<int64_t>& s, bool backward) {
    const int64_t N = s[0], C = s[1];
    auto op = std::make_shared<OneOp>(be, D);
    const TensorId x = op->tensor("x", {N, C}, D), w = op->tensor("w", {C}, D, Role::kParameter),
                   b = op->tensor("b", {C}, D, Role::kParameter), y = op->tensor("y", {N, C}, D),
                   mean = op->tensor("mean", {N}, kF32), rstd = op->tensor("rstd", {N}, kF32);
    const LayerNormForwardArgs fwd{op->view(x, {N, C}),
                                   op->view(w, {C}),
                                   op->view(b, {C}),
                                   op->view(y, {N, C}),
                                   op->view(mean, {N}),
                                   op->view(rstd, {N}),
                                   1e-5f};
    const std::string shape = fmt::format("N={} C={}", N, C);
    if (!backward) {
        op->node(OpCode::kLayerNorm, {x, w, b}, {y, mean, rstd});
        return make_case(op, shape, [fwd](const OneOp& o) { o.backend().layernorm_forward(fwd); });
    }
    be.layernorm_forward(fwd);
    be.synchronize();
    const TensorId dx = op->tensor("dx", {N, C}, D),
                   dw = op->tensor("dw", {C}, kF32, Role::kGradient, OneOp::Fill::kZero),
                   db = op->tensor("db", {C}, kF32, Role::kGradient, OneOp::Fill::kZero);
    op->node(OpCode::kLayerNormBackward, {y, x, w, mean, rstd}, {dx, dw, db});
    const LayerNormBackwardArgs bwd{fwd.out,           fwd.inp,           fwd.weight,
                                    fwd.mean,          fwd.rstd,          op->view(dx, {N, C}),
                                    op->view(dw, {C}), op->view(db, {C}), Accumulate::kOverwrite};
    return make_case(op, shape, [bwd](const OneOp& o) { o.backend().layernorm_backward(bwd); });
}

// GELU over n elements, forward or backward
Case activation(Backend& be, DType D, const std::vector<int64_t>& s, bool backward) {
    const int64_t n = s[0];
    auto op = std::make_shared<OneOp>(be, D);
    const TensorId x = op->tensor("x", {n}, D), y = op->tensor("y", {n}, D);
    const std::string shape = fmt::format("n={}", n);
    if (!backward) {
        op->node(OpCode::kGelu, {x}, {y});
        return make_case(op, shape, [=](const OneOp& o) { o.backend().gelu_forward({o.flat(x), o.flat(y)}); });
    }
    const TensorId dx = op->tensor("dx", {n}, D);
    op->node(OpCode::kGeluBackward, {x, y}, {dx});
    return make_case(op, shape, [=](const OneOp& o) { o.backend().gelu_backward({o.flat(x), o.flat(y), o.flat(dx)}); });
}

Case residual(Backend& be, DType D, const std::vector<int64_t>& s) {
    const int64_t n = s[0];
    auto op = std::make_shared<OneOp>(be, D);
    const TensorId a = op->tensor("a", {n}, D), b = op->tensor("b", {n}, D), y = op->tensor("y", {n}, D);
    op->node(OpCode::kResidual, {a, b}, {y});
    return make_case(op, fmt::format("n={}", n), [=](const OneOp& o) {
        o.backend().residual_forward({o.flat(a), o.flat(b), o.flat(y), Tensor()});
    });
}

// token and position embedding of N tokens (T = min(N, 1024) positions) from a (V, C) table
Case embedding(Backend& be, DType D, const std::vector<int64_t>& s, bool backward) {
    const int64_t N = s[0], V = s[1], C = s[2], T = std::min<int64_t>(N, 1024);
    auto op = std::make_shared<OneOp>(be, D);
    const TensorId tok = op->tensor("tokens", {N}, kI32, Role::kInput, OneOp::Fill::kTokens, V);
    const std::string shape = fmt::format("N={} V={} C={}", N, V, C);
    if (!backward) {
        const TensorId table = op->tensor("wte", {V, C}, D, Role::kParameter),
                       pos = op->tensor("wpe", {T, C}, D, Role::kParameter), x = op->tensor("x", {N, C}, D);
        graph::Node& n = op->node(OpCode::kEmbedding, {tok, table, pos}, {x});
        n.T = T;
        return make_case(op, shape, [=](const OneOp& o) {
            o.backend().embedding_forward(
                {o.view(tok, {N}), o.view(table, {V, C}), o.view(pos, {T, C}), o.view(x, {N, C}), 0, T});
        });
    }
    const TensorId dx = op->tensor("dx", {N, C}, D),
                   dtable = op->tensor("dwte", {V, C}, kF32, Role::kGradient, OneOp::Fill::kZero),
                   dpos = op->tensor("dwpe", {T, C}, kF32, Role::kGradient, OneOp::Fill::kZero);
    graph::Node& n = op->node(OpCode::kEmbeddingBackward, {tok, dx}, {dtable, dpos});
    n.T = T;
    return make_case(op, shape, [=](const OneOp& o) {
        o.backend().embedding_backward(
            {o.view(tok, {N}), o.view(dx, {N, C}), o.view(dtable, {V, C}), o.view(dpos, {T, C}), 0, T});
    });
}

// the loss's statistics over (N, V) logits
Case cross_entropy(Backend& be, DType D, const std::vector<int64_t>& s) {
    const int64_t N = s[0], V = s[1];
    auto op = std::make_shared<OneOp>(be, D);
    const TensorId logits = op->tensor("logits", {N, V}, D),
                   targets = op->tensor("targets", {N}, kI32, Role::kInput, OneOp::Fill::kTokens, V),
                   row_max = op->tensor("row_max", {N}, kF32), sums = op->tensor("sums", {2, N}, kF32);
    graph::Node& n = op->node(OpCode::kCrossEntropy, {logits, targets}, {row_max, sums});
    n.vocab_valid = V;
    return make_case(op, fmt::format("N={} V={}", N, V), [=](const OneOp& o) {
        const Tensor sum = o.flat(sums);
        o.backend().cross_entropy_forward({o.view(logits, {N, V}), o.view(targets, {N}), o.view(row_max, {N}),
                                           sum.slice(0, N), sum.slice(N, N), 0, V, CrossEntropyPhase::kMaxSumExp});
    });
}

// the fused LM head: logits, loss and backward, chunk by chunk
Case lm_head_loss(Backend& be, DType D, const std::vector<int64_t>& s, BackendKind kind) {
    const int64_t N = s[0], C = s[1], V = s[2], valid = dim_or(s, 3, V);
    const int64_t rows = lm_head_loss_chunk_rows(kind, D, N, V);
    auto op = std::make_shared<OneOp>(be, D);
    const TensorId x = op->tensor("lnf", {N, C}, D), w = op->tensor("wte", {V, C}, D, Role::kParameter),
                   targets = op->tensor("targets", {N}, kI32, Role::kInput, OneOp::Fill::kTokens, valid),
                   dloss = op->tensor("dloss", {N}, kF32), losses = op->tensor("losses", {N}, kF32),
                   dx = op->tensor("dlnf", {N, C}, D),
                   dw = op->tensor("dwte", {V, C}, kF32, Role::kGradient, OneOp::Fill::kZero),
                   scratch = op->tensor("scratch", {lm_head_loss_scratch_elems(kind, D, N, V, rows)}, kF32);
    graph::Node& n = op->node(OpCode::kLmHeadLoss, {x, w, targets, dloss}, {losses, dx, dw, scratch});
    n.chunk_rows = rows;
    n.vocab_valid = valid;
    const std::string shape =
        fmt::format("N={} C={} V={}{}", N, C, V, valid == V ? "" : fmt::format(" valid={}", valid));
    return make_case(op, shape, [=](const OneOp& o) {
        o.backend().lm_head_loss({o.view(x, {N, C}), o.view(w, {V, C}), o.view(targets, {N}), o.view(dloss, {N}),
                                  o.view(losses, {N}), o.view(dx, {N, C}), o.view(dw, {V, C}), o.flat(scratch), 0,
                                  valid, rows});
    });
}

// AdamW over n fp32 elements (writing the D copy of the weights when D is 16-bit); no graph node: its bytes are the
// cost model's adamw_bytes_per_element
Case adamw(Backend& be, DType D, const std::vector<int64_t>& s) {
    const int64_t n = s[0];
    auto op = std::make_shared<OneOp>(be, D);
    const TensorId p = op->tensor("p", {n}, kF32), g = op->tensor("g", {n}, kF32),
                   m = op->tensor("m", {n}, kF32, Role::kActivation, OneOp::Fill::kZero),
                   v = op->tensor("v", {n}, kF32, Role::kActivation, OneOp::Fill::kZero);
    const TensorId copy = D == kF32 ? graph::kNoTensor : op->tensor("copy", {n}, D);
    const double bytes = static_cast<double>(n) * sim::adamw_bytes_per_element(D);
    return {fmt::format("n={}", n), {OpFamily::kAdamW, 0, bytes}, [=] {
                const Tensor weights = copy == graph::kNoTensor ? Tensor() : op->flat(copy);
                op->backend().adamw({op->flat(p), op->flat(g), op->flat(m), op->flat(v), 1e-4f, 0.9f, 0.95f, 1e-8f,
                                     0.1f, 1.0f, 1, weights});
            }};
}

// zeroing `bytes` (what the gradient buffer costs before a step)
Case memset(Backend& be, DType D, const std::vector<int64_t>& s) {
    const int64_t n = s[0] / 4;
    auto op = std::make_shared<OneOp>(be, D);
    const TensorId x = op->tensor("x", {n}, kF32);
    return {fmt::format("bytes={}", n * 4), {OpFamily::kMemset, 0, static_cast<double>(n * 4)}, [=] {
                op->backend().zero(op->flat(x));
            }};
}

// Each family: how to build a case, its tiny shape (the overhead) and its ladder (--quick: the first `quick`).
struct FamilyPlan {
    OpFamily family;
    Builder build;
    std::vector<int64_t> tiny;
    std::vector<std::vector<int64_t>> ladder;
    size_t quick;
};

std::vector<FamilyPlan> family_plans(BackendKind kind) {
    using F = OpFamily;
    const std::vector<std::vector<int64_t>> gemms = {{64, 256, 256},   {256, 256, 768},   {256, 768, 768},
                                                     {1024, 768, 768}, {1024, 768, 3072}, {4096, 768, 3072}};
    const std::vector<std::vector<int64_t>> attn = {
        {1, 64, 12, 12, 64}, {1, 256, 12, 12, 64}, {4, 256, 12, 12, 64}, {1, 1024, 12, 12, 64}};
    const std::vector<std::vector<int64_t>> rows = {{64, 768}, {512, 768}, {4096, 768}, {16384, 768}};
    const std::vector<std::vector<int64_t>> elems = {{49152}, {393216}, {3145728}, {12582912}};
    using namespace std::placeholders;
    return {
        {F::kMatmulForward, matmul_fwd, {1, 16, 16}, gemms, 3},
        {F::kMatmulBackward, matmul_bwd, {1, 16, 16}, gemms, 3},
        {F::kAttentionForward, std::bind(attention, _1, _2, _3, false), {1, 1, 1, 1, 16}, attn, 2},
        {F::kAttentionBackward, std::bind(attention, _1, _2, _3, true), {1, 1, 1, 1, 16}, attn, 2},
        {F::kNormForward, std::bind(norm, _1, _2, _3, false), {1, 16}, rows, 2},
        {F::kNormBackward, std::bind(norm, _1, _2, _3, true), {1, 16}, rows, 2},
        {F::kActivationForward, std::bind(activation, _1, _2, _3, false), {16}, elems, 2},
        {F::kActivationBackward, std::bind(activation, _1, _2, _3, true), {16}, elems, 2},
        {F::kResidual, residual, {16}, elems, 2},
        {F::kEmbeddingForward,
         std::bind(embedding, _1, _2, _3, false),
         {1, 16, 16},
         {{64, 50304, 768}, {512, 50304, 768}, {4096, 50304, 768}},
         2},
        {F::kEmbeddingBackward,
         std::bind(embedding, _1, _2, _3, true),
         {1, 16, 16},
         {{64, 50304, 768}, {512, 50304, 768}, {4096, 50304, 768}},
         2},
        {F::kCrossEntropy, cross_entropy, {1, 16}, {{64, 8192}, {256, 50304}, {1024, 50304}}, 2},
        {F::kLmHeadLoss,
         std::bind(lm_head_loss, _1, _2, _3, kind),
         {1, 16, 16},
         {{64, 768, 8192}, {256, 768, 8192}, {1024, 768, 8192}},
         1},
        {F::kAdamW, adamw, {16}, {{10000}, {100000}, {1000000}, {10000000}}, 2},
        {F::kMemset, memset, {64}, {{65536}, {1048576}, {16777216}, {268435456}}, 2},
    };
}

// The largest cache of the host's first core, from sysfs ("32768K"); 32 MiB when it says nothing.
size_t last_level_cache_bytes() {
    size_t largest = 0;
    for (int i = 0; i < 8; ++i) {
        std::ifstream in(fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/size", i));
        size_t n = 0;
        char unit = 0;
        if (!(in >> n)) continue;
        in >> unit;
        largest = std::max(largest, n << (unit == 'K' ? 10 : unit == 'M' ? 20 : 0));
    }
    return largest > 0 ? largest : size_t{32} << 20;
}

// Before each timed run on the host: writes and reads twice its last-level cache, so that the op finds its weights,
// gradients and inputs beyond the caches, as a step's ops find them after the rest of the model's ops have passed
// through, rather than where its own previous run left them.
volatile float g_sweep_sum;  // read back, so that no compiler drops the sweep
void evict_host_caches() {
    static std::vector<float> sweep(2 * last_level_cache_bytes() / sizeof(float), 1.0f);
    float sum = 0;
    for (float& x : sweep) {
        x += 1.0f;
        sum += x;
    }
    g_sweep_sum = sum;
}

// The shortest seconds of one run of c, after a warm-up: at least min_runs runs and min_seconds in all (with the
// evictions between them, on the host), unless two runs already took kMaxSeconds. The shortest, not the median: on a
// machine shared with other work an OpenMP barrier that waits for a descheduled thread adds whole scheduler time slices
// to a run, which only the fastest runs are free of, and more runs of a small op give it more chances of one.
double time_case(Backend& be, const Case& c, int min_runs, double min_seconds) {
    constexpr double kMaxSeconds = 1.5;
    const double t_warm = now_seconds();
    c.run();
    be.synchronize();
    // A device runs a batch of launches between synchronizations (so the launches overlap the kernels, as in a step)
    // of about a millisecond; the host runs one op per run.
    const double warm = now_seconds() - t_warm;
    const int batch = be.asynchronous() ? std::clamp(static_cast<int>(1e-3 / std::max(warm, 1e-7)), 1, 100) : 1;
    std::vector<double> t;
    double total = 0;
    constexpr int kMaxRuns = 200;
    auto more = [&] {
        const int runs = static_cast<int>(t.size());
        if (runs >= kMaxRuns || (runs >= 2 && total >= kMaxSeconds)) return false;
        return runs < min_runs || total < min_seconds;
    };
    while (more()) {
        const double t_start = now_seconds();
        if (!be.asynchronous()) evict_host_caches();
        const double t0 = now_seconds();
        for (int i = 0; i < batch; ++i) c.run();
        be.synchronize();
        const double t1 = now_seconds();
        t.push_back((t1 - t0) / batch);
        total += t1 - t_start;
    }
    return *std::min_element(t.begin(), t.end());
}

std::string utc_now() {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    char buf[32];
    std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
            return line.substr(line.find(':') + 2);
    }
    return "unknown CPU";
}

// The 1-minute load average.
double read_load_average() {
    double load = 0;
    std::ifstream("/proc/loadavg") >> load;
    return load;
}

// The load for the profile's source, and a warning when other work wants the cores the ops will run on (`threads`
// over all the ranks): a busy machine's measurements include waits for it.
std::string machine_load(double load, int threads, std::string& warning) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    if (threads > 0 && load > cores - threads + 0.5) {
        warning = fmt::format(
            "calibrate: WARNING: the machine is busy (load average {:.1f} on {} cores, and the ops want {} of them): "
            "the times will include waits for other work\n---> HINT: calibrate on an idle machine, or with fewer "
            "--threads or ranks",
            load, cores, threads);
    }
    return fmt::format("load average {:.1f} on {} cores at the start", load, cores);
}

std::string human_rate(double rate, sim::Bound b) {
    return b == sim::Bound::kCompute ? fmt::format("{:8.1f} GFLOP/s", rate / 1e9)
                                     : fmt::format("{:8.2f} GB/s   ", rate / 1e9);
}

// The links: a GPU's estimate when calibrate runs on one we have an estimate for, else the CPU link emulation's
// defaults (engine/config/config.h LinkModelConfig); then, under mpirun with two ranks or more on this host, the
// intra-node link as measured (sim::probe_link), the inter-node one left as it was.
void set_links(sim::Profile& p, const sim::LinkProbe* probe) {
    if (probe != nullptr) {
        set_links(p, nullptr);
        p.intra_node = probe->link;
        const auto list = [](const std::vector<sim::LinkSample>& samples) {
            std::string out;
            for (const sim::LinkSample& s : samples)
                out += fmt::format("{}{:.0f} B {:.2f} us", out.empty() ? "" : ", ", s.bytes, s.one_way_s * 1e6);
            return out;
        };
        p.links_source = fmt::format(
            "intra_node measured: MPI ping-pong between two ranks of this host, one way {} (alpha: the smallest, "
            "bytes/s: the slope to the largest); fp32 all-reduces over the {} ranks {} (reduce_bytes_per_s: what "
            "they took beyond the ring's transfers, per byte each rank adds; absent: no longer); inter_node {}",
            list(probe->samples), probe->ranks, list(probe->all_reduce), p.links_source);
        return;
    }
    for (const std::string& name : sim::estimate_profile_names()) {
        const sim::Profile e = sim::estimate_profile(name);
        const DevicePeak* mine = find_device_peak(p.device);
        if (p.backend == "cuda" && mine != nullptr && mine == find_device_peak(e.device)) {
            p.intra_node = e.intra_node;
            p.inter_node = e.inter_node;
            p.links_source = "not measured: the " + name + " estimate's (" + e.links_source + ")";
            return;
        }
    }
    const LinkModelConfig lm;
    p.intra_node = {lm.intra_node_latency_us * 1e-6, lm.intra_node_bandwidth_gbps * 1e9};
    p.inter_node = {lm.inter_node_latency_us * 1e-6, lm.inter_node_bandwidth_gbps * 1e9};
    p.links_source =
        "not measured: the link model's defaults (engine/config/config.h LinkModelConfig); `mpirun -np 2 "
        "mindspeed-train calibrate` measures the intra-node link";
}

// How each case is timed: at least `runs` runs and `seconds` in all (time_case). Under mpirun every rank times every
// case at the same moment, after a barrier of `ranks`, because in a step every rank computes at once and the cores
// of a host share its memory bandwidth and clock; only rank 0 (`report`) prints and writes.
struct Timing {
    int runs = 3;
    double seconds = 0.2;
    Communicator* ranks = nullptr;  // null: one process
    bool report = true;
};

// One family measured: the tiny shape's time gives the overhead (at most half the shortest point's, so that every
// point keeps a positive time of its own), each ladder shape a point whose rate is work / (time - overhead).
// c timed as `timing` says, every rank at once; rank 0 prints its line.
double timed_case(Backend& be, const Case& c, OpFamily f, const Timing& timing) {
    if (timing.ranks != nullptr) timing.ranks->barrier();
    const double seconds = time_case(be, c, timing.runs, timing.seconds);
    if (timing.report) {
        std::printf("  %-15s %-28s %9.3g %-4s %9.3f ms\n", sim::family_name(f), c.shape.c_str(), c.work.work(),
                    sim::family_bound(f) == sim::Bound::kCompute ? "FLOP" : "B", seconds * 1e3);
        std::fflush(stdout);
    }
    return seconds;
}

sim::FamilyCurve measure_family(Backend& be, DType D, const FamilyPlan& f, size_t shapes, const Timing& timing) {
    const sim::Bound bound = sim::family_bound(f.family);
    Timing quiet = timing;
    quiet.report = false;
    const double tiny = timed_case(be, f.build(be, D, f.tiny), f.family, quiet);
    std::vector<std::pair<double, double>> measured;  // work, seconds
    for (size_t i = 0; i < shapes; ++i) {
        const Case c = f.build(be, D, f.ladder[i]);
        measured.emplace_back(c.work.work(), timed_case(be, c, f.family, timing));
    }
    sim::FamilyCurve curve;
    double shortest = tiny;
    for (const auto& m : measured) shortest = std::min(shortest, m.second);
    curve.overhead_s = std::min(tiny, 0.5 * shortest);
    for (const auto& [work, seconds] : measured) curve.points.push_back({work, work / (seconds - curve.overhead_s)});
    std::sort(curve.points.begin(), curve.points.end(),
              [](const sim::RatePoint& x, const sim::RatePoint& y) { return x.work < y.work; });
    if (timing.report) {
        std::printf("  %-15s overhead %.2f us; rates:", sim::family_name(f.family), curve.overhead_s * 1e6);
        for (const sim::RatePoint& r : curve.points) std::printf(" %s", human_rate(r.rate, bound).c_str());
        std::printf("\n");
    }
    return curve;
}

// The MFU denominator of the table: a GPU's datasheet peak (device_peak.cpp); else the best matmul measured, or on the
// CPU in fp32 the trainer's sgemm probe when that is higher (both are measurements, and a busy machine lowers either).
void set_peak(sim::DTypeTable& table, const Backend& be, BackendKind kind) {
    const DevicePeak* peak = find_device_peak(be.device_name());
    if (kind == BackendKind::kCUDA && peak != nullptr) {
        table.matmul_peak_flops = table.dtype == kF32 ? peak->fp32 : peak->bf16;
        table.peak_source =
            fmt::format("engine/train/device_peak.cpp: {} dense {}", peak->device, dtype_name(table.dtype));
        return;
    }
    double best = 0;
    for (const sim::RatePoint& r : table.of(OpFamily::kMatmulForward).points) best = std::max(best, r.rate);
    const double probe = kind == BackendKind::kCPU && table.dtype == kF32 ? cpu::sgemm_peak_flops() : 0;
    table.matmul_peak_flops = std::max(best, probe);
    table.peak_source = probe > best ? "measured: the sgemm probe (engine/backends/cpu/probe.h), the trainer's MFU "
                                       "denominator"
                                     : "measured: the best matmul_fwd point";
}

// What calibrate measures: the config (its model's op shapes with --world-size), the activation dtype and the
// backend's options, from the config and the command line.
struct Setup {
    Config cfg;
    DType act;
    BackendOptions backend;
};
Setup calibrate_setup(const CalibrateArgs& a) {
    Config cfg;
    if (!a.config_path.empty() || !a.overrides.empty()) cfg = load_config(a.config_path, a.overrides);
    if (!a.world_sizes.empty() && a.config_path.empty())
        throw UserError(
            "calibrate: --world-size measures the op shapes of a config's model, and no --config was given\n---> "
            "HINT: pass the config you will plan (`plan --search --world-size N`) with --config");
    for (const int w : a.world_sizes)
        if (w < 1)
            throw UserError(fmt::format(
                "calibrate: --world-size {} is not a number of ranks\n---> HINT: pass the world sizes you will "
                "plan for, e.g. --world-size 8",
                w));
    MixedPrecisionConfig mp;
    mp.dtype = a.dtype.empty() ? cfg.mixed_precision.dtype : a.dtype;
    if (mp.dtype != "fp32" && mp.dtype != "bf16" && mp.dtype != "fp16")
        throw UserError(
            fmt::format("calibrate: --dtype {} is not a dtype; the dtypes are fp32, bf16 and fp16\n---> "
                        "HINT: pass --dtype bf16 for a bf16 run's profile",
                        mp.dtype));
    const std::filesystem::path dir = std::filesystem::path(a.output).parent_path();
    if (!dir.empty() && !std::filesystem::is_directory(dir))
        throw UserError(
            fmt::format("calibrate: --output {}: the directory '{}' does not exist\n---> HINT: create it, or "
                        "write the profile elsewhere",
                        a.output, dir.string()));
    BackendOptions bo;
    bo.kind = parse_backend_kind(cfg.run.backend);
    bo.num_threads = a.threads > 0 ? a.threads : cfg.run.num_threads;
    bo.cuda = cuda_debug_options(cfg.debug);
    return {cfg, model_dtype(mp), bo};
}

// The ops of a.config's model at every shape `plan --search` and `plan --simulate` price on a.world_sizes ranks
// (planned_op_shapes), each timed as itself into the table's shape_seconds. `p` holds the table's curves already:
// they price the layouts while the shapes are collected.
void measure_shapes(Backend& be, const Setup& setup, const CalibrateArgs& a, sim::Profile& p, const Timing& timing) {
    sim::DTypeTable& table = p.tables.back();
    const std::vector<sim::OpShape> shapes =
        planned_op_shapes(setup.cfg, a.world_sizes, a.ranks_per_node, sim::ProfileCostModel(p), p.device_memory_bytes);
    const std::vector<FamilyPlan> plans = family_plans(setup.backend.kind);
    if (timing.report)
        std::printf("calibrate: the model's own op shapes for world sizes %s: %zu\n",
                    fmt::format("{}", fmt::join(a.world_sizes, ", ")).c_str(), shapes.size());
    for (const sim::OpShape& shape : shapes) {
        const auto plan =
            std::find_if(plans.begin(), plans.end(), [&](const FamilyPlan& f) { return f.family == shape.family; });
        MS_CHECK(plan != plans.end(), "calibrate: no builder for the op family {}", sim::family_name(shape.family));
        const Case c = plan->build(be, setup.act, shape.dims);
        table.shape_seconds[c.key] = timed_case(be, c, shape.family, timing);
    }
}

int run_calibrate(const CalibrateArgs& a) {
    const double t_start = now_seconds();
    const Setup setup = calibrate_setup(a);
    const DType D = setup.act;
    const BackendOptions& bo = setup.backend;
    // Under mpirun every rank measures the link first; then every rank times the ops at once (Timing), and rank 0
    // prints and writes the profile. One process alone starts no MPI: there is no link to measure.
    std::optional<MpiRuntime> mpi;
    if (launched_as_several_ranks()) mpi.emplace();
    const int ranks = mpi ? mpi->size() : 1;
    const double load_average = read_load_average();  // before the link probe, whose ranks it would count
    std::optional<sim::LinkProbe> probe;
    if (ranks > 1) {
        if (mpi->num_nodes() > 1)
            throw UserError(fmt::format(
                "calibrate: the {} ranks run on {} hosts; the link it measures is the one inside a host\n---> HINT: "
                "run `mpirun -np 2 mindspeed-train calibrate ...` on one host",
                mpi->size(), mpi->num_nodes()));
        probe = sim::probe_link(mpi->world(), a.quick);
        if (mpi->rank() == 0)
            std::printf(
                "calibrate: intra-node link (MPI between ranks 0 and 1): alpha %.2f us, %.2f GB/s; all-reduces "
                "of %d ranks reduce at %.2f GB/s (0: no slower than their transfers)\n",
                probe->link.alpha_s * 1e6, probe->link.bytes_per_s / 1e9, probe->ranks,
                probe->link.reduce_bytes_per_s / 1e9);
    }
    Timing timing = a.quick ? Timing{2, 0.002} : Timing{};
    if (ranks > 1) timing.ranks = &mpi->world();
    timing.report = !mpi || mpi->rank() == 0;
    const std::unique_ptr<Backend> be = make_backend(bo);

    sim::Profile p;
    p.backend = bo.kind == BackendKind::kCUDA ? "cuda" : "cpu";
    p.name = be->device_name().empty() ? "cpu" : be->device_name();
    p.device = be->device_name().empty() ? fmt::format("{} (OpenBLAS {})", cpu_model(), cpu::blas_kernel_name())
                                         : be->device_name();
    p.threads = bo.kind == BackendKind::kCPU ? omp_get_max_threads() : 0;
    p.cores = bo.kind == BackendKind::kCPU ? static_cast<int>(std::thread::hardware_concurrency()) : 0;
    p.date = utc_now();
    std::string busy;
    const std::string load = machine_load(load_average, p.threads * ranks, busy);
    p.source = fmt::format("measured by mindspeed-train {} calibrate{} on the {} backend{}; {}", MS_VERSION,
                           a.quick ? " --quick" : "", be->name(),
                           ranks > 1 ? fmt::format(", {} ranks timing every op at once", ranks) : "", load);
    p.device_memory_bytes = static_cast<int64_t>(be->device_memory().total_bytes);
    set_links(p, probe ? &*probe : nullptr);
    if (timing.report) {
        if (!busy.empty()) std::fprintf(stderr, "%s\n", busy.c_str());
        std::printf("%s\n", fmt::format("calibrate: {}, {}, {}{}{}", p.device, dtype_name(D),
                                        p.threads > 0 ? fmt::format("{} thread{}", p.threads, p.threads > 1 ? "s" : "")
                                                      : std::string(be->name()),
                                        ranks > 1 ? fmt::format(" a rank, {} ranks at once", ranks) : "",
                                        a.quick ? " (quick)" : "")
                                .c_str());
        std::printf("  %-15s %-28s %14s %12s\n", "family", "shape", "work", "time");
    }
    sim::DTypeTable table;
    table.dtype = D;
    for (const FamilyPlan& f : family_plans(bo.kind))
        table.of(f.family) =
            measure_family(*be, D, f, a.quick ? std::min(f.quick, f.ladder.size()) : f.ladder.size(), timing);
    // the streaming rate out of caches: the residual add's largest point
    p.memory_bytes_per_s = table.of(OpFamily::kResidual).points.back().rate;
    set_peak(table, *be, bo.kind);
    p.tables.push_back(std::move(table));
    if (!a.world_sizes.empty()) measure_shapes(*be, setup, a, p, timing);
    if (!timing.report) return kExitOk;
    sim::save_profile(p, a.output);
    std::printf("calibrate: matmul peak %.1f GFLOP/s (%s), streaming %.2f GB/s; wrote %s in %.1f s\n",
                p.tables[0].matmul_peak_flops / 1e9, p.tables[0].peak_source.c_str(), p.memory_bytes_per_s / 1e9,
                a.output.c_str(), now_seconds() - t_start);
    return kExitOk;
}

}  // namespace

Command add_calibrate_command(CLI::App& parent) {
    CLI::App* cmd = parent.add_subcommand(
        "calibrate",
        "Time every op family over a ladder of shapes on the backend at hand and write a profile for `plan "
        "--simulate` (docs/planner.md); under `mpirun -np 2` also the link between two ranks of this host");
    auto a = std::make_shared<CalibrateArgs>();
    cmd->add_option("-o,--output", a->output, "The profile file (JSON) to write")->required();
    cmd->add_option("-c,--config", a->config_path,
                    "YAML config (optional): its run.backend, run.num_threads and mixed_precision.dtype say what to "
                    "measure")
        ->check(CLI::ExistingFile);
    cmd->add_option("--set", a->overrides, "Override one config key: section.key=value (repeatable)")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    cmd->add_option("--threads", a->threads, "CPU threads (default: run.num_threads, else OpenMP's)");
    cmd->add_option("--dtype", a->dtype, "Activation dtype: fp32, bf16 or fp16 (default: mixed_precision.dtype)");
    cmd->add_option("--world-size", a->world_sizes,
                    "Also time, each as itself, every matmul, attention and LM-head shape of the --config's model "
                    "that `plan --search` and `plan --simulate` price on this many ranks (repeatable)")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    cmd->add_option("--ranks-per-node,--gpus-per-node", a->ranks_per_node,
                    "Ranks per node of those plans (default: run.ranks_per_node, else 8)");
    cmd->add_flag("--quick", a->quick, "A few shapes per family, briefly timed (seconds): for tests");
    return {cmd, [a]() { return run_calibrate(*a); }};
}

}  // namespace ms::app
