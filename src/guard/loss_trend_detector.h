// LossTrendDetector: a slow divergence of the loss, found while it is still small. A loss that
// climbs a few percent over hundreds of iterations, with noise larger than each step's rise, is no
// spike, and the level rule (InstabilityDetector's median of 50 > 5% above the lowest) sees it
// only once it is 5% up. This detector looks for the start of a rise instead:
//
//   expected curve  at each candidate start s (on a grid of `grid` iterations), a robust line
//                   through the `reference` iterations before s: Theil-Sen over the medians of 8
//                   blocks of log(loss), shrunk toward 0 by its standard error (noise alone gives
//                   a slope of about one) and never rising. Its level at s: the winsorized mean of
//                   the newest `level_window` iterations carried to s at that slope (its error
//                   counts the slope's); after s it falls at `slope_damping` of the slope (a
//                   healthy loss falls ever more slowly). Its noise: the winsorized RMS of
//                   consecutive differences in the reference (the MAD alone is noisy on 100
//                   records, and an underestimate inflates every z).
//   the rise        for every candidate start s between max_window and min_window iterations ago,
//                   the residuals of log(loss) after s against that curve are fitted with a ramp
//                   b (t - s); z = sum r (t - s) / its standard error (the noise and the
//                   uncertainty of the level at s). The start with the largest z is the onset.
//   divergence      z >= z_threshold (+0.5 per doubling of records per `grid` iterations), the
//                   loss above its level at s by >= min_abs_rise, a ramp above the plain mean of
//                   the 200 iterations before s at z >= 3.25 (a plateau falls short of the curve
//                   but does not rise), no better fit by a step, and the newest quarter of the
//                   window still up (a bump that came back is not a drift).
//
// Values are what the caller judged normal (no spikes: the spike detector has those). A restart
// drops what came after the resume point and ignores `settle` iterations, at least
// `settle_records` records (the bump after a resume); Rebaseline (a new LR warm-up, a new batch
// size) starts the history afresh. Sizes are relative (log loss), so the detector is the same for
// any loss scale. Used by the guard (live, and per dataset of a mixture) and by `keel logs analyze`
// / `watch`.
#pragma once

#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace keel {

struct LossTrendConfig {
  int64_t reference = 1000;     // iterations the expected curve is fitted on
  int64_t min_window = 100;     // a rise is judged over at least this many iterations ...
  int64_t max_window = 600;     // ... and its start looked for at most this far back
  int64_t grid = 10;            // candidate starts every this many iterations (at least a record)
  int min_records = 8;          // records in a judged window (and 2x in the reference)
  double z_threshold = 4.0;     // standard errors of the rise
  int64_t level_window = 500;   // the newest iterations of the reference that set its level
  double min_abs_rise = 0.005;  // rise above the level at the start (relative)
  double slope_damping = 0.5;   // the expected curve keeps this much of the reference's fall
  int64_t settle = 20;          // iterations ignored after a restart ...
  int settle_records = 10;      // ... and at least this many records (a log's bump lasts records)
};

struct LossTrend {
  bool diverging = false;
  int64_t start = 0;          // iteration the rise began (the best candidate start)
  int64_t found = 0;          // iteration it was decided
  int64_t latest = 0;         // the newest iteration judged
  double base = 0;            // the loss level at the start (the expected curve there)
  double size = 0;            // relative rise of the loss above `base` at `latest` (the ramp's fit)
  double above_expected = 0;  // relative rise above the expected curve
  double z = 0;
  double confidence = 0;  // 1 - the one-sided p of z, Bonferroni-corrected over candidate starts
};

class LossTrendDetector {
 public:
  explicit LossTrendDetector(const LossTrendConfig& cfg = {});

  // One value (a record's loss, or an iteration's); non-finite or <= 0 values are refused. Returns
  // true when this value confirmed a new divergence (current() says which); while it lasts no new
  // one is reported, and it ends once the median of the last min_window iterations is back at its
  // base.
  bool Add(int64_t iteration, double loss);
  const LossTrend& current() const { return cur_; }
  bool diverging() const { return cur_.diverging; }

  // The run resumed after `iteration` (a restart; a rollback): values after it are dropped, an
  // open divergence is forgotten, and the next `settle` iterations (at least `settle_records`
  // records, at the smallest spacing of the last values kept) are ignored.
  void Restart(int64_t iteration);
  // The work changed (LR warm-up, a new global batch size): the history starts afresh.
  void Rebaseline();
  size_t size() const { return points_.size(); }
  // The largest z of a rise that passed the size, step and persistence tests, divergence or not
  // (how close a healthy run came to the threshold).
  double max_z() const { return max_z_; }
  const LossTrendConfig& config() const { return cfg_; }

  nlohmann::json ToJson() const;
  Status FromJson(const nlohmann::json& j, const std::string& where);

 private:
  struct Point {
    int64_t it;
    double y;  // log(loss)
  };
  struct Fit {  // the expected curve from candidate start s
    int64_t s = 0;
    bool ok = false;
    double level = 0, slope = 0, noise = 0, level_se = 0;
    double flat_level = 0, flat_se = 0, slope_se = 0;  // the level just before s, not carried
  };
  Fit FitAt(int64_t s) const;
  void Judge();

  LossTrendConfig cfg_;
  std::deque<Point> points_;
  std::deque<Fit> fits_;  // cached by start, ascending
  int64_t ignore_until_ = -1;
  LossTrend cur_;
  double max_z_ = 0;
};

}  // namespace keel
