// keel launch's typed kinds (launch/launch_events.h): each reads back what it writes, refuses a
// line missing a required field by name, writes the bytes the supervisor's inline JSON wrote,
// and docs/observability.md lists each with its fields.
#include "launch/launch_events.h"

#include <gtest/gtest.h>

#include "../journal/journal_test_util.h"

namespace keel {
namespace {

using json = nlohmann::json;

template <class E>
E Filled() {
  E e;
  SampleFiller f;
  e.Fields(f);
  return e;
}

std::string Written(const JournalEvent& e) {
  return json(e.ToJson()).dump();
}

TEST(LaunchEventsTest, EveryKindReadsBackAndRefusesAMissingField) {
  CheckEventType<LaunchEvent>();
  CheckEventType<RestartEvent>();
  CheckEventType<LaunchStopEvent>();
  CheckEventType<LaunchFinishedEvent>();
  CheckEventType<LaunchGaveUpEvent>();
  CheckEventType<AttemptEndEvent>();
}

TEST(LaunchEventsTest, DocsListEveryKind) {
  CheckDocumented("launch", LaunchEventSchemas());
}

// Each against the supervisor's inline JSON before the types (copied from there; ints were int).
TEST(LaunchEventsTest, EveryKindWritesTheBytesOfBefore) {
  {
    const LaunchEvent e = Filled<LaunchEvent>();
    json old = {{"event", "launch"},
                {"command", e.command},
                {"max_restarts", static_cast<int>(e.max_restarts)},
                {"max_hours", e.max_hours},
                {"backoff_seconds", e.backoff_seconds},
                {"max_backoff_seconds", e.max_backoff_seconds},
                {"stall_minutes", e.stall_minutes},
                {"unix_time", *e.unix_time}};  // added for goodput (issue 32)
    EXPECT_EQ(Written(e), old.dump());
  }
  const AttemptFailure f = [] {
    AttemptFailure x;
    SampleFiller fill;
    x.Fields(fill);
    return x;
  }();
  auto failure_json = [&](int attempt) {
    json j = {{"attempt", attempt},
              {"cause", f.cause},
              {"reason", f.cause},
              {"checkpoint_iteration", f.checkpoint_iteration},
              {"lost_iterations", f.lost_iterations},
              {"lost_compute_seconds", f.lost_compute_seconds},
              {"stuck_seconds", f.stuck_seconds}};
    j["iteration"] = *f.iteration;
    j["signal"] = *f.signal;
    j["hang_dump"] = *f.hang_dump;
    return j;
  };
  {
    RestartEvent e;
    e.attempt = 2;
    e.failure = f;
    e.failure.reason = f.cause;
    e.restart = 1;
    e.max_restarts = 3;
    e.backoff_seconds = 30;
    e.downtime_seconds = 30.5;
    e.lost_seconds = 31.25;
    json old = failure_json(2);
    old["event"] = "restart";
    old["restart"] = 1;
    old["max_restarts"] = 3;
    old["backoff_seconds"] = 30.0;
    old["downtime_seconds"] = 30.5;
    old["lost_seconds"] = 31.25;
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    LaunchGaveUpEvent e;
    e.failure = f;
    e.failure.reason = f.cause;
    e.attempt = 4;
    e.restarts = 3;
    e.exit_code = 1;
    json old = failure_json(4);
    old["event"] = "launch_gave_up";
    old["attempt"] = 4;
    old["restarts"] = 3;
    old["exit_code"] = 1;
    EXPECT_EQ(Written(e), old.dump());
  }
  {
    LaunchStopEvent e;
    e.reason = "SIGTERM";
    e.child = "exit 0";
    e.term_grace_seconds = 120;
    e.attempt = 1;
    e.exit_code = 1;
    json old = {{"event", "launch_stop"},
                {"reason", "SIGTERM"},
                {"child", "exit 0"},
                {"term_grace_seconds", 120.0}};
    old["attempt"] = 1;
    old["restarts"] = 0;
    old["exit_code"] = 1;
    EXPECT_EQ(Written(e), old.dump());
    LaunchStopEvent k;
    k.reason = "kill switch";
    k.path = "/tmp/STOP";
    json kold = {{"event", "launch_stop"}, {"reason", "kill switch"}, {"path", "/tmp/STOP"}};
    kold["attempt"] = 0;
    kold["restarts"] = 0;
    kold["exit_code"] = 0;
    EXPECT_EQ(Written(k), kold.dump());
  }
  {
    LaunchFinishedEvent e;
    e.attempt = 2;
    e.restarts = 1;
    json old = {{"event", "launch_finished"}};
    old["attempt"] = 2;
    old["restarts"] = 1;
    old["exit_code"] = 0;
    EXPECT_EQ(Written(e), old.dump());
  }
}

}  // namespace
}  // namespace keel
