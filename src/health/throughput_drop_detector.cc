#include "health/throughput_drop_detector.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace keel {
namespace {

bool Valid(double seconds) {
  return std::isfinite(seconds) && seconds > 0;
}

}  // namespace

ThroughputDropDetector::ThroughputDropDetector(int world_size, ThroughputDropOptions o)
    : world_size_(std::max(world_size, 1)), opt_(o), rule_{o.threshold, Worse::kHigher} {
  opt_.window = std::max(opt_.window, 1);
  opt_.warmup = std::max(opt_.warmup, 0);
  opt_.baseline_windows = std::max(opt_.baseline_windows, 1);
  Rebaseline();
}

void ThroughputDropDetector::Rebaseline() {
  const size_t n = static_cast<size_t>(world_size_), w = static_cast<size_t>(opt_.window);
  seen_ = 0;
  base_job_.clear();
  base_compute_.assign(n, {});
  baseline_ = NAN;
  rank_baselines_.assign(n, NAN);
  recent_ = RobustWindow(w);
  recent_compute_.assign(n, RobustWindow(w));
  history_.clear();
  open_ = false;
  streak_ = 0;
  follows_ = -1;
  last_drop_ = NAN;
}

std::optional<ThroughputDropEvent> ThroughputDropDetector::Add(
    int64_t iteration, double job_seconds, const std::vector<double>& compute_seconds) {
  if (!Valid(job_seconds)) return std::nullopt;
  if (seen_++ < opt_.warmup) return std::nullopt;
  const size_t w = static_cast<size_t>(opt_.window);
  recent_.Add(job_seconds);
  history_.push_back({iteration, job_seconds});
  while (history_.size() > 3 * w) history_.pop_front();
  for (size_t r = 0; r < recent_compute_.size() && r < compute_seconds.size(); ++r) {
    if (Valid(compute_seconds[r])) recent_compute_[r].Add(compute_seconds[r]);
  }

  if (std::isnan(baseline_)) {
    base_job_.push_back(job_seconds);
    for (size_t r = 0; r < base_compute_.size() && r < compute_seconds.size(); ++r) {
      if (Valid(compute_seconds[r])) base_compute_[r].push_back(compute_seconds[r]);
    }
    if (base_job_.size() < static_cast<size_t>(opt_.baseline_windows) * w) return std::nullopt;
    baseline_ = MedianOf(std::move(base_job_));
    base_job_.clear();
    for (size_t r = 0; r < base_compute_.size(); ++r) {
      rank_baselines_[r] = MedianOf(std::move(base_compute_[r]));
      base_compute_[r].clear();
    }
  }

  const double level = recent_.Median();
  last_drop_ = rule_.Worsening(level, baseline_);
  const bool towards = open_ ? rule_.Back(level, baseline_) : rule_.Shifted(level, baseline_);
  streak_ = towards ? streak_ + 1 : 0;
  if (streak_ < opt_.window) return std::nullopt;
  streak_ = 0;
  const int64_t since = ChangePoint(/*after_is_slow=*/!open_);
  open_ = !open_;
  if (open_) follows_ = FollowedRank(level);
  return ThroughputDropEvent{open_,      since,    iteration,
                             last_drop_, follows_, follows_ >= 0 ? Rise(follows_) : 0};
}

int64_t ThroughputDropDetector::ChangePoint(bool after_is_slow) const {
  // score(j) = #{i < j: sample i is in the old state} + #{i >= j: sample i is in the new one}
  auto in_new_state = [&](const Sample& s) {
    return after_is_slow ? rule_.Shifted(s.job_seconds, baseline_)
                         : rule_.Back(s.job_seconds, baseline_);
  };
  int64_t score = std::count_if(history_.begin(), history_.end(), in_new_state);
  int64_t best_score = score;
  size_t best = 0;
  for (size_t j = 0; j + 1 < history_.size(); ++j) {
    score += in_new_state(history_[j]) ? -1 : 1;
    if (score > best_score) best_score = score, best = j + 1;
  }
  return history_[best].iteration;
}

double ThroughputDropDetector::Rise(int rank) const {
  return rule_.Worsening(recent_compute_[static_cast<size_t>(rank)].Median(),
                         rank_baselines_[static_cast<size_t>(rank)]);
}

int ThroughputDropDetector::FollowedRank(double level) const {
  int best = -1;
  double best_rise = -std::numeric_limits<double>::infinity(), best_seconds = 0;
  std::vector<double> rises_seconds;
  for (size_t r = 0; r < recent_compute_.size(); ++r) {
    const double now = recent_compute_[r].Median(), base = rank_baselines_[r];
    if (!std::isfinite(now) || !std::isfinite(base)) continue;
    rises_seconds.push_back(now - base);
    const double rise = Rise(static_cast<int>(r));
    if (rise > best_rise) best = static_cast<int>(r), best_rise = rise, best_seconds = now - base;
  }
  if (best < 0) return -1;
  const double shared =
      rises_seconds.size() < 2 ? 0.0 : std::max(0.0, LowerMedianOf(std::move(rises_seconds)));
  const double job_rise = level - baseline_;
  return best_seconds - shared >= 0.5 * job_rise && job_rise > 0 ? best : -1;
}

}  // namespace keel
