// test_clip_run.cpp: CLIP (model.arch: clip) trains the same model under every tensor x data parallel layout as on
// one rank: the contrastive loss all-gathers the features, so the global batch's negatives, its loss and its
// gradient are the same whatever the layout (engine/clip/clip_model.h). Each layout runs tests/parallel/
// tiny-clip.yaml with only the layout and the per-rank batch changed; the losses of its 8 steps are compared with
// one rank's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "tests/common/clip_train.h"

namespace ms::test {
namespace {

struct Layout {
    const char* name;
    int ranks, tp, micro_batch;
};

// Tolerance: the layouts differ from one rank in the order of fp32 sums (the features' gradients are
// reduce-scattered over dp, parameter gradients averaged over dp, row-parallel matmuls summed over tp). Over 8
// steps the largest difference measured was 2.4e-7 in every layout (one fp32 ulp of a loss near 2); 1e-5 leaves
// room for other BLAS kernels.
TEST(ClipLayouts, EveryLayoutTrainsAsOneRank) {
    const TrainRun one = run_tiny_clip(1, "");
    ASSERT_EQ(one.losses.size(), 8u) << one.output;
    for (const Layout& l :
         {Layout{"dp2", 2, 1, 4}, Layout{"dp4", 4, 1, 2}, Layout{"tp2", 2, 2, 8}, Layout{"tp2_dp2", 4, 2, 4}}) {
        SCOPED_TRACE(l.name);
        const TrainRun r =
            run_tiny_clip(l.ranks, "--set parallel.tensor_model_parallel_size=" + std::to_string(l.tp) +
                                       " --set training.micro_batch_size=" + std::to_string(l.micro_batch));
        ASSERT_EQ(r.losses.size(), one.losses.size()) << r.output;
        double worst = 0;
        for (size_t i = 0; i < r.losses.size(); ++i) worst = std::max(worst, std::abs(r.losses[i] - one.losses[i]));
        std::printf("%s: largest loss difference from one rank over %zu steps: %.3g\n", l.name, r.losses.size(), worst);
        EXPECT_LT(worst, 1e-5);
        EXPECT_LT(r.losses.back(), r.losses.front()) << "the loss did not fall";
    }
}

// With cross-modal layers (clip.cross_modal_layers) tensor parallelism still trains as one rank: the hard negatives
// are drawn from features every tp rank holds whole, with the same Philox numbers, so every rank pairs the same
// samples, and the fusion's heads are split as the towers' are. (Data parallelism changes the matching loss: each
// rank draws its negatives from its own samples, as ALBEF does.) Tolerance as above: the largest difference measured
// over 8 steps was 2.4e-7 (contrastive) and 0 (matching).
TEST(ClipLayouts, CrossModalLayersTrainAsOneRankUnderTensorParallelism) {
    const std::string itm = " --set clip.cross_modal_layers=1";
    const TrainRun one = run_tiny_clip(1, itm);
    const TrainRun tp2 = run_tiny_clip(2, itm + " --set parallel.tensor_model_parallel_size=2");
    ASSERT_EQ(one.itm_losses.size(), 8u) << one.output;
    ASSERT_EQ(tp2.itm_losses.size(), 8u) << tp2.output;
    ASSERT_EQ(tp2.losses.size(), 8u) << tp2.output;
    double worst = 0, worst_itm = 0;
    for (size_t i = 0; i < 8; ++i) {
        worst = std::max(worst, std::abs(tp2.losses[i] - one.losses[i]));
        worst_itm = std::max(worst_itm, std::abs(tp2.itm_losses[i] - one.itm_losses[i]));
    }
    std::printf("tp2 with a cross-modal layer: largest difference from one rank: %.3g (contrastive), %.3g (matching)\n",
                worst, worst_itm);
    EXPECT_LT(worst, 1e-5);
    EXPECT_LT(worst_itm, 1e-5);
    EXPECT_GT(one.itm_losses.front(), 0.3);  // a real loss, not zeros
}

}  // namespace
}  // namespace ms::test
