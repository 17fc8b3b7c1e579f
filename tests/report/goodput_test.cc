// Goodput from a journal (report/goodput.h): each category from synthetic events whose seconds
// are known, summing to the wall time: a crash's tail and a rollback's iterations lost, a resume
// from an older checkpoint splitting a record, a hang from where the watchdog saw it begin, the
// restart's gap, and a run without keel launch.
#include "report/goodput.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../cli/keel_process.h"
#include "journal/events.h"
#include "launch/launch_events.h"

namespace keel {
namespace {

using json = nlohmann::json;

json Start(int64_t attempt, int64_t iteration, double process_start, double loop) {
  GoodputStartEvent e;
  e.attempt = attempt;
  e.iteration = iteration;
  e.process_start = process_start;
  e.unix_time = loop;
  return json(e.ToJson());
}

json Record(int64_t first, int64_t last, double t, double compute, double save = 0,
            const std::string& why = "save", double other = 0) {
  GoodputEvent e;
  e.first_iteration = first;
  e.last_iteration = last;
  e.why = why;
  e.unix_time = t;
  e.seconds.compute = compute;
  e.seconds.save = save;
  e.seconds.other = other;
  return json(e.ToJson());
}

json AttemptEnd(int64_t attempt, double start, double end) {
  AttemptEndEvent e;
  e.attempt = attempt;
  e.start_time = start;
  e.end_time = end;
  e.exit = "exit 1";
  return json(e.ToJson());
}

GoodputBreakdown Compute(const std::vector<json>& lines) {
  GoodputBreakdown g;
  const Status st = GoodputFromEvents(lines, "events.jsonl", &g);
  EXPECT_TRUE(st.ok()) << st.message();
  double sum = 0;
  for (double s : g.seconds) sum += s;
  EXPECT_NEAR(sum, g.wall_seconds, 1e-9);
  return g;
}

TEST(GoodputTest, ACrashUnderLaunchLosesItsTailAndTheGapIsTheRestarts) {
  // Attempt 1: start-up 1 s, iterations 1..20 in 1.8 s and a 0.2 s save, then 2 s of iterations
  // after the checkpoint until SIGKILL. Backoff 1 s. Attempt 2 resumes at 20: start-up 1 s,
  // iterations 21..40 in 3 s, exits 0.5 s after its last record.
  const GoodputBreakdown g = Compute({
      Start(1, 0, 100.5, 101),
      Record(1, 20, 103, 1.8, 0.2),
      AttemptEnd(1, 100, 105),
      Start(2, 20, 106.2, 107),
      Record(21, 40, 110, 3.0, 0, "end"),
      AttemptEnd(2, 106, 110.5),
  });
  EXPECT_NEAR(g.wall_seconds, 10.5, 1e-9);
  EXPECT_NEAR(g.Of("productive"), 4.8, 1e-9);
  EXPECT_NEAR(g.Of("lost"), 2.0, 1e-9);
  EXPECT_NEAR(g.Of("save"), 0.2, 1e-9);
  EXPECT_NEAR(g.Of("startup"), 2.0, 1e-9);
  EXPECT_NEAR(g.Of("restart"), 1.0, 1e-9);
  EXPECT_NEAR(g.Of("other"), 0.5, 1e-9);
  EXPECT_EQ(g.processes, 2);
  EXPECT_EQ(g.attempts, 2);
  const json j = json(g.ToJson());
  EXPECT_EQ(j["wall_seconds"], g.wall_seconds);
  EXPECT_EQ(j["categories"].size(), GoodputCategories().size());
  EXPECT_NEAR(j["categories"]["productive"].get<double>(), 4.8, 1e-9);
}

TEST(GoodputTest, ARollbackAndAResumeFromAnOlderCheckpointMakeIterationsLost) {
  RollbackEvent rb;
  rb.iteration = 30;
  rb.to_iteration = 20;
  const GoodputBreakdown g = Compute({
      Start(0, 0, 0, 1),
      Record(1, 20, 3, 2.0),                  // kept
      Record(21, 30, 4, 1.0, 0, "rollback"),  // rolled back: lost
      json(rb.ToJson()),
      Record(21, 40, 6, 2.0),  // 21..30 a second time, then 31..40
      Record(41, 60, 8, 2.0),
      // A new process resumes from iteration 50 (the newest checkpoint was unreadable): half of
      // 41..60 is computed again.
      Start(0, 50, 9, 10),
      Record(51, 60, 11, 1.0, 0, "end"),
  });
  EXPECT_NEAR(g.Of("lost"), 1.0 + 1.0, 1e-9);
  EXPECT_NEAR(g.Of("productive"), 2.0 + 2.0 + 1.0 + 1.0, 1e-9);
  EXPECT_NEAR(g.Of("startup"), 1.0 + 1.0, 1e-9);
  EXPECT_NEAR(g.Of("restart"), 1.0, 1e-9);  // 8 to 9: no supervisor, a gap between processes
  EXPECT_NEAR(g.wall_seconds, 11, 1e-9);
}

TEST(GoodputTest, AHangCountsFromWhereThePhaseStoodStill) {
  HangEvent h;
  h.iteration = 31;
  h.unix_time = 110;
  h.stuck_seconds = 6;  // began at 104: 103..104 computed iterations lost, 104..110 hung
  const GoodputBreakdown g = Compute({
      Start(1, 0, 100, 101), Record(1, 30, 103, 2.0), json(h.ToJson()),
      AttemptEnd(1, 100, 111),  // the dump and the exit: part of the hang
  });
  EXPECT_NEAR(g.Of("lost"), 1.0, 1e-9);
  EXPECT_NEAR(g.Of("hang"), 7.0, 1e-9);
  EXPECT_NEAR(g.Of("startup"), 1.0, 1e-9);
  EXPECT_NEAR(g.Of("productive"), 2.0, 1e-9);
}

TEST(GoodputTest, AnAttemptThatNeverReachedItsLoopIsStartUp) {
  const GoodputBreakdown g = Compute({
      AttemptEnd(1, 100, 102),  // died while starting
      Start(2, 0, 103, 104),
      Record(1, 10, 105, 1.0, 0, "end"),
      AttemptEnd(2, 103, 105),
  });
  EXPECT_NEAR(g.Of("startup"), 2.0 + 1.0, 1e-9);
  EXPECT_NEAR(g.Of("restart"), 1.0, 1e-9);
  EXPECT_NEAR(g.wall_seconds, 5.0, 1e-9);
}

TEST(GoodputTest, ARunWithoutRecordsIsNamedWithTheFix) {
  GoodputBreakdown g;
  Status st = GoodputFromEvents({json{{"event", "launch"}}}, "runs/x/events.jsonl", &g);
  EXPECT_EQ(st.code(), Status::Code::kNotFound);
  EXPECT_NE(st.message().find("runs/x/events.jsonl holds no goodput records"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("keel logs analyze"), std::string::npos);
  const std::string dir = keel_test::FreshTempDir("goodput_none");
  st = ComputeGoodput(Env::Default(), dir, &g);
  EXPECT_EQ(st.code(), Status::Code::kNotFound);
  EXPECT_NE(st.message().find("events.jsonl not found"), std::string::npos) << st.message();
  std::filesystem::remove_all(dir);
}

TEST(GoodputTest, AMalformedRecordIsNamedByItsLine) {
  json bad = Record(1, 2, 3, 1);
  bad["seconds"]["save"] = "long";
  GoodputBreakdown g;
  const Status st = GoodputFromEvents({Start(0, 0, 0, 1), bad}, "e.jsonl", &g);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("e.jsonl line 2: key 'seconds.save'"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace keel
