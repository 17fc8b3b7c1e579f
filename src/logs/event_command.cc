#include "logs/event_command.h"

#include <errno.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>

#include "core/subprocess.h"

namespace keel {
namespace {

volatile sig_atomic_t g_alarm = 0;
void OnAlarm(int) {
  g_alarm = 1;
}

// The guardian, after fork: only async-signal-safe calls. Starts the command in a process group
// of its own, waits for it for `timeout_s`, ends the group if it is still running (SIGTERM, then
// SIGKILL), writes 'T' to `status_fd` when it did, and exits with the command's status.
[[noreturn]] void Guard(char* const* argv, char* const* envp, int stdin_fd, int status_fd,
                        unsigned timeout_s) {
  setsid();  // no controlling terminal: the watcher's Ctrl-C is not ours
  struct sigaction sa = {};
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) sigaction(sig, &sa, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  const pid_t cmd = fork();
  if (cmd < 0) _exit(127);
  if (cmd == 0) {
    setpgid(0, 0);
    if (stdin_fd != 0) {
      dup2(stdin_fd, 0);
      close(stdin_fd);
    }
    execve("/bin/sh", argv, envp);
    _exit(127);
  }
  setpgid(cmd, cmd);
  close(stdin_fd);
  sa.sa_handler = OnAlarm;  // no SA_RESTART: waitpid returns EINTR at the alarm
  sigaction(SIGALRM, &sa, nullptr);
  alarm(timeout_s);
  int status = 0, stage = 0;
  while (waitpid(cmd, &status, 0) < 0) {
    if (errno != EINTR) _exit(127);
    if (!g_alarm) continue;
    g_alarm = 0;
    if (stage++ == 0) {
      (void)!write(status_fd, "T", 1);
      kill(-cmd, SIGTERM);
      alarm(5);
    } else {
      kill(-cmd, SIGKILL);
    }
  }
  _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

class PosixEventCommandRunner : public EventCommandRunner {
 public:
  explicit PosixEventCommandRunner(Env* env) : env_(env) {}

  Status Start(const std::string& label, const std::string& command,
               const std::vector<std::pair<std::string, std::string>>& vars,
               const std::string& stdin_text, double timeout_s) override {
    // Everything the children need is built before fork.
    std::vector<std::string> added;
    for (const auto& [k, v] : vars) added.push_back(k + "=" + v);
    const ExecVectors exec({"sh", "-c", command}, EnvironmentWith(added));
    const unsigned timeout = static_cast<unsigned>(std::max(1.0, std::ceil(timeout_s)));

    // stdin: the JSON is in the pipe before the command starts (it is far below a pipe's
    // capacity; what does not fit is cut), so writing it can neither block nor raise SIGPIPE.
    int in[2], st[2];
    if (pipe2(in, O_CLOEXEC) != 0)
      return Status::IOError(fmt::format("--on-event: cannot create a pipe: {}", strerror(errno)));
    if (pipe2(st, O_CLOEXEC) != 0) {
      const int err = errno;
      close(in[0]);
      close(in[1]);
      return Status::IOError(fmt::format("--on-event: cannot create a pipe: {}", strerror(err)));
    }
    fcntl(in[1], F_SETFL, O_NONBLOCK);
    for (size_t done = 0; done < stdin_text.size();) {
      const ssize_t n = write(in[1], stdin_text.data() + done, stdin_text.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    close(in[1]);
    fcntl(in[0], F_SETFD, 0);  // the command's stdin: kept across exec
    const pid_t pid = fork();
    if (pid < 0) {
      const int err = errno;
      close(in[0]);
      close(st[0]);
      close(st[1]);
      return Status::IOError(fmt::format("--on-event: cannot fork: {}", strerror(err)));
    }
    if (pid == 0) {
      close(st[0]);
      Guard(exec.argv(), exec.envp(), in[0], st[1], timeout);
    }
    close(in[0]);
    close(st[1]);
    children_.push_back({label, pid, st[0], env_->NowMicros(), timeout});
    return Status::OK();
  }

  std::vector<CommandEnd> Reap() override {
    std::vector<CommandEnd> out;
    for (auto it = children_.begin(); it != children_.end();) {
      int status = 0;
      const pid_t r = waitpid(it->pid, &status, WNOHANG);
      if (r == 0 || (r < 0 && errno == EINTR)) {
        ++it;
        continue;
      }
      char t = 0;
      const bool timed_out = read(it->status_fd, &t, 1) == 1 && t == 'T';
      close(it->status_fd);
      const double secs = static_cast<double>(env_->NowMicros() - it->started_us) / 1e6;
      const int code = r > 0 && WIFEXITED(status) ? WEXITSTATUS(status) : 127;
      CommandEnd end{it->label, !timed_out && code == 0, ""};
      if (timed_out)
        end.what = fmt::format("was ended after its timeout of {} s", it->timeout_s);
      else if (code == 127)
        end.what = fmt::format("could not run, or a command in it was not found (status 127)");
      else if (code > 128)
        end.what =
            fmt::format("ended with status {} (signal {}?) after {:.1f} s", code, code - 128, secs);
      else
        end.what = fmt::format("exited with status {} after {:.1f} s", code, secs);
      out.push_back(std::move(end));
      it = children_.erase(it);
    }
    return out;
  }

  int running() const override { return static_cast<int>(children_.size()); }

  ~PosixEventCommandRunner() override {
    // The guardians are left to finish (they end their commands at the timeout); their status
    // pipes are not needed any more.
    for (const Child& c : children_) close(c.status_fd);
  }

 private:
  struct Child {
    std::string label;
    pid_t pid;
    int status_fd;
    uint64_t started_us;
    unsigned timeout_s;
  };
  Env* env_;
  std::vector<Child> children_;
};

}  // namespace

std::unique_ptr<EventCommandRunner> NewPosixEventCommandRunner(Env* env) {
  return std::make_unique<PosixEventCommandRunner>(env);
}

}  // namespace keel
