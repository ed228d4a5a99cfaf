// test_contrastive_loss_dp.cpp: engine/clip/contrastive_loss.h over real data-parallel groups against one rank holding
// the whole batch (SelfCommunicator, computed on every rank).
//
// The world splits into groups of dp consecutive ranks for every dp that divides the world size (1, 2, 4, 8 under
// mpiexec -n 8). Every group trains on the same N = 16 global rows, rank r of a group holding rows r*b .. r*b+b-1
// (b = N / dp). What must match the one-rank run:
//   - the global loss and the image->text accuracy;
//   - each rank's feature gradients: d(sum over the group of local losses)/d(its rows) = dp * the one-rank gradient
//     of the global mean loss for those rows (the trainer's dp average of parameter gradients then gives the
//     gradient of the global mean);
//   - the mean over the group of the ranks' logit-scale gradients (each of its own local loss) = the one-rank one.
// dp = 1 runs the same arithmetic on an MPI group of one as on SelfCommunicator: the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "engine/clip/contrastive_loss.h"
#include "tests/comm/comm_test.h"
#include "tests/common/contrastive_loss_grads.h"
#include "tests/ops/op_test_util.h"

namespace ms::test {
namespace {

constexpr int64_t kN = 16, kD = 24;
constexpr float kLogitScaleParam = 3.0f;

ContrastiveLossGrads run(const std::vector<float>& image, const std::vector<float>& text, int64_t b, Communicator& dp) {
    return contrastive_loss_grads(image, text, b, kD, kLogitScaleParam, dp);
}

// rows [first, first + rows) of v (., kD), times `factor`
std::vector<double> rows_of(const std::vector<float>& v, int64_t first, int64_t rows, double factor) {
    std::vector<double> out(static_cast<size_t>(rows * kD));
    for (size_t i = 0; i < out.size(); ++i) out[i] = factor * v[static_cast<size_t>(first * kD) + i];
    return out;
}

// The largest of `err` over the world (every rank gets it), printed by rank 0 with MS_OP_TEST_VERBOSE.
double worst(const std::string& what, int dp, double err) {
    float e = static_cast<float>(err);
    world().all_reduce(std::span<float>(&e, 1), ReduceOp::kMax).wait();
    if (world().rank() == 0 && std::getenv("MS_OP_TEST_VERBOSE"))
        std::printf("  dp %d %-36s err %.2e\n", dp, what.c_str(), e);
    return e;
}

TEST(ContrastiveLossDp, EveryGroupSizeMatchesOneRankHoldingTheWholeBatch) {
    const std::vector<float> image = random_floats(kN * kD, 61), text = random_floats(kN * kD, 62);
    SelfCommunicator self("dp");
    const ContrastiveLossGrads whole = run(image, text, kN, self);
    for (int dp = 1; dp <= world().size(); ++dp) {
        if (world().size() % dp != 0 || kN % dp != 0) continue;
        SCOPED_TRACE("dp " + std::to_string(dp));
        std::unique_ptr<Communicator> group = world().split(world().rank() / dp, world().rank() % dp, "dp");
        const int64_t b = kN / dp, first = group->rank() * b;
        const std::vector<float> my_image(image.begin() + first * kD, image.begin() + (first + b) * kD);
        const std::vector<float> my_text(text.begin() + first * kD, text.begin() + (first + b) * kD);
        const ContrastiveLossGrads part = run(my_image, my_text, b, *group);

        float dlogit_mean = part.r.dlogit_scale_param;
        group->all_reduce(std::span<float>(&dlogit_mean, 1), ReduceOp::kAvg).wait();
        EXPECT_EQ(part.r.i2t_accuracy, whole.r.i2t_accuracy);
        EXPECT_EQ(part.r.logit_scale, whole.r.logit_scale);
        if (dp == 1) {
            EXPECT_EQ(part.r.loss, whole.r.loss);
            EXPECT_EQ(part.r.dlogit_scale_param, whole.r.dlogit_scale_param);
            EXPECT_TRUE(bit_identical(part.dimage, whole.dimage));
            EXPECT_TRUE(bit_identical(part.dtext, whole.dtext));
        }
        // The group sums fp32 partial gradients and losses where one rank sums in double: a few fp32 roundings
        // apart. Measured 0 (loss, mean dlogit) and <= 1.7e-7 (gradients) at dp 2, 4, 8; the bounds leave ~6x.
        const double loss_err = std::fabs(part.r.loss - whole.r.loss) / std::fabs(whole.r.loss);
        const double dimage_err = max_rel_error(part.dimage, rows_of(whole.dimage, first, b, dp));
        const double dtext_err = max_rel_error(part.dtext, rows_of(whole.dtext, first, b, dp));
        const double dlogit_err =
            std::fabs(dlogit_mean - whole.r.dlogit_scale_param) / std::fabs(whole.r.dlogit_scale_param);
        EXPECT_LE(worst("global loss", dp, loss_err), 5e-7);
        EXPECT_LE(worst("dimage vs dp * one-rank rows", dp, dimage_err), 1e-6);
        EXPECT_LE(worst("dtext vs dp * one-rank rows", dp, dtext_err), 1e-6);
        EXPECT_LE(worst("mean dlogit_scale vs one rank", dp, dlogit_err), 1e-6);
    }
}

}  // namespace
}  // namespace ms::test
