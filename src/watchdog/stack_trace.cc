#include "watchdog/stack_trace.h"

#include <cxxabi.h>
#include <dirent.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <fmt/format.h>
#include <link.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

namespace keel {
namespace {

constexpr int kMaxFrames = 64;
constexpr int kMaxSlots = 1024;
constexpr auto kReplyWait = std::chrono::seconds(1);

// A slot's life: the caller arms it (kPending) for one thread; that thread's handler claims it
// (kWriting) and fills it (kDone); a caller that stops waiting takes back a slot still pending,
// so a late handler finds nothing to write into.
enum SlotState : int { kIdle = 0, kPending, kWriting, kDone };

struct Slot {
  std::atomic<int> tid{0};
  std::atomic<int> state{kIdle};
  int depth = 0;
  uintptr_t interrupted_pc = 0;
  void* pcs[kMaxFrames];
};

// Static storage: the handler must not allocate.
Slot g_slots[kMaxSlots];
std::atomic<int> g_armed_slots{0};

uintptr_t InterruptedPc(void* ucontext) {
#if defined(__x86_64__)
  return static_cast<uintptr_t>(static_cast<ucontext_t*>(ucontext)->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<uintptr_t>(static_cast<ucontext_t*>(ucontext)->uc_mcontext.pc);
#else
  return 0;
#endif
}

void OnStackSignal(int, siginfo_t*, void* ucontext) {
  const int saved_errno = errno;
  const int tid = static_cast<int>(syscall(SYS_gettid));
  const int n = g_armed_slots.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    Slot& s = g_slots[i];
    if (s.tid.load(std::memory_order_relaxed) != tid) continue;
    int expected = kPending;
    if (s.state.compare_exchange_strong(expected, kWriting, std::memory_order_acquire)) {
      s.interrupted_pc = InterruptedPc(ucontext);
      s.depth = backtrace(s.pcs, kMaxFrames);
      s.state.store(kDone, std::memory_order_release);
    }
    break;
  }
  errno = saved_errno;
}

int StackSignal() {
  return SIGRTMIN + 4;
}

bool InstallHandlerOnce() {
  static const bool installed = [] {
    // The first backtrace() loads libgcc_s (dlopen, malloc): do it here, not in a handler.
    void* warm[2];
    backtrace(warm, 2);
    struct sigaction sa = {};
    sa.sa_sigaction = OnStackSignal;
    sa.sa_flags = SA_RESTART | SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    return sigaction(StackSignal(), &sa, nullptr) == 0;
  }();
  return installed;
}

std::vector<int> ListTasks() {
  std::vector<int> tids;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return tids;
  while (struct dirent* e = readdir(d)) {
    char* end = nullptr;
    const long tid = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && tid > 0) tids.push_back(static_cast<int>(tid));
  }
  closedir(d);
  std::sort(tids.begin(), tids.end());
  return tids;
}

std::string ThreadName(int tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(f, name);
  for (char& c : name)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return name;
}

const std::string& ExecutablePath() {
  static const std::string path = [] {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("(executable)");
  }();
  return path;
}

std::string Demangle(const char* name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || d == nullptr) return name;
  std::string out = d;
  std::free(d);
  return out;
}

// `return_address`: the frame's pc is where its call returns to, which may already lie past the
// end of the calling function (a call to a noreturn function ends it): look up the byte before.
std::string Symbolize(uintptr_t pc, bool return_address) {
  const uintptr_t lookup = return_address && pc > 0 ? pc - 1 : pc;
  Dl_info info = {};
  link_map* map = nullptr;
  if (dladdr1(reinterpret_cast<void*>(lookup), &info, reinterpret_cast<void**>(&map),
              RTLD_DL_LINKMAP) == 0 ||
      map == nullptr)
    return fmt::format("0x{:x}", pc);
  // The main program's link map has an empty name. l_addr is the load bias, so the offset is
  // what addr2line takes for position-independent and fixed-address binaries alike.
  const std::string module = map->l_name[0] == '\0' ? ExecutablePath() : map->l_name;
  const uintptr_t offset = pc - map->l_addr;
  if (info.dli_sname == nullptr) return fmt::format("{}+0x{:x}", module, offset);
  return fmt::format("{}+0x{:x} ({}+0x{:x})", Demangle(info.dli_sname),
                     pc - reinterpret_cast<uintptr_t>(info.dli_saddr), module, offset);
}

std::vector<std::string> SymbolizeAll(void* const* pcs, int n, uintptr_t exact_pc) {
  // A signalled thread's frames begin with the handler and the kernel's signal trampoline; its
  // own stack begins at the interrupted instruction (an exact pc, not a return address).
  int first = 0;
  if (exact_pc != 0) {
    for (int i = 0; i < n; ++i)
      if (reinterpret_cast<uintptr_t>(pcs[i]) == exact_pc) {
        first = i;
        break;
      }
  }
  std::vector<std::string> frames;
  for (int i = first; i < n; ++i) {
    const uintptr_t pc = reinterpret_cast<uintptr_t>(pcs[i]);
    frames.push_back(Symbolize(pc, !(exact_pc != 0 && i == first && pc == exact_pc)));
  }
  return frames;
}

}  // namespace

std::vector<ThreadStack> CaptureAllThreadStacks(int max_frames) {
  static std::mutex one_at_a_time;
  std::lock_guard<std::mutex> lock(one_at_a_time);
  max_frames = std::clamp(max_frames, 1, kMaxFrames);
  const bool installed = InstallHandlerOnce();
  const int self = static_cast<int>(syscall(SYS_gettid));
  const int pid = static_cast<int>(getpid());

  // This thread unwinds itself; frame 0 (this function) is dropped.
  void* own[kMaxFrames + 1];
  const int own_depth = backtrace(own, max_frames + 1);

  std::vector<ThreadStack> out;
  std::vector<int> slot_of;  // per entry of `out`: its slot, or -1
  int next_slot = 0;
  for (int tid : ListTasks()) {
    ThreadStack t;
    t.tid = tid;
    t.name = ThreadName(tid);
    t.is_caller = tid == self;
    int slot = -1;
    if (!t.is_caller && installed) {
      // A slot a stuck handler still writes into from an earlier call stays out of use.
      while (next_slot < kMaxSlots && g_slots[next_slot].state.load() == kWriting) ++next_slot;
      if (next_slot < kMaxSlots) {
        slot = next_slot++;
        g_slots[slot].tid.store(tid, std::memory_order_relaxed);
        g_slots[slot].state.store(kPending, std::memory_order_release);
      }
    }
    slot_of.push_back(slot);
    out.push_back(std::move(t));
  }
  g_armed_slots.store(next_slot, std::memory_order_release);

  for (size_t i = 0; i < out.size(); ++i) {
    if (slot_of[i] < 0) continue;
    // A thread that exited since the listing cannot answer; it is dropped below.
    if (syscall(SYS_tgkill, pid, out[i].tid, StackSignal()) != 0 && errno == ESRCH)
      g_slots[slot_of[i]].state.store(kIdle);
  }

  const auto deadline = std::chrono::steady_clock::now() + kReplyWait;
  for (;;) {
    bool waiting = false;
    for (int s : slot_of)
      if (s >= 0 && g_slots[s].state.load(std::memory_order_acquire) != kDone &&
          g_slots[s].state.load(std::memory_order_acquire) != kIdle)
        waiting = true;
    if (!waiting || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  std::vector<ThreadStack> result;
  for (size_t i = 0; i < out.size(); ++i) {
    ThreadStack& t = out[i];
    const int s = slot_of[i];
    if (t.is_caller) {
      t.frames = SymbolizeAll(own + 1, std::max(own_depth - 1, 0), 0);
      // Sanitizer builds interpose backtrace(), which can leave this function's own frame on
      // top: the caller's stack begins at its caller.
      while (t.frames.size() > 1 && t.frames[0].find("CaptureAllThreadStacks") != std::string::npos)
        t.frames.erase(t.frames.begin());
    } else if (s >= 0) {
      int expected = kPending;
      if (g_slots[s].state.compare_exchange_strong(expected, kIdle)) {
        t.frames = {kNoReplyFrame};  // taken back: a late handler writes nothing
      } else if (expected == kDone) {
        const Slot& slot = g_slots[s];
        t.frames = SymbolizeAll(slot.pcs, slot.depth, slot.interrupted_pc);
        g_slots[s].state.store(kIdle, std::memory_order_release);
      } else if (expected == kIdle) {
        continue;  // the thread is gone
      } else {
        t.frames = {kNoReplyFrame};  // still unwinding: its slot stays kWriting, out of use
      }
    } else {
      t.frames = {kNoReplyFrame};
    }
    if (static_cast<int>(t.frames.size()) > max_frames) t.frames.resize(max_frames);
    result.push_back(std::move(t));
  }
  return result;
}

}  // namespace keel
