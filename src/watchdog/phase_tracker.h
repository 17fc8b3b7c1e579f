// PhaseTracker: what this rank's main thread is doing right now, and for how long it did each
// thing this iteration. The watchdog reads it to tell a stuck rank (and where it is stuck); the
// straggler detector reads this rank's own compute time (waits on other ranks excluded). The main
// thread calls Enter at each phase change; any thread may take a Snapshot.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

#include "core/env.h"

namespace keel {

enum class Phase : int {
  kStartup,  // before the first iteration: data, checkpoint, model
  kData,     // waiting for the iteration's samples
  kForward,
  kBackward,
  kReduce,     // gradient reduction and the other per-iteration collectives
  kOptimizer,  // clipping and the AdamW update
  kEval,
  kSave,
  kCheck,  // replica and collective consistency checks
  kIdle,   // between iterations: logs, metrics, the guard's decisions
};
constexpr int kNumPhases = 10;
// "startup", "data wait", "forward", "backward", "reduce", "optimizer", "eval", "save", "check",
// "between iterations".
const char* PhaseName(Phase p);

struct PhaseSnapshot {
  Phase phase = Phase::kStartup;
  int64_t iteration = 0;        // the iteration under way (1-based); 0 before the first
  bool first_iteration = true;  // no iteration completed yet in this process
  uint64_t since_us = 0;        // when the phase began (Env::NowMicros)
  uint64_t generation = 0;      // changes at every Enter: a watchdog re-arms when it does
};

class PhaseTracker {
 public:
  explicit PhaseTracker(Env* env);
  // The main thread begins iteration `iteration`: per-iteration totals restart, phase kData.
  void BeginIteration(int64_t iteration);
  // The main thread completed the iteration it began (the next one is no longer the first).
  void EndIteration();
  // The main thread moves to phase `p`; returns the phase it left.
  Phase Enter(Phase p);
  PhaseSnapshot Snapshot() const;
  // Seconds spent in `p` since BeginIteration (main thread).
  double IterationSeconds(Phase p) const;
  // Seconds since BeginIteration, every phase (by the Env's clock: what an iteration takes).
  double IterationWallSeconds() const;
  // This iteration's own work: data wait, forward, backward and optimizer, not reduce (the wait
  // for other ranks), check or idle. What the straggler detector compares across ranks.
  double ComputeSeconds() const;

 private:
  void AccountLocked(uint64_t now);
  Env* env_;
  mutable std::mutex mu_;
  PhaseSnapshot now_;
  std::array<uint64_t, kNumPhases> iteration_us_{};
};

// Enters `p` for a scope and returns to the previous phase at its end (a save or an evaluation
// in the middle of the loop). A null tracker does nothing.
class PhaseScope {
 public:
  PhaseScope(PhaseTracker* t, Phase p) : t_(t), prev_(t ? t->Enter(p) : p) {}
  ~PhaseScope() {
    if (t_) t_->Enter(prev_);
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  PhaseTracker* t_;
  Phase prev_;
};

}  // namespace keel
