// `keel train` in one process watches its throughput on the real clock (issue 37): a window of
// iterations that the test hook slows (slow=3:iters=61-100: each sleeps three times its compute
// time, far above this shared machine's noise of 10-30%) is journaled as a drop, said in
// CHRONICLE.md, and `keel logs analyze` of the run's own output, with the live run's window and
// threshold, finds the same drops from the same iterations, noise included. The exact scenario of
// the issue (10% and 60% after a slow start) runs in-process on a clock of its own:
// ThroughputWatchTest.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "keel_process.h"

namespace {

using keel_test::FreshTempDir;
using keel_test::ReadText;
using keel_test::RunShell;
using json = nlohmann::json;

#if defined(KEEL_SANITIZED_BUILD)
#define SKIP_TIMING_UNDER_SANITIZERS() GTEST_SKIP() << "timing test: sanitizers distort timings"
#else
#define SKIP_TIMING_UNDER_SANITIZERS() (void)0
#endif

TEST(ThroughputCliTest, OneProcessSlowWindowIsJournaledAndAnalyzeAgrees) {
  SKIP_TIMING_UNDER_SANITIZERS();
  const std::string dir = FreshTempDir("throughput_cli");
  const keel_test::KeelResult r = RunShell(
      "KEEL_TRAIN_FAULTS=slow=3:iters=61-100 timeout 120 " + std::string(KEEL_BINARY) + " " +
      keel_test::kDataParallelModel + " --train-iters 160 --save-interval 0 --save " + dir +
      "/run > " + dir + "/train.log 2>&1");
  ASSERT_EQ(r.code, 0) << ReadText(dir + "/train.log");
  const std::string out = ReadText(dir + "/train.log");
  EXPECT_NE(out.find("checks: throughput:"), std::string::npos) << out;
  std::vector<json> live;
  std::istringstream in(ReadText(dir + "/run/events.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const json e = json::parse(line);
    if (e["event"] == "throughput_drop" || e["event"] == "throughput_recovered") live.push_back(e);
  }
  // The hook's window lies in a journaled drop, whatever else a busy machine added: measured
  // here, other work on the cores moved this process's own CPU time per iteration by 10-15% for
  // tens of iterations, and a drop it opened just before 61 held the hook's window too. So: a drop
  // open from at most 70 to at least 95 (its size is the exact in-process test's business).
  bool covered = false, off_cores = false;
  for (size_t k = 0; k < live.size(); ++k) {
    if (live[k]["event"] != "throughput_drop" || live[k]["since_iteration"] > 70) continue;
    const bool open_to_95 = k + 1 == live.size() || live[k + 1]["since_iteration"] >= 95;
    if (!open_to_95) continue;
    covered = true;
    off_cores |= live[k].value("reason", "").find("off the cores") != std::string::npos;
  }
  std::string all;
  for (const json& e : live) all += e.dump() + "\n";
  EXPECT_TRUE(covered) << all;
  if (live.size() == 2) {
    EXPECT_TRUE(off_cores) << all;  // a quiet machine: the sleep's cause
  }
  const std::string chronicle = ReadText(dir + "/run/CHRONICLE.md");
  EXPECT_NE(chronicle.find("the job slowed: an iteration takes"), std::string::npos) << chronicle;
  EXPECT_NE(chronicle.find("samples per second against"), std::string::npos) << chronicle;

  // The same series, as a log: the same drops from the same iterations.
  const keel_test::KeelResult a =
      RunShell(std::string(KEEL_BINARY) + " logs analyze --json --drop-window 10 " +
               "--drop-threshold 0.05 " + dir + "/train.log");
  ASSERT_EQ(a.code, 0) << a.out;
  const json analysis = json::parse(a.out.substr(a.out.find('{')));
  std::vector<json> drops;
  for (const json& e : analysis["events"])
    if (e["kind"] == "throughput_drop") drops.push_back(e);
  ASSERT_EQ(drops.size(), (live.size() + 1) / 2) << a.out << all;
  for (size_t k = 0; k < drops.size(); ++k) {
    EXPECT_EQ(drops[k]["start"], live[2 * k]["since_iteration"]) << drops[k].dump() << all;
    if (2 * k + 1 < live.size()) {
      EXPECT_EQ(drops[k]["end"].get<int64_t>() + 1, live[2 * k + 1]["since_iteration"])
          << drops[k].dump() << all;
    }
  }
}

}  // namespace
