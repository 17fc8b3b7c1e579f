// The kinds of `keel logs watch`'s journal (DIR/events.jsonl of the watch's --out-dir, a product
// of its own: "detected" here is a finding in another framework's log, not the guard's), one
// struct each, by the pattern of journal/journal_event.h. docs/observability.md lists them
// (checked by WatchEventsTest.DocsListEveryKind).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "journal/journal_event.h"

namespace keel {

// The "source" of every entry a watch writes: how a watch knows its own journal.
constexpr const char* kLogWatchSource = "keel logs watch";
constexpr const char* kWatchSourceKey = "source";

// Whether `line` is an entry a watch wrote (its "source" is kLogWatchSource).
bool IsWatchEntry(const nlohmann::json& line);

// A finding opened or seen whole ("detected"), or closed ("ended": `ended`).
struct WatchFindingEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT_PAIR(WatchFindingEvent, "detected", "ended", ended)
  bool ended = false;
  std::string kind_name;  // "spike", "divergence", "nan", "restart", ... (LogEventKinds)
  bool open = false;      // still open: its kind and end are provisional
  int64_t start = 0, end = 0, iteration = 0;
  std::string signal;
  double value = NAN, baseline = NAN;
  std::string detail;
  std::string source = kLogWatchSource;
  std::string log;  // the log watched
  template <class F>
  void Fields(F& f) {
    f("kind", kind_name);
    f("open", open);
    f("start", start);
    f("end", end);
    f("iteration", iteration);
    f("signal", signal);
    f("value", value);
    f("baseline", baseline);
    f("detail", detail);
    f(kWatchSourceKey, source);
    f("log", log);
  }
};

// The watch created the kill switch (--kill-switch, on a kind of --kill-on).
struct WatchKillSwitchEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(WatchKillSwitchEvent, "kill_switch")
  std::string kind_name;
  int64_t iteration = 0;
  std::string path;
  std::string source = kLogWatchSource;
  std::string log;
  template <class F>
  void Fields(F& f) {
    f("kind", kind_name);
    f("iteration", iteration);
    f("path", path);
    f(kWatchSourceKey, source);
    f("log", log);
  }
};

// --on-event commands not run: too many running and waiting.
struct HooksDroppedEvent final : JournalEvent {
  KEEL_JOURNAL_EVENT(HooksDroppedEvent, "hooks_dropped")
  int64_t count = 0, total = 0, max_running_hooks = 0, max_queued_hooks = 0;
  std::string reason;
  std::string source = kLogWatchSource;
  std::string log;
  template <class F>
  void Fields(F& f) {
    f("count", count);
    f("total", total);
    f("max_running_hooks", max_running_hooks);
    f("max_queued_hooks", max_queued_hooks);
    f("reason", reason);
    f(kWatchSourceKey, source);
    f("log", log);
  }
};

// Every kind above (for the docs check).
std::vector<EventSchema> WatchEventSchemas();

}  // namespace keel
