// The kinds `keel launch` writes into the run's journal (SAVE/events.jsonl, beside the training
// process's kinds of journal/events.h), one struct each, by the pattern of journal/journal_event.h.
// docs/observability.md lists them (checked by LaunchEventsTest.DocsListEveryKind).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "journal/journal_event.h"

namespace keel {

// keel launch began supervising a command.
struct LaunchEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(LaunchEvent, "launch")
  std::vector<std::string> command;
  int64_t max_restarts = 0;
  double max_hours = 0, backoff_seconds = 0, max_backoff_seconds = 0, stall_minutes = 0;
  // When launch began (Unix seconds): the job's start for goodput. Absent in older journals.
  std::optional<double> unix_time;
  template <class F>
  void Fields(F& f) {
    f("command", command);
    f("max_restarts", max_restarts);
    f("max_hours", max_hours);
    f("backoff_seconds", backoff_seconds);
    f("max_backoff_seconds", max_backoff_seconds);
    f("stall_minutes", stall_minutes);
    f("unix_time", unix_time);
  }
};

// What every end of keel launch carries (Supervisor::Stop fills them): the attempts made, the
// restarts among them, and launch's own exit code.
struct LaunchEndEvent : JournalEvent {
  int64_t attempt = 0, restarts = 0, exit_code = 0;
};

// What a failed attempt cost: in "restart" and "launch_gave_up".
struct AttemptFailure {
  std::string cause;                     // "exit 1 (...)", "stalled: no progress for N minutes"
  std::string reason;                    // the same (readers of every kind show "reason")
  int64_t checkpoint_iteration = -1;     // the newest checkpoint (-1: none)
  int64_t lost_iterations = 0;           // trained after it, lost
  double lost_compute_seconds = 0;       // the time those took
  double stuck_seconds = 0;              // without progress before the end
  std::optional<int64_t> iteration;      // the newest iteration it recorded
  std::optional<std::string> signal;     // "SIGKILL" when a signal ended it
  std::optional<std::string> hang_dump;  // the watchdog's stack dump (exit 4)
  template <class F>
  void Fields(F& f) {
    f("cause", cause);
    f("reason", reason);
    f("checkpoint_iteration", checkpoint_iteration);
    f("lost_iterations", lost_iterations);
    f("lost_compute_seconds", lost_compute_seconds);
    f("stuck_seconds", stuck_seconds);
    f("iteration", iteration);
    f("signal", signal);
    f("hang_dump", hang_dump);
  }
};

// An attempt failed, or launch stopped it (a straggler's host taken out), and the job is started
// again.
struct RestartEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(RestartEvent, "restart")
  int64_t attempt = 0;
  AttemptFailure failure;                 // its fields are the line's own
  int64_t restart = 0, max_restarts = 0;  // restarts counted against --max-restarts, so far
  // false: launch's own stop (a straggler's host taken out), not counted; absent: counted.
  std::optional<bool> counted;
  double backoff_seconds = 0, downtime_seconds = 0, lost_seconds = 0;
  template <class F>
  void Fields(F& f) {
    f("attempt", attempt);
    failure.Fields(f);
    f("restart", restart);
    f("max_restarts", max_restarts);
    f("counted", counted);
    f("backoff_seconds", backoff_seconds);
    f("downtime_seconds", downtime_seconds);
    f("lost_seconds", lost_seconds);
  }
};

// Stopped without a restart: the kill switch, a signal to launch, exit 2 or 3, a failed start.
struct LaunchStopEvent final : LaunchEndEvent {
  KEEL_JOURNAL_EVENT(LaunchStopEvent, "launch_stop")
  std::string reason;
  std::optional<std::string> path;           // the kill switch
  std::optional<std::string> child;          // how the child ended
  std::optional<double> term_grace_seconds;  // when the child was killed after it
  template <class F>
  void Fields(F& f) {
    f("reason", reason);
    f("path", path);
    f("child", child);
    f("term_grace_seconds", term_grace_seconds);
    f("attempt", attempt);
    f("restarts", restarts);
    f("exit_code", exit_code);
  }
};

// The job finished (exit 0).
struct LaunchFinishedEvent final : LaunchEndEvent {
  KEEL_JOURNAL_EVENT(LaunchFinishedEvent, "launch_finished")
  template <class F>
  void Fields(F& f) {
    f("attempt", attempt);
    f("restarts", restarts);
    f("exit_code", exit_code);
  }
};

// An attempt failed and the restarts or hours are spent.
struct LaunchGaveUpEvent final : LaunchEndEvent {
  KEEL_JOURNAL_EVENT(LaunchGaveUpEvent, "launch_gave_up")
  AttemptFailure failure;  // its fields are the line's own
  template <class F>
  void Fields(F& f) {
    f("attempt", attempt);
    failure.Fields(f);
    f("restarts", restarts);
    f("exit_code", exit_code);
  }
};

// An attempt ended (before its "restart" or launch's end): its span by the wall clock, for
// goodput (report/goodput.h); `exit` as DescribeExit says it.
struct AttemptEndEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(AttemptEndEvent, "attempt_end")
  int64_t attempt = 0;
  double start_time = 0, end_time = 0;  // Unix seconds
  std::string exit;
  template <class F>
  void Fields(F& f) {
    f("attempt", attempt);
    f("start_time", start_time);
    f("end_time", end_time);
    f("exit", exit);
  }
};

// ---- Hosts (keel launch --hostfile, or Slurm's node list under srun).

// The hosts an attempt runs on, the spares kept ready and those taken out.
struct LaunchHostsEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(LaunchHostsEvent, "launch_hosts")
  int64_t attempt = 0;
  std::vector<std::string> hosts, spares, excluded;
  std::optional<int64_t> ranks;         // the rank count launch gave the launcher (-np, --ntasks)
  std::optional<std::string> hostfile;  // the file given to mpirun
  std::vector<std::string> command;     // as started
  template <class F>
  void Fields(F& f) {
    f("attempt", attempt);
    f("hosts", hosts);
    f("spares", spares);
    f("excluded", excluded);
    f("ranks", ranks);
    f("hostfile", hostfile);
    f("command", command);
  }
};

// What a failed attempt left says of the hosts: the failure pinned on `host`, or (null) on none.
struct HostBlameEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(HostBlameEvent, "host_blame")
  int64_t attempt = 0;
  std::string blame;  // hang, replica_mismatch, transient_fault, crash, straggler, none
  NullableString host;
  std::optional<int64_t> rank;
  std::string evidence;       // one sentence
  std::string source;         // the hang dump directory, events.jsonl, the launcher's output
  int64_t pinned = 0;         // failures of this kind's class pinned on the host so far
  int64_t exclude_after = 0;  // how many take it out
  template <class F>
  void Fields(F& f) {
    f("attempt", attempt);
    f("blame", blame);
    f("host", host);
    f("rank", rank);
    f("evidence", evidence);
    f("source", source);
    f("pinned", pinned);
    f("exclude_after", exclude_after);
  }
};

// A host taken out of the job: a spare takes its place, or (--elastic) the job goes on with fewer
// data-parallel ranks, or launch stops.
struct HostExcludedEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(HostExcludedEvent, "host_excluded")
  int64_t attempt = 0;
  std::string host;
  std::string blame;  // as in host_blame
  std::string evidence;
  std::optional<std::string> replaced_by;            // the spare swapped in
  std::optional<int64_t> ranks_before, ranks_after;  // an elastic shrink
  template <class F>
  void Fields(F& f) {
    f("attempt", attempt);
    f("host", host);
    f("blame", blame);
    f("evidence", evidence);
    f("replaced_by", replaced_by);
    f("ranks_before", ranks_before);
    f("ranks_after", ranks_after);
  }
};

// An excluded host back: `--readmit-after` passed, or the operator listed it in SAVE/hosts.readmit.
struct HostReadmittedEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(HostReadmittedEvent, "host_readmitted")
  std::string host;
  std::string via;  // "--readmit-after 2h", "SAVE/hosts.readmit"
  double excluded_seconds = 0;
  template <class F>
  void Fields(F& f) {
    f("host", host);
    f("via", via);
    f("excluded_seconds", excluded_seconds);
  }
};

// Every kind above (for the docs check).
std::vector<EventSchema> LaunchEventSchemas();

}  // namespace keel
