#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "config/config.h"
#include "optim/batch_rampup.h"
#include "optim/lr_schedule.h"

namespace keel {
namespace {

constexpr double kMax = 1e-3;
constexpr double kMin = 1e-4;

TEST(LrScheduleTest, WarmupIsLinearFromZero) {
  LrSchedule s(LrDecayStyle::kCosine, kMax, kMin, 100, 1100);
  EXPECT_DOUBLE_EQ(s.LrAt(0), 0.0);
  EXPECT_DOUBLE_EQ(s.LrAt(25), kMax * 0.25);
  EXPECT_DOUBLE_EQ(s.LrAt(50), kMax * 0.5);
  EXPECT_DOUBLE_EQ(s.LrAt(100), kMax);  // warmup end
}

TEST(LrScheduleTest, LinearDecay) {
  LrSchedule s(LrDecayStyle::kLinear, kMax, kMin, 100, 1100);
  EXPECT_DOUBLE_EQ(s.LrAt(100), kMax);
  EXPECT_DOUBLE_EQ(s.LrAt(350), kMin + 0.75 * (kMax - kMin));
  EXPECT_DOUBLE_EQ(s.LrAt(600), kMin + 0.5 * (kMax - kMin));  // midpoint
  EXPECT_DOUBLE_EQ(s.LrAt(1100), kMin);                       // end
  EXPECT_DOUBLE_EQ(s.LrAt(1101), kMin);                       // beyond end
  EXPECT_DOUBLE_EQ(s.LrAt(1000000), kMin);
}

TEST(LrScheduleTest, CosineDecay) {
  LrSchedule s(LrDecayStyle::kCosine, kMax, kMin, 100, 1100);
  EXPECT_DOUBLE_EQ(s.LrAt(100), kMax);
  const double quarter = 0.5 * (std::cos(std::numbers::pi * 0.25) + 1.0);
  EXPECT_DOUBLE_EQ(s.LrAt(350), kMin + quarter * (kMax - kMin));
  EXPECT_NEAR(s.LrAt(600), kMin + 0.5 * (kMax - kMin), 1e-18);  // midpoint
  EXPECT_NEAR(s.LrAt(1100), kMin, 1e-18);                       // end
  EXPECT_DOUBLE_EQ(s.LrAt(1101), kMin);                         // beyond end
}

TEST(LrScheduleTest, ConstantKeepsWarmupThenMaxForever) {
  LrSchedule s(LrDecayStyle::kConstant, kMax, kMin, 100, 100);
  EXPECT_DOUBLE_EQ(s.LrAt(50), kMax * 0.5);
  EXPECT_DOUBLE_EQ(s.LrAt(100), kMax);
  EXPECT_DOUBLE_EQ(s.LrAt(101), kMax);
  EXPECT_DOUBLE_EQ(s.LrAt(1000000), kMax);
}

TEST(LrScheduleTest, NoWarmupStartsAtMax) {
  LrSchedule s(LrDecayStyle::kLinear, kMax, 0.0, 0, 1000);
  EXPECT_DOUBLE_EQ(s.LrAt(0), kMax);
  EXPECT_DOUBLE_EQ(s.LrAt(500), kMax * 0.5);
}

TEST(LrScheduleTest, IterationRunsConvertToSamplesWithTheGlobalBatch) {
  TrainConfig c;  // 400 iterations, warmup 40 iterations, global batch 16
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&c, &notes).ok());
  LrSchedule s = LrSchedule::FromConfig(c);
  EXPECT_EQ(s.warmup_samples(), 640);
  EXPECT_EQ(s.decay_samples(), 6400);
  // keel's convention: the first update already counts its own batch, so its lr is not 0.
  EXPECT_DOUBLE_EQ(s.LrAt(16), c.lr * 16 / 640);
  EXPECT_DOUBLE_EQ(s.LrAt(640), c.lr);
  EXPECT_NEAR(s.LrAt(6400), c.min_lr, 1e-18);
}

TEST(LrScheduleTest, SamplesRunsUseSamplesDirectly) {
  TrainConfig c;
  c.train_iters = 0;
  c.lr_warmup_iters = 0;
  c.train_samples = 10000;
  c.lr_warmup_samples = 1000;
  c.lr_decay_style = LrDecayStyle::kLinear;
  std::vector<std::string> notes;
  ASSERT_TRUE(Validate(&c, &notes).ok());
  LrSchedule s = LrSchedule::FromConfig(c);
  EXPECT_EQ(s.warmup_samples(), 1000);
  EXPECT_EQ(s.decay_samples(), 10000);
  EXPECT_DOUBLE_EQ(s.LrAt(5500), c.min_lr + 0.5 * (c.lr - c.min_lr));
}

TEST(BatchRampupTest, ConstantWithoutRampup) {
  BatchRampup r(64, 4, 2);
  EXPECT_FALSE(r.ramps());
  EXPECT_EQ(r.GlobalBatchAt(0), 64);
  EXPECT_EQ(r.GlobalBatchAt(1000000), 64);
  EXPECT_EQ(r.NumMicroBatchesAt(0), 8);
}

TEST(BatchRampupTest, SmallRampByHand) {
  // start 2, +2, over 10 samples, to 6: two increments, one every 10 / 2 = 5 samples.
  BatchRampup r(2, 2, 10, 6, 1, 1);
  const std::vector<int64_t> expected = {2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 6, 6, 6};
  for (int64_t s = 0; s < static_cast<int64_t>(expected.size()); ++s) {
    EXPECT_EQ(r.GlobalBatchAt(s), expected[s]) << "consumed " << s;
  }
}

TEST(BatchRampupTest, MegatronDocsExampleStageBoundaries) {
  // --rampup-batch-size 16 16 5859375 with --global-batch-size 2048 (BLOOM-176B): 127 increments,
  // one every 5859375 / 127 = 46136.81 samples, so stage k starts at ceil(k * 46136.81).
  BatchRampup r(16, 16, 5859375, 2048, 1, 16);
  EXPECT_TRUE(r.ramps());
  EXPECT_EQ(r.GlobalBatchAt(0), 16);
  EXPECT_EQ(r.GlobalBatchAt(46136), 16);
  EXPECT_EQ(r.GlobalBatchAt(46137), 32);
  EXPECT_EQ(r.GlobalBatchAt(92273), 32);
  EXPECT_EQ(r.GlobalBatchAt(92274), 48);
  EXPECT_EQ(r.GlobalBatchAt(5813238), 2016);
  EXPECT_EQ(r.GlobalBatchAt(5813239), 2032);
  EXPECT_EQ(r.GlobalBatchAt(5859374), 2032);
  EXPECT_EQ(r.GlobalBatchAt(5859375), 2048);
  EXPECT_EQ(r.GlobalBatchAt(5859376), 2048);
  EXPECT_EQ(r.GlobalBatchAt(int64_t{1} << 40), 2048);
  // micro 1 * DP 16: one micro-batch per rank at the start, 128 at the end.
  EXPECT_EQ(r.NumMicroBatchesAt(0), 1);
  EXPECT_EQ(r.NumMicroBatchesAt(46137), 2);
  EXPECT_EQ(r.NumMicroBatchesAt(6000000), 128);
}

TEST(BatchRampupTest, StartEqualToGlobalIsConstant) {
  BatchRampup r(32, 8, 1000, 32, 4, 1);
  EXPECT_FALSE(r.ramps());
  EXPECT_EQ(r.GlobalBatchAt(0), 32);
  EXPECT_EQ(r.GlobalBatchAt(500), 32);
}

TrainConfig SamplesConfig(int64_t train_samples, int global, std::vector<int64_t> rampup) {
  TrainConfig c;
  c.train_iters = 0;
  c.lr_warmup_iters = 0;
  c.train_samples = train_samples;
  c.micro_batch_size = 1;
  c.global_batch_size = global;
  c.rampup_batch_size = std::move(rampup);
  return c;
}

TEST(TotalTrainItersTest, IterationRunIsTrainIters) {
  TrainConfig c;
  c.global_batch_size = 8;
  EXPECT_EQ(TotalTrainIters(c), 400);
}

TEST(TotalTrainItersTest, ConstantBatchDropsThePartialLastBatch) {
  EXPECT_EQ(TotalTrainIters(SamplesConfig(1000, 64, {})), 15);
  EXPECT_EQ(TotalTrainIters(SamplesConfig(1024, 64, {})), 16);
}

TEST(TotalTrainItersTest, SmallRampByHand) {
  // Batches 2, 2, 2 (consumed 6), 4 (10), 6 (16 > 10: ramp over) = 5 iterations, then
  // (30 - 16) // 6 = 2 more.
  EXPECT_EQ(TotalTrainIters(SamplesConfig(30, 6, {2, 2, 10})), 7);
  // Megatron floors a negative remainder too: the ramp's last batch overshot 15 samples.
  EXPECT_EQ(TotalTrainIters(SamplesConfig(15, 6, {2, 2, 10})), 4);
}

TEST(TotalTrainItersTest, Bloom176B) {
  // Megatron's update_train_iters evaluated in Python for --rampup-batch-size 16 16 5859375,
  // --global-batch-size 2048, --train-samples 300000000: the ramp takes 15647 iterations and ends
  // at 5860784 samples; (300000000 - 5860784) // 2048 = 143622 more.
  EXPECT_EQ(TotalTrainIters(SamplesConfig(300000000, 2048, {16, 16, 5859375})), 159269);
}

}  // namespace
}  // namespace keel
