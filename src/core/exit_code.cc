#include "core/exit_code.h"

namespace keel {

const char* ExitCodeMeaning(int code) {
  switch (static_cast<ExitCode>(code)) {
    case ExitCode::kSuccess:
      return "finished";
    case ExitCode::kRuntimeFailure:
      return "a runtime failure";
    case ExitCode::kUsageError:
      return "a usage or configuration error";
    case ExitCode::kGuardStopped:
      return "the guard stopped the run: unhealthy state";
    case ExitCode::kRanksCannotGoOn:
      return "the ranks could not go on together: a hang or collectives out of step";
  }
  return nullptr;
}

}  // namespace keel
