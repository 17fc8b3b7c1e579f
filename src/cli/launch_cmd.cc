// `keel launch [options] -- COMMAND ARGS...`: run a training job and restart it when it fails or
// hangs (launch/supervisor.h). This file parses and installs the signal handlers; the library
// decides.
#include <fmt/format.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/exit_code.h"
#include "core/log.h"
#include "launch/supervisor.h"

namespace keel::cli {
namespace {

volatile std::sig_atomic_t g_signal = 0;

void OnStopSignal(int sig) {
  if (g_signal == 0) g_signal = sig;
}

constexpr const char* kFooter = R"(
The child's exit code decides (keel's codes):
  0                 finished, or stopped on purpose (kill switch, SIGTERM)  -> launch exits 0
  2                 usage or configuration error: not restarted             -> launch exits 2
  3                 the guard stopped the run (unhealthy): not restarted    -> launch exits 3
  4                 the ranks could not go on (a hang, out of step)         -> restart
  any other, or killed by a signal                                          -> restart
Budget spent: launch gives up and exits with the last child's code (1 for a signal).
SIGTERM, SIGINT or SIGUSR1 to launch: the job is asked to save and exit (SIGTERM to each keel
train rank on this host, SIGUSR1 to mpirun or srun, which pass it on to every rank without
killing any), no restart, exit 0 after a clean save; whatever still runs after
--term-grace-seconds gets SIGTERM, then SIGKILL, and launch exits non-zero.
Without launch, stop a job with `kill -USR1 <mpirun pid>` (SIGTERM to mpirun kills the ranks
1 s after passing it on, in their save); in Slurm, `#SBATCH --signal=USR1@180`.

examples:
  keel launch --max-restarts 5 -- mpirun -np 8 keel train --save runs/x ...
  keel launch -- srun --mpi=pmix keel train --save /shared/runs/x ...   (in an sbatch script)
)";

// A number >= 0 (CLI11's own check prints its range with 300 digits).
const CLI::Validator kNonNegative(
    [](std::string& v) -> std::string {
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !std::isfinite(d) || d < 0)
        return "'" + v + "' is not a number >= 0";
      return "";
    },
    "NUMBER >= 0");

// CLI11 knows no `-- COMMAND ARGS...`; the usage line says it.
class LaunchFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return "Usage: keel launch [OPTIONS] -- COMMAND ARGS...\n";
  }
};

}  // namespace

int LaunchCommand(int argc, const char* const* argv) {
  CLI::App app(
      "Run a training command and restart it when it fails or hangs: the same command again, "
      "which resumes from the newest valid checkpoint of --save. Each restart goes into "
      "SAVE/CHRONICLE.md and events.jsonl; SAVE/launch.status holds one line of state.",
      "keel launch");
  app.formatter(std::make_shared<LaunchFormatter>());
  app.footer(kFooter);
  LaunchOptions o;
  app.add_option("--save", o.save_dir,
                 "the run directory (default: the command's --save); status and journal go here");
  app.add_option("--kill-switch-path", o.kill_switch_path,
                 "while this file exists nothing is (re)started (default: the command's "
                 "--kill-switch-path)");
  app.add_option("--status-file", o.status_file, "one line of state (default SAVE/launch.status)");
  app.add_option("--max-restarts", o.max_restarts, "restarts allowed (default 3)")
      ->check(kNonNegative);
  app.add_option("--max-hours", o.max_hours,
                 "no restart begins after this much wall time (default 0: no limit)")
      ->check(kNonNegative);
  app.add_option("--backoff-seconds", o.backoff_seconds,
                 "wait before a restart; doubles with each consecutive failure, back to this "
                 "after a failure that came after a new checkpoint (default 30)")
      ->check(kNonNegative);
  app.add_option("--max-backoff-seconds", o.max_backoff_seconds,
                 "the longest wait before a restart (default 600)")
      ->check(kNonNegative);
  app.add_option("--term-grace-seconds", o.term_grace_seconds,
                 "after the job is asked to save and exit, how long until it is ended (SIGTERM, "
                 "SIGKILL 5 s later); give more than the longest save (default 120)")
      ->check(kNonNegative);
  app.add_option("--stall-minutes", o.stall_minutes,
                 "restart a job whose SAVE/metrics.jsonl has not changed this long (default 0: "
                 "off; give more than the start-up and the longest save or evaluation)")
      ->check(kNonNegative);

  // Everything after the first `--` is the command, whatever it looks like.
  int split = 1;
  while (split < argc && std::strcmp(argv[split], "--") != 0) ++split;
  const bool has_command = split < argc;
  for (int i = split + 1; i < argc; ++i) o.command.push_back(argv[i]);
  bool help = false;
  for (int i = 1; i < split; ++i)
    help = help || !std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h");
  if (!has_command && !help) {
    LogError(
        "error: keel launch needs `--` before the command it runs: keel launch [options] -- "
        "COMMAND ARGS... (e.g. keel launch -- mpirun -np 8 keel train --save runs/x ...)");
    return 2;
  }
  try {
    app.parse(split, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help, or the error with a hint
    return rc == 0 ? 0 : 2;
  }
  if (o.command.empty()) {
    LogError("error: no command after `--`: keel launch [options] -- COMMAND ARGS...");
    return 2;
  }
  if (o.save_dir.empty()) o.save_dir = CommandFlagValue(o.command, "--save");
  if (o.save_dir.empty()) {
    LogError(
        "error: keel launch needs the run directory, for its status file and journal and to see "
        "the job's progress: pass --save DIR (the command's own --save is used when it has "
        "one)");
    return 2;
  }
  if (o.kill_switch_path.empty())
    o.kill_switch_path = CommandFlagValue(o.command, "--kill-switch-path");

  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);  // Slurm's --signal=B:USR1@N, sent ahead of the time limit
  signal(SIGPIPE, SIG_IGN);  // a log reader gone (`| tee` ended) must not end the supervisor
  Log("keel {} - launch", KEEL_VERSION);
  std::unique_ptr<ChildProcess> child = NewPosixChildProcess(o.term_grace_seconds);
  Supervisor supervisor(o, Env::Default(), child.get(), [] { return static_cast<int>(g_signal); });
  LaunchResult result;
  const Status st = supervisor.Run(&result);
  if (!st.ok()) return Fail(st);
  JournalGoodputSummary(o.save_dir, "launch: ");  // the whole job's, across its attempts
  return result.exit_code;
}

}  // namespace keel::cli
