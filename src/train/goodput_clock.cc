#include "train/goodput_clock.h"

#include <algorithm>
#include <cstdlib>

namespace keel {

GoodputClock::GoodputClock(Env* env, RunJournal* journal, int64_t process_start_us)
    : env_(env), journal_(journal), process_start_us_(process_start_us) {}

void GoodputClock::Start(int64_t iteration) {
  started_ = true;
  mark_us_ = Now();
  first_iteration_ = iteration + 1;
  if (journal_ == nullptr) return;
  GoodputStartEvent ev;
  ev.iteration = iteration;
  // keel launch numbers its attempts; goodput matches each process to its attempt by it.
  const char* attempt = std::getenv("KEEL_LAUNCH_ATTEMPT");
  ev.attempt = attempt ? std::atoll(attempt) : 0;
  ev.process_start = static_cast<double>(process_start_us_) / 1e6;
  ev.unix_time = static_cast<double>(mark_us_) / 1e6;
  journal_->Append(ev, "", "");  // events.jsonl only: the chronicle gets the summary
}

void GoodputClock::Add(Part part, double seconds) {
  switch (part) {
    case Part::kDataWait:
      parts_.data_wait += seconds;
      break;
    case Part::kEval:
      parts_.eval += seconds;
      break;
    case Part::kSave:
      parts_.save += seconds;
      break;
    case Part::kGuard:
      parts_.guard += seconds;
      break;
    case Part::kResume:
      parts_.resume += seconds;
      break;
  }
}

void GoodputClock::LoopEnded() {
  if (loop_end_us_ < 0) loop_end_us_ = Now();
}

void GoodputClock::Record(const std::string& why, int64_t last_iteration) {
  if (!started_) return;  // the loop never began: the supervisor sees the process's span
  const int64_t now = Now();
  // The span's parts not named are the iterations' compute, or after the loop "other"; a span
  // that holds the loop's end has both.
  const double named = parts_.data_wait + parts_.eval + parts_.save + parts_.guard + parts_.resume;
  const double span = static_cast<double>(now - mark_us_) / 1e6;
  double rest = std::max(0.0, span - named);
  if (loop_end_us_ >= 0) {
    const double after = static_cast<double>(now - std::max(loop_end_us_, mark_us_)) / 1e6;
    parts_.other = std::clamp(after - parts_.save, 0.0, rest);  // the final save is named
    rest -= parts_.other;
  }
  parts_.compute = rest;
  if (journal_ != nullptr) {
    GoodputEvent ev;
    ev.first_iteration = first_iteration_;
    ev.last_iteration = last_iteration;
    ev.why = why;
    ev.unix_time = static_cast<double>(now) / 1e6;
    ev.seconds = parts_;
    journal_->Append(ev, "", "");
  }
  mark_us_ = now;
  if (loop_end_us_ >= 0) loop_end_us_ = now;
  first_iteration_ = last_iteration + 1;
  parts_ = GoodputSeconds{};
}

}  // namespace keel
