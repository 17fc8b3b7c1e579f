// ThroughputDropScan: a sustained drop of a throughput, value by value, for a log read at once
// (`keel logs analyze`) or followed as it is written (`keel logs watch`); both find the same drops.
// The median of the `window` values after a point is compared with the median of the `window`
// before it by the live detectors' rule (health/level_shift.h): a stretch of points where it fell
// by more than `threshold` is one drop, placed at its deepest point; it lasts until a window is
// back within half the threshold of the level before (its end is then half a window into that
// window), or to the end. A point is judged once `window` values after it are known, so a drop is
// reported a window after it began.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>

#include "health/level_shift.h"

namespace keel {

struct ThroughputDrop {
  int64_t start = 0, end = 0;  // iterations: the deepest point; the last iteration down
  double baseline = 0, level = 0;
  bool open = true;   // not back yet
  bool back = false;  // closed because it came back (not by Finish)
};

class ThroughputDropScan {
 public:
  // `on_change` hears of a drop when it is found (open) and when it ends (closed).
  ThroughputDropScan(double threshold, int window,
                     std::function<void(const ThroughputDrop&)> on_change);

  void Add(int64_t iteration, double value);
  // No more values: a stretch of drops still being measured is placed, an open drop closes.
  void Finish();
  int window() const { return w_; }

 private:
  enum class State { kSeek, kDeepest, kLasting };
  void Advance(bool finishing);
  double Median(int64_t from, int64_t to) const;  // over positions [from, to)
  int64_t size() const { return base_ + static_cast<int64_t>(values_.size()); }
  void Trim();

  const LevelShift drop_;
  const int64_t w_;
  std::function<void(const ThroughputDrop&)> on_change_;
  // Values and iterations from position base_ on (older ones are no longer needed).
  std::deque<double> values_;
  std::deque<int64_t> iters_;
  int64_t base_ = 0;
  State state_ = State::kSeek;
  int64_t i_ = 0;     // kSeek: the next point to judge
  int64_t best_ = 0;  // kDeepest, kLasting: the deepest point of the stretch
  double deepest_ = 0;
  int64_t j_ = 0;  // kDeepest: the next point of the stretch; kLasting: the next window start
  ThroughputDrop cur_;
};

}  // namespace keel
