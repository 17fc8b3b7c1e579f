// Issue 36: the guard's answer to a slow divergence found by the trend test: notify journals a
// slow_divergence entry and goes on; act rolls back before its start, skips the data since and
// cuts the LR; neither fires on a healthy run.
#include <gtest/gtest.h>

#include <cmath>

#include "guard/guard.h"

namespace keel {
namespace {

struct Journaled {
  std::vector<nlohmann::json> events;
  Guard::Journal Sink() {
    return [this](const nlohmann::json& e, const std::string&) { events.push_back(e); };
  }
  int Count(const std::string& kind) const {
    int n = 0;
    for (const auto& e : events) n += e.value("event", "") == kind;
    return n;
  }
};

// A falling loss with 1% noise; from `climb` on it climbs 5% over 500 iterations.
GuardSignals At(int64_t it, int64_t climb) {
  uint64_t h = static_cast<uint64_t>(it) * 0x9E3779B97F4A7C15ULL;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ULL;
  h ^= h >> 32;
  const double u = static_cast<double>(h >> 11) / static_cast<double>(1ULL << 53);
  auto healthy = [](double t) { return 2 + 6 * std::pow(1 + t / 200, -0.5); };
  double loss = healthy(static_cast<double>(it));
  if (climb > 0 && it > climb)
    loss = healthy(static_cast<double>(climb)) * (1 + 0.05 * static_cast<double>(it - climb) / 500);
  GuardSignals s;
  s.iteration = it;
  s.consumed_samples = it * 8;
  s.loss = loss * (1 + 0.01 * (2 * u - 1) * std::sqrt(3.0));
  s.grad_norm = 0.5;
  return s;
}

TEST(GuardDivergenceTest, NotifyJournalsOnceAndGoesOn) {
  Journaled j;
  GuardConfig cfg;  // act mode, --guard-divergence notify
  Guard g(cfg, j.Sink());
  int64_t found = -1;
  // To 2400: from 2500 the climb is 5% and the level rule (act) would roll back.
  for (int64_t it = 1; it <= 2400; ++it) {
    const StepVerdict v = g.OnStep(At(it, 2000));
    EXPECT_EQ(v.decision.kind, GuardDecision::Kind::kContinue) << it;
    if (found < 0 && j.Count("slow_divergence") > 0) found = it;
  }
  ASSERT_EQ(j.Count("slow_divergence"), 1) << j.events.back().dump();
  const auto& e = j.events[0];
  EXPECT_EQ(e["action"], "notify");
  EXPECT_NEAR(e["start"].get<double>(), 2000, 100);
  EXPECT_LE(found - 2000, 200);
  EXPECT_LT(e["size"].get<double>(), 0.03);  // before the loss is 3% above its level
  EXPECT_GT(e["confidence"].get<double>(), 0.95);
  EXPECT_EQ(g.rollbacks(), 0);
}

TEST(GuardDivergenceTest, ActRollsBackBeforeTheStartSkipsTheDataSinceAndCutsTheLr) {
  Journaled j;
  GuardConfig cfg;
  cfg.divergence_act = true;
  Guard g(cfg, j.Sink());
  nlohmann::json saved;  // the guard state of a checkpoint at 1900
  for (int64_t it = 1; it <= 2600; ++it) {
    const StepVerdict v = g.OnStep(At(it, 2000));
    if (it == 1900) saved = g.ToJson();
    if (v.decision.kind == GuardDecision::Kind::kContinue) continue;
    ASSERT_EQ(v.decision.kind, GuardDecision::Kind::kRollback);
    EXPECT_NEAR(static_cast<double>(v.decision.onset), 2000, 100);
    EXPECT_LT(v.decision.latest_target, v.decision.onset);
    EXPECT_LE(v.decision.skip_first, v.decision.onset);
    EXPECT_EQ(v.decision.skip_last, it);  // the data since the start, to where it was found
    EXPECT_EQ(v.decision.lr_factor, cfg.lr_cut);
    EXPECT_LE(it - 2000, 200);
    EXPECT_EQ(j.Count("slow_divergence"), 1);
    EXPECT_EQ(j.events.back()["action"], "rollback");
    g.OnRolledBack(v.decision, 1900, saved);
    EXPECT_FALSE(g.trend().diverging());
    EXPECT_GT(g.trend().size(), 1000u);  // the history before the rise, from the checkpoint
    // The run goes on healthy from there (the data skipped, the LR cut): no new report.
    for (int64_t k = 1901; k <= 2600; ++k)
      EXPECT_EQ(g.OnStep(At(k, 0)).decision.kind, GuardDecision::Kind::kContinue) << k;
    EXPECT_EQ(j.Count("slow_divergence"), 1);
    return;
  }
  FAIL() << "no rollback";
}

TEST(GuardDivergenceTest, QuietOnAHealthyRunAndAfterARestart) {
  Journaled j;
  GuardConfig cfg;
  cfg.divergence_act = true;
  Guard g(cfg, j.Sink());
  for (int64_t it = 1; it <= 3000; ++it) {
    GuardSignals s = At(it, 0);
    if (it == 2000) g.OnRestart(1999);
    if (it > 2000 && it <= 2005) s.loss *= 1.05;  // the bump after a resume
    EXPECT_EQ(g.OnStep(s).decision.kind, GuardDecision::Kind::kContinue) << it;
  }
  EXPECT_EQ(j.Count("slow_divergence"), 0);
}

TEST(GuardDivergenceTest, EachDatasetOfAMixtureHasItsOwnTest) {
  Journaled j;
  GuardConfig cfg;
  Guard g(cfg, j.Sink());
  for (int64_t it = 1; it <= 2600; ++it) {
    GuardSignals s = At(it, 0);
    // Dataset 1 climbs (a shard gone bad), dataset 0 does not; the total barely moves.
    s.dataset_loss = {At(it + 5000, 0).loss, At(it, 2000).loss};
    g.OnStep(s);
  }
  ASSERT_EQ(j.Count("slow_divergence"), 1);
  EXPECT_EQ(j.events[0]["signal"], "lm loss of dataset 1");
  EXPECT_EQ(j.events[0]["action"], "notify");
}

}  // namespace
}  // namespace keel
