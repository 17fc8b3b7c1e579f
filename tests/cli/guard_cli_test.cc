// End-to-end tests of the guard through `keel train`: a poisoned data window (KEEL_TRAIN_FAULTS)
// is rolled back and skipped with the journal written; a spent budget stops the run with exit 3
// and no final checkpoint; observe mode only journals; --skip-train-iteration-range skips and
// says so; bad guard flags are refused with the fix.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "headless_chromium.h"
#include "keel_process.h"

namespace {

namespace fs = std::filesystem;
using keel_test::FreshTempDir;
using keel_test::RunKeelShell;
using json = nlohmann::json;

const std::string kModel =
    "train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
    "--micro-batch-size 2 --global-batch-size 8 --lr-warmup-iters 3 --log-interval 10 "
    "--eval-interval 1000 --eval-iters 1 --sample-tokens 0 --threads 1 --save-interval 20 "
    "--train-iters 150 --lr 5e-3 --guard-max-data-skips 3";  // the rollback ladder, as before

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<json> Events(const std::string& dir) {
  std::vector<json> out;
  std::istringstream in(ReadFile(dir + "/events.jsonl"));
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

TEST(GuardCliTest, PoisonedWindowIsRolledBackSkippedAndJournaled) {
  const std::string dir = FreshTempDir("guard_poison");
  const auto r = RunKeelShell("KEEL_TRAIN_FAULTS=poison=61-72", kModel + " --save " + dir + "/run");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("guard: iteration 61: lm loss jumped from"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rolled back to iteration 60 (checkpoint pinned), skipping iterations "
                       "61..111 (samples 480..887)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("skipping iterations 61..111: their 408 samples are read past"),
            std::string::npos);
  EXPECT_NE(r.out.find("recovered"), std::string::npos);
  const std::vector<json> ev = Events(dir + "/run");
  int rollbacks = 0;
  for (const json& e : ev) {
    EXPECT_TRUE(e.contains("at")) << e.dump();
    // Every run watches its throughput: a busy machine's drop is journaled too, not the guard's;
    // and every run journals its goodput.
    if (e["event"].get<std::string>().rfind("throughput_", 0) == 0) continue;
    if (e["event"].get<std::string>().rfind("goodput", 0) == 0) continue;
    EXPECT_TRUE(e.contains("consumed_samples")) << e.dump();
    if (e["event"] == "rollback") ++rollbacks;
  }
  EXPECT_EQ(rollbacks, 1);
  const std::string chronicle = ReadFile(dir + "/run/CHRONICLE.md");
  EXPECT_NE(chronicle.find("## started at iteration 0"), std::string::npos) << chronicle;
  EXPECT_NE(chronicle.find("- iteration 64: 4 anomalous iterations in a row"), std::string::npos)
      << chronicle;
  // The pre-spike checkpoint survives retention (pinned); the final state is healthy.
  EXPECT_TRUE(fs::exists(dir + "/run/iter_0000060"));
  const json state = json::parse(ReadFile(dir + "/run/iter_0000150/state.json"));
  EXPECT_EQ(state["guard"]["healthy"], true);
  EXPECT_EQ(state["data"]["skipped_iteration_ranges"], json::parse("[[61, 111]]"));
  EXPECT_EQ(state["counters"]["data_skipped_iterations"], 51);
  // Metrics follow the rollback: the live metrics.jsonl runs 1..150 once, in order; what the
  // rolled-back iterations 61..64 wrote is in metrics-archive/rollback-iter64-to-iter60-*.
  std::istringstream metrics(ReadFile(dir + "/run/metrics.jsonl"));
  int64_t expect = 1;
  for (std::string line; std::getline(metrics, line);) {
    const json m = json::parse(line);
    if (m["kind"] == "train") {
      EXPECT_EQ(m["iteration"], expect++) << line;
    }
  }
  EXPECT_EQ(expect, 151);
  int archives = 0;
  for (const auto& e : fs::directory_iterator(dir + "/run/metrics-archive")) {
    ++archives;
    EXPECT_EQ(e.path().filename().string().rfind("rollback-iter64-to-iter60-", 0), 0u) << e.path();
    EXPECT_TRUE(fs::exists(e.path() / "metrics.jsonl"));
  }
  EXPECT_EQ(archives, 1);
  // The report marks the guard's decisions and the rollback, and renders the chronicle.
  const auto rep = RunKeelShell("", "report " + dir + "/run");
  ASSERT_EQ(rep.code, 0) << rep.out;
  const std::string html = ReadFile(dir + "/run/report.html");
  EXPECT_NE(html.find("<td>rollback</td><td>events.jsonl</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>rollback</td><td>metrics-archive</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>detected</td>"), std::string::npos);
  EXPECT_NE(html.find("<li>iteration 64: 4 anomalous iterations in a row"), std::string::npos);
  if (keel_test::HaveChromium()) {
    const keel_test::PageLoad page = keel_test::LoadInChromium(dir + "/run/report.html", dir);
    ASSERT_TRUE(page.ran) << page.log;
    EXPECT_EQ(page.status, "ok") << page.log;
    EXPECT_EQ(page.errors, "");
    EXPECT_EQ(keel_test::ConsoleLines(page.log), "");
  }
  fs::remove_all(dir);
}

TEST(GuardCliTest, SpentBudgetStopsWithExit3AndNoFinalCheckpoint) {
  const std::string dir = FreshTempDir("guard_budget");
  const auto r = RunKeelShell("KEEL_TRAIN_FAULTS=poison=61-72,poison=125-140",
                              kModel + " --guard-max-rollbacks 1 --save " + dir + "/run");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("the guard stopped the run"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("budget is spent"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CHRONICLE.md"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir + "/run/iter_0000150"));
  std::vector<json> ev = Events(dir + "/run");
  while (!ev.empty() && ev.back()["event"].get<std::string>().rfind("goodput", 0) == 0)
    ev.pop_back();  // the run's goodput, journaled as it ends
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back()["event"], "stop");
  fs::remove_all(dir);
}

TEST(GuardCliTest, ObserveModeOnlyJournals) {
  const std::string dir = FreshTempDir("guard_observe");
  const auto r = RunKeelShell("KEEL_TRAIN_FAULTS=poison=61-72",
                              kModel + " --guard observe --save " + dir + "/run");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("would skip the update"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("would roll back"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rolled back to"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir + "/run/guard.json"));
  fs::remove_all(dir);
}

TEST(GuardCliTest, SkipTrainIterationRangeSkipsAndSaysSo) {
  const std::string dir = FreshTempDir("guard_skip");
  const auto r = RunKeelShell(
      "", kModel + " --train-iters 40 --skip-train-iteration-range 11-15 31-32 --save " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("iterations 11..15 will be skipped (--skip-train-iteration-range)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("skipping iterations 11..15: their 40 samples are read past"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("skipping iterations 31..32: their 16 samples"), std::string::npos);
  const json state = json::parse(ReadFile(dir + "/iter_0000040/state.json"));
  EXPECT_EQ(state["counters"]["data_skipped_iterations"], 7);
  EXPECT_EQ(state["counters"]["consumed_samples"], 320);  // skipped samples are still consumed
  fs::remove_all(dir);
}

TEST(GuardCliTest, BadGuardFlagsAreRefusedWithTheFix) {
  auto r = RunKeelShell("", kModel + " --guard maybe");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("one of off,observe,act"), std::string::npos) << r.out;
  r = RunKeelShell("", kModel + " --guard-lr-cut 2");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--guard-lr-cut 2 must be in (0, 1]"), std::string::npos) << r.out;
  r = RunKeelShell("", kModel + " --skip-train-iteration-range 20-10");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("expected FIRST-LAST with 1 <= FIRST <= LAST"), std::string::npos) << r.out;
  r = RunKeelShell("", kModel + " --guard-min-history 500");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--guard-min-history 500 must be between 3 and --guard-window 100"),
            std::string::npos)
      << r.out;
  r = RunKeelShell("KEEL_TRAIN_FAULTS=poison=x", kModel);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("expected comma-separated poison=A-B"), std::string::npos) << r.out;
}

}  // namespace

namespace {

// The default model and settings (scripts/train-default.sh) with the guard at its defaults, cut
// to its first 150 iterations (the fast early fall of the loss, where a detector is most easily
// fooled) on one thread so it does not fight the other tests for the cores: a clean run, so the
// guard must take no action at all. The whole 400-iteration default job was checked by hand (no
// guard event; docs/guard.md). Skipped under the sanitizers, where it would take many minutes.
TEST(GuardCliTest, DefaultJobRaisesNoFalseAlarm) {
#if defined(KEEL_SANITIZED_BUILD)
  GTEST_SKIP()
      << "the full default job is too slow under AddressSanitizer; the release run covers it";
#endif
  const std::string dir = FreshTempDir("guard_default");
  const auto r = RunKeelShell(
      "", "train --train-iters 150 --threads 1 --sample-tokens 0 --save " + dir + "/run");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(" iteration      150/     150 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("guard: act"), std::string::npos);
  EXPECT_EQ(r.out.find("guard: iteration"), std::string::npos) << r.out;
  // Nothing journaled but, on a busy machine, its throughput drops (every run watches them),
  // and its goodput.
  for (const json& e : Events(dir + "/run"))
    if (e["event"].get<std::string>().rfind("goodput", 0) != 0) {
      EXPECT_EQ(e["event"].get<std::string>().rfind("throughput_", 0), 0u) << e.dump();
    }
  EXPECT_NE(r.out.find("number of skipped iterations:   0 | number of nan iterations:   0"),
            std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
