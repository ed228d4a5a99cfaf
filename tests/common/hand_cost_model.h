// hand_cost_model.h: a CostModel (engine/sim/cost_model.h) with hand-set numbers, for tests whose expected step
// times are worked out by hand: every matmul (forward, fused with GELU, backward) costs `matmul_s`, every other op
// `other_s`, the optimizer `optimizer_s_per_elem` per parameter, zeroing `memory_s_per_byte`, and the links are
// the given alpha and beta inside and between nodes.
#pragma once

#include <string>

#include "engine/sim/cost_model.h"

namespace ms::test {

struct HandCostModel final : sim::CostModel {
    double matmul_s = 0, other_s = 0;
    double optimizer_s_per_elem = 0, memory_s_per_byte = 0;
    double peak = 1e12;
    LinkParams intra{0, 1e9}, inter{0, 1e8};

    std::string describe() const override { return "hand-set costs"; }
    double op_seconds(const graph::Graph&, const graph::Node& n) const override {
        using graph::OpCode;
        const bool matmul = n.op == OpCode::kMatmul || n.op == OpCode::kMatmulGelu || n.op == OpCode::kMatmulBackward;
        return matmul ? matmul_s : other_s;
    }
    double optimizer_seconds(int64_t elements, DType) const override {
        return static_cast<double>(elements) * optimizer_s_per_elem;
    }
    double memory_seconds(int64_t bytes) const override { return static_cast<double>(bytes) * memory_s_per_byte; }
    double peak_flops(DType) const override { return peak; }
    LinkModel links() const override { return LinkModel{intra, inter, nullptr}; }
};

}  // namespace ms::test
