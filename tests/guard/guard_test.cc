// The guard's decisions on synthetic signal streams: robust windows that a NaN cannot poison,
// spike / divergence / non-finite detection, no alarm on a noisy clean run, recovery
// classification, the escalation ladder and its budget, observe mode, and state round trips.
#include "guard/guard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "guard/instability_detector.h"
#include "guard/robust_window.h"

namespace keel {
namespace {

using json = nlohmann::json;

TEST(RobustWindowTest, MedianMadAndNonFiniteRefused) {
  RobustWindow w(5);
  for (double v : {1.0, 2.0, 3.0, 4.0, 100.0}) EXPECT_TRUE(w.Add(v));
  EXPECT_FALSE(w.Add(NAN));
  EXPECT_FALSE(w.Add(INFINITY));
  EXPECT_EQ(w.size(), 5u);
  EXPECT_DOUBLE_EQ(w.Median(), 3.0);
  EXPECT_DOUBLE_EQ(w.Mad(), 1.0);  // |x - 3| = 2,1,0,1,97
  w.Add(5.0);                      // drops 1.0: 2,3,4,100,5
  EXPECT_DOUBLE_EQ(w.Median(), 4.0);
  // z with the floors: MAD-based scale 1.4826, or 10% of the median if larger.
  EXPECT_NEAR(w.Z(10.0, 0.0, 0.0), 6.0 / w.NoiseScale(), 1e-12);
  EXPECT_NEAR(w.Z(10.0, 20.0, 0.0), 6.0 / 80.0, 1e-12);  // the relative floor wins
}

TEST(RobustWindowTest, JsonRoundTripIsExact) {
  RobustWindow w(4), r;
  for (double v : {0.1, 1.0 / 3.0, 2.718281828459045, 6.02e23}) w.Add(v);
  ASSERT_TRUE(r.FromJson(json::parse(w.ToJson().dump()), "w").ok());
  EXPECT_EQ(r.ToJson(), w.ToJson());
  EXPECT_EQ(r.Median(), w.Median());
  json bad = w.ToJson();
  bad["capacity"] = 2;  // more values than capacity
  EXPECT_FALSE(r.FromJson(bad, "w").ok());
}

// A noisy, slowly falling loss (clean training) and a matching gradient norm.
GuardSignals Clean(int64_t it, uint64_t seed = 7) {
  GuardSignals s;
  s.iteration = it;
  const double noise = NormalAt({seed, RngPurpose::kTest, 0}, static_cast<uint64_t>(it));
  s.loss = 3.0 + 2.0 * std::exp(-it / 1000.0) + 0.05 * noise;
  s.grad_norm = 0.8 + 0.1 * NormalAt({seed, RngPurpose::kTest, 1}, static_cast<uint64_t>(it));
  return s;
}

TEST(InstabilityDetectorTest, NoAlarmOnACleanNoisyRun) {
  InstabilityDetector d;
  for (int64_t it = 1; it <= 3000; ++it) {
    const GuardSignals s = Clean(it);
    ASSERT_EQ(d.Check(s).kind, AnomalyKind::kNone) << "iteration " << it;
    d.Accept(s);
  }
}

TEST(InstabilityDetectorTest, SpikeOnLossAndOnGradNormButNotBeforeMinHistory) {
  InstabilityDetector d;
  GuardSignals s = Clean(1);
  s.loss = 50;  // huge, but no history yet
  EXPECT_EQ(d.Check(s).kind, AnomalyKind::kNone);
  for (int64_t it = 1; it <= 100; ++it) d.Accept(Clean(it));
  s = Clean(101);
  s.loss += 1.5;
  Anomaly a = d.Check(s);
  EXPECT_EQ(a.kind, AnomalyKind::kSpike);
  EXPECT_EQ(a.signal, "lm loss");
  EXPECT_GT(a.z, 6);
  EXPECT_EQ(a.onset, 101);
  s = Clean(101);
  s.grad_norm = 20;
  a = d.Check(s);
  EXPECT_EQ(a.kind, AnomalyKind::kSpike);
  EXPECT_EQ(a.signal, "grad norm");
  s = Clean(101);
  s.loss += 0.1;  // within noise: 2 sigma
  EXPECT_EQ(d.Check(s).kind, AnomalyKind::kNone);
}

TEST(InstabilityDetectorTest, NonFiniteIsImmediateAndNeverPoisonsTheWindows) {
  InstabilityDetector d;
  for (int64_t it = 1; it <= 60; ++it) d.Accept(Clean(it));
  const double median = d.LossBaseline();
  GuardSignals s = Clean(61);
  s.loss = NAN;
  EXPECT_EQ(d.Check(s).kind, AnomalyKind::kNonFinite);
  d.Accept(s);  // a NaN offered to the windows is refused
  s = Clean(61);
  s.grad_norm = INFINITY;
  s.nonfinite = true;
  EXPECT_EQ(d.Check(s).kind, AnomalyKind::kNonFinite);
  d.Accept(s);
  EXPECT_EQ(d.LossBaseline(), median);
  EXPECT_EQ(d.history(), 60u);
  EXPECT_EQ(d.Check(Clean(62)).kind, AnomalyKind::kNone);
}

TEST(InstabilityDetectorTest, SlowDivergenceIsCaughtWhereZScoresFollowIt) {
  InstabilityDetector d;
  int64_t it = 1;
  for (; it <= 300; ++it) d.Accept(Clean(it));
  // From 300 on the loss creeps up by 0.2% per iteration: never a spike, always a rise.
  Anomaly a;
  for (; it <= 600; ++it) {
    GuardSignals s = Clean(it);
    s.loss = Clean(300).loss * (1.0 + 0.002 * static_cast<double>(it - 300)) +
             0.05 * NormalAt({7, RngPurpose::kTest, 0}, static_cast<uint64_t>(it));
    a = d.Check(s);
    ASSERT_NE(a.kind, AnomalyKind::kSpike) << "iteration " << it;
    if (a.kind == AnomalyKind::kDivergence) break;
    d.Accept(s);
  }
  ASSERT_EQ(a.kind, AnomalyKind::kDivergence);
  EXPECT_LT(it, 400);  // within ~60 iterations of a 5% rise
  EXPECT_GT(a.value, a.baseline * 1.05);
  EXPECT_GE(a.onset, 280);  // the level was lowest around where the rise began
  EXPECT_LE(a.onset, 330);
}

struct Recorder {
  std::vector<json> events;
  std::vector<std::string> sentences;
  Guard::Journal Fn() {
    return [this](const json& e, const std::string& s) {
      events.push_back(e);
      sentences.push_back(s);
    };
  }
  int Count(const std::string& kind) const {
    int n = 0;
    for (const json& e : events) n += e.value("event", "") == kind;
    return n;
  }
};

// Feeds clean iterations [from, to] and returns the first non-continue decision (if any).
GuardDecision Feed(Guard& g, int64_t from, int64_t to, double bump = 0) {
  for (int64_t it = from; it <= to; ++it) {
    GuardSignals s = Clean(it);
    s.loss += bump;
    const StepVerdict v = g.OnStep(s);
    if (v.decision.kind != GuardDecision::Kind::kContinue) return v.decision;
  }
  return GuardDecision{};
}

TEST(GuardTest, IsolatedSpikeIsSkippedAndClassifiedRecovered) {
  Recorder rec;
  Guard g(GuardConfig{}, rec.Fn());
  Feed(g, 1, 100);
  GuardSignals s = Clean(101);
  s.loss += 3;
  StepVerdict v = g.OnStep(s);
  EXPECT_FALSE(v.apply_update);
  EXPECT_FALSE(g.healthy());
  EXPECT_EQ(g.OnStep(Clean(102)).apply_update, true);
  EXPECT_TRUE(g.healthy());
  ASSERT_EQ(rec.Count("recovered"), 1);
  EXPECT_EQ(rec.events.back()["classification"], "recovered spike");
  EXPECT_EQ(rec.Count("skip_update"), 1);
  EXPECT_NE(rec.sentences[0].find("iteration 101: lm loss jumped from"), std::string::npos)
      << rec.sentences[0];
}

// The probes decide who is to blame. Weights healthy (the previous batch scores as it did
// before its update): the anomalous batches' updates are skipped for as long as they last, up
// to max_data_skips. Weights worse on the previous batch: nothing is skipped (that would freeze
// them), and the run rolls back only if the loss is not back within recover_iters.
TEST(GuardTest, ProbesBlameTheBatchOrTheWeights) {
  GuardConfig cfg;
  cfg.max_data_skips = 20;
  {
    Recorder rec;
    Guard g(cfg, rec.Fn());
    Feed(g, 1, 100);
    double previous = Clean(100).loss;
    GuardProbes same;  // the rerun gives the same bits (set per step below)
    same.previous_batch = [&] { return previous - 0.01; };
    int64_t it = 101;
    for (; it <= 120; ++it) {  // 20 bad batches: all skipped
      GuardSignals s = Clean(it);
      s.loss += 3;
      same.rerun = [l = s.loss] { return l; };
      EXPECT_FALSE(g.OnStep(s, &same).apply_update) << it;
    }
    GuardSignals s = Clean(it);  // the 21st: the ladder's next rung
    s.loss += 3;
    same.rerun = [l = s.loss] { return l; };
    const StepVerdict v = g.OnStep(s, &same);
    EXPECT_EQ(v.decision.kind, GuardDecision::Kind::kRollback);
    EXPECT_EQ(rec.events.front()["cause"], "data");
    EXPECT_EQ(rec.Count("skip_update"), 20);
  }
  {
    Recorder rec;
    Guard g(cfg, rec.Fn());
    Feed(g, 1, 100);
    GuardProbes probes;
    probes.previous_batch = [] { return Clean(100).loss + 2; };  // the last update hurt
    int64_t it = 101;
    StepVerdict v;
    for (; it <= 101 + cfg.recover_iters; ++it) {
      GuardSignals s = Clean(it);
      s.loss += 3;
      probes.rerun = [l = s.loss] { return l; };
      v = g.OnStep(s, &probes);
      EXPECT_TRUE(v.apply_update) << it;  // the optimizer goes on
      if (v.decision.kind != GuardDecision::Kind::kContinue) break;
    }
    EXPECT_EQ(rec.events.front()["cause"], "weights");
    EXPECT_EQ(rec.Count("skip_update"), 0);
    EXPECT_EQ(v.decision.kind, GuardDecision::Kind::kRollback);
    EXPECT_EQ(it, 101 + cfg.recover_iters);
    EXPECT_NE(rec.sentences.front().find("the last update made the weights worse"),
              std::string::npos)
        << rec.sentences.front();
  }
  {
    // Rerun before acting: other bits from the same state are a transient fault, no event.
    Recorder rec;
    Guard g(cfg, rec.Fn());
    Feed(g, 1, 100);
    GuardSignals s = Clean(101);
    s.loss += 3;
    GuardProbes probes;
    probes.rerun = [l = s.loss] { return std::nextafter(l, 0.0); };
    const StepVerdict v = g.OnStep(s, &probes);
    EXPECT_FALSE(v.apply_update);
    EXPECT_TRUE(g.healthy());
    EXPECT_EQ(g.transient_faults(), 1);
    ASSERT_EQ(rec.events.size(), 1u);
    EXPECT_EQ(rec.events[0]["event"], "transient_fault");
    EXPECT_TRUE(g.OnStep(Clean(102), &probes).apply_update);
    // Counted across checkpoints.
    Guard restored(cfg, nullptr);
    ASSERT_TRUE(restored.FromJson(g.ToJson(), "t").ok());
    EXPECT_EQ(restored.transient_faults(), 1);
  }
}

// Leading indicator: the max attention logit past the threshold cuts the LR in place (no
// rollback, no skip), again only when it has grown 10x further, at most max_lr_cuts times; the
// journal recommends QK-LayerNorm; observe mode only says what it would do; the arming survives
// a checkpoint.
TEST(GuardTest, AttentionLogitGrowthCutsTheLrBeforeTheLossMoves) {
  GuardConfig cfg;
  cfg.attn_logit_max = 100;
  cfg.max_lr_cuts = 2;
  Recorder rec;
  Guard g(cfg, rec.Fn());
  auto step = [&](Guard& guard, int64_t it, double logit) {
    GuardSignals s = Clean(it);
    s.max_attn_logit = logit;
    return guard.OnStep(s);
  };
  EXPECT_EQ(step(g, 1, 99).decision.kind, GuardDecision::Kind::kContinue);
  StepVerdict v = step(g, 2, 150);
  EXPECT_EQ(v.decision.kind, GuardDecision::Kind::kCutLr);
  EXPECT_EQ(v.decision.lr_factor, cfg.lr_cut);
  EXPECT_TRUE(v.apply_update);
  EXPECT_TRUE(g.healthy());  // no event: the loss has not moved
  EXPECT_EQ(step(g, 3, 1400).decision.kind, GuardDecision::Kind::kContinue);  // < 10 x 150
  Guard restored(cfg, nullptr);
  ASSERT_TRUE(restored.FromJson(g.ToJson(), "t").ok());
  EXPECT_EQ(step(restored, 4, 1400).decision.kind, GuardDecision::Kind::kContinue);
  EXPECT_EQ(step(g, 4, 1600).decision.kind, GuardDecision::Kind::kCutLr);
  EXPECT_EQ(step(g, 5, 1e9).decision.kind, GuardDecision::Kind::kContinue);  // budget spent
  ASSERT_EQ(rec.Count("leading_indicator"), 2);
  EXPECT_EQ(rec.events[0]["recommendation"],
            "enable --qk-layernorm (and --z-loss 1e-4) on the next run");
  EXPECT_NE(rec.sentences[0].find("iteration 2: the max attention logit is 150.0, past 100"),
            std::string::npos)
      << rec.sentences[0];
  GuardConfig observe = cfg;
  observe.mode = GuardMode::kObserve;
  Recorder orec;
  Guard o(observe, orec.Fn());
  EXPECT_EQ(step(o, 1, 500).decision.kind, GuardDecision::Kind::kContinue);
  ASSERT_EQ(orec.Count("leading_indicator"), 1);
  EXPECT_EQ(orec.events[0]["action"], "would_cut_lr");
  cfg.attn_logit_max = 0;  // off
  Guard off(cfg, nullptr);
  EXPECT_EQ(step(off, 1, 1e9).decision.kind, GuardDecision::Kind::kContinue);
}

TEST(GuardTest, SlowRecoveryIsClassifiedAndNotRolledBack) {
  Recorder rec;
  Guard g(GuardConfig{}, rec.Fn());
  Feed(g, 1, 100);
  GuardSignals s = Clean(101);
  s.loss += 3;
  g.OnStep(s);
  // 40 iterations elevated by ~4.5 noise units (not a spike, not recovered), then back.
  EXPECT_EQ(Feed(g, 102, 141, 0.45).kind, GuardDecision::Kind::kContinue);
  EXPECT_FALSE(g.healthy());
  Feed(g, 142, 145);
  EXPECT_TRUE(g.healthy());
  EXPECT_EQ(rec.events.back()["classification"], "slow-recovering spike");
}

TEST(GuardTest, LadderEscalatesThenStopsWhenTheBudgetIsSpent) {
  Recorder rec;
  GuardConfig cfg;
  cfg.max_rollbacks = 3;
  Guard g(cfg, rec.Fn());
  Feed(g, 1, 100);
  int64_t it = 101;
  std::vector<GuardDecision> ds;
  for (int round = 0; round < 4; ++round) {
    // A persistent spike: max_skips skipped updates, then a decision.
    GuardDecision d;
    for (int k = 0; k <= cfg.max_skips; ++k, ++it) {
      GuardSignals s = Clean(it);
      s.loss += 3;
      const StepVerdict v = g.OnStep(s);
      EXPECT_FALSE(v.apply_update);
      if (k < cfg.max_skips) {
        EXPECT_EQ(v.decision.kind, GuardDecision::Kind::kContinue);
      }
      d = v.decision;
    }
    ds.push_back(d);
    if (d.kind != GuardDecision::Kind::kRollback) break;
    const int64_t onset = it - cfg.max_skips - 1;
    EXPECT_EQ(d.onset, onset);
    EXPECT_EQ(d.latest_target, onset - 1);
    EXPECT_EQ(d.skip_first, onset - 5);
    EXPECT_EQ(d.skip_last, onset + 50);
    // The loop rolls back to a checkpoint before the onset, with its (pre-onset) guard state.
    g.OnRolledBack(d, onset - 1, json());
    EXPECT_TRUE(g.healthy());
    Feed(g, it, it + 30);
    it += 31;
  }
  ASSERT_EQ(ds.size(), 4u);
  EXPECT_EQ(ds[0].level, 0);
  EXPECT_EQ(ds[0].lr_factor, 1.0);
  EXPECT_FALSE(ds[0].reseed);
  EXPECT_EQ(ds[1].level, 1);
  EXPECT_EQ(ds[1].lr_factor, 0.5);
  EXPECT_FALSE(ds[1].reseed);
  EXPECT_EQ(ds[2].level, 2);
  EXPECT_TRUE(ds[2].reseed);
  EXPECT_EQ(ds[3].kind, GuardDecision::Kind::kStop);
  EXPECT_NE(ds[3].reason.find("budget is spent"), std::string::npos);
  EXPECT_EQ(g.rollbacks(), 3);
}

TEST(GuardTest, FarApartEventsStartTheLadderAgain) {
  GuardConfig cfg;
  cfg.escalation_window = 100;
  Guard g(cfg, nullptr);
  Feed(g, 1, 100);
  GuardDecision d = Feed(g, 101, 104, 3);
  ASSERT_EQ(d.kind, GuardDecision::Kind::kRollback);
  g.OnRolledBack(d, 100, json());
  Feed(g, 101, 400);
  d = Feed(g, 401, 404, 3);
  ASSERT_EQ(d.kind, GuardDecision::Kind::kRollback);
  EXPECT_EQ(d.level, 0);  // 300 iterations later: not an escalation
}

TEST(GuardTest, NotRecoveredWithinRecoverItersRollsBack) {
  Guard g(GuardConfig{}, nullptr);
  Feed(g, 1, 100);
  GuardSignals s = Clean(101);
  s.loss += 3;
  g.OnStep(s);
  const GuardDecision d = Feed(g, 102, 200, 0.45);
  ASSERT_EQ(d.kind, GuardDecision::Kind::kRollback);
  EXPECT_EQ(d.onset, 101);
  EXPECT_NE(d.reason.find("still above the pre-onset level"), std::string::npos);
}

TEST(GuardTest, ObserveModeJournalsButNeverChangesAnything) {
  Recorder rec;
  GuardConfig cfg;
  cfg.mode = GuardMode::kObserve;
  Guard g(cfg, rec.Fn());
  Feed(g, 1, 100);
  for (int64_t it = 101; it <= 110; ++it) {
    GuardSignals s = Clean(it);
    s.loss += 3;
    const StepVerdict v = g.OnStep(s);
    EXPECT_TRUE(v.apply_update);
    EXPECT_EQ(v.decision.kind, GuardDecision::Kind::kContinue);
  }
  EXPECT_EQ(rec.Count("would_act"), 1);
  EXPECT_NE(rec.sentences.back().find("would roll back"), std::string::npos);
  EXPECT_EQ(rec.events.back()["mode"], "observe");
}

TEST(GuardTest, OffModeSeesNothing) {
  Recorder rec;
  GuardConfig cfg;
  cfg.mode = GuardMode::kOff;
  Guard g(cfg, rec.Fn());
  Feed(g, 1, 100);
  EXPECT_EQ(Feed(g, 101, 110, 3).kind, GuardDecision::Kind::kContinue);
  EXPECT_TRUE(rec.events.empty());
}

TEST(GuardTest, StateRoundTripGivesTheSameDecisions) {
  Guard a(GuardConfig{}, nullptr);
  Feed(a, 1, 150);
  GuardSignals s = Clean(151);
  s.loss += 3;
  a.OnStep(s);  // an event is open at the save
  Guard b(GuardConfig{}, nullptr);
  ASSERT_TRUE(b.FromJson(json::parse(a.ToJson().dump()), "guard").ok());
  EXPECT_EQ(b.ToJson(), a.ToJson());
  EXPECT_FALSE(b.healthy());
  for (int64_t it = 152; it <= 160; ++it) {
    GuardSignals t = Clean(it);
    t.loss += 3;
    const StepVerdict va = a.OnStep(t), vb = b.OnStep(t);
    EXPECT_EQ(va.apply_update, vb.apply_update);
    EXPECT_EQ(static_cast<int>(va.decision.kind), static_cast<int>(vb.decision.kind));
  }
  EXPECT_EQ(b.ToJson(), a.ToJson());
  EXPECT_FALSE(b.FromJson(json::parse("{\"detector\": 3}"), "guard").ok());
}

}  // namespace
}  // namespace keel
