// InstabilityDetector: online detection of loss spikes, divergence and non-finite values from the
// signals of each training iteration.
//
//   spike       robust z-score of the lm loss above z_threshold, or of the gradient norm above
//               grad_z_threshold: distance from the median of the last 20 accepted values, in
//               units of the noise of the last `window` (MAD of consecutive differences, so a
//               falling loss does not blunt the detector)
//   divergence  the median loss of the last `divergence_window` iterations stays more than
//               `divergence_rel` above the lowest such median seen (the pre-onset level): a slow
//               rise that a z-score misses because the window follows it
//   non-finite  NaN/Inf in the loss or the gradients: immediate
//
// Check() is pure; Accept() feeds an iteration judged normal into the windows, so the values of a
// spike never inflate the baseline it is measured against. The windows are part of the
// checkpoint (ToJson/FromJson), so a resumed run detects exactly as an uninterrupted one.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "guard/robust_window.h"

namespace keel {

// What the loop measures every iteration (NaN where a signal is not available).
struct GuardSignals {
  int64_t iteration = 0;         // the iteration these belong to (1-based)
  int64_t consumed_samples = 0;  // before this iteration's batch
  double loss = 0;               // mean lm loss of the global batch
  double grad_norm = 0;          // before clipping
  double update_ratio = NAN;     // ||delta w|| / ||w|| of the previous applied update
  double max_exp_avg_sq = NAN;   // max of Adam's second moment (after the previous update)
  double max_attn_logit = NAN;   // max pre-softmax attention score over layers and heads
  double log_z = NAN;            // mean log-partition of the output softmax
  double loss_scale = NAN;       // --fp16: the dynamic loss scale after this iteration
  bool nonfinite = false;        // NaN/Inf in the loss or any gradient
  // A mixture: each dataset's mean loss over its sequences of the batch (NaN: none this time).
  std::vector<double> dataset_loss;
};

struct DetectorConfig {
  int window = 100;              // values per robust window
  int min_history = 20;          // no spike detection before this many accepted values
  double z_threshold = 6;        // loss spike
  double grad_z_threshold = 10;  // gradient-norm spike (noisier than the loss)
  double loss_rel_floor = 0.02;  // z denominators never below 2% of the median loss ...
  double grad_rel_floor = 0.25;  // ... or 25% of the median gradient norm
  int divergence_window = 50;
  double divergence_rel = 0.05;
  double recover_z = 2;  // an open event has recovered when the loss z falls below this
};

enum class AnomalyKind { kNone, kNonFinite, kSpike, kDivergence };
const char* AnomalyKindName(AnomalyKind k);

struct Anomaly {
  AnomalyKind kind = AnomalyKind::kNone;
  std::string signal;     // "lm loss", "grad norm", "loss or gradients"
  double value = NAN;     // the offending value
  double baseline = NAN;  // median of the window (for divergence: the pre-onset level)
  double z = NAN;
  int64_t onset = 0;  // divergence: iteration at which the pre-onset level was reached
};

class InstabilityDetector {
 public:
  explicit InstabilityDetector(const DetectorConfig& cfg = {});

  Anomaly Check(const GuardSignals& s) const;
  void Accept(const GuardSignals& s);
  // Robust z of the loss against the current window (for recovery checks).
  double LossZ(double loss) const;
  // Robust z of the gradient norm against its window (for recovery checks of grad-norm spikes).
  double GradZ(double grad_norm) const;
  // Robust z of the previous update's ||delta w|| / ||w|| against its window; NaN before
  // min_history values (the guard's blame: an update far larger than usual hurt the weights).
  double UpdateRatioZ(double ratio) const;
  double LossBaseline() const { return loss_.RecentMedian(20); }
  // After a divergence was handled: forget the level so the rolled-back run starts afresh.
  void ResetDivergence();
  size_t history() const { return loss_.size(); }

  nlohmann::json ToJson() const;
  Status FromJson(const nlohmann::json& j, const std::string& where);
  const DetectorConfig& config() const { return cfg_; }

 private:
  DetectorConfig cfg_;
  RobustWindow loss_, grad_, recent_;  // recent_: the last divergence_window losses
  RobustWindow ratio_;                 // update/weight ratios of accepted iterations
  double best_level_ = NAN;            // lowest median of recent_ seen
  int64_t best_level_iter_ = 0;
};

}  // namespace keel
