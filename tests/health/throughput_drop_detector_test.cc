// ThroughputDropDetector on synthetic data-parallel runs: each rank computes ~1 s (±2%), the job's
// iteration is the slowest rank's compute plus ~0.2 s of communication, its throughput 1 / that.
// A rank that slows is the drop's rank; all ranks slowing, or the communication, is no single
// rank; noise and outlier iterations are no drop; a recovery is reported; skipped iterations and
// Rebaseline(). Then one process's exact series (issue 37): a slow start does not hide the drops
// after a fast phase, each drop and recovery is found once with its size and change point.
#include "health/throughput_drop_detector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/rng.h"

namespace keel {
namespace {

double Noise(uint64_t seed, uint64_t stream, int64_t it, double amp) {
  const float u = UniformAt({seed, RngPurpose::kTest, stream}, static_cast<uint64_t>(it));
  return amp * (2.0 * u - 1.0);
}

struct Slowdown {
  int rank = -1;  // -1: every rank's compute
  double compute = 1.0, comm = 1.0;
  int64_t from = 0, to = 1 << 30;
};

// Iterations from..to of n ranks; returns the events.
std::vector<ThroughputDropEvent> Feed(ThroughputDropDetector* d, int n, int64_t from, int64_t to,
                                      uint64_t seed, const Slowdown& s, double outliers = 0) {
  std::vector<ThroughputDropEvent> events;
  for (int64_t it = from; it <= to; ++it) {
    const bool in = it >= s.from && it < s.to;
    std::vector<double> compute(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      double c = 1.0 + Noise(seed, static_cast<uint64_t>(r), it, 0.02);
      if (in && (s.rank < 0 || s.rank == r)) c *= s.compute;
      if (UniformAt({seed, RngPurpose::kTest, 100}, static_cast<uint64_t>(it)) < outliers &&
          U64At({seed, RngPurpose::kTest, 101}, static_cast<uint64_t>(it)) % n ==
              static_cast<uint64_t>(r)) {
        c *= 1.3;
      }
      compute[static_cast<size_t>(r)] = c;
    }
    const double comm = 0.2 * (1 + Noise(seed, 99, it, 0.02)) * (in ? s.comm : 1.0);
    const double job = *std::max_element(compute.begin(), compute.end()) + comm;
    if (auto e = d->Add(it, 1.0 / job, job, compute)) events.push_back(*e);
  }
  return events;
}

// The rule both live detectors and `keel logs analyze` judge a level by.
TEST(ThroughputDropDetectorTest, LevelShiftRule) {
  const LevelShift time{0.05, Worse::kHigher}, throughput{0.05, Worse::kLower};
  EXPECT_NEAR(time.Worsening(1.1, 1.0), 0.1, 1e-12);
  EXPECT_NEAR(throughput.Worsening(140, 150), 1.0 / 15, 1e-12);
  EXPECT_TRUE(time.Shifted(1.06, 1.0));
  EXPECT_FALSE(time.Shifted(1.04, 1.0));
  EXPECT_FALSE(time.Back(1.04, 1.0));  // between threshold / 2 and threshold: neither
  EXPECT_TRUE(time.Back(1.02, 1.0));
  EXPECT_TRUE(time.Back(0.5, 1.0));  // faster is back
  EXPECT_TRUE(throughput.Shifted(140, 150));
  EXPECT_FALSE(throughput.Back(146, 150));
  EXPECT_TRUE(throughput.Back(147, 150));
  EXPECT_FALSE(time.Shifted(NAN, 1.0));
  EXPECT_FALSE(time.Back(NAN, 1.0));
  EXPECT_FALSE(throughput.Shifted(1.0, NAN));
}

TEST(ThroughputDropDetectorTest, OneSlowRankIsFollowed) {
  ThroughputDropDetector d(4, {});
  const auto events = Feed(&d, 4, 1, 700, 1, {.rank = 2, .compute = 1.2, .from = 300});
  ASSERT_EQ(events.size(), 1u);
  const ThroughputDropEvent& e = events[0];
  EXPECT_TRUE(e.dropped);
  EXPECT_GE(e.since_iteration, 298);
  EXPECT_LE(e.since_iteration, 302);
  EXPECT_LE(e.iteration, 300 + 2 * 10);  // within a couple of windows
  EXPECT_GT(e.drop, 0.12);
  EXPECT_EQ(e.follows_rank, 2);
  EXPECT_NEAR(e.rank_rise, 0.2, 0.03);
  EXPECT_TRUE(d.dropped());
  EXPECT_NEAR(d.last_drop(), e.drop, 0.03);
}

TEST(ThroughputDropDetectorTest, AllRanksSlowerIsNoSingleRank) {
  {
    SCOPED_TRACE("every rank computes 10% slower");
    ThroughputDropDetector d(4, {});
    const auto events = Feed(&d, 4, 1, 700, 2, {.rank = -1, .compute = 1.1, .from = 300});
    ASSERT_EQ(events.size(), 1u);
    EXPECT_TRUE(events[0].dropped);
    EXPECT_GE(events[0].since_iteration, 298);
    EXPECT_LE(events[0].since_iteration, 302);
    EXPECT_EQ(events[0].follows_rank, -1);
    EXPECT_EQ(events[0].rank_rise, 0);
  }
  {
    SCOPED_TRACE("the communication takes 60% longer (job +10%), compute as before");
    ThroughputDropDetector d(4, {});
    const auto events = Feed(&d, 4, 1, 700, 3, {.comm = 1.6, .from = 300});
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].follows_rank, -1);
  }
  {
    SCOPED_TRACE("rank 1 5% slower explains less than half of a job slower by the network too");
    ThroughputDropDetector d(2, {});
    const auto events =
        Feed(&d, 2, 1, 700, 4, {.rank = 1, .compute = 1.05, .comm = 1.5, .from = 300});
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].follows_rank, -1);
  }
}

TEST(ThroughputDropDetectorTest, NoiseAndOutlierIterationsAreNoDrop) {
  for (int n : {1, 2, 4, 8}) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      SCOPED_TRACE(testing::Message() << n << " ranks, seed " << seed);
      ThroughputDropDetector d(n, {});
      const auto events = Feed(&d, n, 1, 1000, seed, {}, /*outliers=*/0.03);
      EXPECT_TRUE(events.empty()) << events[0].iteration;
      EXPECT_LT(std::fabs(d.last_drop()), 0.03);
    }
  }
}

TEST(ThroughputDropDetectorTest, RecoveryIsReported) {
  ThroughputDropDetector d(4, {});
  const auto events = Feed(&d, 4, 1, 800, 6, {.rank = 1, .compute = 1.2, .from = 300, .to = 500});
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(events[0].dropped);
  EXPECT_EQ(events[0].follows_rank, 1);
  EXPECT_FALSE(events[1].dropped);
  EXPECT_GE(events[1].since_iteration, 498);
  EXPECT_LE(events[1].since_iteration, 502);
  EXPECT_LE(events[1].iteration, 500 + 2 * 10);
  EXPECT_LT(events[1].drop, 0.025);
  EXPECT_EQ(events[1].follows_rank, 1);  // the rank the drop had followed
  EXPECT_NEAR(events[1].rank_rise, 0, 0.02);
  EXPECT_FALSE(d.dropped());
}

TEST(ThroughputDropDetectorTest, SkippedIterationsAreIgnored) {
  ThroughputDropDetector d(4, {});
  std::vector<ThroughputDropEvent> events;
  for (int64_t it = 1; it <= 600; ++it) {
    std::vector<double> compute(4);
    for (int r = 0; r < 4; ++r)
      compute[static_cast<size_t>(r)] =
          (1 + Noise(8, static_cast<uint64_t>(r), it, 0.02)) * (r == 3 && it >= 300 ? 1.2 : 1.0);
    double job = *std::max_element(compute.begin(), compute.end()) + 0.2;
    if (it % 4 == 0) job = 0, compute.assign(4, 0);  // a skipped iteration computes nothing
    if (it % 11 == 0) job = NAN, compute[3] = INFINITY;
    if (auto e = d.Add(it, 1.0 / job, job, compute)) events.push_back(*e);
  }
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].follows_rank, 3);
}

TEST(ThroughputDropDetectorTest, RebaselineFollowsANewWorkPerIteration) {
  // The global batch doubles at iteration 400: twice the time per iteration is no drop when the
  // loop says the work changed.
  ThroughputDropDetector with(2, {}), without(2, {});
  const Slowdown doubled{.rank = -1, .compute = 2.0, .comm = 2.0, .from = 400};
  EXPECT_TRUE(Feed(&with, 2, 1, 399, 7, doubled).empty());
  with.Rebaseline();
  EXPECT_TRUE(std::isnan(with.baseline()));
  EXPECT_TRUE(Feed(&with, 2, 400, 900, 7, doubled).empty());
  EXPECT_NEAR(1 / with.baseline(), 2 * 1.2, 0.1);
  const auto events = Feed(&without, 2, 1, 900, 7, doubled);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].follows_rank, -1);
}

TEST(ThroughputDropDetectorTest, WorldOfOneFollowsItsCompute) {
  ThroughputDropDetector d(1, {});
  const auto events = Feed(&d, 1, 1, 500, 9, {.rank = 0, .compute = 1.2, .from = 300});
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].follows_rank, 0);
}

// Issue 37's scenario on an exact series: a slow start (half speed, iterations 1-60), a fast
// phase, 10% slower (time per iteration) for 60 iterations, fast again, 60% slower for 20, fast.
std::vector<double> SlowStartSeries() {
  std::vector<double> v;
  for (int64_t it = 1; it <= 340; ++it) {
    double time = 1.0;
    if (it <= 60) time = 2.0;
    if (it >= 141 && it <= 200) time = 1.1;
    if (it >= 261 && it <= 280) time = 1.6;
    v.push_back(100.0 / time);
  }
  return v;
}

TEST(ThroughputDropDetectorTest, SlowStartDoesNotHideLaterDrops) {
  ThroughputDropDetector d(1, {});
  std::vector<ThroughputDropEvent> events;
  const std::vector<double> series = SlowStartSeries();
  for (size_t k = 0; k < series.size(); ++k) {
    const int64_t it = static_cast<int64_t>(k) + 1;
    if (it == 40) {
      EXPECT_DOUBLE_EQ(d.baseline(), 50);  // the slow start, until a faster window
    }
    if (auto e = d.Add(it, series[k], 1.0 / series[k], {1.0 / series[k]})) events.push_back(*e);
    if (it == 70) {
      EXPECT_DOUBLE_EQ(d.baseline(), 100);  // its first fast window
    }
  }
  ASSERT_EQ(events.size(), 4u);
  // A window's median (of 10: the mean of the middle two) passes the threshold once 6 of 10 are
  // 10% slow (5 for 60%: the mean of 62.5 and 100 is already 19% under 100), and a drop is
  // decided after a window of such iterations: 141 + 5 + 9, 261 + 4 + 9.
  const struct {
    bool dropped;
    int64_t since, iteration;
    double drop, level;
  } want[] = {{true, 141, 155, 0.1, 100 / 1.1},
              {false, 201, 215, 0.0, 100},
              {true, 261, 274, 0.6, 62.5},
              {false, 281, 295, 0.0, 100}};
  for (size_t k = 0; k < 4; ++k) {
    SCOPED_TRACE(k);
    EXPECT_EQ(events[k].dropped, want[k].dropped);
    EXPECT_EQ(events[k].since_iteration, want[k].since);
    EXPECT_EQ(events[k].iteration, want[k].iteration);
    EXPECT_NEAR(events[k].drop, want[k].drop, 1e-9);
    EXPECT_DOUBLE_EQ(events[k].baseline, 100);
    EXPECT_NEAR(events[k].level, want[k].level, 1e-9);
    EXPECT_EQ(events[k].follows_rank, 0);  // one process: its own compute time rose
  }
  EXPECT_FALSE(d.dropped());
}

// The old rule (the median of the first windows after warm-up, fixed) took the slow start as the
// level: the fast phase rose above it and the drops back under the fast level were never below it.
TEST(ThroughputDropDetectorTest, BaselineIsTheBestSustainedLevel) {
  ThroughputDropDetector d(1, {});
  // Windows of 10 after the warm-up of 20: medians 50, 60, 70, 80, 90, 100, then 80 forever
  // after; and one fast burst of 4 iterations at 500 (not most of a window: no level).
  std::vector<ThroughputDropEvent> events;
  for (int64_t it = 1; it <= 300; ++it) {
    double v = it <= 20 ? 10 : it <= 80 ? 50 + 10 * static_cast<double>((it - 21) / 10) : 80;
    if (it >= 95 && it <= 98) v = 500;
    if (auto e = d.Add(it, v)) events.push_back(*e);
    if (it == 80) {
      EXPECT_DOUBLE_EQ(d.baseline(), 100);
    }
  }
  ASSERT_EQ(events.size(), 1u);
  EXPECT_TRUE(events[0].dropped);
  EXPECT_EQ(events[0].since_iteration, 81);
  EXPECT_NEAR(events[0].drop, 0.25, 1e-9);  // 100 / 80 - 1
  EXPECT_EQ(events[0].follows_rank, -1);    // no compute given
  EXPECT_DOUBLE_EQ(d.baseline(), 100);      // the drop never leaks into it
}

TEST(ThroughputDropDetectorTest, FiveHundredHealthyNoisyIterationsAreNoDrop) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(seed);
    ThroughputDropDetector d(1, {});
    int events = 0;
    for (int64_t it = 1; it <= 500; ++it) {
      // ±5% on every iteration, 3% of iterations twice as slow (a page fault, a log flush).
      double time = 1 + Noise(seed, 0, it, 0.05);
      if (UniformAt({seed, RngPurpose::kTest, 1}, static_cast<uint64_t>(it)) < 0.03) time *= 2;
      events += d.Add(it, 1 / time).has_value();
    }
    EXPECT_EQ(events, 0);
  }
}

}  // namespace
}  // namespace keel
