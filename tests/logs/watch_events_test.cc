// keel logs watch's typed kinds (logs/watch_events.h): each reads back what it writes, refuses a
// line missing a required field by name, writes the bytes the watcher's inline JSON wrote, and
// docs/observability.md lists each with its fields.
#include "logs/watch_events.h"

#include <gtest/gtest.h>

#include "../journal/journal_test_util.h"
#include "core/json_number.h"

namespace keel {
namespace {

using json = nlohmann::json;

template <class E>
E Filled(const std::string& kind = "") {
  E e;
  if (!kind.empty()) e.SetKind(kind);
  SampleFiller f;
  e.Fields(f);
  return e;
}

std::string Written(const JournalEvent& e) {
  return json(e.ToJson()).dump();
}

TEST(WatchEventsTest, EveryKindReadsBackAndRefusesAMissingField) {
  CheckEventType<WatchFindingEvent>();
  CheckEventType<WatchKillSwitchEvent>();
  CheckEventType<HooksDroppedEvent>();
}

TEST(WatchEventsTest, DocsListEveryKind) {
  CheckDocumented("watch", WatchEventSchemas());
}

TEST(WatchEventsTest, EveryKindWritesTheBytesOfBefore) {
  for (const char* kind : {"detected", "ended"}) {
    WatchFindingEvent e = Filled<WatchFindingEvent>(kind);
    e.source = kLogWatchSource;
    json old = {{"event", kind},
                {"kind", e.kind_name},
                {"open", e.open},
                {"start", e.start},
                {"end", e.end},
                {"iteration", e.iteration},
                {"signal", e.signal},
                {"value", JsonNumber(e.value)},
                {"baseline", JsonNumber(e.baseline)},
                {"detail", e.detail},
                {"source", kLogWatchSource},
                {"log", e.log}};
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    WatchKillSwitchEvent e = Filled<WatchKillSwitchEvent>();
    e.source = kLogWatchSource;
    json old = {{"event", "kill_switch"}, {"kind", e.kind_name},       {"iteration", e.iteration},
                {"path", e.path},         {"source", kLogWatchSource}, {"log", e.log}};
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    HooksDroppedEvent e = Filled<HooksDroppedEvent>();
    e.source = kLogWatchSource;
    json old = {{"event", "hooks_dropped"},
                {"count", e.count},
                {"total", e.total},
                {"max_running_hooks", static_cast<int>(e.max_running_hooks)},
                {"max_queued_hooks", static_cast<int>(e.max_queued_hooks)},
                {"reason", e.reason},
                {"source", kLogWatchSource},
                {"log", e.log}};
    EXPECT_EQ(Written(e), old.dump());
  }
}

TEST(WatchEventsTest, AWatchKnowsItsOwnEntries) {
  EXPECT_TRUE(IsWatchEntry(json(WatchKillSwitchEvent().ToJson())));
  EXPECT_FALSE(IsWatchEntry(json(Filled<WatchKillSwitchEvent>().ToJson())));  // another source
  EXPECT_FALSE(IsWatchEntry({{"event", "detected"}, {"source", 3}}));
  EXPECT_FALSE(IsWatchEntry(json::array()));
}

}  // namespace
}  // namespace keel
