// `keel logs watch` as a user runs it: started before the log exists, it journals the findings
// while the test appends to the log (a spike, a restart with a resume spike, a line written in two
// pieces), creates the kill switch, runs the command hook, and stops on SIGTERM with a summary;
// the journal holds what `keel logs analyze` finds in the same log. And its refusals. Every wait
// has a deadline, and the watcher runs under `timeout`, so nothing can hang the suite.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "../logs/megatron_log_fixture.h"
#include "keel_process.h"

namespace {

namespace fs = std::filesystem;
using keel_test::ReadText;
using keel_test::RunKeelShell;
using keel_test::RunShell;
using Finding = std::tuple<std::string, int64_t, int64_t>;

void Append(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::app | std::ios::binary) << text;
}

// Polls `done` every 50 ms for up to `seconds`.
bool WaitFor(const std::function<bool()>& done, double seconds = 90) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

std::vector<nlohmann::json> Entries(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::istringstream in(ReadText(path));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded()) out.push_back(j);
  }
  return out;
}

bool HasEntry(const std::string& path, const std::string& event, const std::string& kind,
              int64_t start) {
  for (const auto& e : Entries(path))
    if (e.value("event", "") == event && e.value("kind", "") == kind &&
        e.value("start", int64_t{-1}) == start)
      return true;
  return false;
}

size_t EndOfIteration(const std::string& text, int64_t iteration, size_t from = 0) {
  const size_t at = text.find(fmt::format("iteration {:8d}/", iteration), from);
  EXPECT_NE(at, std::string::npos) << iteration;
  return text.find('\n', at) + 1;
}

TEST(LogsWatchCliTest, JournalsALogWhileItIsWritten) {
  const std::string dir = keel_test::FreshTempDir("logs_watch_cli");
  const std::string log = dir + "/main_log.txt", out = dir + "/watch",
                    kill_switch = dir + "/stop-training";
  keel_test::ResumeLogOptions o;
  o.spike_at = 150;
  const std::string text = keel_test::GenerateResumeLog(o);
  std::ofstream(dir + "/hook.sh") << "echo \"$KEEL_EVENT $KEEL_EVENT_KIND $KEEL_EVENT_START\" >> "
                                  << dir << "/hook.txt\ncat >> " << dir << "/hook.jsonl\n";
  // The watcher runs in the background under `timeout`; its pid (after exec) goes to watch.pid.
  const std::string cmd = fmt::format(
      "( timeout 300 sh -c 'echo $$ > {0}/watch.pid; exec {1} logs watch {2} --out {3} "
      "--kill-switch {4} --kill-on resume_spike --on-event \"sh {0}/hook.sh\" --poll-seconds 0.1' "
      "> {0}/watch.out 2>&1; echo $? > {0}/watch.rc ) > /dev/null 2>&1 < /dev/null &",
      dir, KEEL_BINARY, log, out, kill_switch);
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  int pid = 0;
  bool ended = false;
  struct KillOnFailure {  // a failed assertion leaves no watcher running
    const int* pid;
    const bool* ended;
    ~KillOnFailure() {
      if (*pid > 0 && !*ended) kill(*pid, SIGKILL);
    }
  } guard{&pid, &ended};
  ASSERT_TRUE(WaitFor([&] {
    pid = std::atoi(ReadText(dir + "/watch.pid").c_str());
    return pid > 0 && ReadText(dir + "/watch.out").find("does not exist yet") != std::string::npos;
  })) << ReadText(dir + "/watch.out");
  const std::string events = out + "/events.jsonl";

  // The spike at 150-151: journaled once its records are there.
  Append(log, text.substr(0, EndOfIteration(text, 160)));
  EXPECT_TRUE(WaitFor([&] { return HasEntry(events, "ended", "spike_recovered", 150); }))
      << ReadText(dir + "/watch.out");
  EXPECT_FALSE(fs::exists(kill_switch));
  // The restart (back to 241) and the first records of the bump: the resume spike is journaled and
  // the kill switch created before the rest of the log exists.
  const size_t restart = text.find("srun: error");
  const size_t bump = EndOfIteration(text, 244, restart);
  Append(log, text.substr(EndOfIteration(text, 160), bump - EndOfIteration(text, 160)));
  EXPECT_TRUE(WaitFor([&] {
    return HasEntry(events, "detected", "resume_spike", 243) && fs::exists(kill_switch);
  })) << ReadText(dir + "/watch.out");
  EXPECT_TRUE(HasEntry(events, "detected", "restart", 300));
  // The rest, one line written in two pieces.
  const size_t cut = EndOfIteration(text, 300, restart) + 100;
  Append(log, text.substr(bump, cut - bump));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Append(log, text.substr(cut));
  EXPECT_TRUE(WaitFor([&] { return HasEntry(events, "ended", "resume_spike", 243); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // a few more looks at the file
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  ASSERT_TRUE(WaitFor([&] { return !ReadText(dir + "/watch.rc").empty(); }))
      << ReadText(dir + "/watch.out");
  ended = true;
  const std::string said = ReadText(dir + "/watch.out");
  EXPECT_EQ(std::atoi(ReadText(dir + "/watch.rc").c_str()), 0) << said;

  // What a person sees.
  EXPECT_NE(said.find("watch: iteration 243: resume_spike detected: lm loss spike at iteration "
                      "243"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("judged against the records before the restart, to iteration 240"),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find("note: the journal goes"), std::string::npos) << said;  // --out was given
  EXPECT_NE(said.find("note: throughput drops are judged on windows of 20 records"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("watch: stopped: SIGTERM received"), std::string::npos) << said;
  EXPECT_NE(said.find("watch: findings: 1 restart, 1 resume_spike, 1 spike_recovered"),
            std::string::npos)
      << said;

  // The journal: the findings of `keel logs analyze` on the same log.
  std::ofstream(dir + "/copy.txt") << text;
  auto r =
      RunKeelShell("", "logs analyze --json --drop-window 20 " + dir + "/copy.txt 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  std::set<Finding> analyzed;
  const nlohmann::json report = nlohmann::json::parse(r.out);  // kept alive for the loop
  for (const auto& e : report["events"])
    analyzed.insert(
        Finding(e["kind"].get<std::string>(), e["start"].get<int64_t>(), e["end"].get<int64_t>()));
  std::map<std::pair<std::string, int64_t>, int64_t> closed;
  const auto entries = Entries(events);
  for (const auto& e : entries)
    if (e["event"] != "kill_switch" && !e["open"].get<bool>())
      closed[{e["kind"], e["start"]}] = e["end"];
  std::set<Finding> journaled;
  for (const auto& [k, end] : closed) journaled.insert({k.first, k.second, end});
  EXPECT_EQ(journaled, analyzed) << ReadText(events);
  EXPECT_EQ(analyzed.size(), 3u) << r.out;  // the spike, the restart, the resume spike

  const std::string chronicle = ReadText(out + "/CHRONICLE.md");
  EXPECT_NE(chronicle.find("## watching " + log + " from its start"), std::string::npos);
  EXPECT_NE(chronicle.find("- iteration 243: resume_spike detected: "), std::string::npos)
      << chronicle;
  EXPECT_NE(chronicle.find("- iteration 243: created the kill switch " + kill_switch),
            std::string::npos)
      << chronicle;
  EXPECT_NE(ReadText(kill_switch).find("resume_spike detected"), std::string::npos);

  // The hook ran for every entry, with the entry in its environment and on its stdin.
  ASSERT_TRUE(WaitFor([&] { return Entries(dir + "/hook.jsonl").size() >= entries.size(); }, 60));
  const std::string hook = ReadText(dir + "/hook.txt");
  EXPECT_NE(hook.find("detected resume_spike 243\n"), std::string::npos) << hook;
  EXPECT_NE(hook.find("ended spike_recovered 150\n"), std::string::npos) << hook;
  EXPECT_NE(hook.find("kill_switch resume_spike \n"), std::string::npos) << hook;
  for (const auto& e : Entries(dir + "/hook.jsonl")) EXPECT_EQ(e["source"], "keel logs watch");
  fs::remove_all(dir);
}

TEST(LogsWatchCliTest, RefusalsAndStoppingWhenQuiet) {
  const std::string dir = keel_test::FreshTempDir("logs_watch_refusals");
  const std::string log = dir + "/main_log.txt";
  auto r = RunKeelShell("", "logs watch " + log + " --kill-switch " + dir + "/k --kill-on bogus");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("no finding is called 'bogus'"), std::string::npos) << r.out;
  r = RunKeelShell("", "logs watch " + log + " --kill-on nan");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--kill-on needs --kill-switch"), std::string::npos) << r.out;
  r = RunKeelShell("", "logs watch " + log + " --from-start --from-end");
  EXPECT_EQ(r.code, 2) << r.out;
  // A keel run's journal is not mixed with a watch's.
  fs::create_directories(dir + "/run");
  const std::string journal = "{\"event\":\"resume\",\"iteration\":10}\n";
  std::ofstream(dir + "/run/events.jsonl") << journal;
  r = RunKeelShell("", "logs watch " + log + " --out " + dir + "/run --until-idle 1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("holds another journal"), std::string::npos) << r.out;
  EXPECT_EQ(ReadText(dir + "/run/events.jsonl"), journal);
  // A log that never comes: waited for, then the watch ends by itself, with a summary.
  r = RunKeelShell("", "logs watch " + log + " --until-idle 0.5 --poll-seconds 0.1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("does not exist yet: waiting for it"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("note: the journal goes to " + log + ".watch/"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("watch: stopped: " + log + " was quiet for 0.5 s (--until-idle)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("0 iteration records"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

// A crash loop's log: iterations 1-3, then `restarts` times back to 2 and on to 3: one restart
// entry each.
std::string CrashLoopLog(int restarts) {
  std::string text;
  auto line = [&](int64_t it) { text += keel_test::MegatronLogLine(it, 3.0, 0.3, 150, 0) + "\n"; };
  for (int64_t it = 1; it <= 3; ++it) line(it);
  for (int i = 0; i < restarts; ++i) line(2), line(3);
  return text;
}

// Before: every entry started its command at once (a 1,500-line log with 499 restarts and
// `--on-event 'sleep 8'` took a machine from 80 to 1,579 processes). Now at most
// --max-running-hooks commands run at once, --max-queued-hooks wait, the rest are not run and
// counted in the journal. Each hook writes its start and end; the most running at once is read
// from them. Bounded: the hooks sleep 2 s, the watch ends after 8 quiet seconds.
TEST(LogsWatchCliTest, OnEventCommandsAreCappedAndTheDroppedJournaled) {
  const std::string dir = keel_test::FreshTempDir("logs_watch_hooks");
  std::ofstream(dir + "/log.txt") << CrashLoopLog(30);
  std::ofstream(dir + "/hook.sh") << "echo \"+ $(date +%s%N)\" >> " << dir
                                  << "/hooks.txt\nsleep 2\necho \"- $(date +%s%N)\" >> " << dir
                                  << "/hooks.txt\n";
  auto r = RunKeelShell("", fmt::format("logs watch {0}/log.txt --out {0}/w --on-event 'sh "
                                        "{0}/hook.sh' --max-running-hooks 2 --max-queued-hooks 3 "
                                        "--poll-seconds 0.1 --until-idle 8",
                                        dir));
  ASSERT_EQ(r.code, 0) << r.out;
  // The commands outlive the watcher: wait for the last one to end.
  auto ends = [&] {
    const std::string h = ReadText(dir + "/hooks.txt");
    return std::count(h.begin(), h.end(), '-');
  };
  ASSERT_TRUE(WaitFor([&] { return ends() >= 5; }, 30)) << ReadText(dir + "/hooks.txt");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // no sixth one
  std::vector<std::pair<int64_t, int>> marks;                   // time, +1 start / -1 end
  std::istringstream in(ReadText(dir + "/hooks.txt"));
  for (std::string sign, t; in >> sign >> t;)
    marks.push_back({std::stoll(t), sign == "+" ? 1 : -1});
  std::sort(marks.begin(), marks.end());
  int running = 0, most = 0;
  for (const auto& [t, d] : marks) most = std::max(most, running += d);
  EXPECT_EQ(most, 2) << ReadText(dir + "/hooks.txt");
  EXPECT_EQ(marks.size(), 10u) << ReadText(dir + "/hooks.txt");  // 2 at once, then the 3 queued
  int64_t restarts = 0, dropped = 0;
  for (const auto& e : Entries(dir + "/w/events.jsonl")) {
    if (e["event"] == "detected" && e["kind"] == "restart") ++restarts;
    if (e["event"] == "hooks_dropped") dropped += e["count"].get<int64_t>();
  }
  EXPECT_EQ(restarts, 30);
  EXPECT_EQ(dropped, 25) << ReadText(dir + "/w/events.jsonl");
  EXPECT_NE(r.out.find("watch: --on-event: 25 commands not run (25 this watch): 2 were running "
                       "and 3 waiting to start"),
            std::string::npos)
      << r.out;
  // Limits are checked.
  r = RunKeelShell("", "logs watch " + dir + "/log.txt --max-running-hooks 0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--max-running-hooks 0 must be at least 1"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

// What the log holds (its name, its lines) reaches --on-event as data, never as shell text: a
// file name with $(...), backticks and ';' creates no file, and the command sees it literally.
TEST(LogsWatchCliTest, LogTextNeverReachesAShell) {
  const std::string dir = keel_test::FreshTempDir("logs_watch_inject");
  const std::string name = "l$(touch PWNED1);`touch PWNED2`;touch PWNED3;.log";
  std::ofstream(dir + "/" + name) << "$(touch PWNED4); `touch PWNED5`\n" << CrashLoopLog(1);
  std::ofstream(dir + "/hook.sh") << "printf '%s\\n' \"$KEEL_EVENT_LOG\" >> seen-log.txt\n"
                                  << "printf '%s\\n' \"$KEEL_EVENT_SENTENCE\" >> seen.txt\n";
  auto r =
      RunShell(fmt::format("cd {} && {} logs watch './{}' --out w --on-event 'sh hook.sh' "
                           "--poll-seconds 0.1 --until-idle 1",
                           dir, KEEL_BINARY, name));
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(WaitFor([&] { return !ReadText(dir + "/seen.txt").empty(); }, 20)) << r.out;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(ReadText(dir + "/seen-log.txt"), "./" + name + "\n");
  EXPECT_NE(ReadText(dir + "/seen.txt").find("(./" + name + ":"), std::string::npos)
      << ReadText(dir + "/seen.txt");
  for (const auto& f : fs::directory_iterator(dir))
    EXPECT_EQ(f.path().filename().string().rfind("PWNED", 0), std::string::npos) << f.path();
  fs::remove_all(dir);
}

}  // namespace
