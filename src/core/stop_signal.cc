#include "core/stop_signal.h"

#include <signal.h>

namespace keel {
namespace {

volatile sig_atomic_t g_signal = 0;

void OnStopSignal(int sig) {
  g_signal = sig;
}

}  // namespace

void InstallStopSignalHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking I/O in a save continues instead of failing with EINTR
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

int PendingStopSignal() {
  return g_signal;
}

void ClearStopSignal() {
  g_signal = 0;
}

}  // namespace keel
