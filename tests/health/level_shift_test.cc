// SustainedShift and the ThroughputDropDetector's small drops (issue 36): a sustained slowdown of
// 2-5% under noise of 0.3-2% an iteration is found, sure against the noise the series shows, and
// said with its z and that noise; it recovers; healthy noisy series of 10k iterations are no drop,
// where a plain 2% threshold would cry wolf on them.
#include "health/level_shift.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "health/throughput_drop_detector.h"

namespace keel {
namespace {

// 1 s an iteration times a Gaussian factor of relative sd `noise`, 1% of iterations 30% slower;
// `size` slower in [from, to).
double Time(uint64_t seed, int64_t it, double noise, double size = 0, int64_t from = 1 << 30,
            int64_t to = 1 << 30) {
  double t = 1 + noise * NormalAt({seed, RngPurpose::kTest, 0}, static_cast<uint64_t>(it));
  if (UniformAt({seed, RngPurpose::kTest, 1}, static_cast<uint64_t>(it)) < 0.01) t *= 1.3;
  return it >= from && it < to ? t * (1 + size) : t;
}

std::vector<ThroughputDropEvent> Feed(ThroughputDropDetector* d, int64_t n, uint64_t seed,
                                      double noise, double size = 0, int64_t from = 1 << 30,
                                      int64_t to = 1 << 30) {
  std::vector<ThroughputDropEvent> events;
  for (int64_t it = 1; it <= n; ++it)
    if (auto e = d->Add(it, 1 / Time(seed, it, noise, size, from, to))) events.push_back(*e);
  return events;
}

TEST(SustainedShiftTest, NoiseIsMeasuredOnTheSeries) {
  for (double noise : {0.003, 0.01, 0.02}) {
    SCOPED_TRACE(noise);
    SustainedShift s(Worse::kLower, {});
    for (int64_t it = 1; it <= 2000; ++it) s.Add(it, 1 / Time(7, it, noise));
    const ShiftMeasure m = s.Measure(40);
    ASSERT_EQ(m.window, 40);
    EXPECT_NEAR(m.noise, noise, 0.2 * noise);
    EXPECT_NEAR(m.reference, 1, 0.002);
    EXPECT_LT(std::fabs(m.z), 5);
    EXPECT_NEAR(m.se, 1.2533 * m.noise / std::sqrt(40.0), 0.2 * m.se);  // the level's error rules
  }
}

TEST(SustainedShiftTest, TooLittleReferenceMeasuresNothing) {
  SustainedShift s(Worse::kLower, {});
  // 10 reference blocks of 10 must have ended 2M values before the level's M values.
  for (int64_t it = 1; it <= 100 + 2 * 20 - 1; ++it) EXPECT_FALSE(s.Add(it, 1.0));
  EXPECT_EQ(s.Measure(20).window, 0);
  s.Add(140, 1.0);
  EXPECT_EQ(s.Measure(20).window, 20);
  EXPECT_EQ(s.Measure(40).window, 0);
}

// The issue: the live detector's threshold was 5%, so a 2-3% slower job went unreported. Now a
// sustained 2%, 3% or 4% slowdown under 0.3-1% noise is found within ~50 iterations, once, with
// its start, its size, how sure (z >= 5) and the noise it measured.
TEST(ThroughputDropDetectorSmallTest, SmallSustainedSlowdownIsFoundWithItsConfidence) {
  for (double size : {0.02, 0.03, 0.04}) {
    for (double noise : {0.003, 0.005, 0.01}) {
      for (uint64_t seed = 1; seed <= 3; ++seed) {
        SCOPED_TRACE(testing::Message() << size << " slower, noise " << noise << ", seed " << seed);
        ThroughputDropDetector d(1, {});
        const auto events = Feed(&d, 2500, seed, noise, size, 1500);
        ASSERT_EQ(events.size(), 1u);
        const ThroughputDropEvent& e = events[0];
        EXPECT_TRUE(e.dropped);
        EXPECT_TRUE(e.sustained);
        // Found early, from few values: the start and size are as sure as those values (a run of
        // high noise just before the start shows as part of it).
        EXPECT_NEAR(static_cast<double>(e.since_iteration), 1500, 15);
        EXPECT_GT(e.iteration, 1500);
        EXPECT_LE(e.iteration, 1550);
        EXPECT_GE(e.drop, 0.5 * size);
        EXPECT_LE(e.drop, size + 0.01);
        EXPECT_GE(e.z, 5);
        EXPECT_NEAR(e.noise, noise, 0.25 * noise);
        EXPECT_GE(e.window, 20);
        EXPECT_NEAR(e.baseline, 1, 0.003);  // the median level before, not the best window
        EXPECT_TRUE(d.dropped());
      }
    }
  }
}

// Where the noise is as large as the shift, it is found (mostly over a longer window), once: its
// return is judged over a window long enough not to take the noise for it.
TEST(ThroughputDropDetectorSmallTest, TwoPercentUnderTwoPercentNoiseIsFoundOnce) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    SCOPED_TRACE(seed);
    ThroughputDropDetector d(1, {});
    const auto events = Feed(&d, 2500, seed, 0.02, 0.02, 1500);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_TRUE(events[0].sustained);
    EXPECT_LE(events[0].iteration, 1500 + 300);
    EXPECT_GE(events[0].z, 5);
    EXPECT_NEAR(events[0].drop, 0.02, 0.006);
  }
}

TEST(ThroughputDropDetectorSmallTest, SmallDropRecovers) {
  ThroughputDropDetector d(1, {});
  const auto events = Feed(&d, 3000, 4, 0.005, 0.03, 1500, 2000);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(events[0].dropped);
  EXPECT_FALSE(events[1].dropped);
  EXPECT_TRUE(events[1].sustained);
  EXPECT_NEAR(static_cast<double>(events[1].since_iteration), 2000, 5);
  EXPECT_LE(events[1].iteration, 2050);
  EXPECT_LT(std::fabs(events[1].drop), 0.0075);
  EXPECT_FALSE(d.dropped());
}

// Big drops stay the threshold rule's, decided as before, and now say how sure they are too.
TEST(ThroughputDropDetectorSmallTest, BigDropIsTheThresholdRulesWithItsZ) {
  ThroughputDropDetector d(1, {});
  const auto events = Feed(&d, 2000, 5, 0.01, 0.2, 1500);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_FALSE(events[0].sustained);
  EXPECT_EQ(events[0].window, 10);
  EXPECT_LE(events[0].iteration, 1500 + 20);
  EXPECT_GT(events[0].z, 20);
  EXPECT_NEAR(events[0].noise, 0.01, 0.003);
}

// No false drop on healthy series of 10k iterations with 0.3-2% noise and 1% of iterations 30%
// slower; the same series under a plain 2% threshold (the sustained test off) do cry wolf.
TEST(ThroughputDropDetectorSmallTest, HealthyTenThousandIterationSeriesAreNoDrop) {
  int plain_false = 0;
  for (double noise : {0.003, 0.01, 0.02}) {
    for (uint64_t seed = 21; seed <= 23; ++seed) {
      SCOPED_TRACE(testing::Message() << "noise " << noise << ", seed " << seed);
      ThroughputDropDetector d(1, {});
      const auto events = Feed(&d, 10000, seed, noise);
      EXPECT_TRUE(events.empty()) << events[0].iteration << " z " << events[0].z;
      ThroughputDropOptions plain;
      plain.threshold = 0.02;
      plain.shift.min_shift = 0;
      ThroughputDropDetector p(1, plain);
      plain_false += static_cast<int>(Feed(&p, 10000, seed, noise).size());
    }
  }
  EXPECT_GT(plain_false, 0);
}

// Rebaseline() forgets the reference: a new work per iteration is no drop.
TEST(ThroughputDropDetectorSmallTest, RebaselineForgetsTheReference) {
  ThroughputDropDetector d(1, {});
  EXPECT_TRUE(Feed(&d, 1000, 6, 0.005).empty());
  d.Rebaseline();
  std::vector<ThroughputDropEvent> events;
  for (int64_t it = 1001; it <= 2500; ++it)
    if (auto e = d.Add(it, 1 / (1.03 * Time(6, it, 0.005)))) events.push_back(*e);
  EXPECT_TRUE(events.empty());
}

}  // namespace
}  // namespace keel
