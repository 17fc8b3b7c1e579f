// Megatron-LM's loss scalers as closed forms: hysteresis, backoff to the floor, growth after a
// clean window (which alone restores the hysteresis), the static scaler, and Restore.
#include "optim/loss_scaler.h"

#include <gtest/gtest.h>

#include <cmath>

namespace keel {
namespace {

LossScalerOptions Dynamic(double initial, int64_t window, int64_t hysteresis, double min = 1) {
  LossScalerOptions o;
  o.initial_scale = initial;
  o.window = window;
  o.hysteresis = hysteresis;
  o.min_scale = min;
  return o;
}

TEST(LossScalerTest, HysteresisAbsorbsOverflowsUntilSpentThenEveryOverflowHalves) {
  LossScaler s(Dynamic(1024, 1000, 3));
  EXPECT_EQ(s.Update(true), LossScaleChange::kOverflowCounted);
  EXPECT_EQ(s.Update(true), LossScaleChange::kOverflowCounted);
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.Update(true), LossScaleChange::kBackedOff);  // third overflow: hysteresis spent
  EXPECT_EQ(s.scale(), 512);
  // Clean iterations in between do not restore it: the next overflow halves at once.
  EXPECT_EQ(s.Update(false), LossScaleChange::kNone);
  EXPECT_EQ(s.Update(true), LossScaleChange::kBackedOff);
  EXPECT_EQ(s.scale(), 256);
  EXPECT_EQ(s.state().hysteresis_tracker, -1);
}

TEST(LossScalerTest, GrowsAfterACleanWindowWhichRestoresTheHysteresis) {
  LossScaler s(Dynamic(64, 4, 2));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s.Update(false), LossScaleChange::kNone);
  EXPECT_EQ(s.Update(false), LossScaleChange::kGrew);  // the 4th clean one in a row
  EXPECT_EQ(s.scale(), 128);
  EXPECT_EQ(s.state().growth_tracker, 0);
  // An overflow resets the growth count: 3 clean + overflow + 3 clean do not grow.
  for (int i = 0; i < 3; ++i) s.Update(false);
  EXPECT_EQ(s.Update(true), LossScaleChange::kOverflowCounted);
  EXPECT_EQ(s.state().growth_tracker, 0);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s.Update(false), LossScaleChange::kNone);
  EXPECT_EQ(s.scale(), 128);
  EXPECT_EQ(s.Update(false), LossScaleChange::kGrew);
  EXPECT_EQ(s.scale(), 256);
  EXPECT_EQ(s.state().hysteresis_tracker, 2);  // restored by the growth
  EXPECT_EQ(s.Update(true), LossScaleChange::kOverflowCounted);
}

TEST(LossScalerTest, NeverBelowTheMinimum) {
  LossScaler s(Dynamic(8, 1000, 1, 2));
  EXPECT_EQ(s.Update(true), LossScaleChange::kBackedOff);
  EXPECT_EQ(s.scale(), 4);
  EXPECT_EQ(s.Update(true), LossScaleChange::kBackedOff);
  EXPECT_EQ(s.scale(), 2);
  EXPECT_EQ(s.Update(true), LossScaleChange::kOverflowCounted);  // at the floor: unchanged
  EXPECT_EQ(s.scale(), 2);
}

// Megatron's start: 2^32 falls by halves to a workable scale, one per overflow once the
// hysteresis is spent: 2 + (k - 1) overflows reach 2^(32 - k).
TEST(LossScalerTest, FromTwoToTheThirtyTwoDownToAWorkableScale) {
  LossScaler s(Dynamic(std::ldexp(1.0, 32), 1000, 2));
  int overflows = 0;
  while (s.scale() > 65536) {
    s.Update(true);
    ++overflows;
  }
  EXPECT_EQ(s.scale(), 65536);
  EXPECT_EQ(overflows, 17);  // 16 halvings, the first after 2 overflows
}

TEST(LossScalerTest, StaticScalerNeverChanges) {
  LossScalerOptions o;
  o.dynamic = false;
  o.constant_scale = 128;
  LossScaler s(o);
  EXPECT_EQ(s.scale(), 128);
  for (bool inf : {true, true, true, false, false})
    EXPECT_EQ(s.Update(inf), LossScaleChange::kNone);
  EXPECT_EQ(s.scale(), 128);
}

TEST(LossScalerTest, FromConfigAndRestore) {
  TrainConfig c;
  c.initial_loss_scale = 4096;
  c.loss_scale_window = 7;
  c.hysteresis = 3;
  c.min_loss_scale = 2;
  LossScalerOptions o = LossScalerOptions::FromConfig(c);
  EXPECT_TRUE(o.dynamic);
  EXPECT_EQ(o.initial_scale, 4096);
  EXPECT_EQ(o.window, 7);
  EXPECT_EQ(o.hysteresis, 3);
  EXPECT_EQ(o.min_scale, 2);
  c.loss_scale = 16;
  EXPECT_FALSE(LossScalerOptions::FromConfig(c).dynamic);
  EXPECT_EQ(LossScaler(LossScalerOptions::FromConfig(c)).scale(), 16);

  LossScaler a(o);
  a.Update(true);
  a.Update(false);
  LossScaler b(o);
  b.Restore(a.state());
  EXPECT_EQ(b.state(), a.state());
  EXPECT_EQ(a.Update(true), b.Update(true));
  EXPECT_EQ(b.state(), a.state());
}

}  // namespace
}  // namespace keel
