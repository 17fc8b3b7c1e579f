// EventCommandRunner (the `keel logs watch --on-event` runner) with real processes: what a log
// holds reaches the command as data in its environment and on its stdin, never as shell text,
// however it is written ($(...), `...`, ;, quotes, newlines).
#include "logs/event_command.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "../cli/keel_process.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

// Reaps until `n` commands have ended (at most 20 s).
std::vector<CommandEnd> ReapAll(EventCommandRunner* r, size_t n) {
  std::vector<CommandEnd> ends;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (ends.size() < n && std::chrono::steady_clock::now() < until) {
    for (CommandEnd& e : r->Reap()) ends.push_back(std::move(e));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return ends;
}

TEST(EventCommandTest, LogTextIsDataNeverShell) {
  const std::string dir = keel_test::FreshTempDir("event_command");
  const std::string hostile = "$(touch " + dir + "/PWNED1); `touch " + dir + "/PWNED2`; touch " +
                              dir + "/PWNED3 ' \" \\ \n$HOME";
  auto runner = NewPosixEventCommandRunner(Env::Default());
  ASSERT_TRUE(runner
                  ->Start("hook",
                          "cd " + dir +
                              " && printf '%s' \"$KEEL_EVENT_SENTENCE\" > env.txt && cat > "
                              "stdin.txt",
                          {{"KEEL_EVENT_SENTENCE", hostile}}, "{\"detail\": \"" + hostile + "\"}\n",
                          10)
                  .ok());
  const auto ends = ReapAll(runner.get(), 1);
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_TRUE(ends[0].ok) << ends[0].what;
  EXPECT_EQ(keel_test::ReadText(dir + "/env.txt"), hostile);
  EXPECT_EQ(keel_test::ReadText(dir + "/stdin.txt"), "{\"detail\": \"" + hostile + "\"}\n");
  for (const char* f : {"PWNED1", "PWNED2", "PWNED3"}) EXPECT_FALSE(fs::exists(dir + "/" + f)) << f;
  EXPECT_EQ(runner->running(), 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace keel
