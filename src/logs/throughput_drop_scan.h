// ThroughputDropScan: a sustained drop of a throughput, value by value, for a log read at once
// (`keel logs analyze`) or followed as it is written (`keel logs watch`); both find the same drops.
// It is the live run's detector (health/throughput_drop_detector.h) with the log's records as its
// iterations: a drop is found once it lasted a window past the baseline's threshold, begins at its
// change point, and ends where the detector finds the recovery's change point (or at the end, or
// at a Rebaseline: a restart, a new global batch size). A small drop is the detector's
// sustained-shift test's, found once it is sure against the noise the records themselves show. So a
// keel run's journal and the analysis of its log (one record an iteration, the same window and
// threshold) agree.
#pragma once

#include <cstdint>
#include <functional>

#include "health/throughput_drop_detector.h"

namespace keel {

struct ThroughputDrop {
  int64_t start = 0, end = 0;  // iterations: the change point; the last iteration down
  int64_t found = 0;           // the iteration where the detector decided the drop
  double baseline = 0, level = 0;
  bool open = true;   // not back yet
  bool back = false;  // closed because it came back (not by Finish or Rebaseline)
  // How sure (ThroughputDropEvent): decided by the sustained-shift test, the records its level is
  // the median of, the drop over its standard error, the relative noise per record measured.
  bool sustained = false;
  int window = 0;
  double z = 0, noise = 0;
};

class ThroughputDropScan {
 public:
  // `on_change` hears of a drop when it is found (open) and when it ends (closed). The detector's
  // warm-up is two windows.
  ThroughputDropScan(double threshold, int window,
                     std::function<void(const ThroughputDrop&)> on_change);

  void Add(int64_t iteration, double value);
  // The work of an iteration changed (a restart, another global batch size): an open drop closes
  // where it stood (not back), and the baseline is set again.
  void Rebaseline();
  // No more values: an open drop closes.
  void Finish();
  int window() const { return detector_.options().window; }

 private:
  void CloseOpen();

  ThroughputDropDetector detector_;
  std::function<void(const ThroughputDrop&)> on_change_;
  ThroughputDrop cur_;
  int64_t last_ = 0;  // the last iteration added
};

}  // namespace keel
