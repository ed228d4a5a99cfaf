// test_loss_scaler.cpp: fp16's dynamic loss scaling follows Megatron's DynamicGradScaler step by step (hysteresis,
// backoff to min_loss_scale, growth after loss_scale_window good steps); constant and bf16/fp32 scalers never move.
#include <gtest/gtest.h>

#include <vector>

#include "engine/optim/loss_scaler.h"

namespace ms {
namespace {

MixedPrecisionConfig fp16(double initial = 1024, double min_scale = 1, int window = 3, int hysteresis = 2) {
    MixedPrecisionConfig c;
    c.dtype = "fp16";
    c.initial_loss_scale = initial;
    c.min_loss_scale = min_scale;
    c.loss_scale_window = window;
    c.hysteresis = hysteresis;
    return c;
}

TEST(LossScaler, DynamicFollowsMegatronsScaler) {
    LossScaler s(fp16());
    ASSERT_TRUE(s.enabled());
    ASSERT_TRUE(s.dynamic());
    // (overflow?, scale after the update) -- hysteresis 2: the first overflow only spends hysteresis; a good step
    // does not restore it, so the next overflow halves; three good steps double and restore hysteresis.
    const std::vector<std::pair<bool, float>> steps = {
        {true, 1024}, {true, 512}, {false, 512}, {true, 256},  {false, 256},  {false, 256},
        {false, 512}, {true, 512}, {false, 512}, {false, 512}, {false, 1024}, {true, 1024},
    };
    for (size_t i = 0; i < steps.size(); ++i) {
        s.update(steps[i].first);
        EXPECT_EQ(s.scale(), steps[i].second) << "after update " << i;
    }
    EXPECT_EQ(s.state().hysteresis_tracker, 1);
    EXPECT_EQ(s.state().growth_tracker, 0);
}

TEST(LossScaler, NeverDropsBelowTheMinimum) {
    LossScaler s(fp16(/*initial=*/8, /*min=*/2, /*window=*/1000, /*hysteresis=*/1));
    for (float expected : {4.0f, 2.0f, 2.0f, 2.0f}) {
        s.update(true);
        EXPECT_EQ(s.scale(), expected);
    }
}

TEST(LossScaler, StateRoundTripsForResume) {
    LossScaler a(fp16()), b(fp16());
    for (bool o : {true, false, true, false, false}) a.update(o);
    b.set_state(a.state());
    for (bool o : {false, true, false, false, false, true}) {
        a.update(o);
        b.update(o);
        EXPECT_EQ(a.scale(), b.scale());
    }
}

TEST(LossScaler, ConstantScaleAndOtherDtypesNeverMove) {
    MixedPrecisionConfig c = fp16();
    c.loss_scale = 128;
    LossScaler constant(c);
    EXPECT_TRUE(constant.enabled());
    EXPECT_FALSE(constant.dynamic());
    for (bool o : {true, true, false}) constant.update(o);
    EXPECT_EQ(constant.scale(), 128.0f);
    for (const char* dtype : {"fp32", "bf16"}) {
        MixedPrecisionConfig m;
        m.dtype = dtype;
        LossScaler s(m);
        EXPECT_FALSE(s.enabled()) << dtype;
        s.update(true);
        EXPECT_EQ(s.scale(), 1.0f) << dtype;
    }
}

}  // namespace
}  // namespace ms
