// ThroughputDropDetector: the live counterpart of the throughput drop of `keel logs analyze`. It
// says when the whole job slowed down and stayed slow, which rank the slowdown follows, and when
// it is over.
//
// Fed every iteration the job's time (the slowest rank's iteration seconds) and every rank's
// compute seconds. The first `warmup` iterations are ignored; the next `baseline_windows` x
// `window` iterations set the baselines: B, the median job time, and B_r, each rank's median
// compute time. They stay as they are (a drop never leaks into them) until Rebaseline().
//   level      = the median job time of the last `window` iterations (sliding)
//   drop       = level / B - 1                                    (health/level_shift.h, a time)
//   dropped    drop > threshold at `window` consecutive iterations: the drop lasted at least a
//              window (defaults: more than 5% over windows of 10 iterations)
//   recovered  drop <= threshold / 2 at `window` consecutive iterations (hysteresis)
//   since      the change point in the last 3 windows: the iteration that best splits their job
//              times into before (not slow) and after (slow; for a recovery: back)
// The rank a drop follows:
//   rise_r     = rank r's median compute of the last `window` iterations / B_r - 1
//   the rank with the largest rise_r, if the part of its rise in seconds that the ranks do not all
//   share (its rise over the lower median of every rank's rise, in seconds) is at least half the
//   job's rise (level - B); otherwise -1, no single rank: every rank slowed, or the time outside
//   compute grew (filesystem, network). In a world of 1 the rank's whole rise counts.
// Iterations with a non-finite or non-positive job time are ignored (a skipped iteration computes
// nothing), and so are such compute samples.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "guard/robust_window.h"
#include "health/level_shift.h"

namespace keel {

struct ThroughputDropOptions {
  int window = 10;           // iterations per median window
  int warmup = 20;           // iterations ignored at the start and after Rebaseline()
  int baseline_windows = 5;  // windows whose medians are the baselines
  double threshold = 0.05;   // job time over its baseline that counts as a drop
};

struct ThroughputDropEvent {
  bool dropped;             // false: recovered
  int64_t since_iteration;  // where the drop (the recovery) began: the change point
  int64_t iteration;        // where it was decided
  double drop;              // level / B - 1 when decided: 0.2 = the job is 20% slower
  int follows_rank;         // the rank the drop follows; -1: no single rank
  double rank_rise;         // that rank's rise_r when decided (0 for -1)
};

class ThroughputDropDetector {
 public:
  ThroughputDropDetector(int world_size, ThroughputDropOptions o);

  // One iteration: the job's time (the slowest rank's iteration seconds) and every rank's compute
  // seconds (the same values on every rank). Returns the event decided at this iteration, if any.
  std::optional<ThroughputDropEvent> Add(int64_t iteration, double job_seconds,
                                         const std::vector<double>& compute_seconds);

  // The work of an iteration changed (a batch-size ramp stage, a resume on other hardware): warm up
  // and set the baselines again. An open drop is forgotten without a recovery event.
  void Rebaseline();

  bool dropped() const { return open_; }
  double baseline_seconds() const { return baseline_; }  // B; NaN until set
  double last_drop() const { return last_drop_; }        // the drop now; NaN until B is set

 private:
  struct Sample {
    int64_t iteration;
    double job_seconds;
  };
  int64_t ChangePoint(bool after_is_slow) const;
  int FollowedRank(double level) const;  // -1: no single rank
  double Rise(int rank) const;

  int world_size_;
  ThroughputDropOptions opt_;
  LevelShift rule_;
  int64_t seen_ = 0;  // valid iterations since the start or Rebaseline()
  std::vector<double> base_job_;
  std::vector<std::vector<double>> base_compute_;
  double baseline_ = 0;
  std::vector<double> rank_baselines_;
  RobustWindow recent_;
  std::vector<RobustWindow> recent_compute_;
  std::deque<Sample> history_;  // the last 3 windows
  bool open_ = false;
  int streak_ = 0;  // consecutive iterations towards the other state
  int follows_ = -1;
  double last_drop_ = 0;
};

}  // namespace keel
