#include "health/level_shift.h"

#include <algorithm>
#include <cmath>

#include "guard/robust_window.h"

namespace keel {
namespace {

constexpr double kMadToSigma = 1.4826;   // a normal's sigma over its MAD
constexpr double kMedianError = 1.2533;  // a median's standard error over the mean's (normal)

}  // namespace

SustainedShift::SustainedShift(Worse worse, SustainedShiftOptions o) : opt_(o), rule_{0, worse} {
  opt_.block = std::max(opt_.block, 2);
  opt_.min_blocks = std::max(opt_.min_blocks, 3);
  opt_.max_blocks = std::max(opt_.max_blocks, opt_.min_blocks);
  opt_.min_window = std::max(opt_.min_window, 2);
  opt_.max_window = std::max(opt_.max_window, opt_.min_window);
  Reset();
}

void SustainedShift::Reset() {
  count_ = start_ = 0;
  cur_.clear();
  blocks_.clear();
  history_.clear();
  size_t windows = 0;
  for (int m = opt_.min_window; m <= opt_.max_window; m *= 2) ++windows;
  streaks_.assign(windows, 0);
  open_ = open_by_test_ = false;
  frozen_ = Reference();
  open_window_ = 0;
  back_streak_ = 0;
}

std::optional<ShiftMeasure> SustainedShift::Add(int64_t iteration, double v) {
  if (!enabled() || !std::isfinite(v) || v <= 0) return std::nullopt;
  ++count_;
  history_.push_back({iteration, v});
  while (history_.size() > 3 * static_cast<size_t>(opt_.max_window)) history_.pop_front();
  cur_.push_back(v);
  if (cur_.size() == static_cast<size_t>(opt_.block)) {
    const double m = MedianOf(cur_);
    std::vector<double> dev;
    for (double x : cur_) dev.push_back(std::fabs(x - m) / m);
    cur_.clear();
    if (!open_) {
      blocks_.push_back({count_, iteration, m, MedianOf(std::move(dev))});
      // The oldest block any window may still take.
      const size_t keep =
          static_cast<size_t>(opt_.max_blocks + 2 * opt_.max_window / opt_.block + 1);
      while (blocks_.size() > keep) blocks_.pop_front();
    }
  }
  if (open_) {
    if (!open_by_test_) return std::nullopt;  // the other rule decides its end
    const ShiftMeasure m = Measure(back_window_);
    back_streak_ = m.window > 0 && m.worsening <= opt_.min_shift / 2 ? back_streak_ + 1 : 0;
    if (back_streak_ < Streak(back_window_)) return std::nullopt;
    back_streak_ = 0;
    return m;
  }
  size_t k = 0;
  for (int w = opt_.min_window; w <= opt_.max_window; w *= 2, ++k) {
    const ShiftMeasure m = Measure(w);
    const bool shifted = m.window > 0 && m.worsening >= opt_.min_shift && m.z >= opt_.z;
    streaks_[k] = shifted ? streaks_[k] + 1 : 0;
    if (streaks_[k] >= Streak(w)) return m;  // the shortest window that is sure decides
  }
  return std::nullopt;
}

void SustainedShift::Open(int64_t since, const std::optional<ShiftMeasure>& found) {
  open_by_test_ = found.has_value() && found->window > 0;
  if (open_by_test_) {
    frozen_ = ReferenceFor(found->window);
    open_window_ = back_window_ = found->window;
    while (back_window_ < opt_.max_window &&
           StandardError(frozen_, back_window_) > opt_.min_shift / opt_.z)
      back_window_ *= 2;
    // The return is judged on values of the shift only.
    int64_t after = 0;
    for (auto h = history_.rbegin(); h != history_.rend() && h->iteration >= since; ++h) ++after;
    start_ = count_ - after;
  }
  open_ = true;
  // Blocks that hold a value from the shift are not the level it is judged against.
  while (!blocks_.empty() && blocks_.back().last_iteration >= since) blocks_.pop_back();
  std::fill(streaks_.begin(), streaks_.end(), 0);
  back_streak_ = 0;
}

void SustainedShift::Close() {
  open_ = open_by_test_ = false;
  start_ = count_;
  cur_.clear();
  std::fill(streaks_.begin(), streaks_.end(), 0);
  back_streak_ = 0;
}

SustainedShift::Reference SustainedShift::ReferenceFor(int window) const {
  Reference r;
  const int64_t limit = count_ - 2 * static_cast<int64_t>(window);
  std::vector<double> medians, mads;
  for (auto b = blocks_.rbegin(); b != blocks_.rend(); ++b) {
    if (b->end > limit) continue;
    medians.push_back(b->median);
    mads.push_back(b->rel_mad);
    if (medians.size() == static_cast<size_t>(opt_.max_blocks)) break;
  }
  if (medians.size() < static_cast<size_t>(opt_.min_blocks)) return r;
  r.ok = true;
  r.blocks = medians.size();
  r.level = MedianOf(medians);
  // Within a block: the MAD about a sample median of n values is short by about n / (n - 0.8).
  const double n = opt_.block;
  const double within = kMadToSigma * n / (n - 0.8) * MedianOf(std::move(mads));
  std::vector<double> spread;
  for (double m : medians) spread.push_back(std::fabs(m - r.level) / r.level);
  const double between = kMadToSigma * MedianOf(std::move(spread)) * std::sqrt(n) / kMedianError;
  r.noise = std::max({within, between, opt_.noise_floor});
  return r;
}

double SustainedShift::LevelOf(int window) const {
  std::vector<double> v;
  v.reserve(static_cast<size_t>(window));
  for (auto s = history_.end() - window; s != history_.end(); ++s) v.push_back(s->value);
  return MedianOf(std::move(v));
}

double SustainedShift::StandardError(const Reference& r, int window) const {
  const double level = kMedianError * r.noise / std::sqrt(static_cast<double>(window));
  // A median of block medians: each has the error of a median of `block` values.
  const double ref =
      kMedianError * kMedianError * r.noise / std::sqrt(static_cast<double>(r.blocks) * opt_.block);
  return std::hypot(level, ref);
}

ShiftMeasure SustainedShift::Measure(int window) const {
  ShiftMeasure m;
  if (window < 1 || count_ - start_ < window || history_.size() < static_cast<size_t>(window))
    return m;
  const Reference r = open_by_test_ ? frozen_ : ReferenceFor(window);
  if (!r.ok) return m;
  m.window = window;
  m.level = LevelOf(window);
  m.reference = r.level;
  m.worsening = rule_.Worsening(m.level, r.level);
  m.noise = r.noise;
  m.se = StandardError(r, window);
  m.z = m.worsening / m.se;
  return m;
}

double SustainedShift::MedianSince(int64_t iteration) const {
  std::vector<double> v;
  for (auto h = history_.rbegin(); h != history_.rend() && h->iteration >= iteration; ++h)
    v.push_back(h->value);
  return MedianOf(std::move(v));
}

int64_t SustainedShift::ChangePoint(size_t span, double reference, double worsening,
                                    bool after_is_worse) const {
  span = std::min({span, history_.size(), static_cast<size_t>(count_ - start_)});
  if (span == 0) return history_.empty() ? 0 : history_.back().iteration;
  const double cut = rule_.worse == Worse::kHigher ? reference * (1 + worsening / 2)
                                                   : reference * (1 - worsening / 2);
  auto in_new_state = [&](const Sample& s) {
    return (rule_.Worsening(s.value, cut) > 0) == after_is_worse;
  };
  // score(j) = #{i < j: sample i is in the old state} + #{i >= j: sample i is in the new one}
  const auto first = history_.end() - static_cast<long>(span);
  int64_t score = std::count_if(first, history_.end(), in_new_state);
  int64_t best_score = score;
  auto best = first;
  for (auto j = first; j + 1 != history_.end(); ++j) {
    score += in_new_state(*j) ? -1 : 1;
    if (score > best_score) best_score = score, best = j + 1;
  }
  return best->iteration;
}

}  // namespace keel
