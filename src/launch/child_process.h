// ChildProcess: the seam between `keel launch`'s supervisor and the operating system. The
// supervisor starts one child at a time, polls it, finds the job's processes on this host and
// signals them. Production uses NewPosixChildProcess(); tests drive the supervisor with scripted
// children and a fake clock.
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

// The environment variable whose value tags every process a launch's job starts on this host:
// each inherits it (mpirun and srun pass the environment to the ranks they start here), so the
// job is found whatever process group each is in; Open MPI puts every rank in a group of its own.
constexpr const char* kLaunchJobVariable = "KEEL_LAUNCH_JOB";

// The processes of the running job on this host (never launch itself).
struct JobProcesses {
  std::vector<int> ranks;      // keel train processes
  std::vector<int> launchers;  // mpirun, mpiexec, orterun, prterun, srun
  std::vector<int> all;  // every live process tagged or in the child's group (those above too)
};

// Whether `argv0` names a starter of ranks that forwards SIGUSR1 to every rank without killing
// any: Open MPI's mpirun (ess_base_forward_signals) and Slurm's srun. SIGTERM to mpirun reaches
// the ranks too, but it kills them about 1 s later (odls_base_sigkill_timeout), in their save.
bool IsRankLauncher(const std::string& argv0);

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
  // The job's live processes on this host (of the newest child, also after it has ended).
  virtual JobProcesses FindJob() = 0;
  // Sends `sig` to one process.
  virtual void SignalProcess(int pid, int sig) = 0;
  // Sends `sig` to the child's process group and to every process of FindJob(): also after the
  // child itself has ended, so that what it left running (a straggling rank, in a group of its
  // own) can be ended before a restart.
  virtual void SignalGroup(int sig) = 0;

  // When set, the next Start appends the child's stderr to this file instead of launch's own
  // (the supervisor copies it on and reads the launcher's report of a dead rank in it). A file,
  // not a pipe: should launch die, the job writing to it gets no SIGPIPE in its save.
  std::string stderr_file;
};

// Asks the job to save and exit without killing any of it: SIGTERM to each keel train rank on
// this host and SIGUSR1 to each mpirun or srun (which pass it on to every rank, on every host;
// keel train takes SIGUSR1 as it takes SIGTERM). A job with neither (a script launch does not
// know) gets SIGTERM to the child's process group. Returns what was sent, for the log.
std::string AskJobToStop(ChildProcess* child);

// fork, setpgid, execvp. Should this process die first (even by SIGKILL), the job is not left
// running unsupervised: the child gets its stop signal (PR_SET_PDEATHSIG: SIGUSR1 for mpirun or
// srun, SIGTERM otherwise), and a guardian process forked at the first Start, which sees this
// process's end as the end of a pipe, asks the whole job to stop (AskJobToStop) and ends what is
// left after `term_grace_seconds` (SIGTERM, then SIGKILL).
std::unique_ptr<ChildProcess> NewPosixChildProcess(double term_grace_seconds = 120);

}  // namespace keel
