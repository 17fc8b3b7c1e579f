// Issue 36: a small sustained slowdown in another framework's log. On synthetic logs of both styles
// (Megatron-LM, Megatron-DeepSpeed; one record per iteration or per 10; noise on the printed
// iteration time), `keel logs analyze` reports a sustained 2-3% slower iteration within 300
// iterations, says how sure it is, and reports nothing on healthy logs of 10k iterations. Before,
// the drop threshold (3% of throughput: a 3% slower iteration is 2.9% less) missed them all.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "../statistical_sweep.h"
#include "logs/log_analysis.h"
#include "logs/megatron_log.h"
#include "logs/synthetic_log.h"

namespace keel {
namespace {

constexpr int64_t kSlowFrom = 5000;

LogAnalysis Analyze(const SyntheticLogOptions& o) {
  ParsedLog log;
  EXPECT_TRUE(ParseMegatronLog(GenerateSyntheticLog(o), "synthetic.log", &log).ok());
  LogAnalysis a;
  const Status st = AnalyzeLog(log, {}, &a);
  EXPECT_TRUE(st.ok()) << st.message();
  return a;
}

std::vector<LogEvent> Drops(const LogAnalysis& a) {
  std::vector<LogEvent> drops;
  for (const LogEvent& e : a.events)
    if (e.kind == "throughput_drop") drops.push_back(e);
  return drops;
}

// "(found at iteration N, z = Z over the median of W records, noise P% a record)"
struct Found {
  int64_t iteration = -1;
  double z = 0, noise = 0;
};
Found FoundOf(const LogEvent& e) {
  static const std::regex re(
      R"(found at iteration (\d+), z = ([0-9.]+) over the median of \d+ records, noise ([0-9.]+)%)");
  std::smatch m;
  Found f;
  if (!std::regex_search(e.detail, m, re)) return f;
  f.iteration = std::stoll(m[1]);
  f.z = std::stod(m[2]);
  f.noise = std::stod(m[3]) / 100;
  return f;
}

SyntheticLogOptions Slowed(SyntheticLogStyle style, int per_record, double noise, double size,
                           uint64_t seed) {
  SyntheticLogOptions o;
  o.style = style;
  o.per_record = per_record;
  o.time_noise = noise;
  o.slowdown_start = size > 0 ? kSlowFrom : -1;
  o.slowdown_size = size;
  o.seed = seed;
  // A slowdown is judged within 300 iterations: the log need not go on long after.
  if (size > 0) o.iterations = kSlowFrom + 1000;
  return o;
}

// The issue's case: iteration times in ms, one record per 10 iterations, 0.4% noise, 3% slower
// from iteration 5000.
TEST(LogSlowdownTest, Tr8StyleThreePercentSlowdownIsReportedWithItsConfidence) {
  for (SyntheticLogStyle style :
       {SyntheticLogStyle::kMegatronDeepSpeed, SyntheticLogStyle::kMegatronLM}) {
    SCOPED_TRACE(SyntheticLogStyleName(style));
    const LogAnalysis a = Analyze(Slowed(style, 10, 0.004, 0.03, 1));
    const std::vector<LogEvent> drops = Drops(a);
    ASSERT_EQ(drops.size(), 1u);
    const LogEvent& d = drops[0];
    EXPECT_NEAR(static_cast<double>(d.start), kSlowFrom, 30) << d.detail;
    EXPECT_EQ(d.end, kSlowFrom + 1000) << d.detail;  // not back: down to the end of the log
    EXPECT_NEAR(d.value / d.baseline - 1, -0.03, 0.006) << d.detail;
    const Found f = FoundOf(d);
    EXPECT_GT(f.iteration, kSlowFrom) << d.detail;
    EXPECT_LE(f.iteration, kSlowFrom + 300) << d.detail;
    EXPECT_GE(f.z, 5) << d.detail;
    EXPECT_NEAR(f.noise, 0.004, 0.0015) << d.detail;  // measured on the records themselves
    EXPECT_NE(d.detail.find("a sustained shift"), std::string::npos) << d.detail;
  }
}

// Sustained 2% and 3% slowdowns, both styles, one record per iteration or per 10, noise 0.3% to
// 1%: found within 300 iterations of their start. (2% under 1% noise at one record per 10 is the
// edge of what 30 records can tell: there it takes 150-450, docs/benchmarks.md.)
TEST(LogSlowdownTest, TwoAndThreePercentSlowdownsAreFoundWithin300Iterations) {
  for (SyntheticLogStyle style :
       {SyntheticLogStyle::kMegatronDeepSpeed, SyntheticLogStyle::kMegatronLM}) {
    for (int per : {1, 10}) {
      for (double noise : {0.003, 0.005, 0.01}) {
        for (double size : {0.02, 0.03}) {
          if (per == 10 && noise == 0.01 && size == 0.02) continue;
          for (uint64_t seed = 1; seed <= keel_test::SweepSeeds(2, 1); ++seed) {
            SCOPED_TRACE(testing::Message() << SyntheticLogStyleName(style) << ", " << per
                                            << " iterations a record, noise " << noise << ", "
                                            << size << " slower, seed " << seed);
            const std::vector<LogEvent> drops =
                Drops(Analyze(Slowed(style, per, noise, size, seed)));
            ASSERT_EQ(drops.size(), 1u);
            EXPECT_NEAR(static_cast<double>(drops[0].start), kSlowFrom, 10.0 * per)
                << drops[0].detail;
            const Found f = FoundOf(drops[0]);
            EXPECT_GT(f.iteration, kSlowFrom) << drops[0].detail;
            EXPECT_LE(f.iteration, kSlowFrom + 300) << drops[0].detail;
          }
        }
      }
    }
  }
}

// Healthy logs of 10k iterations with the same noise: no drop (nothing else either).
TEST(LogSlowdownTest, HealthyTenThousandIterationLogsReportNoDrop) {
  for (SyntheticLogStyle style :
       {SyntheticLogStyle::kMegatronDeepSpeed, SyntheticLogStyle::kMegatronLM}) {
    for (int per : {1, 10}) {
      for (double noise : {0.003, 0.01}) {
        for (uint64_t seed = 11; seed <= 10 + keel_test::SweepSeeds(2, 1); ++seed) {
          SCOPED_TRACE(testing::Message()
                       << SyntheticLogStyleName(style) << ", " << per
                       << " iterations a record, noise " << noise << ", seed " << seed);
          const std::vector<LogEvent> drops = Drops(Analyze(Slowed(style, per, noise, 0, seed)));
          EXPECT_TRUE(drops.empty()) << drops[0].detail;
        }
      }
    }
  }
}

}  // namespace
}  // namespace keel
