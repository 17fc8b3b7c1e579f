// LevelShift: the one rule for "a signal's level moved and stayed", shared by the live detectors
// (StragglerDetector, ThroughputDropDetector) and the throughput drop of `keel logs analyze`
// (logs/log_analysis). Levels and baselines are medians of windows (MedianOf), so single
// outliers move neither.
//
//   worsening = level / baseline - 1    a time (higher is worse):      0.05 = 5% slower
//             = 1 - level / baseline    a throughput (lower is worse): 0.05 = 5% less
//   shifted   worsening >  threshold
//   back      worsening <= threshold / 2   (hysteresis: a level hovering at the threshold does not
//                                           flap between the two)
//
// A NaN level or baseline (an empty window) is neither shifted nor back.
//
// SustainedShift: the same question for shifts under that threshold (a slow GPU costing 2-3%), as
// a test against the noise the series itself shows. A fixed threshold cannot: at 2% it fires on a
// noisy run, at 5% it misses the 3% that costs a day a month.
//   blocks     the values in consecutive blocks of `block` (10); a block that ended while no shift
//              was open is a reference block (its median, and the median of its values' relative
//              distance to it)
//   reference  R = the median of the medians of the last `max_blocks` (50) reference blocks that
//              ended at least 2M values ago (none of the M the level is taken from, nor the M
//              before, where a shift being found began); judging needs `min_blocks` (10) of them
//   noise      sigma, relative, per value: the larger of 1.4826 * the median of the blocks'
//              relative MADs (the noise within a block) and 1.4826 * the MAD of the blocks' medians
//              * sqrt(block) / 1.2533 (the same noise as seen from block to block: it also holds
//              slow wander and correlated values), at least 0.05%
//   level      L_M = the median of the last M values, M = 20, 40, ..., 640 (longer windows see
//              smaller shifts: a median's standard error is 1.2533 sigma / sqrt(n))
//   z          worsening(L_M, R) / sqrt(se(M)^2 + se(reference)^2)
//   shifted    worsening >= min_shift (1.5%) and z >= z (5) at S = max(M/4, 5) consecutive
//              values, at any M (the shortest that is sure decides)
//   back       worsening <= min_shift / 2 against the same R (frozen while the shift is open) at
//              S consecutive values, the level taken over the values since the shift's change
//              point only and over a window where that bar is sure: the shortest M (at least the
//              one that found the shift) whose standard error is at most min_shift / z, so that a
//              level still down by min_shift is z/2 standard errors from being called back
// A 2% slower iteration is 1.96% less throughput; measured with its noise it must pass the bar
// most of the time, so the bar is 1.5%.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace keel {

enum class Worse { kHigher, kLower };

struct LevelShift {
  double threshold = 0.05;
  Worse worse = Worse::kHigher;

  double Worsening(double level, double baseline) const {
    return worse == Worse::kHigher ? level / baseline - 1 : 1 - level / baseline;
  }
  bool Shifted(double level, double baseline) const {
    return Worsening(level, baseline) > threshold;
  }
  bool Back(double level, double baseline) const {
    return Worsening(level, baseline) <= threshold / 2;
  }
};

struct SustainedShiftOptions {
  double min_shift = 0.015;  // worsening that counts (0: the test is off)
  double z = 5;              // the shift over its standard error
  int block = 10;            // values per reference block
  int min_blocks = 10;       // reference blocks needed to judge
  int max_blocks = 50;       // the reference: at most the last this many
  int min_window = 20;       // M, doubling up to max_window
  int max_window = 640;
  double noise_floor = 0.0005;  // an exact series would make any shift infinitely sure
};

// One measurement of the level against the reference.
struct ShiftMeasure {
  int window = 0;          // M: the values the level is the median of
  double level = NAN;      // L_M
  double reference = NAN;  // R
  double worsening = NAN;  // worsening(L_M, R)
  double se = NAN;         // the standard error of the worsening
  double z = NAN;          // worsening / se
  double noise = NAN;      // sigma: relative noise per value
};

class SustainedShift {
 public:
  SustainedShift(Worse worse, SustainedShiftOptions o);

  // One value (finite and positive) at `iteration`. Returns a measure when it decides: the shift
  // (when none is open) or the return (when one is open).
  std::optional<ShiftMeasure> Add(int64_t iteration, double v);
  // A shift is open from `since` (found by this test or by another rule): the blocks after
  // `since` were already shifted and leave the reference, which freezes; no block is added.
  void Open(int64_t since, const std::optional<ShiftMeasure>& found);
  // It is over: blocks are reference again.
  void Close();
  void Reset();

  // The level over the last `window` values against the reference now (or the frozen one), with
  // its z and the noise; window 0 or NaNs while there is too little reference.
  ShiftMeasure Measure(int window) const;
  // Where the shift (after_is_worse) or the return began among the last `span` values since the
  // start or Close(): the split that best separates the values worse than halfway between
  // `reference` and a level `worsening` worse from the others.
  int64_t ChangePoint(size_t span, double reference, double worsening, bool after_is_worse) const;
  // The median of the values from `iteration` on (NaN when none is still held).
  double MedianSince(int64_t iteration) const;
  const SustainedShiftOptions& options() const { return opt_; }
  bool enabled() const { return opt_.min_shift > 0; }

 private:
  struct Block {
    int64_t end;  // the count of values when it closed
    int64_t last_iteration;
    double median, rel_mad;
  };
  struct Sample {
    int64_t iteration;
    double value;
  };
  struct Reference {
    bool ok = false;
    double level = NAN, noise = NAN;
    size_t blocks = 0;
  };
  Reference ReferenceFor(int window) const;
  double LevelOf(int window) const;
  double StandardError(const Reference& r, int window) const;
  int Streak(int window) const { return std::max(window / 4, 5); }

  SustainedShiftOptions opt_;
  LevelShift rule_;
  int64_t count_ = 0;  // values since Reset()
  int64_t start_ = 0;  // count_ at Reset() or Close(): levels take no value from before
  std::vector<double> cur_;
  std::deque<Block> blocks_;
  std::deque<Sample> history_;  // the last 3 * max_window values
  std::vector<int> streaks_;    // per window (doubling from min_window)
  bool open_ = false, open_by_test_ = false;
  Reference frozen_;
  int open_window_ = 0, back_window_ = 0;
  int back_streak_ = 0;
};

}  // namespace keel
