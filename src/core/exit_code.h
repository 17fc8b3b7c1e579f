// keel's exit codes: the one contract between keel's processes (a rank, mpirun, keel launch, a
// script) written down once. The CLI maps a Status to one, a failing rank ends the job with one,
// the watchdog exits with one, and keel launch decides from one whether to restart. The table is
// in the README ("Exit codes").
#pragma once

namespace keel {

enum class ExitCode : int {
  kSuccess = 0,          // finished, or stopped on purpose (kill switch, a signal) after a save
  kRuntimeFailure = 1,   // a failure at run time (I/O, corruption, out of memory, a bug)
  kUsageError = 2,       // the user can fix the call: a bad flag, value, path or input
  kGuardStopped = 3,     // the guard stopped the run: its rollback budget spent, or nothing to
                         // roll back to; the state was not saved
  kRanksCannotGoOn = 4,  // a hang (the watchdog) or ranks out of step: every rank dumped its
                         // stacks; restarting from the newest checkpoint is the remedy
};

constexpr int ToInt(ExitCode code) {
  return static_cast<int>(code);
}

// What `code` means, for a person ("a usage or configuration error"); nullptr for a code keel
// does not give.
const char* ExitCodeMeaning(int code);

}  // namespace keel
