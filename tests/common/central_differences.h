// central_differences.h: a model's gradients checked against central differences of its loss (the CLIP and
// policy-value model tests). Header-only; the model needs grads(), params(), params_info() and flat_size().
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/model/gpt.h"

namespace ms::test {

// The step and the bound of expect_central_differences.
struct CentralDifferences {
    double h;        // the step added to and taken from a weight
    double rel_tol;  // of the largest gradient checked
    double abs_tol;
};

// The gradients the last step left in model.grads() against central differences (loss(w + h) - loss(w - h)) / 2h,
// for elements 0, numel / 2 and numel - 1 of every parameter (each restored after): each within rel_tol of the
// largest gradient checked, plus abs_tol, and that largest above 1e-3. `loss` runs the step again on the same batch
// and returns the loss whose gradient it computed.
template <typename Model>
void expect_central_differences(Model& model, const std::function<double()>& loss, const CentralDifferences& cd) {
    const std::vector<float> grads(model.grads(), model.grads() + model.flat_size());
    float* params = model.params();
    struct Check {
        std::string name;
        double analytic, numeric;
    };
    std::vector<Check> checks;
    double largest = 0;
    for (const ParamInfo& p : model.params_info()) {
        for (int64_t k : {int64_t{0}, p.numel / 2, p.numel - 1}) {
            float& w = params[p.offset + k];
            const float saved = w;
            w = static_cast<float>(saved + cd.h);
            const double up = loss();
            w = static_cast<float>(saved - cd.h);
            const double down = loss();
            w = saved;
            const double numeric = (up - down) / (2 * cd.h), analytic = grads[static_cast<size_t>(p.offset + k)];
            checks.push_back({p.name + "[" + std::to_string(k) + "]", analytic, numeric});
            largest = std::max(largest, std::abs(analytic));
        }
    }
    ASSERT_GT(largest, 1e-3);
    for (const Check& c : checks) EXPECT_NEAR(c.analytic, c.numeric, cd.rel_tol * largest + cd.abs_tol) << c.name;
}

}  // namespace ms::test
