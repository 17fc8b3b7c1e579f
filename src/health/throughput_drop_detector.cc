#include "health/throughput_drop_detector.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace keel {
namespace {

bool Valid(double v) {
  return std::isfinite(v) && v > 0;
}

}  // namespace

ThroughputDropDetector::ThroughputDropDetector(int world_size, ThroughputDropOptions o)
    : world_size_(std::max(world_size, 1)),
      opt_(o),
      rule_{o.threshold, Worse::kLower},
      shift_(Worse::kLower, o.shift) {
  opt_.window = std::max(opt_.window, 1);
  opt_.warmup = std::max(opt_.warmup, 0);
  opt_.percentile = std::clamp(opt_.percentile, 0.0, 1.0);
  Rebaseline();
}

void ThroughputDropDetector::Rebaseline() {
  const size_t n = static_cast<size_t>(world_size_), w = static_cast<size_t>(opt_.window);
  seen_ = 0;
  cur_tp_.clear();
  cur_job_.clear();
  cur_compute_.assign(n, {});
  windows_.clear();
  baseline_ = base_job_seconds_ = NAN;
  rank_baselines_.assign(n, NAN);
  recent_ = RobustWindow(w);
  recent_job_ = RobustWindow(w);
  recent_compute_.assign(n, RobustWindow(w));
  history_.clear();
  shift_.Reset();
  open_ = by_shift_ = false;
  streak_ = 0;
  follows_ = -1;
  level_ = last_drop_ = NAN;
}

void ThroughputDropDetector::CloseWindow() {
  Window win;
  win.median = MedianOf(std::move(cur_tp_));
  win.job_seconds = MedianOf(std::move(cur_job_));
  win.compute.resize(cur_compute_.size());
  for (size_t r = 0; r < cur_compute_.size(); ++r) {
    win.compute[r] = MedianOf(std::move(cur_compute_[r]));
    cur_compute_[r].clear();
  }
  cur_tp_.clear();
  cur_job_.clear();
  // A window that ended in a drop is not a level the job sustains when healthy.
  if (open_) return;
  windows_.push_back(std::move(win));
  while (windows_.size() > kMaxWindows) windows_.pop_front();
  SetBaseline();
}

void ThroughputDropDetector::SetBaseline() {
  std::vector<size_t> order(windows_.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return windows_[a].median < windows_[b].median; });
  // Nearest rank: the smallest median at or above `percentile` of them.
  const double rank = std::ceil(opt_.percentile * static_cast<double>(order.size()));
  const size_t at = static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(order.size())));
  const Window& b = windows_[order[at - 1]];
  baseline_ = b.median;
  base_job_seconds_ = b.job_seconds;
  rank_baselines_ = b.compute;
}

std::optional<ThroughputDropEvent> ThroughputDropDetector::Add(
    int64_t iteration, double throughput, double job_seconds,
    const std::vector<double>& compute_seconds) {
  if (!Valid(throughput)) return std::nullopt;
  if (seen_++ < opt_.warmup) return std::nullopt;
  const size_t w = static_cast<size_t>(opt_.window);
  recent_.Add(throughput);
  if (Valid(job_seconds)) recent_job_.Add(job_seconds);
  history_.push_back({iteration, throughput});
  while (history_.size() > 3 * w) history_.pop_front();
  cur_tp_.push_back(throughput);
  if (Valid(job_seconds)) cur_job_.push_back(job_seconds);
  for (size_t r = 0; r < recent_compute_.size() && r < compute_seconds.size(); ++r) {
    if (!Valid(compute_seconds[r])) continue;
    recent_compute_[r].Add(compute_seconds[r]);
    cur_compute_[r].push_back(compute_seconds[r]);
  }
  if (cur_tp_.size() == w) CloseWindow();
  const std::optional<ShiftMeasure> shift = shift_.Add(iteration, throughput);
  if (std::isnan(baseline_)) return std::nullopt;

  level_ = recent_.Median();
  last_drop_ = baseline_ / level_ - 1;
  // The threshold rule: a big drop is decided within a window, as it always was.
  const bool towards = by_shift_ ? false
                       : open_   ? rule_.Back(level_, baseline_)
                                 : rule_.Shifted(level_, baseline_);
  streak_ = towards ? streak_ + 1 : 0;
  if (streak_ >= opt_.window) {
    streak_ = 0;
    const int64_t since = ChangePoint(/*after_is_slow=*/!open_);
    const ShiftMeasure m = shift_.Measure(opt_.window);
    open_ = !open_;
    if (open_) {
      follows_ = FollowedRank();
      shift_.Open(since, std::nullopt);
    } else {
      shift_.Close();
    }
    return Event(open_, /*sustained=*/false, since, iteration, baseline_, level_, m);
  }
  // A drop the threshold rule is already deciding is its own (its size, baseline and start).
  if (!shift || (!open_ && streak_ > 0)) return std::nullopt;
  // The sustained-shift test: a smaller drop, sure against the noise, or its end.
  const int64_t since = shift_.ChangePoint(3 * static_cast<size_t>(shift->window), shift->reference,
                                           open_ ? opened_worsening_ : shift->worsening, !open_);
  open_ = !open_;
  by_shift_ = open_;
  streak_ = 0;
  double level = shift->level;
  if (open_) {
    follows_ = FollowedRank();
    shift_.Open(since, shift);
    // Its size: the level since it began (the window that found it may hold values before).
    const double after = shift_.MedianSince(since);
    if (std::isfinite(after)) level = after;
    opened_worsening_ = 1 - level / shift->reference;
  } else {
    shift_.Close();
  }
  return Event(open_, /*sustained=*/true, since, iteration, shift->reference, level, *shift);
}

ThroughputDropEvent ThroughputDropDetector::Event(bool dropped, bool sustained, int64_t since,
                                                  int64_t iteration, double baseline, double level,
                                                  const ShiftMeasure& m) {
  ThroughputDropEvent e{dropped,  since, iteration, baseline / level - 1,
                        baseline, level, follows_,  follows_ >= 0 ? Rise(follows_) : 0};
  e.sustained = sustained;
  e.window = m.window > 0 ? m.window : opt_.window;
  e.noise = m.noise;
  // z: the sustained test's own; the threshold rule's, its worsening against B over the standard
  // error of its window's level.
  e.z = m.window <= 0 ? NAN : sustained ? m.z : rule_.Worsening(level, baseline) / m.se;
  return e;
}

int64_t ThroughputDropDetector::ChangePoint(bool after_is_slow) const {
  // score(j) = #{i < j: sample i is in the old state} + #{i >= j: sample i is in the new one}
  auto in_new_state = [&](const Sample& s) {
    return after_is_slow ? rule_.Shifted(s.throughput, baseline_)
                         : rule_.Back(s.throughput, baseline_);
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
  const size_t r = static_cast<size_t>(rank);
  if (r >= rank_baselines_.size()) return NAN;
  return recent_compute_[r].Median() / rank_baselines_[r] - 1;
}

int ThroughputDropDetector::FollowedRank() const {
  int best = -1;
  double best_rise = -std::numeric_limits<double>::infinity(), best_seconds = 0;
  std::vector<double> rises_seconds;
  for (size_t r = 0; r < recent_compute_.size() && r < rank_baselines_.size(); ++r) {
    const double now = recent_compute_[r].Median(), base = rank_baselines_[r];
    if (!std::isfinite(now) || !std::isfinite(base)) continue;
    rises_seconds.push_back(now - base);
    const double rise = Rise(static_cast<int>(r));
    if (rise > best_rise) best = static_cast<int>(r), best_rise = rise, best_seconds = now - base;
  }
  if (best < 0) return -1;
  const double shared =
      rises_seconds.size() < 2 ? 0.0 : std::max(0.0, LowerMedianOf(std::move(rises_seconds)));
  const double job_rise = recent_job_.Median() - base_job_seconds_;
  return std::isfinite(job_rise) && job_rise > 0 && best_seconds - shared >= 0.5 * job_rise ? best
                                                                                            : -1;
}

}  // namespace keel
