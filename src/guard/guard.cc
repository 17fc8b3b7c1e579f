#include "guard/guard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/json_number.h"
#include "core/json_reader.h"
#include "journal/events.h"

namespace keel {
namespace {

using json = nlohmann::json;

std::string Signals(const GuardSignals& s) {
  std::string out = fmt::format("lm loss {:.4f}, grad norm {:.3f}", s.loss, s.grad_norm);
  if (std::isfinite(s.max_attn_logit))
    out += fmt::format(", max attention logit {:.2f}", s.max_attn_logit);
  if (std::isfinite(s.log_z)) out += fmt::format(", log Z {:.2f}", s.log_z);
  if (std::isfinite(s.loss_scale)) out += fmt::format(", loss scale {:g}", s.loss_scale);
  return out;
}

EventSignals SignalsOf(const GuardSignals& s) {
  EventSignals e;
  e.lm_loss = s.loss;
  e.grad_norm = s.grad_norm;
  e.update_ratio = s.update_ratio;
  e.max_exp_avg_sq = s.max_exp_avg_sq;
  e.max_attn_logit = s.max_attn_logit;
  e.log_z = s.log_z;
  e.loss_scale = s.loss_scale;
  e.nonfinite = s.nonfinite;
  return e;
}

}  // namespace

const char* GuardModeName(GuardMode m) {
  switch (m) {
    case GuardMode::kOff:
      return "off";
    case GuardMode::kObserve:
      return "observe";
    case GuardMode::kAct:
      return "act";
  }
  return "?";
}

Guard::Guard(const GuardConfig& cfg, Journal journal)
    : cfg_(cfg),
      journal_(std::move(journal)),
      detector_(cfg.detector),
      trend_(cfg.trend),
      attn_armed_(cfg.attn_logit_max) {}

template <class E>
void Guard::Emit(E event, const std::string& sentence) {
  ++decisions_;
  event.mode = GuardModeName(cfg_.mode);
  if (journal_) journal_(json(event.ToJson()), sentence);
}

void Guard::OnRestart(int64_t iteration) {
  restart_iter_ = iteration;
  prev_loss_ = NAN;
  // The bump after a resume is no drift: the trend tests let `settle` iterations pass.
  trend_.Restart(iteration);
  for (LossTrendDetector& t : dataset_trends_) t.Restart(iteration);
}

GuardDecision Guard::JudgeTrends(const GuardSignals& s) {
  GuardDecision none;
  if (dataset_trends_.size() < s.dataset_loss.size() && s.dataset_loss.size() > 1)
    dataset_trends_.resize(s.dataset_loss.size(), LossTrendDetector(cfg_.trend));
  auto journal = [&](const LossTrendDetector& t, const std::string& signal, const char* action,
                     const std::string& then) {
    const LossTrend& d = t.current();
    SlowDivergenceEvent ev;
    ev.iteration = s.iteration;
    ev.consumed_samples = s.consumed_samples;
    ev.signal = signal;
    ev.start = d.start;
    ev.baseline = d.base;
    ev.value = d.base * (1 + d.size);
    ev.size = d.size;
    ev.above_expected = d.above_expected;
    ev.z = d.z;
    ev.confidence = d.confidence;
    ev.action = action;
    ev.signals = SignalsOf(s);
    Emit(ev, fmt::format("iteration {}: slow divergence: the {} has been climbing since iteration "
                         "{}, {:+.1f}% above its level there ({:.4f}) and {:+.1f}% above its "
                         "expected curve (z {:.1f}, confidence {:.4f}); {}",
                         s.iteration, signal, d.start, 100 * d.size, d.base, 100 * d.above_expected,
                         d.z, d.confidence, then));
  };
  for (size_t k = 0; k < dataset_trends_.size() && k < s.dataset_loss.size(); ++k)
    if (dataset_trends_[k].Add(s.iteration, s.dataset_loss[k]))
      journal(dataset_trends_[k], fmt::format("lm loss of dataset {}", k), "notify",
              "the mixture's other datasets may hide it in the total loss");
  if (!trend_.Add(s.iteration, s.loss)) return none;
  const bool act = cfg_.mode == GuardMode::kAct && cfg_.divergence_act;
  if (!act) {
    journal(trend_, "lm loss", "notify",
            cfg_.mode == GuardMode::kAct
                ? "--guard-divergence notify: the run goes on (act: roll back before it, skip "
                  "the data since, cut the LR)"
                : "observe mode: nothing changed");
    return none;
  }
  const LossTrend& d = trend_.current();
  journal(trend_, "lm loss", "rollback",
          fmt::format("--guard-divergence act: roll back before iteration {}, skip the data "
                      "since, cut the LR x{}",
                      d.start, cfg_.lr_cut));
  // The ladder's bookkeeping: an event open from the start of the rise, decided at once.
  event_ = Event{};
  event_.open = true;
  event_.kind = "divergence";
  event_.signal = "lm loss";
  event_.onset = std::max<int64_t>(1, d.start);
  event_.first = s.iteration;
  event_.baseline = d.base;
  event_.peak = s.loss;
  event_.decided = true;
  GuardDecision g = Escalate(
      s, fmt::format("slow divergence since iteration {} ({:+.1f}%)", d.start, 100 * d.size));
  // A drift is the LR's or the data's: this rollback cuts the LR whatever the ladder's rung.
  if (g.kind == GuardDecision::Kind::kRollback) g.lr_factor = std::min(g.lr_factor, cfg_.lr_cut);
  return g;
}

void Guard::Close(const GuardSignals& s, const std::string& classification) {
  const std::string cls = event_.resume ? "resume spike (" + classification + ")" : classification;
  RecoveredEvent ev;
  ev.iteration = s.iteration;
  ev.onset = event_.onset;
  ev.classification = cls;
  ev.skipped_updates = event_.skipped;
  ev.signals = SignalsOf(s);
  Emit(ev, fmt::format("iteration {}: {:.4f} is back at the pre-onset level {:.4f} after {} "
                       "iteration(s): {}{}",
                       s.iteration, s.loss, event_.baseline, s.iteration - event_.onset, cls,
                       event_.skipped > 0 ? fmt::format(", {} update(s) skipped", event_.skipped)
                                          : std::string()));
  event_ = Event{};
}

GuardDecision Guard::Escalate(const GuardSignals& s, const std::string& why) {
  GuardDecision d;
  d.onset = event_.onset;
  d.latest_target = event_.onset - cfg_.margin;
  d.skip_first = std::max<int64_t>(1, event_.onset - cfg_.skip_before);
  d.skip_last = std::max<int64_t>(event_.onset + cfg_.skip_after, s.iteration);
  if (rollbacks_ >= cfg_.max_rollbacks) {
    d.kind = GuardDecision::Kind::kStop;
    d.reason = fmt::format(
        "{}; the rollback budget is spent ({} of --guard-max-rollbacks {}): stopping. Study the "
        "pinned checkpoints and the journal, then resume with a lower --lr-scale-on-resume or "
        "raise --guard-max-rollbacks",
        why, rollbacks_, cfg_.max_rollbacks);
    return d;
  }
  d.kind = GuardDecision::Kind::kRollback;
  const bool escalate =
      last_rollback_onset_ >= 0 && event_.onset - last_rollback_onset_ <= cfg_.escalation_window;
  d.level = escalate ? level_ + 1 : 0;
  if (d.level >= 1) d.lr_factor = cfg_.lr_cut;
  if (d.level >= 2) d.reseed = true;
  d.reason = why;
  return d;
}

StepVerdict Guard::OnStepLadder(const GuardSignals& s, const GuardProbes* probes) {
  // The loss of the iteration before this one, for the probe; this one's for the next.
  struct Remember {
    double* slot;
    double value;
    ~Remember() { *slot = value; }
  } remember{&prev_loss_, s.loss};
  StepVerdict v;
  if (cfg_.mode == GuardMode::kOff) return v;
  const bool act = cfg_.mode == GuardMode::kAct;
  if (watch_until_ >= 0 && s.iteration >= watch_until_ && !event_.open) {
    RecoveryConfirmedEvent ev;
    ev.iteration = s.iteration;
    ev.signals = SignalsOf(s);
    Emit(ev,
         fmt::format("iteration {}: past the skipped window with no new anomaly; lm loss median "
                     "{:.4f} (before the onset {:.4f}): recovered",
                     s.iteration, detector_.LossBaseline(), watch_baseline_));
    watch_until_ = -1;
  }
  const Anomaly a = detector_.Check(s);
  if (!event_.open) {
    if (a.kind == AnomalyKind::kNone) {
      detector_.Accept(s);
      v.decision = JudgeTrends(s);
      return v;
    }
    // Rerun before acting: keel is deterministic, so the same state and batch give the same
    // bits; a different loss means this process's arithmetic failed once, not the data.
    if (a.kind != AnomalyKind::kDivergence && probes != nullptr && probes->rerun) {
      const double again = probes->rerun();
      if (std::memcmp(&again, &s.loss, sizeof(double)) != 0) {
        ++transient_faults_;
        const std::vector<int> ranks =
            probes->rerun_ranks ? probes->rerun_ranks() : std::vector<int>{};
        const std::string on =
            ranks.empty()
                ? std::string()
                : fmt::format(" on rank{} {}", ranks.size() > 1 ? "s" : "", fmt::join(ranks, ", "));
        TransientFaultEvent ev;
        ev.iteration = s.iteration;
        ev.lm_loss = s.loss;
        ev.rerun_lm_loss = again;
        ev.transient_faults = transient_faults_;
        ev.ranks.assign(ranks.begin(), ranks.end());
        ev.signals = SignalsOf(s);
        Emit(ev, fmt::format(
                     "iteration {}: {} {:.6g} (z={:.1f}); computed again from the same state it "
                     "is {:.6g}: a transient fault in the arithmetic{} (silent data "
                     "corruption), not the data; {} the update ({} such fault(s) in this "
                     "run); if it repeats, check the machine",
                     s.iteration, a.signal, a.value, a.z, again, on, act ? "skipped" : "would skip",
                     transient_faults_));
        v.apply_update = !act;
        return v;
      }
    }
    event_.open = true;
    event_.kind = AnomalyKindName(a.kind);
    event_.signal = a.signal;
    event_.onset = a.kind == AnomalyKind::kDivergence ? std::max<int64_t>(1, a.onset) : s.iteration;
    event_.first = s.iteration;
    event_.baseline =
        a.kind == AnomalyKind::kSpike && a.signal == "grad norm"
            ? detector_.LossBaseline()
            : (a.kind == AnomalyKind::kDivergence ? a.baseline : detector_.LossBaseline());
    event_.resume = restart_iter_ >= 0 && s.iteration - restart_iter_ <= cfg_.resume_window;
    // Batch or weights: the current weights on the previous (normal) batch.
    std::string blame;
    // A healthy update does not make the loss of the batch it learned from worse (beyond the
    // noise); the last one did if the weights are the problem.
    if (a.kind == AnomalyKind::kSpike && probes != nullptr && probes->previous_batch &&
        std::isfinite(prev_loss_)) {
      event_.probe_loss = probes->previous_batch();
      const double worse = detector_.LossZ(event_.probe_loss) - detector_.LossZ(prev_loss_);
      // An update learns its own batch even when it harms the rest (a far too large step):
      // so a previous update far larger than usual blames the weights too.
      const double big = detector_.UpdateRatioZ(s.update_ratio);
      const bool big_update = std::isfinite(big) && big > cfg_.detector.grad_z_threshold;
      if (std::isfinite(worse)) {
        event_.cause = worse < cfg_.detector.recover_z && !big_update ? "data" : "weights";
        blame = fmt::format(
            "; on the previous batch the weights now score {:.4f} (before its update {:.4f}, "
            "{:+.1f} noise units){}: {}",
            event_.probe_loss, prev_loss_, worse,
            big_update ? fmt::format(", and that update was {:.0f} noise units larger than "
                                     "usual (update/weight {:.3g})",
                                     big, s.update_ratio)
                       : std::string(),
            event_.cause == "data"
                ? "the weights are healthy, this batch is the anomaly"
                : fmt::format("the last update made the weights worse, so the updates go on and "
                              "the optimizer may recover (a rollback if the loss is not back "
                              "within {} iterations)",
                              cfg_.recover_iters));
      }
    }
    std::string what;
    if (a.kind == AnomalyKind::kNonFinite)
      what = fmt::format("non-finite {} ({})", a.signal, a.value);
    else if (a.kind == AnomalyKind::kSpike)
      what = fmt::format("{} jumped from {:.4f} to {:.4f} (z={:.1f})", a.signal, a.baseline,
                         a.value, a.z);
    else
      what = fmt::format(
          "lm loss is diverging: the median of the last {} iterations is {:.4f}, "
          "{:.1f}% above its lowest level {:.4f} (reached at iteration {})",
          cfg_.detector.divergence_window, a.value, 100.0 * (a.value / a.baseline - 1.0),
          a.baseline, a.onset);
    DetectedEvent ev;
    ev.iteration = s.iteration;
    ev.consumed_samples = s.consumed_samples;
    ev.kind_name = event_.kind;
    ev.signal = a.signal;
    ev.value = a.value;
    ev.baseline = a.baseline;
    ev.z = a.z;
    ev.onset = event_.onset;
    ev.resume_spike = event_.resume;
    if (!event_.cause.empty()) ev.cause = event_.cause;
    ev.probe_lm_loss = event_.probe_loss;
    ev.signals = SignalsOf(s);
    Emit(ev, fmt::format("iteration {}: {}{}; {}{}", s.iteration, what,
                         event_.resume ? fmt::format(" ({} iteration(s) after a restart)",
                                                     s.iteration - restart_iter_)
                                       : std::string(),
                         Signals(s), blame));
  }
  event_.peak = std::isfinite(event_.peak) ? std::max(event_.peak, s.loss) : s.loss;

  if (a.kind == AnomalyKind::kNone) {
    event_.consecutive = 0;
    if (detector_.LossZ(s.loss) < cfg_.detector.recover_z) {
      const int64_t took = s.iteration - event_.onset;
      Close(s, event_.kind == "non-finite"       ? "transient non-finite values"
               : took <= cfg_.fast_recover_iters ? "recovered spike"
                                                 : "slow-recovering spike");
      detector_.Accept(s);
      return v;
    }
    if (!event_.decided && s.iteration - event_.onset >= cfg_.recover_iters) {
      event_.decided = true;
      v.decision = Escalate(
          s, fmt::format("lm loss {:.4f} is still above the pre-onset level {:.4f} {} iterations "
                         "after the onset at iteration {}",
                         s.loss, event_.baseline, s.iteration - event_.onset, event_.onset));
    }
  } else {
    ++event_.consecutive;
    if (a.kind == AnomalyKind::kDivergence) {
      if (!event_.decided) {
        event_.decided = true;
        v.decision = Escalate(s, "divergence");
      }
    } else if (event_.cause == "weights" && a.kind == AnomalyKind::kSpike) {
      // Skipping would freeze the weights where they went wrong: the optimizer goes on, and
      // the recovery rule below rolls back if the loss does not return.
      if (!event_.decided && s.iteration - event_.onset >= cfg_.recover_iters) {
        event_.decided = true;
        v.decision = Escalate(
            s, fmt::format("lm loss {:.4f} is still above the pre-onset level {:.4f} {} "
                           "iterations after the onset at iteration {}",
                           s.loss, event_.baseline, s.iteration - event_.onset, event_.onset));
      }
    } else if (event_.consecutive <=
               (event_.cause == "data" ? cfg_.max_data_skips : cfg_.max_skips)) {
      const int limit = event_.cause == "data" ? cfg_.max_data_skips : cfg_.max_skips;
      v.apply_update = false;
      ++event_.skipped;
      SkipUpdateEvent ev;
      ev.iteration = s.iteration;
      ev.onset = event_.onset;
      Emit(ev,
           fmt::format("iteration {}: {} the update ({} of at most {} in a row{})", s.iteration,
                       act ? "skipped" : "would skip", event_.consecutive, limit,
                       event_.cause == "data" ? ", the batches anomalous, the weights not" : ""));
    } else if (!event_.decided) {
      event_.decided = true;
      v.apply_update = false;
      v.decision = Escalate(s, fmt::format("{} anomalous iterations in a row since iteration {}",
                                           event_.consecutive, event_.first));
    }
  }
  if (!act) {
    if (v.decision.kind != GuardDecision::Kind::kContinue) {
      WouldActEvent ev;
      ev.iteration = s.iteration;
      ev.onset = event_.onset;
      ev.action = v.decision.kind == GuardDecision::Kind::kStop ? "stop" : "rollback";
      ev.reason = v.decision.reason;
      Emit(ev, fmt::format("iteration {}: {}; would {} (observe mode: nothing changed)",
                           s.iteration, v.decision.reason,
                           v.decision.kind == GuardDecision::Kind::kStop
                               ? "stop"
                               : fmt::format("roll back before iteration {} and skip iterations "
                                             "{}..{}",
                                             v.decision.onset, v.decision.skip_first,
                                             v.decision.skip_last)));
    }
    v = StepVerdict{};
  }
  return v;
}

StepVerdict Guard::OnStep(const GuardSignals& s, const GuardProbes* probes) {
  StepVerdict v = OnStepLadder(s, probes);
  if (cfg_.mode == GuardMode::kOff) return v;
  const bool act = cfg_.mode == GuardMode::kAct;
  // Leading indicator: attention logits that grew past the threshold saturate the softmax, the
  // precursor of attention-entropy collapse and of the loss climbing back (Wortsman et al.
  // 2023); a smaller LR slows their growth. Acted on before the loss moves.
  if (v.decision.kind == GuardDecision::Kind::kContinue && cfg_.attn_logit_max > 0 &&
      lr_cuts_ < cfg_.max_lr_cuts && std::isfinite(s.max_attn_logit) &&
      std::isfinite(attn_armed_) && s.max_attn_logit > attn_armed_) {
    ++lr_cuts_;
    const double armed = attn_armed_;
    attn_armed_ = 10 * s.max_attn_logit;
    v.decision.kind = GuardDecision::Kind::kCutLr;
    v.decision.lr_factor = cfg_.lr_cut;
    v.decision.onset = s.iteration;
    v.decision.reason =
        fmt::format("the max attention logit is {:.1f}, past {:.0f}", s.max_attn_logit, armed);
    LeadingIndicatorEvent ev;
    ev.iteration = s.iteration;
    ev.signal = "max attention logit";
    ev.value = s.max_attn_logit;
    ev.threshold = armed;
    ev.action = act ? "lr_cut" : "would_cut_lr";
    ev.lr_factor = cfg_.lr_cut;
    ev.lr_cuts = lr_cuts_;
    ev.next_threshold = attn_armed_;
    ev.recommendation = "enable --qk-layernorm (and --z-loss 1e-4) on the next run";
    ev.signals = SignalsOf(s);
    Emit(ev,
         fmt::format("iteration {}: {} (lm loss {:.4f}, not yet moving): attention softmax "
                     "saturating, the precursor of attention-entropy collapse; {} the LR by x{} "
                     "in place ({} of at most {}; the next at a logit of {:.0f}). Recommended: "
                     "enable --qk-layernorm (and --z-loss 1e-4) on the next run",
                     s.iteration, v.decision.reason, s.loss, act ? "cut" : "would cut", cfg_.lr_cut,
                     lr_cuts_, cfg_.max_lr_cuts, attn_armed_));
  }
  if (!act && v.decision.kind == GuardDecision::Kind::kCutLr) v.decision = GuardDecision{};
  return v;
}

void Guard::OnRolledBack(const GuardDecision& d, int64_t iteration, const json& saved_state) {
  prev_loss_ = NAN;  // the trainer's previous batch is from before the rollback
  InstabilityDetector restored(cfg_.detector);
  if (saved_state.is_object() && saved_state.contains("detector") &&
      restored.FromJson(saved_state["detector"], "guard.detector").ok())
    detector_ = restored;
  else
    detector_ = InstabilityDetector(cfg_.detector);
  // The trend test as it stood at that checkpoint (its history before the rise), or afresh.
  LossTrendDetector trend(cfg_.trend);
  if (saved_state.is_object() && saved_state.contains("trend") &&
      trend.FromJson(saved_state["trend"], "guard.trend").ok())
    trend_ = trend;
  else
    trend_ = LossTrendDetector(cfg_.trend);
  trend_.Restart(iteration);
  for (LossTrendDetector& t : dataset_trends_) t.Restart(iteration);
  ++rollbacks_;
  level_ = d.level;
  last_rollback_onset_ = d.onset;
  watch_until_ = d.skip_last + 10;
  watch_baseline_ = event_.baseline;
  event_ = Event{};
}

void Guard::OnRollbackImpossible(const GuardDecision& d, const std::string& why) {
  GuardStopEvent ev;
  ev.onset = d.onset;
  ev.reason = why;
  Emit(ev, fmt::format("cannot roll back: {}; stopping", why));
}

json Guard::PolicyJson() const {
  return {{"rollbacks", rollbacks_},
          {"level", level_},
          {"last_rollback_onset", last_rollback_onset_},
          {"decisions", decisions_},
          {"watch_until", watch_until_},
          {"watch_baseline", JsonNumber(watch_baseline_)},
          {"transient_faults", transient_faults_},
          {"lr_cuts", lr_cuts_},
          {"attn_armed", JsonNumber(attn_armed_)}};
}

Status Guard::PolicyFromJson(const json& j, const std::string& where) {
  JsonReader r(where, j);
  const JsonValue p = r.root();
  const int rollbacks = p["rollbacks"].Get<int>();
  const int level = p["level"].Get<int>();
  const int64_t last_onset = p["last_rollback_onset"].Get<int64_t>();
  const int64_t decisions = p["decisions"].Get<int64_t>();
  const int64_t watch_until = p.Optional("watch_until").Get<int64_t>(-1);
  const double watch_baseline = p.Optional("watch_baseline").Number();
  const int64_t transient = p.Optional("transient_faults").Get<int64_t>(0);
  const int lr_cuts = p.Optional("lr_cuts").Get<int>(0);
  const JsonValue armed = p.Optional("attn_armed");
  KEEL_RETURN_IF_ERROR(r.status());
  rollbacks_ = rollbacks;
  level_ = level;
  last_rollback_onset_ = last_onset;
  decisions_ = decisions;
  watch_until_ = watch_until;
  watch_baseline_ = watch_baseline;
  transient_faults_ = transient;
  lr_cuts_ = lr_cuts;
  if (armed.present()) attn_armed_ = armed.Number();
  return Status::OK();
}

json Guard::ToJson() const {
  json ev = nullptr;
  if (event_.open)
    ev = {{"kind", event_.kind},
          {"signal", event_.signal},
          {"onset", event_.onset},
          {"first", event_.first},
          {"baseline", JsonNumber(event_.baseline)},
          {"peak", JsonNumber(event_.peak)},
          {"consecutive", event_.consecutive},
          {"skipped", event_.skipped},
          {"resume", event_.resume},
          {"decided", event_.decided},
          {"cause", event_.cause},
          {"probe_loss", JsonNumber(event_.probe_loss)}};
  return {
      {"mode", GuardModeName(cfg_.mode)},  {"healthy", healthy()}, {"detector", detector_.ToJson()},
      {"trend", trend_.ToJson()},          {"event", ev},          {"policy", PolicyJson()},
      {"restart_iteration", restart_iter_}};
}

Status Guard::FromJson(const json& j, const std::string& where) {
  if (!j.is_object()) return Status::Corruption(where + ": guard state is not an object");
  KEEL_RETURN_IF_ERROR(detector_.FromJson(j.value("detector", json()), where + ".detector"));
  // Absent in checkpoints saved before the trend test: it starts empty.
  trend_ = LossTrendDetector(cfg_.trend);
  if (j.contains("trend")) KEEL_RETURN_IF_ERROR(trend_.FromJson(j["trend"], where + ".trend"));
  KEEL_RETURN_IF_ERROR(PolicyFromJson(j.value("policy", json()), where + ".policy"));
  event_ = Event{};
  JsonReader r(where, j);
  const JsonValue ev = r.root().Optional("event");
  if (ev.raw().is_object()) {
    event_.open = true;
    event_.kind = ev["kind"].Get<std::string>();
    event_.signal = ev["signal"].Get<std::string>();
    event_.onset = ev["onset"].Get<int64_t>();
    event_.first = ev["first"].Get<int64_t>();
    event_.baseline = ev["baseline"].Number();
    event_.peak = ev["peak"].Number();
    event_.consecutive = ev["consecutive"].Get<int>();
    event_.skipped = ev["skipped"].Get<int>();
    event_.resume = ev["resume"].Get<bool>();
    event_.decided = ev["decided"].Get<bool>();
    event_.cause = ev.Optional("cause").Get<std::string>("");
    event_.probe_loss = ev.Optional("probe_loss").Number();
  } else if (ev.present() && !ev.is_null()) {
    r.Fail(ev.path(), "must be an object (or null), but is " + DescribeJson(ev.raw()));
  }
  restart_iter_ = r.root().Optional("restart_iteration").Get<int64_t>(-1);
  KEEL_RETURN_IF_ERROR(r.status());
  return Status::OK();
}

}  // namespace keel
