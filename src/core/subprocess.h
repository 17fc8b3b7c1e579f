// What keel's two process starters share (`keel launch`'s child, launch/child_process.h, and
// `keel logs watch --on-event`'s command, logs/event_command.h): the argument and environment
// vectors of an exec, built before fork. After fork a child may call only async-signal-safe
// functions, so nothing it uses may allocate; how each forks, and what its child does before the
// exec, stays with each (a process group and a parent-death signal for the launch, a session and a
// timeout guardian for the hook).
#pragma once

#include <string>
#include <vector>

namespace keel {

// This process's environment (environ) with `added` ("NAME=value") in it: every inherited entry of
// a NAME that `added` sets is dropped, and the entries of `added` come last, in their order.
std::vector<std::string> EnvironmentWith(const std::vector<std::string>& added);

// argv and envp for execve and its kin, null-terminated, owning their strings. Neither copied nor
// moved: the pointers point into the strings it holds.
class ExecVectors {
 public:
  ExecVectors(std::vector<std::string> args, std::vector<std::string> env);
  ExecVectors(const ExecVectors&) = delete;
  ExecVectors& operator=(const ExecVectors&) = delete;

  char* const* argv() const { return argv_.data(); }
  char* const* envp() const { return envp_.data(); }

 private:
  std::vector<std::string> args_, env_;
  std::vector<char*> argv_, envp_;
};

}  // namespace keel
