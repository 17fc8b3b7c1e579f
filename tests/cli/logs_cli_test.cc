// `keel logs analyze` as a user runs it: findings, --json for machines, --to-metrics for
// `keel report`, and refusals that leave existing files alone.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "../logs/megatron_log_fixture.h"
#include "keel_process.h"

namespace {

namespace fs = std::filesystem;
using keel_test::RunKeelShell;

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(LogsCliTest, AnalyzeJsonAndToMetrics) {
  const std::string dir = keel_test::FreshTempDir("logs_cli");
  const std::string log = dir + "/main_log.txt";
  std::ofstream(log) << keel_test::GenerateMegatronLog({});

  auto r = RunKeelShell("", "logs analyze " + log);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("iterations: 1 to 400 of 400"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("restarts: 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("TFLOPs fell from 150"), std::string::npos) << r.out;

  r = RunKeelShell("", "logs analyze --json " + log + " 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  std::set<std::string> kinds;
  for (const auto& e : j["events"]) {
    kinds.insert(e["kind"].get<std::string>());
    EXPECT_LE(e["start"].get<int64_t>(), 400);
    EXPECT_TRUE(e.contains("end"));
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"spike_recovered", "nan", "skipped", "restart",
                                          "resume_spike", "throughput_drop", "divergence"}));

  const std::string run = dir + "/run";
  r = RunKeelShell("", "logs analyze " + log + " --to-metrics " + run);
  ASSERT_EQ(r.code, 0) << r.out;
  // The live metrics hold iterations 1..400 once each; what the restart redid is archived.
  std::istringstream live(Slurp(run + "/metrics.jsonl"));
  std::string line;
  int64_t expect = 1, validations = 0;
  while (std::getline(live, line)) {
    const auto m = nlohmann::json::parse(line);
    if (m["kind"] == "validation") {
      ++validations;
      continue;
    }
    EXPECT_EQ(m["iteration"].get<int64_t>(), expect);
    ++expect;
  }
  EXPECT_EQ(expect, 401);
  EXPECT_EQ(validations, 4);
  int archives = 0;
  for (const auto& e : fs::directory_iterator(run + "/metrics-archive")) {
    EXPECT_EQ(e.path().filename().string().rfind("restart-iter260-to-iter240", 0), 0u) << e.path();
    ++archives;
  }
  EXPECT_EQ(archives, 1);
  const auto analysis = nlohmann::json::parse(Slurp(run + "/log-analysis.json"));
  EXPECT_EQ(analysis["events"].size(), j["events"].size());
  int tb = 0;
  for (const auto& e : fs::directory_iterator(run + "/tensorboard"))
    tb += e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  EXPECT_EQ(tb, 1);

  // A second conversion into the same directory is refused; nothing there changes.
  const std::string before = Slurp(run + "/metrics.jsonl");
  r = RunKeelShell("", "logs analyze " + log + " --to-metrics " + run);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("already holds metrics.jsonl"), std::string::npos) << r.out;
  EXPECT_EQ(Slurp(run + "/metrics.jsonl"), before);

  // Not a training log; a missing file.
  std::ofstream(dir + "/notes.txt") << "nothing to see\n";
  r = RunKeelShell("", "logs analyze " + dir + "/notes.txt");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("no Megatron iteration lines"), std::string::npos) << r.out;
  r = RunKeelShell("", "logs analyze " + dir + "/missing.txt");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("cannot read the log"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

// A crash loop (the same restart twice, within a second): iterations 1-20, 11-20, 11-30. Both
// restarts are archived, the live metrics hold 1..30 once, and nothing half-written is left (it
// used to fail with "cannot rename ... Directory not empty" and leave the folder).
TEST(LogsCliTest, CrashLoopLogConvertsAndAbsurdLinesAreNamed) {
  const std::string dir = keel_test::FreshTempDir("logs_crash_loop");
  std::string text;
  for (const auto& [from, to] : {std::pair<int, int>{1, 20}, {11, 20}, {11, 30}}) {
    text += "using world size: 8, data-parallel-size: 8\n";
    for (int it = from; it <= to; ++it)
      text += keel_test::MegatronLogLine(it, 3.0, 0.3, 150.0, 0) + "\n";
  }
  text += " iteration 9223372036854775807/     400 | lm loss: 3.0 |\n";  // a saturated counter
  std::ofstream(dir + "/main_log.txt") << text;
  auto r = RunKeelShell("", "logs analyze " + dir + "/main_log.txt --to-metrics " + dir + "/run");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("restarts: 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ETA: 0.00 days (370 iterations left"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("main_log.txt:54: iteration 9223372036854775807 is beyond"),
            std::string::npos)
      << r.out;
  std::set<std::string> archives;
  for (const auto& e : fs::directory_iterator(dir + "/run/metrics-archive"))
    archives.insert(e.path().filename().string());
  ASSERT_EQ(archives.size(), 2u);
  for (const std::string& a : archives) {
    EXPECT_EQ(a.rfind("restart-iter20-to-iter10-", 0), 0u) << a;
    EXPECT_NE(r.out.find("metrics-archive/" + a), std::string::npos) << r.out;
  }
  std::istringstream live(Slurp(dir + "/run/metrics.jsonl"));
  std::string line;
  int64_t expect = 1;
  while (std::getline(live, line))
    EXPECT_EQ(nlohmann::json::parse(line)["iteration"].get<int64_t>(), expect++);
  EXPECT_EQ(expect, 31);
  std::set<std::string> top;
  for (const auto& e : fs::directory_iterator(dir)) top.insert(e.path().filename().string());
  EXPECT_EQ(top, (std::set<std::string>{"main_log.txt", "run"}));
  fs::remove_all(dir);
}

}  // namespace
