// LogWatcher in process: a log written in steps (cut inside lines, a wrapped record), the findings
// journaled as the records arrive and, at the end, the same as `keel logs analyze` finds; the kill
// switch and the command hook; --from-end; rotation; the run loop on a fake clock; what it refuses.
#include "logs/log_watcher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

#include "../cli/keel_process.h"
#include "core/fault_injection_env.h"
#include "logs/log_analysis.h"
#include "megatron_log_fixture.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using Finding = std::tuple<std::string, int64_t, int64_t>;  // kind, start, end

void Append(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::app | std::ios::binary) << text;
}

std::vector<nlohmann::json> Entries(const std::string& dir) {
  std::vector<nlohmann::json> out;
  std::istringstream in(keel_test::ReadText(dir + "/events.jsonl"));
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The findings as they last closed (a later "ended" entry of the same kind and start replaces an
// earlier one: a divergence that rose again).
std::set<Finding> Closed(const std::vector<nlohmann::json>& entries) {
  std::map<std::pair<std::string, int64_t>, int64_t> last;
  for (const auto& e : entries)
    if (e.value("event", "") != "kill_switch" && !e["open"].get<bool>())
      last[{e["kind"], e["start"]}] = e["end"];
  std::set<Finding> out;
  for (const auto& [k, end] : last) out.insert({k.first, k.second, end});
  return out;
}

bool HasEntry(const std::vector<nlohmann::json>& entries, const std::string& event,
              const std::string& kind, int64_t start) {
  for (const auto& e : entries)
    if (e.value("event", "") == event && e.value("kind", "") == kind &&
        e.value("start", int64_t{-1}) == start)
      return true;
  return false;
}

std::set<Finding> Analyzed(const std::string& text, const LogAnalysisOptions& opt) {
  ParsedLog log;
  EXPECT_TRUE(ParseMegatronLog(text, "x.log", &log).ok());
  LogAnalysis a;
  EXPECT_TRUE(AnalyzeLog(log, opt, &a).ok());
  std::set<Finding> out;
  for (const LogEvent& e : a.events) out.insert({e.kind, e.start, e.end});
  return out;
}

// Records the commands it is asked to start.
class RecordingRunner : public EventCommandRunner {
 public:
  Status Start(const std::string& label, const std::string& command,
               const std::vector<std::pair<std::string, std::string>>& vars,
               const std::string& stdin_text, double timeout_s) override {
    std::map<std::string, std::string> env(vars.begin(), vars.end());
    started.push_back(env);
    stdin_lines.push_back(stdin_text);
    return Status::OK();
  }
  std::vector<CommandEnd> Reap() override { return {}; }
  int running() const override { return 0; }
  std::vector<std::map<std::string, std::string>> started;
  std::vector<std::string> stdin_lines;
};

// The text up to and including the line of `iteration` (its first occurrence after `from`).
size_t EndOfIteration(const std::string& text, int64_t iteration, size_t from = 0) {
  const size_t at = text.find(fmt::format("iteration {:8d}/", iteration), from);
  EXPECT_NE(at, std::string::npos) << iteration;
  return text.find('\n', at) + 1;
}

class LogWatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = keel_test::FreshTempDir("log_watcher");
    opt_.log = dir_ + "/main_log.txt";
    opt_.out_dir = dir_ + "/watch";
    opt_.analysis.drop_window = 20;
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Polls until the watcher has read everything there is.
  void PollAll(LogWatcher* w) {
    bool more = true, read = false;
    while (more) ASSERT_TRUE(w->Poll(&more, &read).ok());
  }
  std::string dir_;
  LogWatchOptions opt_;
  std::vector<std::string> said_;
  LogWatcher::Output Say() {
    return [this](const std::string& s) { said_.push_back(s); };
  }
};

// The generated log (a spike at 150, a NaN at 200, a restart to 241 with a resume spike, a slow
// GPU from 300, a divergence from 330) written in steps cut inside lines: each finding is
// journaled when its records have arrived, not before, and in the end the journal holds what
// `keel logs analyze` finds in the whole log.
TEST_F(LogWatcherTest, FindingsAreJournaledAsTheRecordsArriveAndMatchAnalyze) {
  const std::string text = keel_test::GenerateMegatronLog({});
  opt_.kill_switch = dir_ + "/stop-training";
  opt_.kill_on = {"nan"};
  opt_.on_event = "notify";
  RecordingRunner runner;
  LogWatcher w(Env::Default(), opt_, &runner, Say());
  ASSERT_TRUE(w.Open().ok());
  PollAll(&w);  // the file is not there yet
  size_t written = 0;
  auto write_to = [&](size_t end) {
    Append(opt_.log, text.substr(written, end - written));
    written = end;
    PollAll(&w);
    return Entries(opt_.out_dir);
  };
  // Up to the middle of the spike's first line: nothing yet.
  auto entries = write_to(EndOfIteration(text, 149) + 40);
  EXPECT_TRUE(entries.empty());
  // Through the wrapped record at 123 and the spike's first record: detected, open.
  entries = write_to(EndOfIteration(text, 150));
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0]["event"], "detected");
  EXPECT_EQ(entries[0]["kind"], "spike");
  EXPECT_EQ(entries[0]["start"], 150);
  EXPECT_TRUE(entries[0]["open"].get<bool>());
  EXPECT_EQ(entries[0]["source"], "keel logs watch");
  // Back at 153: ended, as analyze names it.
  entries = write_to(EndOfIteration(text, 160));
  EXPECT_TRUE(HasEntry(entries, "ended", "spike_recovered", 150));
  EXPECT_FALSE(fs::exists(opt_.kill_switch));
  // The NaN at 200 creates the kill switch, once.
  entries = write_to(EndOfIteration(text, 200));
  EXPECT_TRUE(HasEntry(entries, "detected", "nan", 200));
  ASSERT_TRUE(fs::exists(opt_.kill_switch));
  EXPECT_NE(keel_test::ReadText(opt_.kill_switch).find("iteration 200: nan detected"),
            std::string::npos);
  // The restart (the log goes back to 241) and the resume spike at 245.
  const size_t restart = text.find("srun: error");
  entries = write_to(EndOfIteration(text, 246, restart));
  EXPECT_TRUE(HasEntry(entries, "detected", "restart", 260));
  EXPECT_TRUE(HasEntry(entries, "detected", "resume_spike", 245));
  // The rest, then the end of the watch.
  write_to(text.size());
  w.Finish("the test is over");
  entries = Entries(opt_.out_dir);
  LogAnalysisOptions analyze;
  analyze.drop_window = 20;
  EXPECT_EQ(Closed(entries), Analyzed(text, analyze));
  int kill_switches = 0;
  for (const auto& e : entries) kill_switches += e["event"] == "kill_switch";
  EXPECT_EQ(kill_switches, 1);

  // The chronicle tells the same story; every entry ran the command, with the entry in its
  // environment and on its stdin.
  const std::string chronicle = keel_test::ReadText(opt_.out_dir + "/CHRONICLE.md");
  EXPECT_EQ(chronicle.rfind("\n## watching " + opt_.log + " from its start (", 0), 0u) << chronicle;
  EXPECT_NE(chronicle.find("- iteration 150: spike detected: lm loss spike at iteration 150"),
            std::string::npos)
      << chronicle;
  EXPECT_NE(chronicle.find("- iterations 150-153: spike_recovered: "), std::string::npos);
  EXPECT_NE(chronicle.find("- iteration 200: created the kill switch " + opt_.kill_switch),
            std::string::npos);
  ASSERT_EQ(runner.started.size(), entries.size());
  EXPECT_EQ(runner.started[0].at("KEEL_EVENT"), "detected");
  EXPECT_EQ(runner.started[0].at("KEEL_EVENT_KIND"), "spike");
  EXPECT_EQ(runner.started[0].at("KEEL_EVENT_START"), "150");
  EXPECT_EQ(runner.started[0].at("KEEL_EVENT_OPEN"), "1");
  EXPECT_EQ(nlohmann::json::parse(runner.stdin_lines[0])["kind"], "spike");
  // One line for people per entry, and a summary.
  int event_lines = 0;
  for (const std::string& s : said_) event_lines += s.rfind("watch: iteration", 0) == 0;
  EXPECT_EQ(event_lines, static_cast<int>(entries.size()));
  const std::string all = [&] {
    std::string a;
    for (const std::string& s : said_) a += s + "\n";
    return a;
  }();
  EXPECT_NE(all.find("watch: stopped: the test is over"), std::string::npos) << all;
  const auto lines = std::count(text.begin(), text.end(), '\n');
  EXPECT_NE(all.find(fmt::format("watch: read {} lines of {} (1 file): 420 iteration records",
                                 lines, opt_.log)),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("main_log.txt does not exist yet: waiting for it"), std::string::npos);
}

// The resume-spike rule is the same live: the bump after the restart is journaled while the log
// is being written.
TEST_F(LogWatcherTest, ResumeBumpIsFoundLive) {
  keel_test::ResumeLogOptions o;
  const std::string text = keel_test::GenerateResumeLog(o);
  LogWatcher w(Env::Default(), opt_, nullptr, Say());
  ASSERT_TRUE(w.Open().ok());
  const size_t restart = text.find("srun: error");
  Append(opt_.log, text.substr(0, EndOfIteration(text, 243, restart)));
  PollAll(&w);
  auto entries = Entries(opt_.out_dir);
  EXPECT_TRUE(HasEntry(entries, "detected", "resume_spike", 243));
  Append(opt_.log, text.substr(EndOfIteration(text, 243, restart)));
  PollAll(&w);
  w.Finish("done");
  entries = Entries(opt_.out_dir);
  EXPECT_TRUE(HasEntry(entries, "ended", "resume_spike", 243));
  LogAnalysisOptions analyze;
  analyze.drop_window = 20;
  EXPECT_EQ(Closed(entries), Analyzed(text, analyze));
}

// --from-end: what is there primes the detectors and is not journaled; what comes is.
TEST_F(LogWatcherTest, FromEndPrimesTheDetectorsWithoutJournalingThePast) {
  const std::string text = keel_test::GenerateMegatronLog({});
  const size_t cut = EndOfIteration(text, 170);
  Append(opt_.log, text.substr(0, cut));
  opt_.from_end = true;
  LogWatcher w(Env::Default(), opt_, nullptr, Say());
  ASSERT_TRUE(w.Open().ok());
  PollAll(&w);
  EXPECT_TRUE(Entries(opt_.out_dir).empty());  // the spike at 150 was before the watch
  Append(opt_.log, text.substr(cut, EndOfIteration(text, 201) - cut));
  PollAll(&w);
  const auto entries = Entries(opt_.out_dir);
  ASSERT_FALSE(entries.empty());
  EXPECT_TRUE(HasEntry(entries, "detected", "nan", 200));
  for (const auto& e : entries) EXPECT_GE(e["iteration"].get<int64_t>(), 171) << e;
  bool noted = false;
  for (const std::string& s : said_)
    noted |= s.find("the 170 records already in") != std::string::npos;
  EXPECT_TRUE(noted);
}

// A rotated log (logrotate: rename, new file) is one run: the same findings as the whole text.
TEST_F(LogWatcherTest, ARotatedLogIsOneRun) {
  const std::string text = keel_test::GenerateMegatronLog({});
  LogWatcher w(Env::Default(), opt_, nullptr, Say());
  ASSERT_TRUE(w.Open().ok());
  const size_t cut = EndOfIteration(text, 180) + 30;  // inside a line
  Append(opt_.log, text.substr(0, cut));
  PollAll(&w);
  fs::rename(opt_.log, opt_.log + ".1");
  Append(opt_.log + ".1", text.substr(cut, EndOfIteration(text, 190) - cut));  // written late
  Append(opt_.log, text.substr(EndOfIteration(text, 190)));
  PollAll(&w);
  w.Finish("done");
  LogAnalysisOptions analyze;
  analyze.drop_window = 20;
  EXPECT_EQ(Closed(Entries(opt_.out_dir)), Analyzed(text, analyze));
}

// An Env whose clock only moves when the watcher sleeps, and which writes the next piece of the
// log at given times: Run stops by itself once the file has been quiet for --until-idle.
class ScriptedClockEnv : public FaultInjectionEnv {
 public:
  ScriptedClockEnv() : FaultInjectionEnv(Env::Default()) {}
  uint64_t NowMicros() override { return now_; }
  void SleepForMicros(uint64_t micros) override {
    now_ += micros;
    while (!script_.empty() && script_.front().first <= now_) {
      script_.front().second();
      script_.erase(script_.begin());
    }
  }
  uint64_t now_ = 1000000;
  std::vector<std::pair<uint64_t, std::function<void()>>> script_;
};

TEST_F(LogWatcherTest, RunStopsWhenTheLogIsQuietOnAFakeClock) {
  const std::string text = keel_test::GenerateMegatronLog({});
  ScriptedClockEnv env;
  const size_t half = EndOfIteration(text, 200);
  env.script_.push_back({3000000, [&] { Append(opt_.log, text.substr(0, half)); }});
  env.script_.push_back({9000000, [&] { Append(opt_.log, text.substr(half)); }});
  opt_.poll_seconds = 1;
  opt_.until_idle_seconds = 30;
  LogWatcher w(&env, opt_, nullptr, Say());
  ASSERT_TRUE(w.Open().ok());
  std::string why;
  ASSERT_TRUE(w.Run([] { return std::string(); }, &why).ok());
  EXPECT_EQ(why, opt_.log + " was quiet for 30 s (--until-idle)");
  EXPECT_GE(env.now_, 39000000u);  // the last bytes at 9 s, then 30 s of quiet
  EXPECT_LE(env.now_, 41000000u);
  w.Finish(why);
  EXPECT_EQ(w.records(), 420);
  // A stop request ends it too.
  LogWatchOptions again = opt_;
  again.out_dir = dir_ + "/watch2";
  LogWatcher w2(&env, again, nullptr, Say());
  ASSERT_TRUE(w2.Open().ok());
  int looks = 0;
  ASSERT_TRUE(
      w2.Run([&] { return ++looks > 3 ? std::string("SIGTERM received") : ""; }, &why).ok());
  EXPECT_EQ(why, "SIGTERM received");
}

// A directory that holds another journal is refused untouched; an earlier watch's journal is
// refused unless the user says how to go on, then appended to.
TEST_F(LogWatcherTest, AnExistingJournalIsRefusedOrAppendedToAsAsked) {
  fs::create_directories(opt_.out_dir);
  const std::string guard_journal =
      "{\"event\":\"resume\",\"iteration\":100,\"at\":\"2026-11-22T15:26:38Z\"}\n";
  std::ofstream(opt_.out_dir + "/events.jsonl") << guard_journal;
  {
    LogWatcher w(Env::Default(), opt_, nullptr, Say());
    const Status st = w.Open();
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(st.message().find("holds another journal (line 1: \"event\": \"resume\""),
              std::string::npos)
        << st.message();
    EXPECT_EQ(keel_test::ReadText(opt_.out_dir + "/events.jsonl"), guard_journal);
    EXPECT_FALSE(fs::exists(opt_.out_dir + "/CHRONICLE.md"));
  }
  fs::remove_all(opt_.out_dir);
  Append(opt_.log, keel_test::GenerateMegatronLog({}).substr(0, 200000));
  {
    LogWatcher w(Env::Default(), opt_, nullptr, Say());
    ASSERT_TRUE(w.Open().ok());
    PollAll(&w);
    w.Finish("first watch");
  }
  const std::string before = keel_test::ReadText(opt_.out_dir + "/events.jsonl");
  ASSERT_FALSE(before.empty());
  {
    LogWatcher w(Env::Default(), opt_, nullptr, Say());
    const Status st = w.Open();
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(st.message().find("already holds the journal of an earlier watch"), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("--from-end"), std::string::npos);
  }
  EXPECT_EQ(keel_test::ReadText(opt_.out_dir + "/events.jsonl"), before);
  opt_.from_end = true;
  opt_.append_to_journal = true;
  LogWatcher w(Env::Default(), opt_, nullptr, Say());
  ASSERT_TRUE(w.Open().ok());
  PollAll(&w);
  w.Finish("second watch");
  const std::string after = keel_test::ReadText(opt_.out_dir + "/events.jsonl");
  EXPECT_EQ(after.rfind(before, 0), 0u);  // nothing written before is lost
  const std::string chronicle = keel_test::ReadText(opt_.out_dir + "/CHRONICLE.md");
  EXPECT_NE(chronicle.find("from its end"), std::string::npos);
}

TEST_F(LogWatcherTest, AKillSwitchInADirectoryThatDoesNotExistIsRefused) {
  opt_.kill_switch = dir_ + "/no/such/dir/stop";
  opt_.kill_on = {"divergence"};
  LogWatcher w(Env::Default(), opt_, nullptr, Say());
  const Status st = w.Open();
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("the directory " + dir_ + "/no/such/dir does not exist"),
            std::string::npos)
      << st.message();
  EXPECT_FALSE(fs::exists(opt_.out_dir));
}

// Commands that run until the test ends them: how many run at once, and the most ever.
class SlotRunner : public EventCommandRunner {
 public:
  Status Start(const std::string& label, const std::string&,
               const std::vector<std::pair<std::string, std::string>>&, const std::string&,
               double) override {
    labels.push_back(label);
    most = std::max(most, ++running_);
    return Status::OK();
  }
  std::vector<CommandEnd> Reap() override {
    std::vector<CommandEnd> out(static_cast<size_t>(finish), CommandEnd{"", true, ""});
    running_ -= finish;
    finish = 0;
    return out;
  }
  int running() const override { return running_; }
  int finish = 0;  // commands to end at the next Reap
  int most = 0;
  std::vector<std::string> labels;

 private:
  int running_ = 0;
};

// A burst of findings with --on-event: at most max_running_hooks commands run at once, the
// next max_queued_hooks wait and start as slots free up, the rest are not run and their count is
// journaled; the ones still queued when the watch ends are not started either, and counted.
// (Before: every entry started its command at once, three processes each.)
TEST_F(LogWatcherTest, HooksAreCappedQueuedAndTheDroppedCounted) {
  opt_.on_event = "notify";
  opt_.max_running_hooks = 2;
  opt_.max_queued_hooks = 1;
  SlotRunner runner;
  LogWatcher w(Env::Default(), opt_, &runner, Say());
  ASSERT_TRUE(w.Open().ok());
  const std::string text = keel_test::GenerateMegatronLog({});
  Append(opt_.log, text.substr(0, EndOfIteration(text, 300, text.find("srun: error"))));
  PollAll(&w);
  EXPECT_EQ(runner.labels.size(), 2u);
  EXPECT_EQ(runner.most, 2);
  auto count = [&](const std::string& event) {
    int64_t n = 0, dropped = 0;
    for (const auto& e : Entries(opt_.out_dir)) {
      if (e["event"] == event) ++n;
      if (e["event"] == "hooks_dropped") dropped += e["count"].get<int64_t>();
    }
    return std::pair{n, dropped};
  };
  const int64_t findings = w.entries() - count("hooks_dropped").first;
  ASSERT_GE(findings, 5);  // spike (2), nan, restart, resume spike ...
  EXPECT_EQ(count("hooks_dropped").second, findings - 3);  // 2 running, 1 queued
  // Two commands end: the queued one starts in a slot; the next entry finds the other free.
  runner.finish = 2;
  bool more = false, read = false;
  ASSERT_TRUE(w.Poll(&more, &read).ok());
  EXPECT_EQ(runner.labels.size(), 3u);
  Append(opt_.log, text.substr(EndOfIteration(text, 300, text.find("srun: error"))));
  PollAll(&w);
  w.Finish("the test is over");
  EXPECT_EQ(runner.most, 2);
  const auto entries = Entries(opt_.out_dir);
  int64_t dropped = 0, ended_early = 0;
  for (const auto& e : entries) {
    if (e["event"] != "hooks_dropped") continue;
    dropped += e["count"].get<int64_t>();
    EXPECT_EQ(e["total"], dropped);
    EXPECT_EQ(e["max_running_hooks"], 2);
    EXPECT_EQ(e["max_queued_hooks"], 1);
    EXPECT_EQ(e["source"], "keel logs watch");
    if (e["reason"] == "the watch ended before they could start") ended_early = e["count"];
  }
  // Every finding's command either ran or was counted as not run.
  const int64_t all_findings = static_cast<int64_t>(entries.size()) - count("hooks_dropped").first;
  EXPECT_EQ(static_cast<int64_t>(runner.labels.size()) + dropped, all_findings);
  EXPECT_EQ(ended_early, 1);  // the one waiting when the watch ended
  std::string all;
  for (const std::string& s : said_) all += s + "\n";
  EXPECT_NE(all.find("--on-event: " + std::to_string(findings - 3) + " commands not run (" +
                     std::to_string(findings - 3) +
                     " this watch): 2 were running and 1 waiting to start, the most "
                     "--max-running-hooks and --max-queued-hooks allow"),
            std::string::npos)
      << all;
  const std::string chronicle = keel_test::ReadText(opt_.out_dir + "/CHRONICLE.md");
  EXPECT_NE(chronicle.find("the watch ended before they could start"), std::string::npos)
      << chronicle;
}

}  // namespace
}  // namespace keel
