#include "health/straggler_detector.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "guard/robust_window.h"

namespace keel {

StragglerDetector::StragglerDetector(int world_size, StragglerOptions o)
    : world_size_(std::max(world_size, 1)),
      opt_(o),
      rule_{o.threshold, Worse::kHigher},
      ranks_(static_cast<size_t>(world_size_)) {
  opt_.window = std::max(opt_.window, 1);
  opt_.windows_to_name = std::max(opt_.windows_to_name, 1);
}

std::vector<StragglerEvent> StragglerDetector::Add(int64_t iteration,
                                                   const std::vector<double>& compute_seconds) {
  bool any = false;
  for (size_t r = 0; r < ranks_.size() && r < compute_seconds.size(); ++r) {
    const double v = compute_seconds[r];
    if (!std::isfinite(v) || v <= 0) continue;
    ranks_[r].samples.push_back(v);
    any = true;
  }
  if (!any) return {};
  if (in_window_ == 0) window_start_ = iteration;
  if (++in_window_ < opt_.window) return {};
  in_window_ = 0;

  // The window is complete: every rank's median, their lower median, each rank's slowdown.
  std::vector<double> medians(ranks_.size(), NAN), present;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r].samples.empty()) continue;
    medians[r] = MedianOf(std::move(ranks_[r].samples));
    ranks_[r].samples.clear();
    present.push_back(medians[r]);
  }
  const double reference = LowerMedianOf(std::move(present));
  last_slowdowns_.assign(ranks_.size(), NAN);
  for (size_t r = 0; r < ranks_.size(); ++r)
    last_slowdowns_[r] = rule_.Worsening(medians[r], reference);
  if (world_size_ < 2) return {};

  std::vector<StragglerEvent> events;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const double s = last_slowdowns_[r];
    if (!std::isfinite(s)) continue;  // no sample this window: the streak waits
    Rank& k = ranks_[r];
    const bool towards =
        k.named ? rule_.Back(medians[r], reference) : rule_.Shifted(medians[r], reference);
    if (!towards) {
      k.streak = 0;
      continue;
    }
    if (k.streak++ == 0) {
      k.streak_since = window_start_;
      k.streak_slowdowns.clear();
    }
    k.streak_slowdowns.push_back(s);
    if (k.streak < opt_.windows_to_name) continue;
    k.named = !k.named;
    k.streak = 0;
    events.push_back(
        {k.named, static_cast<int>(r), MedianOf(k.streak_slowdowns), k.streak_since, iteration});
  }
  return events;
}

std::vector<int> StragglerDetector::current_stragglers() const {
  std::vector<int> out;
  for (size_t r = 0; r < ranks_.size(); ++r)
    if (ranks_[r].named) out.push_back(static_cast<int>(r));
  return out;
}

}  // namespace keel
