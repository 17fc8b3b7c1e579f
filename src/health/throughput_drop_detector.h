// ThroughputDropDetector: the one throughput-drop rule of keel. The live run (train/run_health,
// every run, one process included) and `keel logs analyze` / `keel logs watch`
// (logs/throughput_drop_scan) feed it the same per-iteration throughput, so on the same series
// they find the same drops and recoveries. It says when the job slowed down and stayed slow,
// against which level, which rank the slowdown follows, and when it is over.
//
// Fed every iteration a throughput (samples per second, TFLOPs: higher is better) and optionally
// the job's seconds and every rank's compute seconds. Iterations with a non-finite or
// non-positive throughput are ignored (a skipped iteration computes nothing).
//   warmup     the first `warmup` iterations after the start and after Rebaseline() are ignored
//   windows    the iterations after the warm-up, in consecutive windows of `window`
//   B          the baseline: the `percentile` (nearest rank) of the medians of the windows seen
//              since the start or Rebaseline() (at most the last kMaxWindows), taking only windows
//              that ended while no drop was open: the best sustained level so far. A slow start
//              does not hide a later drop (the faster windows that follow raise B), a single fast
//              burst does not set it (a window's median needs most of the window), and a drop
//              never leaks into it. Judging starts once one window is complete.
//   level L    the median throughput of the last `window` iterations (sliding)
//   worsening  1 - L / B                                    (health/level_shift.h, a throughput)
//   dropped    worsening > threshold at `window` consecutive iterations
//   recovered  worsening <= threshold / 2 at `window` consecutive iterations (hysteresis)
//   since      the change point in the last 3 windows: the iteration that best splits their
//              throughputs into before (not slow) and after (slow; for a recovery: back)
//   drop       B / L - 1 when decided: 0.6 = an iteration takes 60% longer than at B
// A smaller sustained drop is the SustainedShift test's (health/level_shift.h) on the same
// throughputs: a level (the median of the last M = 20..640 iterations) at least 1.5% under the
// reference (the median level of the healthy iterations before it) and at least z = 5 of its
// standard errors under it, the noise measured on the series itself, for max(M/4, 5) iterations,
// unless the threshold rule's own streak runs (a big drop stays its to decide, as before). Then B
// is that reference, `since` its change point, L the median of the iterations since then, and the
// drop is over when a level of its iterations is within 0.75% of B as long, over a window long
// enough to be sure of it (level_shift.h; the threshold rule above does not end it).
// Every event says how sure it is: z, the drop over its standard error at its window, and the
// noise (relative, per iteration) it measured.
// The rank a drop follows (when compute seconds are given):
//   rise_r     = rank r's median compute of the last `window` iterations / its median compute in
//              the window that set B, - 1
//   the rank with the largest rise_r, if the part of its rise in seconds that the ranks do not all
//   share (its rise over the lower median of every rank's rise, in seconds) is at least half the
//   job's rise in seconds (its median time now less that of the window that set B); otherwise -1,
//   no single rank: every rank slowed, or the time outside compute grew (filesystem, network).
//   In a world of 1 the rank's whole rise counts.
#pragma once

#include <cmath>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "guard/robust_window.h"
#include "health/level_shift.h"

namespace keel {

struct ThroughputDropOptions {
  int window = 10;              // iterations per median window
  int warmup = 20;              // iterations ignored at the start and after Rebaseline()
  double threshold = 0.05;      // throughput under its baseline that counts as a drop (5% less)
  double percentile = 0.9;      // of the windows' medians: the baseline
  SustainedShiftOptions shift;  // the test for smaller sustained drops (min_shift 0: off)

  // The live run's options (the defaults above) and those of `keel logs analyze --drop-window W
  // --drop-threshold T`: the warm-up is two windows.
  static ThroughputDropOptions For(double threshold, int window) {
    ThroughputDropOptions o;
    o.window = window < 1 ? 1 : window;
    o.warmup = 2 * o.window;
    o.threshold = threshold;
    return o;
  }
};

struct ThroughputDropEvent {
  bool dropped;             // false: recovered
  int64_t since_iteration;  // where the drop (the recovery) began: the change point
  int64_t iteration;        // where it was decided
  double drop;              // B / L - 1 when decided: 0.2 = an iteration takes 20% longer
  double baseline;          // B, in the throughput's unit
  double level;             // L when decided
  int follows_rank;         // the rank the drop follows; -1: no single rank (or no compute given)
  double rank_rise;         // that rank's rise_r when decided (0 for -1)
  // How sure: the rule that decided (false: the threshold rule; true: the sustained-shift test),
  // the iterations the level is the median of, the worsening over its standard error (NaN while
  // the run is too short to measure its noise) and the relative noise per iteration measured.
  bool sustained = false;
  int window = 0;
  double z = NAN, noise = NAN;
};

class ThroughputDropDetector {
 public:
  static constexpr size_t kMaxWindows = 1000;

  ThroughputDropDetector(int world_size, ThroughputDropOptions o);

  // One iteration: its throughput; the job's seconds (NaN: not known) and every rank's compute
  // seconds (empty: not known). Returns the event decided at this iteration, if any.
  std::optional<ThroughputDropEvent> Add(int64_t iteration, double throughput,
                                         double job_seconds = NAN,
                                         const std::vector<double>& compute_seconds = {});

  // The work of an iteration changed (a batch-size ramp stage, a resume, a rollback): warm up and
  // set the baseline again. An open drop is forgotten without a recovery event.
  void Rebaseline();

  bool dropped() const { return open_; }
  double baseline() const { return baseline_; }    // B; NaN until set
  double level() const { return level_; }          // L; NaN until B is set
  double last_drop() const { return last_drop_; }  // B / L - 1 now; NaN until B is set
  const ThroughputDropOptions& options() const { return opt_; }

 private:
  struct Sample {
    int64_t iteration;
    double throughput;
  };
  struct Window {
    double median;                // of the throughput
    double job_seconds;           // the median job seconds (NaN: not given)
    std::vector<double> compute;  // each rank's median compute seconds
  };
  void CloseWindow();
  void SetBaseline();
  int64_t ChangePoint(bool after_is_slow) const;
  ThroughputDropEvent Event(bool dropped, bool sustained, int64_t since, int64_t iteration,
                            double baseline, double level, const ShiftMeasure& m);
  int FollowedRank() const;  // -1: no single rank
  double Rise(int rank) const;

  int world_size_;
  ThroughputDropOptions opt_;
  LevelShift rule_;
  int64_t seen_ = 0;  // valid iterations since the start or Rebaseline()
  // The window being filled.
  std::vector<double> cur_tp_, cur_job_;
  std::vector<std::vector<double>> cur_compute_;
  std::deque<Window> windows_;  // complete windows that may set B
  double baseline_ = 0, base_job_seconds_ = 0;
  std::vector<double> rank_baselines_;
  RobustWindow recent_, recent_job_;
  std::vector<RobustWindow> recent_compute_;
  std::deque<Sample> history_;  // the last 3 windows
  SustainedShift shift_;
  bool open_ = false;
  bool by_shift_ = false;  // the open drop is the sustained-shift test's
  double opened_worsening_ = 0;
  int streak_ = 0;  // consecutive iterations towards the other state
  int follows_ = -1;
  double level_ = 0, last_drop_ = 0;
};

}  // namespace keel
