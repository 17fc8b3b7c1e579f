// ChildProcess: the seam between `keel launch`'s supervisor and the operating system. The
// supervisor starts one child at a time, polls it, and signals its whole process group (mpirun or
// srun and the ranks they start). Production uses NewPosixChildProcess(); tests drive the
// supervisor with scripted children and a fake clock.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace keel {

// How a child ended: its exit status, or the signal that killed it.
struct ChildExit {
  bool signaled = false;
  int code = 0;    // exit status (when !signaled)
  int signal = 0;  // the signal that ended it (when signaled)
};

// "SIGKILL", "SIGSEGV", ..., or "signal 42".
std::string SignalName(int sig);

class ChildProcess {
 public:
  virtual ~ChildProcess() = default;
  // Starts `argv` (searched on PATH) in a new process group with `env` ("NAME=value") added to
  // this process's environment. InvalidArgument when it cannot be executed (not found, not
  // executable): starting it again would fail the same way.
  virtual Status Start(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                       int* pid) = 0;
  // Never blocks: true once the child has ended (reaped), with how.
  virtual bool Poll(ChildExit* exit) = 0;
  // Sends `sig` to the child's process group; also after the child itself has ended, so that
  // what it left running in its group (a straggling rank) can be ended before a restart.
  virtual void SignalGroup(int sig) = 0;
};

// fork, setpgid, execvp; the child also gets SIGTERM should this process die first (Linux), so a
// supervisor killed outright does not leave the job running unsupervised.
std::unique_ptr<ChildProcess> NewPosixChildProcess();

}  // namespace keel
