#include "launch/child_process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <fmt/format.h>

#include <set>

extern char** environ;

namespace keel {

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : fmt::format("signal {}", sig);
}

namespace {

class PosixChildProcess : public ChildProcess {
 public:
  Status Start(const std::vector<std::string>& argv, const std::vector<std::string>& env,
               int* pid_out) override {
    if (argv.empty()) return Status::InvalidArgument("no command to run");
    if (running_) return Status::Internal("a child is still running");
    // The environment is built before fork: the child only calls async-signal-safe functions.
    std::set<std::string> replaced;
    for (const std::string& e : env) replaced.insert(e.substr(0, e.find('=')));
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) {
      const std::string entry = *e;
      if (!replaced.count(entry.substr(0, entry.find('=')))) env_strings.push_back(entry);
    }
    env_strings.insert(env_strings.end(), env.begin(), env.end());
    std::vector<char*> envp, args;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_copy = argv;
    for (std::string& a : argv_copy) args.push_back(a.data());
    args.push_back(nullptr);

    // A close-on-exec pipe reports a failed exec (its errno); a successful one closes it.
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
      return Status::IOError(fmt::format("cannot create a pipe: {}", strerror(errno)));
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
      const int err = errno;
      close(fds[0]);
      close(fds[1]);
      return Status::IOError(fmt::format("cannot fork: {}", strerror(err)));
    }
    if (pid == 0) {
      close(fds[0]);
      setpgid(0, 0);
      signal(SIGPIPE, SIG_DFL);  // launch ignores it; the job gets the usual behaviour
#ifdef __linux__
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(127);  // the supervisor died before prctl took effect
#endif
      execvpe(args[0], args.data(), envp.data());
      const int err = errno;
      (void)!write(fds[1], &err, sizeof(err));
      _exit(127);
    }
    close(fds[1]);
    setpgid(pid, pid);  // also here: a signal sent right after Start must reach the group
    int err = 0;
    ssize_t n;
    do {
      n = read(fds[0], &err, sizeof(err));
    } while (n < 0 && errno == EINTR);
    close(fds[0]);
    if (n == static_cast<ssize_t>(sizeof(err))) {
      int status;
      waitpid(pid, &status, 0);
      return Status::InvalidArgument(fmt::format("cannot run '{}': {}", argv[0], strerror(err)));
    }
    pid_ = pid;
    running_ = true;
    *pid_out = pid;
    return Status::OK();
  }

  bool Poll(ChildExit* exit) override {
    if (!running_) {
      *exit = last_;
      return true;
    }
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == 0 || (r < 0 && errno == EINTR)) return false;
    running_ = false;
    *exit = ChildExit{};
    if (r < 0) {
      exit->code = 1;  // not ours to wait for any more (should not happen): a failure
    } else if (WIFSIGNALED(status)) {
      exit->signaled = true;
      exit->signal = WTERMSIG(status);
    } else {
      exit->code = WEXITSTATUS(status);
    }
    last_ = *exit;
    return true;
  }

  void SignalGroup(int sig) override {
    if (pid_ > 0) kill(-pid_, sig);
  }

 private:
  pid_t pid_ = -1;  // also the process group's id
  bool running_ = false;
  ChildExit last_;
};

}  // namespace

std::unique_ptr<ChildProcess> NewPosixChildProcess() {
  return std::make_unique<PosixChildProcess>();
}

}  // namespace keel
