#include "logs/throughput_drop_scan.h"

#include <algorithm>
#include <vector>

#include "guard/robust_window.h"

namespace keel {

ThroughputDropScan::ThroughputDropScan(double threshold, int window,
                                       std::function<void(const ThroughputDrop&)> on_change)
    : drop_{threshold, Worse::kLower},
      w_(std::max(window, 1)),
      on_change_(std::move(on_change)),
      i_(w_) {}

double ThroughputDropScan::Median(int64_t from, int64_t to) const {
  return MedianOf(
      std::vector<double>(values_.begin() + (from - base_), values_.begin() + (to - base_)));
}

void ThroughputDropScan::Add(int64_t iteration, double value) {
  values_.push_back(value);
  iters_.push_back(iteration);
  Advance(false);
  Trim();
}

void ThroughputDropScan::Finish() {
  Advance(true);
}

void ThroughputDropScan::Advance(bool finishing) {
  const int64_t n = size();
  for (;;) {
    if (state_ == State::kSeek) {
      while (i_ + w_ <= n && !drop_.Shifted(Median(i_, i_ + w_), Median(i_ - w_, i_))) ++i_;
      if (i_ + w_ > n) return;
      best_ = i_;
      deepest_ = drop_.Worsening(Median(i_, i_ + w_), Median(i_ - w_, i_));
      j_ = i_ + 1;
      state_ = State::kDeepest;
    }
    if (state_ == State::kDeepest) {
      // The stretch of shifted points goes on while the next one is shifted too.
      bool ended = false;
      for (; j_ + w_ <= n; ++j_) {
        const double before = Median(j_ - w_, j_), after = Median(j_, j_ + w_);
        if (!drop_.Shifted(after, before)) {
          ended = true;
          break;
        }
        if (drop_.Worsening(after, before) > deepest_)
          deepest_ = drop_.Worsening(after, before), best_ = j_;
      }
      if (!ended && !finishing) return;
      cur_ = ThroughputDrop();
      cur_.start = iters_[static_cast<size_t>(best_ - base_)];
      cur_.end = iters_.back();
      cur_.baseline = Median(best_ - w_, best_);
      cur_.level = Median(best_, best_ + w_);
      on_change_(cur_);
      j_ = best_ + 1;
      state_ = State::kLasting;
    }
    if (state_ == State::kLasting) {
      int64_t end = -1;
      for (; j_ + w_ <= n; ++j_) {
        if (drop_.Back(Median(j_, j_ + w_), cur_.baseline)) {
          end = j_ + w_ / 2;
          break;
        }
      }
      if (end < 0 && !finishing) return;
      cur_.back = end >= 0;
      if (end < 0) end = n;
      cur_.end = iters_[static_cast<size_t>(std::min(end, n) - 1 - base_)];
      cur_.open = false;
      on_change_(cur_);
      i_ = std::max(end, best_ + w_);
      state_ = State::kSeek;
      if (finishing && end >= n) return;
    }
  }
}

void ThroughputDropScan::Trim() {
  // The oldest position any later step reads.
  const int64_t need = state_ == State::kSeek      ? i_ - w_
                       : state_ == State::kDeepest ? best_ - w_
                                                   : std::min(best_, j_) - w_;
  if (need - base_ < 4096) return;
  const int64_t drop = need - base_;
  values_.erase(values_.begin(), values_.begin() + drop);
  iters_.erase(iters_.begin(), iters_.begin() + drop);
  base_ = need;
}

}  // namespace keel
