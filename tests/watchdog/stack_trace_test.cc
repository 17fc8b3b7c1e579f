// CaptureAllThreadStacks on this process: every thread answers with its own frames, named.
#include "watchdog/stack_trace.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace keel_test {

// Exported (not static, not in an anonymous namespace) and never inlined, so dladdr names it in
// the parked thread's frames.
__attribute__((noinline)) void StackTraceTestParkedHere(std::atomic<bool>* parked,
                                                        std::atomic<bool>* release) {
  parked->store(true);
  while (!release->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  asm volatile("");  // not a tail call: this frame stays on the stack while it waits
}

}  // namespace keel_test

namespace {

using keel::CaptureAllThreadStacks;
using keel::ThreadStack;

int CountTasks() {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  while (struct dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

bool HasFrame(const ThreadStack& t, const std::string& part) {
  for (const std::string& f : t.frames)
    if (f.find(part) != std::string::npos) return true;
  return false;
}

TEST(StackTraceTest, EveryThreadAnswersWithItsOwnFrames) {
  std::atomic<bool> parked{false}, release{false};
  std::thread helper(keel_test::StackTraceTestParkedHere, &parked, &release);
  while (!parked.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  const auto stacks = CaptureAllThreadStacks();
  const int tasks = CountTasks();
  release.store(true);
  helper.join();

  EXPECT_EQ(static_cast<int>(stacks.size()), tasks);
  int callers = 0, parked_in_known = 0;
  for (const ThreadStack& t : stacks) {
    ASSERT_FALSE(t.frames.empty()) << t.tid;
    EXPECT_NE(t.frames[0], keel::kNoReplyFrame) << "thread " << t.tid << " (" << t.name << ")";
    EXPECT_LE(t.frames.size(), 48u);
    if (t.is_caller) {
      ++callers;
      // The caller's stack begins at its caller (this test, whose class is not exported: a
      // module+offset frame), not inside the capture.
      EXPECT_TRUE(HasFrame(t, "testing::Test::Run()")) << ::testing::PrintToString(t.frames);
      EXPECT_FALSE(HasFrame(t, "CaptureAllThreadStacks")) << ::testing::PrintToString(t.frames);
      EXPECT_EQ(t.tid, static_cast<int>(gettid()));
    }
    if (HasFrame(t, "keel_test::StackTraceTestParkedHere(")) {
      ++parked_in_known;
      // Its stack starts where it was interrupted: not in the signal handler.
      EXPECT_FALSE(HasFrame(t, "OnStackSignal")) << ::testing::PrintToString(t.frames);
      // Every frame names a module and an offset addr2line can take.
      for (const std::string& f : t.frames) EXPECT_NE(f.find("+0x"), std::string::npos) << f;
    }
  }
  EXPECT_EQ(callers, 1);
  EXPECT_EQ(parked_in_known, 1);
}

TEST(StackTraceTest, AThreadThatBlocksTheSignalIsListedWithoutReply) {
  std::atomic<bool> parked{false}, release{false};
  std::thread deaf([&] {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    keel_test::StackTraceTestParkedHere(&parked, &release);
  });
  while (!parked.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto start = std::chrono::steady_clock::now();
  const auto stacks = CaptureAllThreadStacks(8);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  release.store(true);
  deaf.join();

  int no_reply = 0;
  for (const ThreadStack& t : stacks) {
    EXPECT_LE(t.frames.size(), 8u);
    if (t.frames == std::vector<std::string>{keel::kNoReplyFrame}) ++no_reply;
  }
  EXPECT_EQ(no_reply, 1);
  EXPECT_LT(waited, 3.0);  // bounded: about 1 s for the thread that never answers
  // The next capture is not confused by the signal left pending on the deaf thread.
  for (const ThreadStack& t : CaptureAllThreadStacks())
    EXPECT_NE(t.frames[0], keel::kNoReplyFrame) << t.tid;
}

}  // namespace
