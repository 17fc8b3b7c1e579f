#include "launch/supervisor.h"

#include <fmt/format.h>
#include <signal.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "checkpoint/manifest.h"
#include "core/exit_code.h"
#include "core/log.h"
#include "core/timestamp.h"
#include "launch/run_progress.h"
#include "metrics/run_metrics.h"

namespace keel {

std::string CommandFlagValue(const std::vector<std::string>& command, const std::string& flag) {
  std::string value;  // the last one given wins, as in keel's own parser
  for (size_t i = 0; i < command.size(); ++i) {
    if (command[i] == flag && i + 1 < command.size())
      value = command[++i];
    else if (command[i].rfind(flag + "=", 0) == 0)
      value = command[i].substr(flag.size() + 1);
  }
  return value;
}

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
      "{} keel launch: {} | attempt {} | restarts {} of {} | pid {} | iteration {} | checkpoint "
      "{} | up {} | lost {}\n",
      UtcTimestamp(static_cast<std::time_t>(env_->NowUnixMicros() / 1000000)), state, attempt_,
      restarts_, opt_.max_restarts, pid_ > 0 ? std::to_string(pid_) : "-",
      iteration < 0 ? "-" : std::to_string(iteration), marker < 0 ? "-" : std::to_string(marker),
      Elapsed(Seconds()), Iterations(lost_iterations_));
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
    WriteStatus(state_, false);
    env_->SleepForMicros(static_cast<uint64_t>(opt_.poll_seconds * 1e6));
  }
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
  if (a.stalled) return false;  // whatever it exited with, launch ended it
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
             fmt::format("launch: attempt {} finished (exit 0) after {} restart{}, {} lost to "
                         "failures",
                         a.number, restarts_, restarts_ == 1 ? "" : "s",
                         Iterations(lost_iterations_)),
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

Supervisor::Failure Supervisor::AccountFailure(const Attempt& a, const ChildExit& exit) {
  Failure f;
  f.cause = a.stalled ? fmt::format("stalled: no progress for {} minutes", opt_.stall_minutes)
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
      "attempt {} failed: {}; it {}, newest checkpoint {} ({} lost){}", a.number, f.cause,
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
    WriteStatus("starting", true);
    const Status st = child_->Start(
        opt_.command, {"KEEL_LAUNCH=1", fmt::format("KEEL_LAUNCH_ATTEMPT={}", a.number)}, &pid_);
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
    consecutive = f.marker > a.marker_at_start ? 1 : consecutive + 1;
    const double backoff =
        std::min(opt_.max_backoff_seconds,
                 opt_.backoff_seconds * std::pow(2.0, std::min(consecutive - 1, 30)));
    std::string spent;
    if (restarts_ >= opt_.max_restarts)
      spent = fmt::format("its {} restarts are spent", opt_.max_restarts);
    else if (opt_.max_hours > 0 && Seconds() + backoff >= opt_.max_hours * 3600)
      spent = fmt::format("--max-hours {} would be spent before a restart ({} used)",
                          opt_.max_hours, Elapsed(Seconds()));
    if (!spent.empty()) {
      LaunchGaveUpEvent gave_up;
      gave_up.failure = f.event;
      Stop(LaunchEnd::kGaveUp, ExitCodeOf(exit), std::move(gave_up),
           fmt::format("launch: gave up, {}: {}", spent, f.sentence), result);
      return Status::OK();
    }
    Log("launch: {}; restart {} of {} in {} s", f.sentence, restarts_ + 1, opt_.max_restarts,
        backoff);
    WriteStatus("backoff", true);
    if (!Backoff(backoff, exit, result)) return Status::OK();
    ++restarts_;
    const double down_s = (env_->NowMicros() - a.end_us) / 1e6;
    const double lost_s = f.compute_s + f.stuck_s + down_s;
    RestartEvent restart;
    restart.attempt = a.number;
    restart.failure = f.event;
    restart.restart = restarts_;
    restart.max_restarts = opt_.max_restarts;
    restart.backoff_seconds = backoff;
    restart.downtime_seconds = down_s;
    restart.lost_seconds = lost_s;
    journal_.Append(
        restart,
        fmt::format("launch: restart {} of {}: {}; continuing from {}; lost {:.1f} s ({:.1f} s "
                    "computing the lost iterations, {:.1f} s without progress before the end, "
                    "{:.1f} s down including the {} s backoff)",
                    restarts_, opt_.max_restarts, f.sentence,
                    f.marker < 0 ? "the start" : CheckpointDirName(f.marker), lost_s, f.compute_s,
                    f.stuck_s, down_s, backoff));
  }
}

}  // namespace keel
