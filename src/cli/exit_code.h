// How a command's failure becomes keel's exit code (core/exit_code.h): 2 when the user can fix
// the call (InvalidArgument: a bad flag, value or path), 1 for a failure at run time.
#pragma once

#include "core/exit_code.h"
#include "core/log.h"
#include "core/status.h"

namespace keel::cli {

// Whether NotFound is the user's doing (the command was given a path that does not exist, and
// that is its only way to fail with NotFound) or a failure at run time.
enum class NotFoundIs { kRuntimeError, kUsageError };

inline ExitCode ExitCodeFor(const Status& st, NotFoundIs not_found = NotFoundIs::kRuntimeError) {
  if (st.ok()) return ExitCode::kSuccess;
  if (st.code() == Status::Code::kInvalidArgument) return ExitCode::kUsageError;
  if (st.code() == Status::Code::kNotFound && not_found == NotFoundIs::kUsageError)
    return ExitCode::kUsageError;
  return ExitCode::kRuntimeFailure;
}

// Logs "error: MESSAGE" on stderr and returns ExitCodeFor(st, not_found) as the process's exit
// status, for `return Fail(st);`.
inline int Fail(const Status& st, NotFoundIs not_found = NotFoundIs::kRuntimeError) {
  LogError("error: " + st.message());
  return ToInt(ExitCodeFor(st, not_found));
}

}  // namespace keel::cli
