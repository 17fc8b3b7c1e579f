// StragglerDetector: names the data-parallel rank whose compute is persistently slower than the
// others' (a slow GPU or CPU, a throttled node), from every rank's compute seconds per iteration
// (the time it worked; the time it waited on the other ranks left out).
//
// Per window of W iterations (StragglerOptions::window):
//   median_r    = the median of rank r's compute seconds in the window
//   reference   = the LOWER median over ranks of median_r: sorted, index (n - 1) / 2 (of 2
//                 ranks the faster one, so the slow one of 2 is still visible; a slow minority
//                 never moves it)
//   slowdown_r  = median_r / reference - 1              (health/level_shift.h, a time)
// A rank is named when slowdown_r > threshold in `windows_to_name` consecutive windows (defaults:
// 5 windows of 10 iterations over 3%, i.e. 50 iterations), and recovered after `windows_to_name`
// consecutive windows with slowdown_r <= threshold / 2 (hysteresis). A window in between breaks
// either streak. Non-finite and non-positive samples are ignored (a skipped iteration computes
// nothing); an iteration with no sample at all does not count towards a window, and a rank with no
// sample in a window neither extends nor breaks its streak. World size 1: nobody is ever named.
//
// Groups: ranks that do different work by design (pipeline stages: the last computes the loss, a
// stage may hold more layers) are not each other's reference. With a group per rank, the
// reference of a rank is the lower median of its own group's medians only; a group of one rank
// has no peer to be slower than, so its rank is never named.
#pragma once

#include <cstdint>
#include <vector>

#include "health/level_shift.h"

namespace keel {

struct StragglerOptions {
  int window = 10;          // iterations per window
  double threshold = 0.03;  // slowdown over the reference that counts as slow
  int windows_to_name = 5;  // consecutive slow windows to name a rank (fast ones to recover)
};

struct StragglerEvent {
  bool named;  // false: recovered
  int rank;
  double slowdown;          // median over the streak's windows, e.g. 0.05 = 5% over the reference
  int64_t since_iteration;  // the first iteration of the streak's first window
  int64_t iteration;        // where it was decided (the end of the streak's last window)
};

class StragglerDetector {
 public:
  // `group_of`: each rank's group (e.g. its pipeline stage); empty: one group of every rank.
  StragglerDetector(int world_size, StragglerOptions o, std::vector<int> group_of = {});

  // The groups with a single rank (ascending): none of their ranks can ever be named.
  std::vector<int> lone_groups() const;

  // One iteration's compute seconds of every rank (waits on other ranks excluded; the same vector
  // on every rank). Returns the events decided at this iteration (only at window ends).
  std::vector<StragglerEvent> Add(int64_t iteration, const std::vector<double>& compute_seconds);

  // Each rank's slowdown in the last complete window (for TensorBoard); empty before the first
  // (NaN for a rank with no sample in it).
  const std::vector<double>& last_slowdowns() const { return last_slowdowns_; }
  // The ranks named and not recovered, ascending.
  std::vector<int> current_stragglers() const;

 private:
  struct Rank {
    std::vector<double> samples;  // this window's
    bool named = false;
    int streak = 0;  // consecutive windows towards the other state (slow, or back when named)
    int64_t streak_since = 0;
    std::vector<double> streak_slowdowns;
  };

  int world_size_;
  StragglerOptions opt_;
  std::vector<int> group_of_;    // per rank
  std::vector<int> group_size_;  // per rank: how many ranks its group has
  LevelShift rule_;
  int in_window_ = 0;  // iterations in the window so far
  int64_t window_start_ = 0;
  std::vector<Rank> ranks_;
  std::vector<double> last_slowdowns_;
};

}  // namespace keel
