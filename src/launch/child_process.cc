#include "launch/child_process.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <set>

#include "core/subprocess.h"

namespace keel {

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : fmt::format("signal {}", sig);
}

namespace {

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The whole of a small /proc file; false when it cannot be read (the process is gone, or not
// ours to look at).
bool ReadProcFile(const std::string& path, std::string* out) {
  out->clear();
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return n == 0;
}

std::string ReadLink(const std::string& path) {
  char buf[4096];
  const ssize_t n = readlink(path.c_str(), buf, sizeof(buf));
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

std::vector<std::string> SplitNul(const std::string& s) {
  std::vector<std::string> out;
  for (size_t p = 0; p < s.size();) {
    const size_t end = std::min(s.find('\0', p), s.size());
    out.push_back(s.substr(p, end - p));
    p = end + 1;
  }
  return out;
}

std::string PidList(const std::vector<int>& pids) {
  std::string s;
  for (int p : pids) s += (s.empty() ? "" : ", ") + std::to_string(p);
  return s;
}

void SleepSeconds(double s) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(s);
  ts.tv_nsec = static_cast<long>((s - static_cast<double>(ts.tv_sec)) * 1e9);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

double MonotonicSeconds() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// How long the last stage of an escalation waits between SIGTERM and SIGKILL.
double KillDelay(double grace) {
  return std::min(5.0, grace);
}

}  // namespace

bool IsRankLauncher(const std::string& argv0) {
  static const std::set<std::string> kLaunchers = {"mpirun", "mpiexec", "orterun", "prterun",
                                                   "srun"};
  return kLaunchers.count(Basename(argv0)) > 0;
}

std::string AskJobToStop(ChildProcess* child) {
  const JobProcesses job = child->FindJob();
  for (int p : job.ranks) child->SignalProcess(p, SIGTERM);
  for (int p : job.launchers) child->SignalProcess(p, SIGUSR1);
  std::vector<std::string> sent;
  if (!job.ranks.empty())
    sent.push_back(fmt::format("SIGTERM to the keel train rank{} on this host (pid {})",
                               job.ranks.size() == 1 ? "" : "s", PidList(job.ranks)));
  if (!job.launchers.empty())
    sent.push_back(fmt::format("SIGUSR1 to mpirun/srun (pid {}), which passes it on to every rank",
                               PidList(job.launchers)));
  if (sent.empty()) {
    // Neither keel train nor a launcher of ranks in sight (a script): the old way, to all of it.
    child->SignalGroup(SIGTERM);
    return "SIGTERM to the job's process group (no keel train rank or mpirun/srun found in it)";
  }
  return sent.size() == 1 ? sent[0] : sent[0] + "; " + sent[1];
}

namespace {

class PosixChildProcess : public ChildProcess {
 public:
  explicit PosixChildProcess(double term_grace_seconds)
      : grace_(term_grace_seconds),
        tag_(fmt::format("{}-{}", getpid(), static_cast<int64_t>(MonotonicSeconds() * 1e9))),
        self_exe_(ReadLink("/proc/self/exe")) {}

  ~PosixChildProcess() override {
    if (guard_fd_ >= 0) close(guard_fd_);  // the guardian's cue: ends what is left, then exits
    if (guardian_ > 0) {
      int status;
      while (waitpid(guardian_, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }

  Status Start(const std::vector<std::string>& argv, const std::vector<std::string>& env,
               int* pid_out) override {
    if (argv.empty()) return Status::InvalidArgument("no command to run");
    if (running_) return Status::Internal("a child is still running");
    if (guardian_ <= 0) StartGuardian();
    // The environment is built before fork: the child only calls async-signal-safe functions.
    std::vector<std::string> added = env;
    added.push_back(fmt::format("{}={}", kLaunchJobVariable, tag_));
    const ExecVectors exec(argv, EnvironmentWith(added));
    // mpirun and srun pass SIGUSR1 on to the ranks; SIGTERM would have mpirun kill them.
    const int death_signal = IsRankLauncher(argv[0]) ? SIGUSR1 : SIGTERM;

    // A close-on-exec pipe reports a failed exec (its errno); a successful one closes it.
    int err_fd = -1;
    if (!stderr_file.empty()) {
      err_fd = open(stderr_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (err_fd < 0)
        return Status::IOError(
            fmt::format("cannot open {} for the job's stderr: {}", stderr_file, strerror(errno)));
    }
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      if (err_fd >= 0) close(err_fd);
      return Status::IOError(fmt::format("cannot create a pipe: {}", strerror(errno)));
    }
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
      const int err = errno;
      close(fds[0]);
      close(fds[1]);
      if (err_fd >= 0) close(err_fd);
      return Status::IOError(fmt::format("cannot fork: {}", strerror(err)));
    }
    if (pid == 0) {
      close(fds[0]);
      if (err_fd >= 0) dup2(err_fd, 2);
      setpgid(0, 0);
      signal(SIGPIPE, SIG_DFL);  // launch ignores it; the job gets the usual behaviour
      // launch may handle these (its stop signals): the job gets the default disposition.
      signal(SIGUSR1, SIG_DFL);
#ifdef __linux__
      prctl(PR_SET_PDEATHSIG, death_signal);
      if (getppid() != parent) _exit(127);  // the supervisor died before prctl took effect
#endif
      execvpe(exec.argv()[0], exec.argv(), exec.envp());
      const int err = errno;
      (void)!write(fds[1], &err, sizeof(err));
      _exit(127);
    }
    close(fds[1]);
    if (err_fd >= 0) close(err_fd);
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
    if (guard_fd_ >= 0) {  // the guardian watches this group from now on
      const int32_t p = pid;
      (void)!write(guard_fd_, &p, sizeof(p));
    }
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

  JobProcesses FindJob() override {
    JobProcesses job;
    const std::string marker = std::string(kLaunchJobVariable) + "=" + tag_;
    DIR* d = opendir("/proc");
    if (d == nullptr) return job;
    const pid_t self = getpid();
    while (const dirent* e = readdir(d)) {
      char* end = nullptr;
      const long pid = std::strtol(e->d_name, &end, 10);
      if (*end != '\0' || pid <= 0 || pid == self) continue;
      const std::string dir = fmt::format("/proc/{}", pid);
      std::string stat;
      if (!ReadProcFile(dir + "/stat", &stat)) continue;
      // "pid (comm) state ppid pgrp ...": comm may hold anything, so parse after its last ')'.
      const size_t paren = stat.rfind(')');
      char state = 0;
      int ppid = 0, pgrp = 0;
      if (paren == std::string::npos ||
          std::sscanf(stat.c_str() + paren + 1, " %c %d %d", &state, &ppid, &pgrp) != 3 ||
          state == 'Z' || state == 'X')
        continue;  // a zombie is gone already: only its parent's wait is missing
      std::string environ_text;
      ReadProcFile(dir + "/environ", &environ_text);
      bool tagged = false;
      for (const std::string& v : SplitNul(environ_text)) tagged = tagged || v == marker;
      if (!tagged && !(pid_ > 0 && pgrp == pid_)) continue;
      job.all.push_back(static_cast<int>(pid));
      std::string cmdline;
      ReadProcFile(dir + "/cmdline", &cmdline);
      const std::vector<std::string> args = SplitNul(cmdline);
      if (args.empty()) continue;
      if (IsRankLauncher(args[0])) {
        job.launchers.push_back(static_cast<int>(pid));
      } else if ((Basename(args[0]) == "keel" ||
                  (!self_exe_.empty() && ReadLink(dir + "/exe") == self_exe_)) &&
                 std::find(args.begin() + 1, args.end(), "train") != args.end()) {
        job.ranks.push_back(static_cast<int>(pid));
      }
    }
    closedir(d);
    std::sort(job.all.begin(), job.all.end());
    std::sort(job.ranks.begin(), job.ranks.end());
    std::sort(job.launchers.begin(), job.launchers.end());
    return job;
  }

  void SignalProcess(int pid, int sig) override {
    if (pid > 0) kill(pid, sig);
  }

  void SignalGroup(int sig) override {
    if (pid_ > 0) kill(-pid_, sig);
    for (int p : FindJob().all) kill(p, sig);
  }

 private:
  // Forks the guardian: it reads the pid of each new child from a pipe, and the pipe's end (this
  // process exited or was killed) is its cue to stop what is left of the job, then exit.
  void StartGuardian() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;  // no guardian; the death signal still works
    const pid_t g = fork();
    if (g < 0) {
      close(fds[0]);
      close(fds[1]);
      return;
    }
    if (g == 0) {
      close(fds[1]);
      setpgid(0, 0);  // a signal to launch's group (Ctrl-C, kill -9 -PGID) must not end it too
      signal(SIGINT, SIG_IGN);
      signal(SIGTERM, SIG_IGN);
      signal(SIGHUP, SIG_IGN);
      signal(SIGUSR1, SIG_IGN);
      signal(SIGPIPE, SIG_IGN);
      Guard(fds[0]);
      _exit(0);
    }
    close(fds[0]);
    guard_fd_ = fds[1];
    guardian_ = g;
  }

  void Guard(int fd) {
    const pid_t launcher = getppid();
    running_ = false;
    int32_t pid = 0;
    ssize_t n;
    while ((n = read(fd, &pid, sizeof(pid))) != 0) {
      if (n == static_cast<ssize_t>(sizeof(pid))) pid_ = pid;
      if (n < 0 && errno != EINTR) break;
    }
    if (FindJob().all.empty()) return;  // launch ended after its job, as it should
    const std::string said = AskJobToStop(this);
    Note(
        fmt::format("keel launch (pid {}) has ended while its job still runs: asked the job to "
                    "save and exit ({}); what is left in {} s is ended",
                    launcher, said, grace_));
    const double deadline = MonotonicSeconds() + grace_;
    while (!FindJob().all.empty() && MonotonicSeconds() < deadline) SleepSeconds(0.1);
    if (FindJob().all.empty()) return;
    SignalGroup(SIGTERM);
    const double kill_at = MonotonicSeconds() + KillDelay(grace_);
    while (!FindJob().all.empty() && MonotonicSeconds() < kill_at) SleepSeconds(0.1);
    if (FindJob().all.empty()) return;
    Note(
        fmt::format("the job of keel launch (pid {}) did not exit within --term-grace-seconds "
                    "{}: sent SIGKILL to what is left",
                    launcher, grace_));
    SignalGroup(SIGKILL);
  }

  static void Note(const std::string& text) {
    const std::string line = "launch guardian: " + text + "\n";
    (void)!write(2, line.data(), line.size());
  }

  double grace_;
  std::string tag_;       // this launch's value of KEEL_LAUNCH_JOB
  std::string self_exe_;  // this binary: a rank runs it too
  pid_t pid_ = -1;        // also the process group's id
  bool running_ = false;
  ChildExit last_;
  int guard_fd_ = -1;  // the write end of the guardian's pipe
  pid_t guardian_ = -1;
};

}  // namespace

std::unique_ptr<ChildProcess> NewPosixChildProcess(double term_grace_seconds) {
  return std::make_unique<PosixChildProcess>(term_grace_seconds);
}

}  // namespace keel
