#include "logs/synthetic_log.h"

#include <gtest/gtest.h>

#include <cmath>

#include "logs/megatron_log.h"

namespace keel {
namespace {

TEST(SyntheticLog, BothStylesParseWithTheInjectedEffects) {
  for (auto style : {SyntheticLogStyle::kMegatronLM, SyntheticLogStyle::kMegatronDeepSpeed}) {
    for (int per : {1, 10}) {
      SyntheticLogOptions o;
      o.style = style;
      o.per_record = per;
      o.iterations = 3000;
      o.loss_noise = 0;
      o.time_noise = 0;
      o.divergence_start = 1000;
      o.divergence_size = 0.05;
      o.divergence_iterations = 500;
      o.slowdown_start = 2000;
      o.slowdown_size = 0.03;
      ParsedLog log;
      ASSERT_TRUE(ParseMegatronLog(GenerateSyntheticLog(o), "synthetic.log", &log).ok());
      ASSERT_EQ(log.records.size(), static_cast<size_t>(3000 / per))
          << SyntheticLogStyleName(style);
      EXPECT_TRUE(log.rejected.empty());
      for (const LogRecord& r : log.records) {
        ASSERT_TRUE(r.has_loss);
        ASSERT_TRUE(std::isfinite(r.iteration_seconds));
        double want = SyntheticHealthyLoss(o, static_cast<double>(r.iteration));
        if (r.iteration > 1000)
          want = SyntheticHealthyLoss(o, 1000) *
                 (1 + 0.05 * static_cast<double>(r.iteration - 1000) / 500);
        EXPECT_NEAR(r.lm_loss / want, 1.0, 1e-5) << r.iteration;
        EXPECT_NEAR(r.iteration_seconds, r.iteration > 2000 ? 1.5 * 1.03 : 1.5, 1e-3);
      }
      EXPECT_EQ(log.records.front().iteration, per);
    }
  }
}

TEST(SyntheticLog, NoiseHasTheRequestedSize) {
  SyntheticLogOptions o;
  o.iterations = 20000;
  o.loss_noise = 0.01;
  o.time_noise = 0.004;
  ParsedLog log;
  ASSERT_TRUE(ParseMegatronLog(GenerateSyntheticLog(o), "s.log", &log).ok());
  double s2 = 0, t2 = 0;
  for (const LogRecord& r : log.records) {
    const double e = r.lm_loss / SyntheticHealthyLoss(o, static_cast<double>(r.iteration)) - 1;
    const double f = r.iteration_seconds / 1.5 - 1;
    s2 += e * e;
    t2 += f * f;
  }
  const double n = static_cast<double>(log.records.size());
  EXPECT_NEAR(std::sqrt(s2 / n), 0.01, 0.0005);
  EXPECT_NEAR(std::sqrt(t2 / n), 0.004, 0.0003);  // the ms field's rounding adds a little
}

TEST(SyntheticLog, RestartGoesBackAndBumps) {
  SyntheticLogOptions o;
  o.iterations = 1000;
  o.loss_noise = 0;
  o.restart_at = 600;
  o.resume_from = 500;
  o.resume_bump = 0.1;
  ParsedLog log;
  ASSERT_TRUE(ParseMegatronLog(GenerateSyntheticLog(o), "s.log", &log).ok());
  ASSERT_EQ(log.records.size(), 1100u);
  const LogRecord& r = log.records[600];
  EXPECT_EQ(r.iteration, 501);
  EXPECT_TRUE(r.after_start);
  EXPECT_NEAR(r.lm_loss / SyntheticHealthyLoss(o, 501), 1.1, 1e-5);
  EXPECT_NEAR(log.records[603].lm_loss / SyntheticHealthyLoss(o, 504), 1.0, 1e-5);
}

}  // namespace
}  // namespace keel
