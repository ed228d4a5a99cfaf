// recompute_options.h: which activations a chunk recomputes instead of keeping (Megatron's recompute_granularity,
// recompute_method and recompute_num_layers); the pass is engine/graph/recompute.cpp (passes.h).
//   kFull       every op of a layer runs again before its backward: only its input stays
//   kSelective  the cheap ops run again (LayerNorms, with the tensor-parallel copy or all-gather after them, and the
//               GELU): a layer keeps its GEMM outputs, the attention's output and statistics, the LayerNorms' inputs
// Which layers (kFull): kUniform every layer (groups of recompute_num_layers, which must be 1), kBlock the first
// num_layers of the chunk. kSelective: every layer.
#pragma once

#include <compare>
#include <cstdint>

namespace ms::graph {

enum class RecomputeGranularity : uint8_t { kNone, kFull, kSelective };
enum class RecomputeMethod : uint8_t { kUniform, kBlock };
struct RecomputeOptions {
    RecomputeGranularity granularity = RecomputeGranularity::kNone;
    RecomputeMethod method = RecomputeMethod::kUniform;
    int num_layers = 1;  // kBlock: the chunk's first num_layers layers; kUniform: layers per group (1)
    auto operator<=>(const RecomputeOptions&) const = default;
    // Whether the chunk's `index`-th layer (0-based within the chunk) is recomputed.
    bool recomputes(int index) const {
        if (granularity == RecomputeGranularity::kNone) return false;
        if (granularity == RecomputeGranularity::kFull && method == RecomputeMethod::kBlock) return index < num_layers;
        return true;
    }
};

}  // namespace ms::graph
