#include "watchdog/phase_tracker.h"

namespace keel {

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kStartup:
      return "startup";
    case Phase::kData:
      return "data wait";
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kReduce:
      return "reduce";
    case Phase::kOptimizer:
      return "optimizer";
    case Phase::kEval:
      return "eval";
    case Phase::kSave:
      return "save";
    case Phase::kCheck:
      return "check";
    case Phase::kIdle:
      return "between iterations";
  }
  return "?";
}

PhaseTracker::PhaseTracker(Env* env) : env_(env) {
  now_.since_us = env_->NowMicros();
}

void PhaseTracker::AccountLocked(uint64_t now) {
  iteration_us_[static_cast<int>(now_.phase)] += now - now_.since_us;
  now_.since_us = now;
  ++now_.generation;
}

void PhaseTracker::BeginIteration(int64_t iteration) {
  const uint64_t now = env_->NowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  AccountLocked(now);
  iteration_us_.fill(0);
  now_.iteration = iteration;
  now_.phase = Phase::kData;
}

void PhaseTracker::EndIteration() {
  const uint64_t now = env_->NowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  AccountLocked(now);
  now_.first_iteration = false;
  now_.phase = Phase::kIdle;
}

Phase PhaseTracker::Enter(Phase p) {
  const uint64_t now = env_->NowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  AccountLocked(now);
  const Phase prev = now_.phase;
  now_.phase = p;
  return prev;
}

PhaseSnapshot PhaseTracker::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return now_;
}

double PhaseTracker::IterationSeconds(Phase p) const {
  const uint64_t now = env_->NowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t us = iteration_us_[static_cast<int>(p)];
  if (now_.phase == p) us += now - now_.since_us;
  return static_cast<double>(us) * 1e-6;
}

double PhaseTracker::IterationWallSeconds() const {
  const uint64_t now = env_->NowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t us = now - now_.since_us;
  for (uint64_t t : iteration_us_) us += t;
  return static_cast<double>(us) * 1e-6;
}

double PhaseTracker::ComputeSeconds() const {
  double s = 0;
  for (Phase p : {Phase::kData, Phase::kForward, Phase::kBackward, Phase::kOptimizer})
    s += IterationSeconds(p);
  return s;
}

}  // namespace keel
