// Native stacks of every thread of this process (Linux), for hang dumps: the py-spy dump of the
// 176B run's deadlocks, taken from inside the process so it needs no ptrace, no debugger and no
// shell on the node. Each thread is asked with a real-time signal (SIGRTMIN+4, whose handler the
// first call installs) to unwind itself; a thread that blocks the signal or never returns to user
// space (stuck in the kernel uninterruptibly) is listed without frames rather than waited for.
#pragma once

#include <string>
#include <vector>

namespace keel {

struct ThreadStack {
  int tid = 0;
  std::string name;        // /proc/self/task/TID/comm (control characters replaced by '?')
  bool is_caller = false;  // the thread that called CaptureAllThreadStacks
  // Innermost first: "FUNCTION+0xOFF (MODULE+0xOFF)" where dladdr names the function, else
  // "MODULE+0xOFF" (for `addr2line -e MODULE 0xOFF`). A thread that did not answer in time has
  // the single frame kNoReplyFrame.
  std::vector<std::string> frames;
};

constexpr const char* kNoReplyFrame = "(no reply)";

// Every thread of this process, in /proc/self/task order, each with at most `max_frames` frames
// (1..64). Waits at most about 1 s in all for the other threads' replies. Safe to call from any
// thread, one call at a time (concurrent calls are serialised). Interrupted system calls without
// SA_RESTART semantics (sleeps, timed waits) may return EINTR in the threads it samples.
std::vector<ThreadStack> CaptureAllThreadStacks(int max_frames = 48);

}  // namespace keel
