// GoodputClock: where each second of this process's training loop goes, journaled for goodput
// (report/goodput.h adds the records of every process and keel launch's attempts into the
// job's breakdown). The loop marks the parts it can name (the wait for data, evaluation, saves,
// the guard's reruns and probes, a rollback's restore); the rest of an iteration's span is its
// compute. A record goes to events.jsonl at each save (so every checkpoint a later process can
// resume from is a record's boundary), before a rollback, and at the end: not per iteration.
#pragma once

#include <cstdint>
#include <string>

#include "core/env.h"
#include "journal/events.h"
#include "journal/run_journal.h"

namespace keel {

class GoodputClock {
 public:
  enum class Part { kDataWait, kEval, kSave, kGuard, kResume };

  // `journal` null: nothing is written (no --save, or not rank 0). `process_start_us`: Unix
  // microseconds when the process began its work.
  GoodputClock(Env* env, RunJournal* journal, int64_t process_start_us);

  // The loop begins at `iteration` (the resume point): journals goodput_start.
  void Start(int64_t iteration);
  // Adds `seconds` of a named part to the current record.
  void Add(Part part, double seconds);
  // Unix microseconds now (what a caller measures a part with).
  int64_t Now() const { return env_->NowUnixMicros(); }
  // Journals the record since the previous one; its iterations end at `last_iteration` (the next
  // begins after it: after a rollback, the iteration restored).
  void Record(const std::string& why, int64_t last_iteration);
  // The loop is over: time from here on is "other", not compute.
  void LoopEnded();
  // The iteration the next record begins after (a rollback moved the run back).
  void MovedTo(int64_t iteration) { first_iteration_ = iteration + 1; }

 private:
  Env* env_;
  RunJournal* journal_;
  int64_t process_start_us_;
  bool started_ = false;
  int64_t mark_us_ = 0;  // the previous record (or the start)
  int64_t loop_end_us_ = -1;
  int64_t first_iteration_ = 1;
  GoodputSeconds parts_;
};

// RAII: the seconds of a scope added to one part.
class GoodputScope {
 public:
  GoodputScope(GoodputClock* clock, GoodputClock::Part part)
      : clock_(clock), part_(part), start_us_(clock ? clock->Now() : 0) {}
  ~GoodputScope() {
    if (clock_) clock_->Add(part_, static_cast<double>(clock_->Now() - start_us_) / 1e6);
  }
  GoodputScope(const GoodputScope&) = delete;
  GoodputScope& operator=(const GoodputScope&) = delete;

 private:
  GoodputClock* clock_;
  GoodputClock::Part part_;
  int64_t start_us_;
};

}  // namespace keel
