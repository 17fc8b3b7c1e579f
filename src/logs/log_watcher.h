// LogWatcher: `keel logs watch`: the guard's eyes on a run keel does not train. A Megatron-LM /
// Megatron-DeepSpeed (or keel) log that another framework is writing is followed (LogFollower:
// appends, partial lines, truncation, rotation, a file that is not there yet), parsed a line at a
// time (MegatronLogParser: wrapped records, restarts) and judged record by record by the code of
// `keel logs analyze` (LogEventScanner: the guard's detector, resume spikes, NaN and skipped
// iterations, throughput drops). Every finding is journaled as keel's own runs journal the
// guard's decisions (RunJournal: DIR/events.jsonl and DIR/CHRONICLE.md), printed as one line, and
// can create a kill-switch file or run a command (EventCommandRunner). Files and time go through
// the Env, so tests drive it with a fake clock.
//
// events.jsonl entries (logs/watch_events.h): "detected" | "ended" (WatchFindingEvent),
// "kill_switch", and "hooks_dropped" when --on-event commands were dropped. A finding that opens (a
// spike, a divergence, a NaN, ...) is "detected" with "open": true and its provisional kind; its
// "ended" entry ("open": false) has the kind, start and end `keel logs analyze` reports. A restart
// is complete when seen: one "detected" entry, "open": false. A divergence that rises again within
// a divergence window opens again: its next "ended" entry replaces the earlier one.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "journal/run_journal.h"
#include "logs/event_command.h"
#include "logs/log_events.h"
#include "logs/log_follower.h"
#include "logs/megatron_log.h"
#include "logs/watch_events.h"

namespace keel {

struct LogWatchOptions {
  std::string log;      // the file followed
  std::string out_dir;  // events.jsonl and CHRONICLE.md
  LogAnalysisOptions analysis;
  // The lines already in the file prime the detectors (windows, levels, restarts) and are not
  // reported; findings still open when they are read are.
  bool from_end = false;
  // A directory that already holds a watch's journal: append to it (false: refuse and say how).
  bool append_to_journal = false;
  std::string kill_switch;  // created on the first finding of a kind in kill_on
  std::set<std::string> kill_on;
  std::string on_event;  // a shell command for every journal entry
  double on_event_timeout_s = 30;
  // At most this many --on-event commands run at once (each is three processes: its guardian,
  // sh and the command), so a burst of findings cannot fill the process table. An entry beyond
  // them waits in a queue of at most max_queued_hooks; beyond that its command is dropped, and
  // the count journaled ("hooks_dropped").
  int max_running_hooks = 4;
  int max_queued_hooks = 16;
  double poll_seconds = 1;
  double until_idle_seconds = 0;  // stop once the file has been quiet this long (0: never)
};

// Every kind a finding can have, open or closed (for --kill-on).
const std::set<std::string>& LogEventKinds();

class LogWatcher {
 public:
  using Output = std::function<void(const std::string&)>;
  // `runner` runs --on-event (may be null without one); `out` receives every line for people.
  LogWatcher(Env* env, LogWatchOptions opt, EventCommandRunner* runner, Output out);
  ~LogWatcher();

  // Checks the output directory and the kill switch, and starts the chronicle. InvalidArgument
  // for what the user must change: a journal of something else in DIR, a watch's journal without
  // append_to_journal, a kill switch in a directory that does not exist.
  Status Open();
  // One look at the file: what was written is read, parsed, judged and journaled. `more`: there
  // is more to read right now; `read`: anything was read.
  Status Poll(bool* more, bool* read);
  // Polls until `stop` returns a reason (a signal) or the file has been quiet for
  // until_idle_seconds, sleeping poll_seconds between looks. `why` says which.
  Status Run(const std::function<std::string()>& stop, std::string* why);
  // The end: a record still waiting for its continuation is read, open findings close (and are
  // journaled, "not back by the end of the watch"), and the summary is printed.
  void Finish(const std::string& why);

  int64_t records() const { return records_; }
  int64_t entries() const { return entries_; }

 private:
  void Take();  // the parsed records, validations and refusals, to the scanner and the output
  void OnUpdate(const LogEventUpdate& u);
  // Journals a finding's update (and creates the kill switch when it is the first of its kind).
  void Journal(const LogEventUpdate& u, const std::string& suffix);
  // Appends an entry to the journal and runs --on-event for it (`run_hook`).
  void Record(const JournalEvent& event, const std::string& sentence, bool run_hook = true);
  void EndPriming();
  // Reaps the commands that ended, starts queued ones in their place, journals any dropped.
  void ReapCommands();
  void StartHook(const std::string& label,
                 const std::vector<std::pair<std::string, std::string>>& vars,
                 const std::string& stdin_text);
  // A "hooks_dropped" entry for the commands dropped since the last one (none: nothing).
  void JournalDroppedHooks(const std::string& reason);

  Env* env_;
  LogWatchOptions opt_;
  EventCommandRunner* runner_;
  Output out_;
  std::unique_ptr<RunJournal> journal_;
  LogFollower follower_;
  ParsedLog parsed_;
  MegatronLogParser parser_;
  std::unique_ptr<LogEventScanner> scanner_;
  bool priming_ = false;
  std::map<int64_t, LogEvent> open_;  // findings open now, by id
  std::set<int64_t> reported_open_;   // ... whose "detected" entry was journaled
  bool killed_ = false;
  bool finished_ = false;
  int64_t records_ = 0, validations_ = 0, refused_ = 0, entries_ = 0;
  int64_t first_iteration_ = -1, last_iteration_ = -1, max_iteration_ = 0, train_iters_ = 0;
  std::map<int64_t, std::string> closed_;  // the kind each finding last closed as, by id
  std::deque<double> recent_seconds_;      // time per iteration of the last records
  struct QueuedHook {
    std::string label;
    std::vector<std::pair<std::string, std::string>> vars;
    std::string stdin_text;
  };
  std::deque<QueuedHook> queued_hooks_;  // waiting for one of max_running_hooks to end
  int64_t hooks_dropped_ = 0, hooks_dropped_journaled_ = 0;
};

}  // namespace keel
