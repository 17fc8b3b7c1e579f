#include "health/straggler_detector.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "guard/robust_window.h"

namespace keel {

StragglerDetector::StragglerDetector(int world_size, StragglerOptions o, std::vector<int> group_of)
    : world_size_(std::max(world_size, 1)),
      opt_(o),
      group_of_(std::move(group_of)),
      rule_{o.threshold, Worse::kHigher},
      ranks_(static_cast<size_t>(world_size_)) {
  opt_.window = std::max(opt_.window, 1);
  opt_.windows_to_name = std::max(opt_.windows_to_name, 1);
  group_of_.resize(static_cast<size_t>(world_size_), 0);  // missing ranks: group 0
  group_size_.assign(group_of_.size(), 0);
  for (size_t r = 0; r < group_of_.size(); ++r)
    group_size_[r] = static_cast<int>(std::count(group_of_.begin(), group_of_.end(), group_of_[r]));
}

std::vector<int> StragglerDetector::lone_groups() const {
  std::vector<int> out;
  for (size_t r = 0; r < group_of_.size(); ++r)
    if (group_size_[r] == 1) out.push_back(group_of_[r]);
  std::sort(out.begin(), out.end());
  return out;
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

  // The window is complete: every rank's median, their lower median in each group, each rank's
  // slowdown against its group's.
  std::vector<double> medians(ranks_.size(), NAN);
  std::map<int, std::vector<double>> present;  // per group
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r].samples.empty()) continue;
    medians[r] = MedianOf(std::move(ranks_[r].samples));
    ranks_[r].samples.clear();
    present[group_of_[r]].push_back(medians[r]);
  }
  std::map<int, double> reference;
  for (auto& [g, m] : present) reference[g] = LowerMedianOf(std::move(m));
  auto reference_of = [&](size_t r) {
    auto it = reference.find(group_of_[r]);
    return it == reference.end() ? NAN : it->second;
  };
  last_slowdowns_.assign(ranks_.size(), NAN);
  for (size_t r = 0; r < ranks_.size(); ++r)
    last_slowdowns_[r] = rule_.Worsening(medians[r], reference_of(r));

  std::vector<StragglerEvent> events;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const double s = last_slowdowns_[r];
    if (!std::isfinite(s)) continue;   // no sample this window: the streak waits
    if (group_size_[r] < 2) continue;  // no peer: never named
    Rank& k = ranks_[r];
    const double ref = reference_of(r);
    const bool towards = k.named ? rule_.Back(medians[r], ref) : rule_.Shifted(medians[r], ref);
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
