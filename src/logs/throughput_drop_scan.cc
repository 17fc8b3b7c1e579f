#include "logs/throughput_drop_scan.h"

#include <algorithm>

namespace keel {

ThroughputDropScan::ThroughputDropScan(double threshold, int window,
                                       std::function<void(const ThroughputDrop&)> on_change)
    : detector_(1, ThroughputDropOptions::For(threshold, window)),
      on_change_(std::move(on_change)) {}

void ThroughputDropScan::Add(int64_t iteration, double value) {
  last_ = iteration;
  const auto e = detector_.Add(iteration, value);
  if (!e) return;
  if (e->dropped) {
    cur_ = ThroughputDrop();
    cur_.start = e->since_iteration;
    cur_.end = cur_.found = e->iteration;
    cur_.baseline = e->baseline;
    cur_.level = e->level;
    cur_.sustained = e->sustained;
    cur_.window = e->window;
    cur_.z = e->z;
    cur_.noise = e->noise;
    on_change_(cur_);
    return;
  }
  cur_.end = std::max(cur_.start, e->since_iteration - 1);
  cur_.open = false;
  cur_.back = true;
  on_change_(cur_);
}

void ThroughputDropScan::CloseOpen() {
  if (!detector_.dropped()) return;
  cur_.end = last_;
  cur_.open = false;
  cur_.back = false;
  on_change_(cur_);
}

void ThroughputDropScan::Rebaseline() {
  CloseOpen();
  detector_.Rebaseline();
}

void ThroughputDropScan::Finish() {
  Rebaseline();
}

}  // namespace keel
