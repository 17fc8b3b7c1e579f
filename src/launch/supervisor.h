// Supervisor: `keel launch`, a job that restarts itself. It runs a command (keel train, or
// mpirun/srun starting it) as a child, and when the child fails or hangs it runs the same command
// again (keel train resumes from its newest valid checkpoint by itself), so a crash at 3 am
// costs the iterations since the last checkpoint rather than the night (the 176B run's
// "training crashes, but SLURM doesn't quit").
//
// What the child's end means (keel's exit codes, core/exit_code.h):
//
//   exit 0            finished, or stopped on purpose (kill switch, SIGTERM)  -> launch exits 0
//   exit 2            usage or configuration error: would fail the same way   -> no restart, 2
//   exit 3            the guard stopped the run (unhealthy state)             -> no restart, 3
//   exit 4            the ranks could not go on (a hang, collectives out of step) -> restart
//   any other code    a failure (1: runtime error; 137: a rank was killed)    -> restart
//   killed by signal  SIGKILL (the OOM killer), SIGSEGV, ...                  -> restart
//
// Restarts wait a backoff that doubles with each consecutive failure (a failure after a new
// checkpoint starts again at the base), within a budget of restarts and optionally hours; spent,
// launch gives up with the last child's code (1 for a signal). Every decision goes to stdout
// ("launch: "), each restart and stop to the run's journal (CHRONICLE.md, events.jsonl), and
// the state to a one-line status file rewritten in place.
//
// Given the hosts (LaunchOptions::hosts), each attempt runs on those in use; a failure is pinned
// on a host only when what the job left names one (launch/blame.h), and a host pinned often
// enough is taken out: a spare takes its place, or (--elastic) fewer data-parallel ranks go on,
// or launch stops naming it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "journal/run_journal.h"
#include "launch/blame.h"
#include "launch/child_process.h"
#include "launch/hosts.h"
#include "launch/job_settings.h"
#include "launch/launch_events.h"

namespace keel {

constexpr const char* kLaunchStatusFile = "launch.status";

struct LaunchOptions {
  std::vector<std::string> command;  // argv of the child
  std::string save_dir;              // the run directory (keel train --save)
  std::string kill_switch_path;      // empty: none
  std::string status_file;           // empty: SAVE/launch.status
  int max_restarts = 3;
  double max_hours = 0;  // total wall time after which no restart is begun (0: no limit)
  double backoff_seconds = 30;
  double max_backoff_seconds = 600;
  // After the job is asked to save and exit (a signal to launch, the stall backstop), how long
  // until all its processes get SIGTERM, then SIGKILL 5 s later (or
  // after the grace, when it is shorter).
  double term_grace_seconds = 120;
  double stall_minutes = 0;  // metrics.jsonl unchanged this long: kill, restart (0: off)
  double status_interval_seconds = 10;
  double poll_seconds = 0.1;  // how often the child is looked at

  // Hosts (--hostfile FILE, or SLURM_JOB_NODELIST under srun): empty, launch leaves the hosts to
  // the command. The last `spare_hosts` start as spares; each attempt gets the hosts in use
  // (mpirun --hostfile SAVE/launch-hosts/attempt-N, srun --nodelist), the rest of the command
  // as written.
  std::vector<HostEntry> hosts;
  std::string hosts_source;  // where they came from, for the journal
  int spare_hosts = 0;
  // Failures pinned on one host that take it out; 0: 1 for a hang or a replica mismatch, 2 for a
  // crash or a transient fault.
  int exclude_after = 0;
  double straggler_exclude_minutes = 0;  // a straggler named this long goes (0: never)
  bool elastic = false;                  // without a spare, go on with fewer data-parallel ranks
  double readmit_after_seconds = 0;      // an excluded host comes back after this (0: never)
};

// The file an operator writes host names into (one a line) to readmit them at the next restart.
constexpr const char* kHostsReadmitFile = "hosts.readmit";

// What one end of the child means (the table above).
enum class ChildVerdict { kFinished, kConfigError, kGuardStopped, kRestart };
ChildVerdict JudgeExit(const ChildExit& exit);
// "exit 4 (the ranks could not go on together: ...)", "killed by SIGKILL (Killed)".
std::string DescribeExit(const ChildExit& exit);
// keel launch's exit code for a child that ended so: its code, or 1 for a signal.
int ExitCodeOf(const ChildExit& exit);

enum class LaunchEnd {
  kFinished,    // the child exited 0
  kStopped,     // exit 2 or 3, the kill switch, or a signal to launch: not restarted
  kGaveUp,      // the budget of restarts or hours was spent
  kNotStarted,  // the command could not be executed
};

struct LaunchResult {
  LaunchEnd end = LaunchEnd::kNotStarted;
  int exit_code = 1;  // what `keel launch` exits with
  int attempts = 0;
  int restarts = 0;          // counted against --max-restarts
  int planned_restarts = 0;  // launch's own stops (a straggler's host taken out): not counted
  int64_t lost_iterations = 0;
};

class Supervisor {
 public:
  // `pending_signal` returns the stop signal this process received (SIGTERM, SIGINT,
  // SIGUSR1) or 0.
  Supervisor(LaunchOptions options, Env* env, ChildProcess* child,
             std::function<int()> pending_signal);

  // Runs the command until it finishes, is stopped, or the budget is spent. An error only when
  // the command cannot be executed at all (InvalidArgument).
  Status Run(LaunchResult* result);

 private:
  struct Attempt;
  // What a failed attempt cost, for its journal entry.
  struct Failure {
    std::string cause, sentence;
    int64_t marker = -1, lost = 0;
    double compute_s = 0, stuck_s = 0;
    AttemptFailure event;
  };
  // Watches the running child until it ends; sets `stalled` or `stopped_by` when launch ended it.
  ChildExit Watch(Attempt* a);
  // Stops (true) when the child's end is not restarted: finished, exit 2 or 3, a signal to launch.
  bool EndsWithoutRestart(const Attempt& a, const ChildExit& exit, LaunchResult* result);
  // The cause, the iterations and time lost, the hang dump; adds to the lost iterations.
  Failure AccountFailure(const Attempt& a, const ChildExit& exit);
  // Launch's own stop, not a failure: the job saved and exited (0) when launch asked it to, to
  // take a straggler's host out. Its restart does not count against --max-restarts.
  bool PlannedStop(const Attempt& a, const ChildExit& exit) const;
  // "2 restarts" and, when there were any, the planned ones beside them.
  std::string RestartsText() const;
  // Sleeps `seconds` in steps, watching the kill switch and signals; false when told to stop.
  bool Backoff(double seconds, const ChildExit& last, LaunchResult* result);
  // Ends the run of launch: the result, a journal entry (`event`, `sentence`), the status file.
  void Stop(LaunchEnd end, int code, LaunchEndEvent&& event, const std::string& sentence,
            LaunchResult* result);
  void WriteStatus(const std::string& state, bool force);
  // Hosts (all no-ops without opt_.hosts). The command of attempt `a`, its hostfile written.
  Status CommandForAttempt(Attempt* a, std::vector<std::string>* command);
  // Reads the job's new events.jsonl lines while it runs: a straggler named for
  // --straggler-exclude-minutes has the job stopped at the next checkpoint.
  bool WatchStragglers(Attempt* a);  // true: ask the job to stop now
  // Copies the job's new stderr to launch's own.
  void RelayStderr(Attempt* a);
  // Pins the failure on a host when the evidence names one; takes the host out at the threshold.
  void BlameAttempt(const Attempt& a, const ChildExit& exit);
  // Readmits hosts, swaps spares in, shrinks (--elastic); false (with `why`) when it cannot go on.
  bool PlaceHosts(std::string* why);
  std::string HostsText() const;  // for the status line

  struct Excluded {
    HostEntry host;
    uint64_t at_us = 0;
  };
  std::vector<HostEntry> in_use_, spares_;
  std::vector<Excluded> excluded_;
  struct PendingExclusion {
    std::string host, kind, evidence;
  };
  std::vector<PendingExclusion> pending_;  // decided by BlameAttempt, done by PlaceHosts
  std::map<std::string, int> pinned_hard_, pinned_crash_;  // hangs and mismatches; crashes
  size_t target_hosts_ = 0;
  int base_ranks_ = -1, ranks_ = -1;  // the command's rank count, and the current one
  // keel train's settings (--config under the flags), read at the start when --elastic or
  // --straggler-exclude-minutes needs them.
  JobSettings job_;
  bool job_read_ = false;
  // The newest checkpoint is the run's last (a job that finished); false when not known.
  bool RunComplete(int64_t* marker);
  // No restart could begin within --max-hours (the backoff included).
  bool HoursSpentBy(double backoff) const;
  bool KillSwitchOn();
  double Seconds() const;  // since Run began

  LaunchOptions opt_;
  Env* env_;
  ChildProcess* child_;
  std::function<int()> pending_signal_;
  RunJournal journal_;
  uint64_t start_us_ = 0;
  uint64_t last_status_us_ = 0;
  bool status_warned_ = false;
  std::string state_;
  int attempt_ = 0, restarts_ = 0, planned_restarts_ = 0, pid_ = 0;
  int64_t lost_iterations_ = 0;
};

}  // namespace keel
