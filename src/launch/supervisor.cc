#include "launch/supervisor.h"

#include <fmt/format.h>
#include <signal.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/manifest.h"
#include "core/exit_code.h"
#include "core/log.h"
#include "core/timestamp.h"
#include "launch/run_progress.h"
#include "metrics/run_metrics.h"

namespace keel {

ChildVerdict JudgeExit(const ChildExit& exit) {
  if (exit.signaled) return ChildVerdict::kRestart;
  switch (static_cast<ExitCode>(exit.code)) {
    case ExitCode::kSuccess:
      return ChildVerdict::kFinished;
    case ExitCode::kUsageError:
      return ChildVerdict::kConfigError;
    case ExitCode::kGuardStopped:
      return ChildVerdict::kGuardStopped;
    case ExitCode::kRuntimeFailure:
    case ExitCode::kRanksCannotGoOn:
      break;
  }
  return ChildVerdict::kRestart;  // 1, 4, and whatever else a launcher or a signal made of it
}

std::string DescribeExit(const ChildExit& exit) {
  if (exit.signaled)
    return fmt::format("killed by {} ({})", SignalName(exit.signal), strsignal(exit.signal));
  if (const char* meaning = ExitCodeMeaning(exit.code))
    return fmt::format("exit {} ({})", exit.code, meaning);
  // mpirun, srun and shells report a process killed by signal N as 128 + N.
  if (exit.code > 128 && exit.code < 128 + 65)
    return fmt::format("exit {} (a process of the job was killed by {})", exit.code,
                       SignalName(exit.code - 128));
  return fmt::format("exit {} (a failure)", exit.code);
}

int ExitCodeOf(const ChildExit& exit) {
  return exit.signaled ? 1 : exit.code;
}

namespace {

LaunchStopEvent StopFor(std::string reason) {
  LaunchStopEvent e;
  e.reason = std::move(reason);
  return e;
}

LaunchStopEvent KillSwitchStop(const std::string& path) {
  LaunchStopEvent e = StopFor("kill switch");
  e.path = path;
  return e;
}

std::string CommandText(const std::vector<std::string>& command) {
  std::string s;
  for (const std::string& a : command) s += (s.empty() ? "" : " ") + a;
  return s;
}

// 1-07:27:33 (days-hours:minutes:seconds, as Slurm writes elapsed time) or 07:27:33.
std::string Elapsed(double seconds) {
  const int64_t t = static_cast<int64_t>(seconds);
  const std::string hms = fmt::format("{:02}:{:02}:{:02}", (t / 3600) % 24, (t / 60) % 60, t % 60);
  return t >= 86400 ? fmt::format("{}-{}", t / 86400, hms) : hms;
}

std::string Iterations(int64_t n) {
  return fmt::format("{} iteration{}", n, n == 1 ? "" : "s");
}

std::string CheckpointText(int64_t marker) {
  return marker < 0 ? "none" : CheckpointDirName(marker);
}

}  // namespace

struct Supervisor::Attempt {
  int number = 0;
  uint64_t start_us = 0, end_us = 0;
  int64_t start_unix_us = 0;  // for goodput's attempt_end
  int64_t marker_at_start = -1;
  int64_t iteration_at_start = -1;  // newest train record when it started
  uint64_t metrics_size_at_start = 0;
  uint64_t metrics_size = 0;  // as last seen
  uint64_t progress_us = 0;   // when metrics.jsonl last changed (or the attempt started)
  bool stalled = false;       // launch ended it: no progress
  int stopped_by = 0;         // launch ended it: this signal came to launch
  bool escalated = false;     // it outlived --term-grace-seconds and was killed
  // Hosts: what of events.jsonl and of the job's stderr file this attempt wrote and was read.
  uint64_t events_size_at_start = 0, events_seen = 0, stderr_seen = 0;
  std::string stderr_path, stderr_tail;
  std::map<std::string, uint64_t> straggler_since;  // host -> when launch first saw it named
  std::map<int64_t, std::string> straggler_rank;    // rank -> host, of those named
  std::string straggler_pending;                    // past the limit: stop at the next checkpoint
  int64_t straggler_marker = -1;                    // the checkpoint when it passed the limit
  std::string straggler_host, straggler_evidence;   // launch stopped the job to take it out
};

Supervisor::Supervisor(LaunchOptions options, Env* env, ChildProcess* child,
                       std::function<int()> pending_signal)
    : opt_(std::move(options)),
      env_(env),
      child_(child),
      pending_signal_(std::move(pending_signal)),
      journal_(
          env, opt_.save_dir, [](const std::string& line) { LogLine(line); }, "") {
  if (opt_.status_file.empty()) opt_.status_file = JoinPath(opt_.save_dir, kLaunchStatusFile);
}

double Supervisor::Seconds() const {
  return (env_->NowMicros() - start_us_) / 1e6;
}

bool Supervisor::KillSwitchOn() {
  return !opt_.kill_switch_path.empty() && env_->FileExists(opt_.kill_switch_path);
}

void Supervisor::WriteStatus(const std::string& state, bool force) {
  const uint64_t now = env_->NowMicros();
  if (!force && state == state_ && now - last_status_us_ < opt_.status_interval_seconds * 1e6)
    return;
  state_ = state;
  last_status_us_ = now;
  const int64_t iteration =
      ReadMetricsProgress(env_, opt_.save_dir, std::numeric_limits<int64_t>::max())
          .newest_iteration;
  const int64_t marker = ReadCheckpointMarker(env_, opt_.save_dir);
  const std::string line = fmt::format(
      "{} keel launch: {} | attempt {} | restarts {} of {}{} | pid {} | iteration {} | checkpoint "
      "{} | up {} | lost {}{}\n",
      UtcTimestamp(static_cast<std::time_t>(env_->NowUnixMicros() / 1000000)), state, attempt_,
      restarts_, opt_.max_restarts,
      planned_restarts_ > 0 ? fmt::format(" (+{} planned)", planned_restarts_) : "",
      pid_ > 0 ? std::to_string(pid_) : "-", iteration < 0 ? "-" : std::to_string(iteration),
      marker < 0 ? "-" : std::to_string(marker), Elapsed(Seconds()), Iterations(lost_iterations_),
      HostsText());
  Status st = WriteFileAtomic(env_, opt_.status_file, line);
  if (!st.ok() && !status_warned_) {
    status_warned_ = true;
    Warn("launch: cannot write the status file: {}", st.message());
  }
}

void Supervisor::Stop(LaunchEnd end, int code, LaunchEndEvent&& event, const std::string& sentence,
                      LaunchResult* result) {
  result->end = end;
  result->exit_code = code;
  result->attempts = attempt_;
  result->restarts = restarts_;
  result->planned_restarts = planned_restarts_;
  result->lost_iterations = lost_iterations_;
  pid_ = 0;
  event.attempt = attempt_;
  event.restarts = restarts_;
  event.exit_code = code;
  journal_.Append(event, sentence + fmt::format("; keel launch exits {}", code));
  WriteStatus(end == LaunchEnd::kFinished ? "finished"
              : end == LaunchEnd::kGaveUp ? "gave up"
                                          : "stopped",
              true);
}

ChildExit Supervisor::Watch(Attempt* a) {
  const std::string metrics = JoinPath(opt_.save_dir, kMetricsFile);
  uint64_t stop_sent_us = 0, term_sent_us = 0;
  bool killed = false;
  const double kill_delay = std::min(5.0, opt_.term_grace_seconds);
  ChildExit exit;
  while (!child_->Poll(&exit)) {
    const uint64_t now = env_->NowMicros();
    const int sig = pending_signal_ ? pending_signal_() : 0;
    if (sig != 0 && stop_sent_us == 0) {
      a->stopped_by = sig;
      const std::string said = AskJobToStop(child_);
      Log("launch: received {}: asking the job to save a checkpoint and exit: {}; no restart; "
          "what is left after --term-grace-seconds {} is ended",
          SignalName(sig), said, opt_.term_grace_seconds);
      stop_sent_us = now;
    }
    uint64_t size = 0;
    if (!env_->FileExists(metrics) || !env_->GetFileSize(metrics, &size).ok()) size = 0;
    if (size != a->metrics_size) {  // grown, or replaced by a rewind: either is progress
      a->metrics_size = size;
      a->progress_us = now;
    } else if (opt_.stall_minutes > 0 && stop_sent_us == 0 &&
               now - a->progress_us >= opt_.stall_minutes * 60e6) {
      a->stalled = true;
      // Ranks that still answer save what they have; hung ones are ended after the grace.
      const std::string said = AskJobToStop(child_);
      Log("launch: {} has not changed for {} minutes: asking the job to save and exit ({}), "
          "ending it after --term-grace-seconds {}, then restarting it",
          metrics, opt_.stall_minutes, said, opt_.term_grace_seconds);
      stop_sent_us = now;
    }
    if (stop_sent_us != 0 && term_sent_us == 0 &&
        now - stop_sent_us >= opt_.term_grace_seconds * 1e6) {
      a->escalated = true;
      Log("launch: the job did not exit within --term-grace-seconds {} of the request to save "
          "and exit: sending SIGTERM to all its processes (process group {} and its ranks), "
          "SIGKILL after {} s",
          opt_.term_grace_seconds, pid_, kill_delay);
      child_->SignalGroup(SIGTERM);
      term_sent_us = now;
    }
    if (term_sent_us != 0 && !killed && now - term_sent_us >= kill_delay * 1e6) {
      Log("launch: the job is still running {} s after SIGTERM: sending SIGKILL to all its "
          "processes",
          kill_delay);
      child_->SignalGroup(SIGKILL);
      killed = true;
    }
    RelayStderr(a);
    if (WatchStragglers(a) && stop_sent_us == 0) {
      const std::string said = AskJobToStop(child_);
      Log("launch: {}: asking the job to save and exit ({}) to restart it without host {}",
          a->straggler_evidence, said, a->straggler_host);
      stop_sent_us = now;
    }
    WriteStatus(state_, false);
    env_->SleepForMicros(static_cast<uint64_t>(opt_.poll_seconds * 1e6));
  }
  RelayStderr(a);
  a->end_us = env_->NowMicros();
  return exit;
}

bool Supervisor::Backoff(double seconds, const ChildExit& last, LaunchResult* result) {
  const uint64_t deadline = env_->NowMicros() + static_cast<uint64_t>(seconds * 1e6);
  while (true) {
    if (KillSwitchOn()) {
      Stop(LaunchEnd::kStopped, 0, KillSwitchStop(opt_.kill_switch_path),
           fmt::format("launch: the kill switch {} appeared during the backoff: not restarting",
                       opt_.kill_switch_path),
           result);
      return false;
    }
    if (const int sig = pending_signal_ ? pending_signal_() : 0; sig != 0) {
      Stop(LaunchEnd::kStopped, ExitCodeOf(last), StopFor(SignalName(sig)),
           fmt::format("launch: received {} during the backoff: not restarting", SignalName(sig)),
           result);
      return false;
    }
    const uint64_t now = env_->NowMicros();
    if (now >= deadline) return true;
    WriteStatus("backoff", false);
    env_->SleepForMicros(std::min<uint64_t>(deadline - now, 1000000));  // the kill switch: 1 s
  }
}

bool Supervisor::EndsWithoutRestart(const Attempt& a, const ChildExit& exit, LaunchResult* result) {
  const std::string how = DescribeExit(exit);
  if (a.stopped_by != 0 && a.escalated) {
    // Killed: whatever it exited with, its save may not have been made.
    const int code = ExitCodeOf(exit) != 0 ? ExitCodeOf(exit) : 1;
    LaunchStopEvent ev = StopFor(SignalName(a.stopped_by));
    ev.child = how;
    ev.term_grace_seconds = opt_.term_grace_seconds;
    Stop(LaunchEnd::kStopped, code, std::move(ev),
         fmt::format("launch: stopped by {}: attempt {} did not save and exit within "
                     "--term-grace-seconds {} and was killed ({}); its newest checkpoint is {}; "
                     "give a longer --term-grace-seconds if its save takes longer; not "
                     "restarting",
                     SignalName(a.stopped_by), a.number, opt_.term_grace_seconds, how,
                     CheckpointText(ReadCheckpointMarker(env_, opt_.save_dir))),
         result);
    return true;
  }
  if (a.stopped_by != 0) {
    LaunchStopEvent ev = StopFor(SignalName(a.stopped_by));
    ev.child = how;
    Stop(LaunchEnd::kStopped, ExitCodeOf(exit), std::move(ev),
         fmt::format("launch: stopped by {}: attempt {} was asked to save and exit, and ended "
                     "with {}; not restarting",
                     SignalName(a.stopped_by), a.number, how),
         result);
    return true;
  }
  // Launch stopped it to take a straggler's host out at a checkpoint that is the run's last:
  // the job finished on its own, and no host needs taking out of a run that is over.
  if (PlannedStop(a, exit)) {
    int64_t marker = -1;
    if (RunComplete(&marker)) {
      Stop(LaunchEnd::kFinished, 0, LaunchFinishedEvent(),
           fmt::format("launch: attempt {} finished (exit 0): checkpoint {} completes the run "
                       "(--train-iters {}); host {}, named a straggler, was to be taken out at "
                       "it and is not, nothing being left to run; after {}, {} lost to failures",
                       a.number, CheckpointText(marker), job_.train_iters, a.straggler_host,
                       RestartsText(), Iterations(lost_iterations_)),
           result);
      return true;
    }
    if (job_.train_iters < 0)
      Log("note: launch: attempt {} saved and exited to take host {} out; {} give no iteration "
          "count, so whether checkpoint {} completes the run is not known: it is restarted (an "
          "attempt that finds the run complete exits 0 at once)",
          a.number, a.straggler_host, job_.source, CheckpointText(marker));
  }
  // Whatever it exited with, launch ended it: no progress, or to take a straggler's host out.
  if (a.stalled || !a.straggler_host.empty()) return false;
  switch (JudgeExit(exit)) {
    case ChildVerdict::kFinished:
      if (KillSwitchOn())
        Stop(LaunchEnd::kStopped, 0, KillSwitchStop(opt_.kill_switch_path),
             fmt::format("launch: attempt {} stopped on the kill switch {} (exit 0); not "
                         "restarting",
                         a.number, opt_.kill_switch_path),
             result);
      else
        Stop(LaunchEnd::kFinished, 0, LaunchFinishedEvent(),
             fmt::format("launch: attempt {} finished (exit 0) after {}, {} lost to failures",
                         a.number, RestartsText(), Iterations(lost_iterations_)),
             result);
      return true;
    case ChildVerdict::kConfigError:
      Stop(LaunchEnd::kStopped, 2, StopFor(how),
           fmt::format("launch: attempt {} ended with {}: not restarting, it would fail the same "
                       "way; fix the command",
                       a.number, how),
           result);
      return true;
    case ChildVerdict::kGuardStopped:
      Stop(LaunchEnd::kStopped, 3, StopFor(how),
           fmt::format("launch: attempt {} ended with {}: not restarting; the guard's entries "
                       "above say why (docs/guard.md)",
                       a.number, how),
           result);
      return true;
    case ChildVerdict::kRestart:
      break;
  }
  return false;
}

bool Supervisor::PlannedStop(const Attempt& a, const ChildExit& exit) const {
  return !a.straggler_host.empty() && !a.stalled && !a.escalated &&
         JudgeExit(exit) == ChildVerdict::kFinished;
}

std::string Supervisor::RestartsText() const {
  return fmt::format("{} restart{}{}", restarts_, restarts_ == 1 ? "" : "s",
                     planned_restarts_ > 0 ? fmt::format(" (and {} planned by launch, not counted)",
                                                         planned_restarts_)
                                           : "");
}

bool Supervisor::RunComplete(int64_t* marker) {
  *marker = ReadCheckpointMarker(env_, opt_.save_dir);
  return job_read_ && job_.train_iters > 0 && *marker >= job_.train_iters;
}

bool Supervisor::HoursSpentBy(double backoff) const {
  return opt_.max_hours > 0 && Seconds() + backoff >= opt_.max_hours * 3600;
}

Supervisor::Failure Supervisor::AccountFailure(const Attempt& a, const ChildExit& exit) {
  Failure f;
  f.cause = a.stalled ? fmt::format("stalled: no progress for {} minutes", opt_.stall_minutes)
            : !a.straggler_host.empty() ? fmt::format("stopped by launch to take out host {}: {}",
                                                      a.straggler_host, a.straggler_evidence)
                                        : DescribeExit(exit);
  f.marker = ReadCheckpointMarker(env_, opt_.save_dir);
  const int64_t from = std::max<int64_t>(f.marker, 0);
  const MetricsProgress mp = ReadMetricsProgress(env_, opt_.save_dir, from);
  const std::string metrics = JoinPath(opt_.save_dir, kMetricsFile);
  uint64_t size = 0;
  if (env_->FileExists(metrics)) (void)env_->GetFileSize(metrics, &size);
  // Records this attempt did not write (it died before its first iteration) were lost, and
  // counted, by the attempt before it.
  const bool trained =
      size != a.metrics_size_at_start || mp.newest_iteration != a.iteration_at_start;
  f.lost = trained ? std::max<int64_t>(0, mp.newest_iteration - from) : 0;
  f.compute_s = trained ? mp.ms_after / 1000.0 : 0.0;
  f.stuck_s = (a.end_us - std::max(a.progress_us, a.start_us)) / 1e6;
  lost_iterations_ += f.lost;
  const std::string hang =
      !exit.signaled && exit.code == 4 ? NewestHangDump(env_, opt_.save_dir) : "";

  f.event.cause = f.event.reason = f.cause;
  f.event.checkpoint_iteration = f.marker;
  f.event.lost_iterations = f.lost;
  f.event.lost_compute_seconds = f.compute_s;
  f.event.stuck_seconds = f.stuck_s;
  if (mp.newest_iteration >= 0) f.event.iteration = mp.newest_iteration;
  if (exit.signaled) f.event.signal = SignalName(exit.signal);
  if (!hang.empty()) f.event.hang_dump = hang;
  f.sentence = fmt::format(
      "attempt {} {}: {}; it {}, newest checkpoint {} ({} lost){}", a.number,
      PlannedStop(a, exit) ? "was stopped (exit 0)" : "failed", f.cause,
      mp.newest_iteration < 0 ? "had recorded no iteration"
                              : fmt::format("had reached iteration {}", mp.newest_iteration),
      CheckpointText(f.marker), Iterations(f.lost),
      hang.empty() ? ""
                   : fmt::format("; the watchdog's stack dump is {}: run `keel hangs analyze {}`",
                                 hang, hang));
  return f;
}

Status Supervisor::Run(LaunchResult* result) {
  *result = LaunchResult{};
  start_us_ = env_->NowMicros();
  if (opt_.command.empty()) return Status::InvalidArgument("no command to run");
  KEEL_RETURN_IF_ERROR(env_->CreateDirs(opt_.save_dir));
  journal_.Heading(fmt::format("keel launch at {} (keel {})", UtcTimestamp(), KEEL_VERSION));
  LaunchEvent launch;
  launch.command = opt_.command;
  launch.max_restarts = opt_.max_restarts;
  launch.max_hours = opt_.max_hours;
  launch.backoff_seconds = opt_.backoff_seconds;
  launch.max_backoff_seconds = opt_.max_backoff_seconds;
  launch.stall_minutes = opt_.stall_minutes;
  launch.unix_time = static_cast<double>(env_->NowUnixMicros()) / 1e6;
  journal_.Append(
      launch,
      fmt::format("launch: supervising `{}`: up to {} restarts{}, backoff {} s doubling up to {} "
                  "s{}; status in {}",
                  CommandText(opt_.command), opt_.max_restarts,
                  opt_.max_hours > 0 ? fmt::format(" within {} hours", opt_.max_hours) : "",
                  opt_.backoff_seconds, opt_.max_backoff_seconds,
                  opt_.stall_minutes > 0
                      ? fmt::format("; a job whose metrics.jsonl stays unchanged {} minutes is "
                                    "restarted",
                                    opt_.stall_minutes)
                      : "",
                  opt_.status_file));
  if (!opt_.hosts.empty()) {
    Status st = CheckCommandTakesHosts(opt_.command);
    if (st.ok() && opt_.spare_hosts >= static_cast<int>(opt_.hosts.size()))
      st = Status::InvalidArgument(
          fmt::format("--spare-hosts {} leaves no host to run on: {} lists {}; give fewer spares",
                      opt_.spare_hosts, opt_.hosts_source, opt_.hosts.size()));
    if (!st.ok()) {
      Stop(LaunchEnd::kNotStarted, 2, StopFor(st.message()),
           fmt::format("launch: cannot start: {}", st.message()), result);
      return st;
    }
    const size_t n = opt_.hosts.size() - static_cast<size_t>(opt_.spare_hosts);
    in_use_.assign(opt_.hosts.begin(), opt_.hosts.begin() + static_cast<std::ptrdiff_t>(n));
    spares_.assign(opt_.hosts.begin() + static_cast<std::ptrdiff_t>(n), opt_.hosts.end());
    target_hosts_ = in_use_.size();
    base_ranks_ = ranks_ = CommandRankCount(opt_.command);
    if (opt_.elastic || opt_.straggler_exclude_minutes > 0) {
      // The replica size a shrink keeps whole, and the run's length: from the job's --config too.
      if (Status js = ReadJobSettings(opt_.command, base_ranks_, &job_); !js.ok()) {
        Stop(LaunchEnd::kNotStarted, 2, StopFor(js.message()),
             fmt::format("launch: cannot start: {}", js.message()), result);
        return js;
      }
      job_read_ = true;
      Log("launch: the job's settings, from {}: tensor x pipeline parallel {} x {}, global batch "
          "{}, micro-batch {}, {}",
          job_.source, job_.tensor, job_.pipeline,
          job_.global_batch > 0 ? std::to_string(job_.global_batch) : "not given",
          job_.micro_batch > 0 ? std::to_string(job_.micro_batch) : "not given",
          job_.train_iters > 0 ? fmt::format("{} iterations", job_.train_iters)
                               : std::string("iterations not known"));
    }
  }
  WriteStatus("starting", true);
  if (KillSwitchOn()) {
    Stop(LaunchEnd::kStopped, 0, KillSwitchStop(opt_.kill_switch_path),
         fmt::format("launch: the kill switch {} exists: not starting the job (remove it first)",
                     opt_.kill_switch_path),
         result);
    return Status::OK();
  }

  const std::string metrics = JoinPath(opt_.save_dir, kMetricsFile);
  int consecutive = 0;  // failures since the last one that came after a new checkpoint
  while (true) {
    Attempt a;
    a.number = ++attempt_;
    a.marker_at_start = ReadCheckpointMarker(env_, opt_.save_dir);
    a.iteration_at_start =
        ReadMetricsProgress(env_, opt_.save_dir, std::numeric_limits<int64_t>::max())
            .newest_iteration;
    if (env_->FileExists(metrics)) (void)env_->GetFileSize(metrics, &a.metrics_size_at_start);
    a.metrics_size = a.metrics_size_at_start;
    const std::string events = JoinPath(opt_.save_dir, "events.jsonl");
    if (env_->FileExists(events)) (void)env_->GetFileSize(events, &a.events_size_at_start);
    a.events_seen = a.events_size_at_start;
    WriteStatus("starting", true);
    std::vector<std::string> command = opt_.command;
    Status st = CommandForAttempt(&a, &command);
    if (st.ok())
      st = child_->Start(command,
                         {"KEEL_LAUNCH=1", fmt::format("KEEL_LAUNCH_ATTEMPT={}", a.number)}, &pid_);
    if (!st.ok()) {
      Stop(LaunchEnd::kNotStarted, st.code() == Status::Code::kInvalidArgument ? 2 : 1,
           StopFor(st.message()),
           fmt::format("launch: attempt {} could not start: {}", a.number, st.message()), result);
      return st;
    }
    a.start_us = a.progress_us = env_->NowMicros();
    a.start_unix_us = env_->NowUnixMicros();
    Log("launch: attempt {} started: pid {} (its process group), KEEL_LAUNCH_ATTEMPT={}", a.number,
        pid_, a.number);
    WriteStatus("running", true);
    const ChildExit exit = Watch(&a);
    AttemptEndEvent span;  // goodput's measure of the attempt, by the wall clock
    span.attempt = a.number;
    span.start_time = static_cast<double>(a.start_unix_us) / 1e6;
    span.end_time = static_cast<double>(env_->NowUnixMicros()) / 1e6;
    span.exit = DescribeExit(exit);
    journal_.Append(span, "", "");  // events.jsonl only: the restart or end entry says it
    if (EndsWithoutRestart(a, exit, result)) return Status::OK();

    // A restart must never run beside what the failed job left in its process group.
    child_->SignalGroup(SIGKILL);
    pid_ = 0;
    Failure f = AccountFailure(a, exit);
    BlameAttempt(a, exit);
    // Launch's own stop is no failure: the user's budget of restarts is for failures.
    const bool planned = PlannedStop(a, exit);
    consecutive = f.marker > a.marker_at_start ? 1 : consecutive + 1;
    const double backoff =
        std::min(opt_.max_backoff_seconds,
                 opt_.backoff_seconds * std::pow(2.0, std::min(consecutive - 1, 30)));
    std::string spent;
    if (!planned && restarts_ >= opt_.max_restarts)
      spent = fmt::format("its {} restarts are spent", opt_.max_restarts);
    else if (HoursSpentBy(backoff))
      spent = fmt::format("--max-hours {} would be spent before a restart ({} used)",
                          opt_.max_hours, Elapsed(Seconds()));
    if (!spent.empty()) {
      LaunchGaveUpEvent gave_up;
      gave_up.failure = f.event;
      Stop(LaunchEnd::kGaveUp, ExitCodeOf(exit), std::move(gave_up),
           fmt::format("launch: gave up, {}: {}", spent, f.sentence), result);
      return Status::OK();
    }
    if (std::string why; !PlaceHosts(&why)) {
      LaunchStopEvent ev = StopFor(why);
      ev.child = f.cause;
      Stop(LaunchEnd::kStopped, ExitCodeOf(exit) != 0 ? ExitCodeOf(exit) : 1, std::move(ev),
           fmt::format("launch: {}; {}; not restarting", f.sentence, why), result);
      return Status::OK();
    }
    if (planned)
      Log("launch: {}; a planned restart, not counted against --max-restarts ({} of {} used), "
          "in {} s",
          f.sentence, restarts_, opt_.max_restarts, backoff);
    else
      Log("launch: {}; restart {} of {} in {} s", f.sentence, restarts_ + 1, opt_.max_restarts,
          backoff);
    WriteStatus("backoff", true);
    if (!Backoff(backoff, exit, result)) return Status::OK();
    ++(planned ? planned_restarts_ : restarts_);
    const double down_s = (env_->NowMicros() - a.end_us) / 1e6;
    const double lost_s = f.compute_s + f.stuck_s + down_s;
    RestartEvent restart;
    restart.attempt = a.number;
    restart.failure = f.event;
    restart.restart = restarts_;
    restart.max_restarts = opt_.max_restarts;
    if (planned) restart.counted = false;
    restart.backoff_seconds = backoff;
    restart.downtime_seconds = down_s;
    restart.lost_seconds = lost_s;
    journal_.Append(
        restart,
        fmt::format("launch: {}: {}; continuing from {}; lost {:.1f} s ({:.1f} s "
                    "computing the lost iterations, {:.1f} s without progress before the end, "
                    "{:.1f} s down including the {} s backoff)",
                    planned ? fmt::format("planned restart (not counted against --max-restarts: "
                                          "{} of {} used)",
                                          restarts_, opt_.max_restarts)
                            : fmt::format("restart {} of {}", restarts_, opt_.max_restarts),
                    f.sentence, f.marker < 0 ? "the start" : CheckpointDirName(f.marker), lost_s,
                    f.compute_s, f.stuck_s, down_s, backoff));
  }
}

// ---- Hosts.

namespace {

std::vector<std::string> Names(const std::vector<HostEntry>& hosts) {
  std::vector<std::string> out;
  for (const HostEntry& h : hosts) out.push_back(h.name);
  return out;
}

std::string NameList(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ",") + n;
  return s.empty() ? "-" : s;
}

int Slots(const std::vector<HostEntry>& hosts) {
  int n = 0;
  for (const HostEntry& h : hosts) n += h.slots;
  return n;
}

// A host named by the evidence is one of launch's when the names are equal, or equal up to the
// first dot (a rank's gethostname may be short where the hostfile is fully qualified).
bool SameHost(const std::string& a, const std::string& b) {
  if (a == b) return true;
  return a.substr(0, a.find('.')) == b.substr(0, b.find('.'));
}

}  // namespace

std::string Supervisor::HostsText() const {
  if (opt_.hosts.empty()) return "";
  std::vector<std::string> out;
  for (const Excluded& e : excluded_) out.push_back(e.host.name);
  return fmt::format(" | hosts {} | spares {} | excluded {}", NameList(Names(in_use_)),
                     NameList(Names(spares_)), NameList(out));
}

Status Supervisor::CommandForAttempt(Attempt* a, std::vector<std::string>* command) {
  child_->stderr_file.clear();
  if (opt_.hosts.empty()) return Status::OK();
  const std::string dir = JoinPath(opt_.save_dir, "launch-hosts");
  KEEL_RETURN_IF_ERROR(env_->CreateDirs(dir));
  const std::string hostfile = JoinPath(dir, fmt::format("attempt-{}.hosts", a->number));
  KEEL_RETURN_IF_ERROR(WriteFileAtomic(env_, hostfile, FormatHostfile(in_use_)));
  *command = CommandForHosts(opt_.command, hostfile, in_use_, ranks_ != base_ranks_ ? ranks_ : -1);
  // The job's stderr goes to a file launch copies on: mpirun's report of a dead rank is evidence.
  a->stderr_path = JoinPath(dir, fmt::format("attempt-{}.stderr", a->number));
  child_->stderr_file = a->stderr_path;
  LaunchHostsEvent ev;
  ev.attempt = a->number;
  ev.hosts = Names(in_use_);
  ev.spares = Names(spares_);
  for (const Excluded& e : excluded_) ev.excluded.push_back(e.host.name);
  if (ranks_ >= 0) ev.ranks = ranks_;
  if (RankLauncherOf(opt_.command) == RankLauncher::kMpirun) ev.hostfile = hostfile;
  ev.command = *command;
  journal_.Append(
      ev, fmt::format("launch: attempt {} runs on {} host{} ({}){}; spares {}; "
                      "excluded {}",
                      a->number, in_use_.size(), in_use_.size() == 1 ? "" : "s", NameList(ev.hosts),
                      ranks_ >= 0 ? fmt::format(", {} ranks", ranks_) : "", NameList(ev.spares),
                      NameList(ev.excluded)));
  return Status::OK();
}

void Supervisor::RelayStderr(Attempt* a) {
  if (a->stderr_path.empty()) return;
  uint64_t size = 0;
  if (!env_->FileExists(a->stderr_path) || !env_->GetFileSize(a->stderr_path, &size).ok() ||
      size <= a->stderr_seen)
    return;
  std::string text;
  const size_t n = static_cast<size_t>(std::min<uint64_t>(size - a->stderr_seen, 1 << 20));
  if (!env_->ReadFileRange(a->stderr_path, a->stderr_seen, n, &text).ok()) return;
  a->stderr_seen += text.size();
  fwrite(text.data(), 1, text.size(), stderr);
  fflush(stderr);
  a->stderr_tail += text;
  constexpr size_t kKeep = 256 * 1024;  // mpirun's report comes last; a flood before it is not kept
  if (a->stderr_tail.size() > kKeep) a->stderr_tail.erase(0, a->stderr_tail.size() - kKeep);
}

bool Supervisor::WatchStragglers(Attempt* a) {
  if (opt_.hosts.empty() || opt_.straggler_exclude_minutes <= 0 || !a->straggler_host.empty())
    return false;
  const uint64_t now = env_->NowMicros();
  const std::vector<std::string> lines = EventLinesSince(env_, opt_.save_dir, a->events_seen);
  for (const std::string& line : lines) {
    a->events_seen += line.size() + 1;
    const nlohmann::json e = nlohmann::json::parse(line, nullptr, false);
    if (!e.is_object()) continue;
    const std::string kind = e.value("event", "");
    if (kind == "straggler") {
      const std::string host = e.value("host", "");
      if (host.empty()) continue;
      a->straggler_rank[e.value("rank", int64_t{-1})] = host;
      a->straggler_since.emplace(host, now);
    } else if (kind == "straggler_recovered") {
      auto it = a->straggler_rank.find(e.value("rank", int64_t{-1}));
      if (it == a->straggler_rank.end()) continue;
      a->straggler_since.erase(it->second);
      if (a->straggler_pending == it->second) a->straggler_pending.clear();
      a->straggler_rank.erase(it);
    }
  }
  if (a->straggler_pending.empty()) {
    for (const auto& [host, since] : a->straggler_since) {
      if (now - since < opt_.straggler_exclude_minutes * 60e6) continue;
      bool ours = false;
      for (const HostEntry& h : in_use_) ours = ours || SameHost(h.name, host);
      // Without a spare or --elastic nothing could take its place: a slow job beats none.
      if (!ours || (spares_.empty() && !opt_.elastic)) continue;
      a->straggler_pending = host;
      a->straggler_marker = ReadCheckpointMarker(env_, opt_.save_dir);
      Log("launch: host {} has been named a straggler for {} minutes (--straggler-exclude-minutes "
          "{}): it is taken out at the next checkpoint",
          host, opt_.straggler_exclude_minutes, opt_.straggler_exclude_minutes);
      break;
    }
  }
  if (a->straggler_pending.empty() ||
      ReadCheckpointMarker(env_, opt_.save_dir) <= a->straggler_marker)
    return false;
  if (HoursSpentBy(opt_.backoff_seconds)) {
    // A stop launch could not restart would end a job that runs: the host stays.
    Log("launch: host {} stays in: --max-hours {} leaves no time for the restart that would take "
        "it out",
        a->straggler_pending, opt_.max_hours);
    a->straggler_pending.clear();
    a->straggler_since.clear();
    a->straggler_rank.clear();
    return false;
  }
  a->straggler_host = a->straggler_pending;
  a->straggler_evidence = fmt::format(
      "events.jsonl: host {} named a straggler for over --straggler-exclude-minutes {} (no "
      "straggler_recovered since), and checkpoint {} is written",
      a->straggler_host, opt_.straggler_exclude_minutes,
      CheckpointText(ReadCheckpointMarker(env_, opt_.save_dir)));
  return true;
}

void Supervisor::BlameAttempt(const Attempt& a, const ChildExit& exit) {
  if (opt_.hosts.empty()) return;
  (void)exit;
  Blame b;
  if (!a.straggler_host.empty()) {
    b.kind = BlameKind::kStraggler;
    b.host = a.straggler_host;
    b.source = JoinPath(opt_.save_dir, "events.jsonl");
    b.evidence = a.straggler_evidence;
  } else {
    // Ranks launch itself killed (the stall backstop, the grace) are no evidence against their
    // hosts: mpirun's report of their deaths is left out then.
    const bool launch_killed = a.stalled || a.escalated;
    b = BlameFailure(env_, opt_.save_dir,
                     EventLinesSince(env_, opt_.save_dir, a.events_size_at_start),
                     launch_killed ? "" : a.stderr_tail);
  }
  HostBlameEvent ev;
  ev.attempt = a.number;
  ev.blame = BlameKindName(b.kind);
  ev.evidence = b.evidence;
  ev.source = b.source;
  if (b.rank >= 0) ev.rank = b.rank;
  std::string host;
  for (const HostEntry& h : in_use_)
    if (!b.host.empty() && SameHost(h.name, b.host)) host = h.name;
  if (host.empty()) {
    ev.host = nullptr;
    std::string why = b.kind == BlameKind::kNone
                          ? "no hang dump, events.jsonl line or report of the launcher names a host"
                      : b.host.empty()
                          ? b.evidence + "; that names no one host"
                          : fmt::format("{}; host {} is not one of launch's hosts ({})", b.evidence,
                                        b.host, NameList(Names(in_use_)));
    if (ev.evidence.empty()) ev.evidence = why;
    journal_.Append(ev, fmt::format("launch: attempt {}'s failure is pinned on no host: {}; "
                                    "nothing is excluded",
                                    a.number, why));
    return;
  }
  const bool hard = b.kind == BlameKind::kHang || b.kind == BlameKind::kReplicaMismatch;
  const int threshold = b.kind == BlameKind::kStraggler ? 1
                        : opt_.exclude_after > 0        ? opt_.exclude_after
                        : hard                          ? 1
                                                        : 2;
  const int pinned = b.kind == BlameKind::kStraggler ? 1
                     : hard                          ? ++pinned_hard_[host]
                                                     : ++pinned_crash_[host];
  ev.host = host;
  ev.pinned = pinned;
  ev.exclude_after = threshold;
  const bool out = pinned >= threshold;
  journal_.Append(
      ev, fmt::format("launch: attempt {}'s failure is pinned on host {} ({}): {}; {} of {} "
                      "such failure{} pinned on it{}",
                      a.number, host, ev.blame, b.evidence, pinned, threshold,
                      threshold == 1 ? "" : "s",
                      out ? ": it is taken out" : fmt::format(" (--exclude-after {})", threshold)));
  if (out) pending_.push_back({host, ev.blame, b.evidence});
}

bool Supervisor::PlaceHosts(std::string* why) {
  if (opt_.hosts.empty()) return true;
  const uint64_t now = env_->NowMicros();
  // Readmissions first: an excluded host back becomes a spare, and may fill a place below.
  std::set<std::string> listed;
  const std::string readmit = JoinPath(opt_.save_dir, kHostsReadmitFile);
  if (env_->FileExists(readmit)) {
    std::string text;
    if (env_->ReadFileToString(readmit, &text).ok()) {
      std::vector<HostEntry> names;
      if (ParseHostfile(text, readmit, &names).ok())
        for (const HostEntry& h : names) listed.insert(h.name);
      (void)env_->RemoveFile(readmit);  // read once: what it listed is done
    }
  }
  for (auto it = excluded_.begin(); it != excluded_.end();) {
    const double secs = (now - it->at_us) / 1e6;
    std::string via;
    if (listed.erase(it->host.name))
      via = readmit;
    else if (opt_.readmit_after_seconds > 0 && secs >= opt_.readmit_after_seconds)
      via = fmt::format("--readmit-after {} s", opt_.readmit_after_seconds);
    if (via.empty()) {
      ++it;
      continue;
    }
    HostReadmittedEvent ev;
    ev.host = it->host.name;
    ev.via = via;
    ev.excluded_seconds = secs;
    journal_.Append(ev, fmt::format("launch: host {} is readmitted ({}) after {:.0f} s out; it "
                                    "is a spare again, in use where the job is short of hosts",
                                    it->host.name, via, secs));
    spares_.push_back(it->host);
    it = excluded_.erase(it);
  }
  for (const std::string& name : listed)
    Warn("launch: {} lists host {}, which is not excluded: nothing to readmit", readmit, name);

  // Exclusions: a spare takes the host's place (the same world size, the same rank order).
  std::vector<PendingExclusion> unreplaced;
  for (const PendingExclusion& p : pending_) {
    auto it = std::find_if(in_use_.begin(), in_use_.end(),
                           [&](const HostEntry& h) { return h.name == p.host; });
    if (it == in_use_.end()) continue;
    excluded_.push_back({*it, now});
    HostExcludedEvent ev;
    ev.attempt = attempt_;
    ev.host = p.host;
    ev.blame = p.kind;
    ev.evidence = p.evidence;
    if (!spares_.empty()) {
      *it = spares_.front();
      spares_.erase(spares_.begin());
      ev.replaced_by = it->name;
      journal_.Append(ev, fmt::format("launch: host {} is excluded ({}); spare host {} takes its "
                                      "place: the same world size, the job resumes bit for bit",
                                      p.host, p.kind, it->name));
    } else {
      in_use_.erase(it);
      unreplaced.push_back(p);
    }
  }
  pending_.clear();
  // Short of hosts (an exclusion without a spare, or one before): spares fill the places first.
  while (in_use_.size() < target_hosts_ && !spares_.empty()) {
    Log("launch: spare host {} goes into use: the job grows back toward its {} hosts",
        spares_.front().name, target_hosts_);
    in_use_.push_back(spares_.front());
    spares_.erase(spares_.begin());
  }
  const int before = ranks_;
  int target_slots = 0;
  for (size_t i = 0; i < opt_.hosts.size() - static_cast<size_t>(opt_.spare_hosts); ++i)
    target_slots += opt_.hosts[i].slots;
  const int short_by = target_slots - Slots(in_use_);
  std::string excluded_text;
  for (const PendingExclusion& p : unreplaced)
    excluded_text += fmt::format("{}host {} is excluded ({}: {})",
                                 excluded_text.empty() ? "" : "; ", p.host, p.kind, p.evidence);
  if (short_by > 0) {
    const std::string lead = excluded_text.empty()
                                 ? fmt::format("the job is {} slot{} short of its hosts", short_by,
                                               short_by == 1 ? "" : "s")
                                 : excluded_text;
    if (in_use_.empty()) {
      *why = lead + " and no host is left to run on";
      return false;
    }
    if (!opt_.elastic) {
      *why = lead +
             " and no spare host is left; give --spare-hosts N to keep spares ready, or "
             "--elastic to go on with fewer data-parallel ranks (the global batch and the "
             "LR schedule stay; more micro-batches per rank)";
      return false;
    }
    // keel trains any tensor x pipeline layout and resumes it at any data-parallel size: the job
    // shrinks by whole model replicas of T x P ranks.
    const int mp = job_.ModelParallel();
    if (mp > 1 && base_ranks_ < 0) {
      *why = lead + fmt::format(
                        " and --elastic cannot shrink this job: its tensor x pipeline parallel "
                        "size is {}, so the ranks must drop by whole groups of {}, and the "
                        "command gives no rank count (-np, --ntasks) to lower; give one, or "
                        "--spare-hosts N",
                        mp, mp);
      return false;
    }
    if (base_ranks_ >= 0) {
      const int left = base_ranks_ - short_by;
      ranks_ = left / mp * mp;
      if (ranks_ < 1) {
        *why = lead + (mp == 1 ? fmt::format(" and {} ranks less leaves none", short_by)
                               : fmt::format(" and the {} ranks left hold no whole model replica "
                                             "(tensor x pipeline parallel {} ranks); give "
                                             "--spare-hosts N",
                                             std::max(left, 0), mp));
        ranks_ = before;
        return false;
      }
      // The global batch must split into micro-batches over the data-parallel ranks left, or
      // keel refuses.
      const long gbs = job_.global_batch, mbs = job_.micro_batch;
      const int data = ranks_ / mp;
      if (gbs > 0 && mbs > 0 && gbs % (mbs * data) != 0) {
        *why = lead + (mp == 1 ? fmt::format(" and --elastic cannot shrink to {} ranks: "
                                             "--global-batch-size {} is not a multiple of "
                                             "--micro-batch-size {} x {} ranks; give "
                                             "--spare-hosts N",
                                             ranks_, gbs, mbs, ranks_)
                               : fmt::format(" and --elastic cannot shrink to {} ranks: "
                                             "--global-batch-size {} is not a multiple of "
                                             "--micro-batch-size {} x {} data-parallel ranks "
                                             "({} ranks / tensor x pipeline parallel {}); give "
                                             "--spare-hosts N",
                                             ranks_, gbs, mbs, data, ranks_, mp));
        ranks_ = before;
        return false;
      }
      if (ranks_ < left)
        Log("note: launch: {} ranks fit on the hosts left; {} run (whole model replicas of "
            "tensor x pipeline parallel {} ranks), {} slot{} idle",
            left, ranks_, mp, left - ranks_, left - ranks_ == 1 ? " stays" : "s stay");
    }
  } else {
    ranks_ = base_ranks_;
  }
  for (const PendingExclusion& p : unreplaced) {
    HostExcludedEvent ev;
    ev.attempt = attempt_;
    ev.host = p.host;
    ev.blame = p.kind;
    ev.evidence = p.evidence;
    if (before >= 0) ev.ranks_before = before;
    if (ranks_ >= 0) ev.ranks_after = ranks_;
    journal_.Append(
        ev, fmt::format("launch: host {} is excluded ({}); no spare is left, and --elastic: the "
                        "job goes on with fewer data-parallel ranks ({} -> {}); the global batch "
                        "and the LR schedule stay as they were (more micro-batches per rank), so "
                        "the run's arithmetic changes from here",
                        p.host, p.kind, before >= 0 ? std::to_string(before) : "?",
                        ranks_ >= 0 ? std::to_string(ranks_) : "the slots of the hosts left"));
  }
  if (unreplaced.empty() && before != ranks_)
    Log("launch: the job grows back to {} ranks on {} hosts", ranks_, in_use_.size());
  return true;
}

}  // namespace keel
