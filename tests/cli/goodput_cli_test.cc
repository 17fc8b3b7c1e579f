// Goodput end to end (issue 32's done-when): a job under `keel launch` with a known fault
// schedule (SIGKILL at iterations 30 and 50, a hang at 130, a poisoned window the guard rolls
// back) reports a breakdown that matches the figures the schedule gives within 2% of the wall
// time, category by category; `keel goodput --json` sums to the wall time; `keel report` draws
// it (Chromium); the chronicle has the summary. And `keel goodput` on a directory without a
// journal exits 2 naming the fix.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "headless_chromium.h"
#include "keel_process.h"
#include "keel_test_paths.h"  // KEEL_BINARY

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using keel_test::ReadText;

std::vector<json> Lines(const std::string& path, const std::string& key, const std::string& value) {
  std::vector<json> out;
  std::istringstream in(ReadText(path));
  for (std::string line; std::getline(in, line);)
    if (json j = json::parse(line); j.value(key, "") == value) out.push_back(j);
  return out;
}

TEST(GoodputCliTest, ALaunchedJobWithAKnownFaultScheduleMatchesItsFigures) {
  const std::string dir = keel_test::FreshTempDir("goodput_schedule"), run = dir + "/run";
  // The schedule. Checkpoints every 20 iterations; each iteration sleeps 4x its compute (slow=4)
  // so that iterations, not start-up, carry the job's time.
  const int kSaveInterval = 20, kKillA = 30, kKillB = 50, kHang = 130, kRollbackAt = 64,
            kRollbackTo = 60;
  const double kBackoff = 3, kWatchdogSeconds = 0.03 * 60;
  // (slow first: a killed iteration has slept its share before it dies, so it is a whole one.)
  const std::string faults = fmt::format(
      "KEEL_TRAIN_FAULTS=slow=4,kill={}:attempt=1,kill={}:attempt=2,hang={}:attempt=3,"
      "poison=61-72",
      kKillA, kKillB, kHang);
  const std::string train =
      std::string(KEEL_BINARY) +
      " train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
      "--micro-batch-size 2 --global-batch-size 8 --lr-warmup-iters 3 --log-interval 10 "
      "--eval-interval 1000 --eval-iters 0 --sample-tokens 0 --threads 1 --save-interval 20 "
      "--train-iters 150 --lr 5e-3 --guard-max-data-skips 3 --distributed-timeout-minutes 0.03 "
      "--first-iteration-timeout-minutes 1 --save " +
      run;
  const auto t0 = std::chrono::steady_clock::now();
  const keel_test::KeelResult r =
      keel_test::RunShell(faults + " timeout 120 " + KEEL_BINARY + " launch --backoff-seconds " +
                          fmt::format("{:g}", kBackoff) + " --max-restarts 4 -- " + train);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.code, 0) << r.out;
  // The schedule happened as planned: three restarts, one rollback, one hang.
  const std::string events = run + "/events.jsonl";
  ASSERT_EQ(Lines(events, "event", "restart").size(), 3u) << r.out;
  ASSERT_EQ(Lines(events, "event", "hang").size(), 1u) << r.out;
  const std::vector<json> rb = Lines(events, "event", "rollback");
  ASSERT_EQ(rb.size(), 1u) << r.out;
  ASSERT_EQ(rb[0]["iteration"], kRollbackAt);
  ASSERT_EQ(rb[0]["to_iteration"], kRollbackTo);

  // The figures the schedule gives, each iteration at the time the trainer recorded for it
  // (iteration_ms, less its wait for data). The iterations that stayed: metrics.jsonl, which
  // follows resumes and rollbacks, holds each once.
  double stayed_s = 0, wait_s = 0;
  int computed = 0;
  // `whole`: a crashed process wrote no record after its last save, so its iterations' waits
  // for data are lost with them.
  auto add = [&](const json& m, double* compute, bool whole = false) {
    const double w = m["timers_ms"].value("batch-generator", 0.0) / 1e3;
    *compute += m["iteration_ms"].get<double>() / 1e3 - (whole ? 0.0 : w);
    if (!whole) wait_s += w;
  };
  for (const json& m : Lines(run + "/metrics.jsonl", "kind", "train")) {
    if (m["data_skipped"].get<bool>()) continue;
    add(m, &stayed_s);
    ++computed;
  }
  ASSERT_GT(computed, 90);
  // Lost: after each kill, the iterations since the checkpoint before it; the rolled-back ones;
  // before the hang, those since its checkpoint. Their records, as written before the rewind,
  // are in metrics-archive/ (named for the iterations the run went back from and to); the
  // iteration each kill cut short was never recorded and counts at the average.
  const int lost_iterations = (kKillA - kKillA / kSaveInterval * kSaveInterval) +
                              (kKillB - kKillB / kSaveInterval * kSaveInterval) +
                              (kRollbackAt - kRollbackTo) +
                              (kHang - kHang / kSaveInterval * kSaveInterval);
  EXPECT_EQ(lost_iterations, 34);
  double lost_s = 0;
  int archived = 0;
  for (const auto& entry : fs::directory_iterator(run + "/metrics-archive")) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    ASSERT_TRUE(std::regex_search(name, m, std::regex(R"(iter(\d+)-to-iter(\d+))"))) << name;
    const int from = std::stoi(m[1]), to = std::stoi(m[2]);
    std::map<int, json> last;  // an archive holds the file as it was: its newest of each
    for (const json& r : Lines(entry.path().string() + "/metrics.jsonl", "kind", "train"))
      last[r["iteration"].get<int>()] = r;
    for (int it = to + 1; it <= from; ++it) {
      ASSERT_TRUE(last.count(it)) << name << " lacks iteration " << it;
      add(last[it], &lost_s, name.rfind("resume", 0) == 0);
      ++archived;
    }
  }
  EXPECT_EQ(archived, lost_iterations - 3);  // 30, 50 and 130 died before their records
  lost_s += 2 * stayed_s / computed;         // 30 and 50; 130's time is the hang's
  struct Expected {
    const char* key;
    double seconds;
  };
  const std::vector<Expected> expected = {
      {"productive", stayed_s},
      {"lost", lost_s},
      // The phase's time when the watchdog fired: its limit, checked every tenth of it (half a
      // check late on average).
      {"hang", kWatchdogSeconds * 1.05},
      // keel launch's backoff, and half its 0.1 s poll until it sees the attempt end.
      {"restart", 3 * (kBackoff + 0.05)},
      {"data_wait", wait_s},
  };

  const keel_test::KeelResult g =
      keel_test::RunShell(std::string(KEEL_BINARY) + " goodput --json " + run);
  ASSERT_EQ(g.code, 0) << g.out;
  const json j = json::parse(g.out);
  const double w = j["wall_seconds"].get<double>();
  double sum = 0;
  for (const auto& [k, v] : j["categories"].items()) sum += v.get<double>();
  EXPECT_NEAR(sum, w, 1e-6 * w);
  // Wall time: the test's own clock around keel launch.
  EXPECT_NEAR(w, wall, 0.02 * wall) << g.out;
  std::string table = fmt::format("wall: measured {:.2f} s, reported {:.2f} s\n", wall, w);
  double rest = w;
  for (const Expected& e : expected) {
    const double got = j["categories"][e.key].get<double>();
    EXPECT_NEAR(got, e.seconds, 0.02 * wall) << e.key << "\n" << g.out;
    table += fmt::format("{:<11} schedule {:6.2f} s  reported {:6.2f} s  diff {:+5.2f}% of wall\n",
                         e.key, e.seconds, got, 100 * (got - e.seconds) / wall);
    rest -= e.seconds;
  }
  // What the schedule does not fix (start-up, saves, the guard's probes, evaluation, other) is
  // the rest of the wall time.
  double got_rest = 0;
  for (const char* k : {"startup", "save", "guard", "eval", "other"})
    got_rest += j["categories"][k].get<double>();
  // Not a category: five of them together, carrying the errors of the five checked above too.
  EXPECT_NEAR(got_rest, rest, 0.03 * wall) << g.out;
  table += fmt::format("{:<11} rest     {:6.2f} s  reported {:6.2f} s  diff {:+5.2f}% of wall\n",
                       "the rest", rest, got_rest, 100 * (got_rest - rest) / wall);
  std::printf("%s", table.c_str());

  // The table, the chronicle's summary, and the report's stacked bar.
  const keel_test::KeelResult t = keel_test::RunShell(std::string(KEEL_BINARY) + " goodput " + run);
  EXPECT_EQ(t.code, 0);
  EXPECT_NE(t.out.find("hang until the watchdog fired"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("4 keel launch attempts"), std::string::npos) << t.out;
  const std::string chronicle = ReadText(run + "/CHRONICLE.md");
  EXPECT_NE(chronicle.find("- goodput: "), std::string::npos) << chronicle;
  EXPECT_EQ(Lines(events, "event", "goodput_summary").size(), 1u);  // launch's, not each attempt's
  const keel_test::KeelResult rep =
      keel_test::RunShell(std::string(KEEL_BINARY) + " report " + run);
  ASSERT_EQ(rep.code, 0) << rep.out;
  const std::string html = ReadText(run + "/report.html");
  EXPECT_NE(html.find("id=\"goodput-bar\""), std::string::npos);
  if (!keel_test::HaveChromium()) GTEST_SKIP() << "chromium is not installed (scripts/setup.sh)";
  const keel_test::PageLoad page = keel_test::LoadInChromium(run + "/report.html", dir);
  ASSERT_TRUE(page.ran) << page.log;
  EXPECT_EQ(page.errors, "");
  // The bar as the browser holds it: one segment per category with time, widths summing to
  // 100% of the wall time.
  const size_t bar = page.dom.find("<div id=\"goodput-bar\">");
  ASSERT_NE(bar, std::string::npos) << page.dom;
  const std::string segs = page.dom.substr(bar, page.dom.find("</div></div>", bar) - bar);
  double width = 0;
  for (size_t p = segs.find("width:"); p != std::string::npos; p = segs.find("width:", p + 1))
    width += std::stod(segs.substr(p + 6));
  EXPECT_NEAR(width, 100.0, 0.1) << segs;
  for (const char* k : {"productive", "lost", "hang", "restart"})
    EXPECT_NE(segs.find(fmt::format("data-category=\"{}\"", k)), std::string::npos) << segs;
  fs::remove_all(dir);
}

TEST(GoodputCliTest, ADirectoryWithoutAJournalExitsTwoNamingTheFix) {
  const std::string dir = keel_test::FreshTempDir("goodput_empty");
  const keel_test::KeelResult r = keel_test::RunShell(std::string(KEEL_BINARY) + " goodput " + dir);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("events.jsonl not found"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("keel logs analyze"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

}  // namespace
