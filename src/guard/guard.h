// Guard: decides what to do about each iteration's signals, within limits the user sets.
//
// An anomalous iteration (InstabilityDetector) opens an event. Before acting, with the trainer's
// probes (GuardProbes), the guard re-runs the iteration's forward from the same state: a loss
// that differs in any bit is a transient fault, not the data (journaled, counted, the update
// skipped). A spike is then blamed on the batch or on the weights by the loss of the current
// weights on the previous, normal batch ("cause"). The escalation ladder, in act mode:
//   1. skip the update of an anomalous iteration: a bad batch's (the weights are healthy) for as
//      long as the batches stay anomalous, at most `max_data_skips` in a row; a NaN/Inf, or a
//      spike of unknown cause, at most `max_skips` in a row. A spike of the weights themselves is
//      not skipped (skipping would freeze them where they went wrong): the optimizer goes on;
//   2. still anomalous after that, not back at the pre-onset level `recover_iters` after the
//      onset, or a divergence: roll back to the newest healthy checkpoint at least `margin`
//      iterations before the onset and skip the data window [onset - skip_before, onset +
//      skip_after];
//   3. a rollback within `escalation_window` iterations of the previous one also multiplies the
//      LR by `lr_cut`; the one after that also re-seeds the data order;
//   4. after `max_rollbacks` rollbacks the run stops with a report.
// Observe mode runs the same logic and journals what it would do, changing nothing. The Guard
// only decides: the training loop (train/guard_controller) executes rollbacks and skips.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "guard/instability_detector.h"
#include "guard/loss_trend_detector.h"

namespace keel {

enum class GuardMode { kOff, kObserve, kAct };
const char* GuardModeName(GuardMode m);

struct GuardConfig {
  GuardMode mode = GuardMode::kAct;
  DetectorConfig detector;
  int max_skips = 3;        // non-finite values, or spikes of unknown cause (no probes)
  int max_data_skips = 50;  // spikes of the batch (the weights probed healthy)
  int recover_iters = 50;
  int fast_recover_iters = 30;  // recovered within this: "recovered spike", else "slow-recovering"
  int margin = 1;
  int skip_before = 5;
  int skip_after = 50;
  double lr_cut = 0.5;
  int max_rollbacks = 4;
  int escalation_window = 500;
  int resume_window = 20;  // events this soon after a restart are "resume spikes"
  // Leading indicator: the max attention logit past this (0: off) cuts the LR by lr_cut in
  // place, before the loss moves; again each time it grows 10x more, at most max_lr_cuts times.
  double attn_logit_max = 100;
  int max_lr_cuts = 3;
  // Slow divergence (the trend test, on the loss of the iterations the detector judged normal,
  // and on each dataset's loss of a mixture): journaled always; in act mode with
  // divergence_act, a rollback before its start that skips the data since and cuts the LR.
  LossTrendConfig trend;
  bool divergence_act = false;
};

struct GuardDecision {
  enum class Kind { kContinue, kRollback, kStop, kCutLr };  // kCutLr: in place, no rollback
  Kind kind = Kind::kContinue;
  int64_t onset = 0;          // first anomalous iteration of the event
  int64_t latest_target = 0;  // roll back to a checkpoint at or before this iteration
  int64_t skip_first = 0;     // iterations to skip after the rollback, inclusive
  int64_t skip_last = -1;
  double lr_factor = 1.0;  // multiply the LR scale by this
  bool reseed = false;     // re-seed the data order
  int level = 0;           // rung of the ladder (0: rollback + skip)
  std::string reason;      // one sentence
};

// What the guard may ask the trainer before it decides (each a collective in data parallel, run
// between an iteration's gradients and its update). Either may be empty.
struct GuardProbes {
  std::function<double()> rerun;           // this iteration's lm loss, computed again
  std::function<double()> previous_batch;  // the current weights' lm loss on the last batch
  // After `rerun`: the data-parallel ranks whose own part differed (empty: not known).
  std::function<std::vector<int>()> rerun_ranks;
};

struct StepVerdict {
  bool apply_update = true;
  GuardDecision decision;
};

class Guard {
 public:
  // `journal` receives every detection and decision: a JSON event and a plain sentence.
  using Journal = std::function<void(const nlohmann::json& event, const std::string& sentence)>;
  Guard(const GuardConfig& cfg, Journal journal);

  // Judges iteration s.iteration before its update is applied; `probes` (optional) are asked
  // only when an anomaly is detected.
  StepVerdict OnStep(const GuardSignals& s, const GuardProbes* probes = nullptr);
  // The controller rolled back to `iteration`; `saved_state` is that checkpoint's guard state
  // (null when it has none): its detector windows describe the run before the onset.
  void OnRolledBack(const GuardDecision& d, int64_t iteration, const nlohmann::json& saved_state);
  // A rollback was needed but not possible (no healthy checkpoint, no --save): the event stays
  // open and the run stops.
  void OnRollbackImpossible(const GuardDecision& d, const std::string& why);
  // The process (re)started at `iteration` from a checkpoint.
  void OnRestart(int64_t iteration);

  // No event open: a checkpoint saved now is a rollback target.
  bool healthy() const { return !event_.open; }
  GuardMode mode() const { return cfg_.mode; }
  const GuardConfig& config() const { return cfg_; }
  int rollbacks() const { return rollbacks_; }
  int64_t decisions() const { return decisions_; }
  int64_t transient_faults() const { return transient_faults_; }
  const LossTrendDetector& trend() const { return trend_; }

  // Everything (detector windows, open event, ladder and budget): the checkpoint's guard slot.
  nlohmann::json ToJson() const;
  Status FromJson(const nlohmann::json& j, const std::string& where);
  // The ladder and budget alone: they survive rollbacks (guard.json in the run directory).
  nlohmann::json PolicyJson() const;
  Status PolicyFromJson(const nlohmann::json& j, const std::string& where);

 private:
  struct Event {
    bool open = false;
    std::string kind;  // AnomalyKindName of the first anomaly
    std::string signal;
    int64_t onset = 0, first = 0;  // onset (divergence: where the level was lowest); detection
    double baseline = NAN, peak = NAN;
    int consecutive = 0;   // anomalous iterations in a row
    int skipped = 0;       // updates skipped in this event
    bool resume = false;   // within resume_window of a restart
    bool decided = false;  // a rollback/stop decision was issued (observe: would have been)
    std::string cause;     // "data", "weights", or "" (not probed)
    double probe_loss = NAN;
  };
  // The spike/divergence ladder; OnStep adds the leading indicators.
  StepVerdict OnStepLadder(const GuardSignals& s, const GuardProbes* probes);
  GuardDecision Escalate(const GuardSignals& s, const std::string& why);
  // The trend tests, on an iteration judged normal; a decision when act mode acts on one.
  GuardDecision JudgeTrends(const GuardSignals& s);
  void Close(const GuardSignals& s, const std::string& classification);
  // Journals `event` (a kind of journal/events.h) with the guard's mode.
  template <class E>
  void Emit(E event, const std::string& sentence);

  GuardConfig cfg_;
  Journal journal_;
  InstabilityDetector detector_;
  LossTrendDetector trend_;
  std::vector<LossTrendDetector> dataset_trends_;  // one per dataset of a mixture
  Event event_;
  int rollbacks_ = 0;
  int level_ = 0;
  int64_t last_rollback_onset_ = -1;
  int64_t decisions_ = 0;
  int64_t transient_faults_ = 0;
  int lr_cuts_ = 0;          // leading-indicator LR cuts so far
  double attn_armed_ = NAN;  // the next cut when the max attention logit passes this
  double prev_loss_ = NAN;   // the previous OnStep's lm loss (not saved: NaN after a restart)
  int64_t restart_iter_ = -1;
  int64_t watch_until_ = -1;  // after a rollback: report recovery once past this iteration
  double watch_baseline_ = NAN;
};

}  // namespace keel
