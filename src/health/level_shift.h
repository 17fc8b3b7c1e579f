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
#pragma once

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

}  // namespace keel
