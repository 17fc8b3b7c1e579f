// StragglerDetector on synthetic compute times: a slow rank among 2, 3 and 8 is named once, noise
// and outlier iterations name nobody, a recovered rank is reported once (with hysteresis), a rank
// that is slow only every other window is never named, and skipped iterations are ignored.
#include "health/straggler_detector.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "guard/robust_window.h"

namespace keel {
namespace {

// Uniform in [-amp, amp), one stream per (seed, rank).
double Noise(uint64_t seed, int rank, int64_t it, double amp) {
  const float u =
      UniformAt({seed, RngPurpose::kTest, static_cast<uint64_t>(rank)}, static_cast<uint64_t>(it));
  return amp * (2.0 * u - 1.0);
}

// Iterations 1..iters of `n` ranks computing 1 s each with ±amp noise, times factor(rank, it).
template <typename Factor>
std::vector<StragglerEvent> Feed(StragglerDetector* d, int n, int64_t from, int64_t to,
                                 uint64_t seed, double amp, Factor factor) {
  std::vector<StragglerEvent> all;
  for (int64_t it = from; it <= to; ++it) {
    std::vector<double> t(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r)
      t[static_cast<size_t>(r)] = (1 + Noise(seed, r, it, amp)) * factor(r, it);
    for (const StragglerEvent& e : d->Add(it, t)) all.push_back(e);
  }
  return all;
}

TEST(StragglerDetectorTest, LowerMedian) {
  EXPECT_EQ(LowerMedianOf({2.0, 1.0}), 1.0);  // of 2: the smaller
  EXPECT_EQ(LowerMedianOf({3.0, 1.0, 2.0}), 2.0);
  EXPECT_EQ(LowerMedianOf({4.0, 1.0, 3.0, 2.0}), 2.0);
  EXPECT_TRUE(std::isnan(LowerMedianOf({})));
}

TEST(StragglerDetectorTest, SlowRankIsNamedOnceAmong2And3And8) {
  for (auto [n, slow] : {std::pair{2, 0}, std::pair{3, 2}, std::pair{8, 5}}) {
    SCOPED_TRACE(testing::Message() << n << " ranks, rank " << slow << " 5% slower");
    StragglerDetector d(n, {});
    const auto events =
        Feed(&d, n, 1, 400, 11, 0.01, [s = slow](int r, int64_t) { return r == s ? 1.05 : 1.0; });
    ASSERT_EQ(events.size(), 1u);  // named once, not every window after
    EXPECT_TRUE(events[0].named);
    EXPECT_EQ(events[0].rank, slow);
    EXPECT_LE(events[0].iteration, 100);
    EXPECT_EQ(events[0].since_iteration, 1);
    EXPECT_NEAR(events[0].slowdown, 0.05, 0.01);
    EXPECT_EQ(d.current_stragglers(), std::vector<int>{slow});
    ASSERT_EQ(d.last_slowdowns().size(), static_cast<size_t>(n));
    EXPECT_NEAR(d.last_slowdowns()[static_cast<size_t>(slow)], 0.05, 0.01);
  }
}

// ±2% uniform noise, ranks up to 0.5% apart for good, and 3% of iterations a random rank 30% slow.
TEST(StragglerDetectorTest, HealthyRanksWithRealisticNoiseNameNobody) {
  for (int n : {2, 3, 8}) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      SCOPED_TRACE(testing::Message() << n << " ranks, seed " << seed);
      StragglerDetector d(n, {});
      const auto events = Feed(&d, n, 1, 500, seed, 0.02, [&](int r, int64_t it) {
        const double offset = 0.005 * Noise(seed + 100, r, 0, 1.0);
        const bool outlier =
            UniformAt({seed, RngPurpose::kTest, 1000}, it) < 0.03 &&
            U64At({seed, RngPurpose::kTest, 1001}, it) % n == static_cast<uint64_t>(r);
        return (1 + offset) * (outlier ? 1.3 : 1.0);
      });
      EXPECT_TRUE(events.empty()) << "rank " << events[0].rank << " at " << events[0].iteration;
      EXPECT_TRUE(d.current_stragglers().empty());
      for (double s : d.last_slowdowns()) EXPECT_LT(s, 0.03);
    }
  }
}

TEST(StragglerDetectorTest, RecoveryIsReportedOnceWithHysteresis) {
  for (int n : {2, 4}) {
    SCOPED_TRACE(testing::Message() << n << " ranks");
    StragglerDetector d(n, {});
    // Rank 1: 6% slower to 200, then 2% (between threshold/2 and threshold: still named), then
    // back to normal from 401.
    const auto events = Feed(&d, n, 1, 600, 3, 0.01, [](int r, int64_t it) {
      if (r != 1) return 1.0;
      return it <= 200 ? 1.06 : it <= 400 ? 1.02 : 1.0;
    });
    ASSERT_EQ(events.size(), 2u);
    EXPECT_TRUE(events[0].named);
    EXPECT_EQ(events[0].rank, 1);
    EXPECT_EQ(events[0].iteration, 50);
    EXPECT_FALSE(events[1].named);
    EXPECT_EQ(events[1].rank, 1);
    EXPECT_EQ(events[1].since_iteration, 401);
    EXPECT_EQ(events[1].iteration, 450);
    EXPECT_LT(events[1].slowdown, 0.015);
    EXPECT_TRUE(d.current_stragglers().empty());
  }
}

TEST(StragglerDetectorTest, RankSlowOnlyInAlternateWindowsIsNotNamed) {
  StragglerDetector d(4, {});
  // Slow in windows 0, 2, 4, ... (iterations 1-10, 21-30, ...), normal in between.
  auto events = Feed(&d, 4, 1, 1000, 5, 0.01, [](int r, int64_t it) {
    return r == 3 && ((it - 1) / 10) % 2 == 0 ? 1.1 : 1.0;
  });
  EXPECT_TRUE(events.empty());
  // Four slow windows out of five: never five in a row either.
  StragglerDetector d2(4, {});
  events = Feed(&d2, 4, 1, 1000, 5, 0.01,
                [](int r, int64_t it) { return r == 3 && ((it - 1) / 10) % 5 != 4 ? 1.1 : 1.0; });
  EXPECT_TRUE(events.empty());
}

TEST(StragglerDetectorTest, SkippedAndNonFiniteSamplesAreIgnored) {
  StragglerDetector d(3, {});
  std::vector<StragglerEvent> events;
  int64_t valid = 0;
  for (int64_t it = 1; it <= 300; ++it) {
    std::vector<double> t = {1.0 + Noise(9, 0, it, 0.01), 1.0 + Noise(9, 1, it, 0.01),
                             1.05 + Noise(9, 2, it, 0.01)};
    if (it % 3 == 0) t = {0, 0, 0};  // a skipped iteration: nothing computed, not a window slot
    if (it % 7 == 0) t[0] = NAN, t[1] = INFINITY, t[2] = -1;
    if (it % 3 != 0 && it % 7 != 0) ++valid;
    for (const StragglerEvent& e : d.Add(it, t)) events.push_back(e);
    if (events.empty()) {
      EXPECT_LT(valid, 50) << it;  // named at the end of the 5th window of valid iterations
    }
  }
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].rank, 2);
  EXPECT_NEAR(events[0].slowdown, 0.05, 0.01);
}

TEST(StragglerDetectorTest, WorldOfOneNamesNobody) {
  StragglerDetector d(1, {});
  const auto events =
      Feed(&d, 1, 1, 300, 2, 0.02, [](int, int64_t it) { return it > 100 ? 2.0 : 1.0; });
  EXPECT_TRUE(events.empty());
  EXPECT_TRUE(d.current_stragglers().empty());
  ASSERT_EQ(d.last_slowdowns().size(), 1u);
  EXPECT_EQ(d.last_slowdowns()[0], 0.0);
}

TEST(StragglerDetectorTest, LastSlowdownsEmptyBeforeTheFirstWindow) {
  StragglerDetector d(2, {.window = 10});
  for (int64_t it = 1; it <= 9; ++it) d.Add(it, {1.0, 1.2});
  EXPECT_TRUE(d.last_slowdowns().empty());
  d.Add(10, {1.0, 1.2});
  ASSERT_EQ(d.last_slowdowns().size(), 2u);
  EXPECT_DOUBLE_EQ(d.last_slowdowns()[0], 0.0);
  EXPECT_NEAR(d.last_slowdowns()[1], 0.2, 1e-12);
}

// Pipeline stages do different work: with each rank's stage as its group, the last stage being
// slower by design names nobody (on the old one-group rule, P=2 x D=2 named both ranks of stage 1
// and P=2 named stage 1's rank), while a rank slowed among its own stage's ranks still is.
TEST(StragglerDetectorTest, RanksAreComparedWithinTheirStageOnly) {
  // Megatron's order at T=1, P=2, D=2: ranks 0 and 1 are stage 0, ranks 2 and 3 stage 1.
  const std::vector<int> stage = {0, 0, 1, 1};
  {
    SCOPED_TRACE("stage 1 30% slower by design");
    StragglerDetector d(4, {}, stage);
    EXPECT_TRUE(d.lone_groups().empty());
    const auto events =
        Feed(&d, 4, 1, 400, 21, 0.01, [](int r, int64_t) { return r >= 2 ? 1.3 : 1.0; });
    EXPECT_TRUE(events.empty());
    EXPECT_TRUE(d.current_stragglers().empty());
    for (double s : d.last_slowdowns()) EXPECT_LT(s, 0.03);
  }
  {
    SCOPED_TRACE("stage 1 slower by design, and rank 3 8% slower than its peer rank 2");
    StragglerDetector d(4, {}, stage);
    const auto events = Feed(&d, 4, 1, 400, 22, 0.01, [](int r, int64_t) {
      return (r >= 2 ? 1.3 : 1.0) * (r == 3 ? 1.08 : 1.0);
    });
    ASSERT_EQ(events.size(), 1u);
    EXPECT_TRUE(events[0].named);
    EXPECT_EQ(events[0].rank, 3);
    EXPECT_NEAR(events[0].slowdown, 0.08, 0.01);  // against rank 2, not the world's reference
    EXPECT_EQ(d.current_stragglers(), std::vector<int>{3});
  }
  {
    SCOPED_TRACE("a slowed rank of stage 0 among its data peers");
    StragglerDetector d(4, {}, stage);
    const auto events = Feed(&d, 4, 1, 400, 23, 0.01, [](int r, int64_t) {
      return (r >= 2 ? 1.3 : 1.0) * (r == 0 ? 1.08 : 1.0);
    });
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].rank, 0);
  }
  {
    SCOPED_TRACE("P=2, one rank per stage: stage 1 slower, nobody to compare with");
    StragglerDetector d(2, {}, {0, 1});
    EXPECT_EQ(d.lone_groups(), (std::vector<int>{0, 1}));
    const auto events =
        Feed(&d, 2, 1, 400, 24, 0.01, [](int r, int64_t) { return r == 1 ? 1.5 : 1.0; });
    EXPECT_TRUE(events.empty());
    // Without groups the same times name rank 1: the rule above is what spares it.
    StragglerDetector one_group(2, {});
    EXPECT_TRUE(one_group.lone_groups().empty());
    const auto named =
        Feed(&one_group, 2, 1, 400, 24, 0.01, [](int r, int64_t) { return r == 1 ? 1.5 : 1.0; });
    ASSERT_EQ(named.size(), 1u);
    EXPECT_EQ(named[0].rank, 1);
  }
}

}  // namespace
}  // namespace keel
