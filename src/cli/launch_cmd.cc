// `keel launch [options] -- COMMAND ARGS...`: run a training job and restart it when it fails or
// hangs (launch/supervisor.h). This file parses and installs the signal handlers; the library
// decides.
#include <fmt/format.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
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
#include "launch/hosts.h"
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

Hosts (--hostfile, or Slurm's node list under srun): each attempt runs on the hosts in use
(mpirun gets --hostfile SAVE/launch-hosts/attempt-N.hosts, srun --nodelist); a failure is pinned
on a host only when the evidence names one (a hang dump's odd one out, a replica mismatch, a
transient fault, mpirun's or srun's report of a dead rank); at --exclude-after such failures the
host is taken out: a spare takes its place, or with --elastic the job goes on with fewer
data-parallel ranks, else launch stops naming the host. An operator readmits hosts by listing
them in SAVE/hosts.readmit (read at the next restart).

examples:
  keel launch --max-restarts 5 -- mpirun -np 8 keel train --save runs/x ...
  keel launch --hostfile hosts --spare-hosts 1 -- mpirun -np 24 keel train --save runs/x ...
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
  app.add_option("--max-restarts", o.max_restarts,
                 "restarts after failures allowed (default 3; launch's own stop "
                 "to take a straggler's host out is not counted)")
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
  std::string hostfile, readmit_after;
  app.add_option("--hostfile", hostfile,
                 "the job's hosts, Open MPI's format (NAME [slots=N] a line); launch gives each "
                 "attempt those in use. Under srun without it: SLURM_JOB_NODELIST, when a host "
                 "option below is given");
  app.add_option("--spare-hosts", o.spare_hosts,
                 "the last N hosts start as spares, swapped in for an excluded host (default 0)")
      ->check(kNonNegative);
  app.add_option("--exclude-after", o.exclude_after,
                 "failures pinned on one host that take it out (default: 1 for a hang or a "
                 "replica mismatch, 2 for a crash or a transient fault)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--straggler-exclude-minutes", o.straggler_exclude_minutes,
                 "a host named a straggler this long is taken out at the next checkpoint, when a "
                 "spare or --elastic can replace it; a planned restart, not counted against "
                 "--max-restarts (default 0: never)")
      ->check(kNonNegative);
  app.add_flag("--elastic", o.elastic,
               "with no spare left, relaunch with fewer data-parallel ranks (the global batch and "
               "LR schedule stay, more micro-batches per rank; whole tensor x pipeline replicas, "
               "their sizes read from the job's --config and flags); off: launch stops");
  app.add_option("--readmit-after", readmit_after,
                 "an excluded host comes back after this long (30m, 2h, 1d; default: never, only "
                 "through SAVE/hosts.readmit)");

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
  if (!readmit_after.empty() && !ParseDuration(readmit_after, &o.readmit_after_seconds)) {
    LogError(
        fmt::format("error: --readmit-after '{}' is not a duration; give e.g. 90s, 30m, 2h "
                    "or 1d",
                    readmit_after));
    return 2;
  }
  const bool host_options = o.spare_hosts > 0 || o.exclude_after > 0 || o.elastic ||
                            o.straggler_exclude_minutes > 0 || !readmit_after.empty();
  if (!hostfile.empty()) {
    std::string text;
    Status st = Env::Default()->ReadFileToString(hostfile, &text);
    if (!st.ok()) {
      LogError(
          fmt::format("error: --hostfile {}: {}; give the file of the job's hosts (one "
                      "NAME [slots=N] a line)",
                      hostfile, st.message()));
      return 2;
    }
    st = ParseHostfile(text, hostfile, &o.hosts);
    if (!st.ok()) {
      LogError("error: --hostfile " + st.message());
      return 2;
    }
    o.hosts_source = hostfile;
  } else if (host_options && RankLauncherOf(o.command) == RankLauncher::kSrun) {
    const char* list = std::getenv("SLURM_JOB_NODELIST");
    if (list == nullptr || *list == '\0') {
      LogError(
          "error: the host options (--spare-hosts, --exclude-after, --elastic, ...) need the "
          "hosts: give --hostfile FILE, or run in a Slurm allocation (SLURM_JOB_NODELIST is not "
          "set)");
      return 2;
    }
    std::vector<std::string> names;
    if (Status st = ExpandSlurmNodeList(list, &names); !st.ok()) {
      LogError("error: SLURM_JOB_NODELIST: " + st.message());
      return 2;
    }
    int per_node = 1;
    if (const char* t = std::getenv("SLURM_NTASKS_PER_NODE"); t != nullptr)
      per_node = std::max(1, std::atoi(t));
    for (const std::string& n : names) o.hosts.push_back({n, per_node, ""});
    o.hosts_source = "SLURM_JOB_NODELIST";
    Log("note: keel launch takes the hosts from SLURM_JOB_NODELIST={} ({} nodes, {} task{} "
        "each)",
        list, names.size(), per_node, per_node == 1 ? "" : "s");
  } else if (host_options) {
    LogError(
        "error: the host options (--spare-hosts, --exclude-after, --elastic, "
        "--straggler-exclude-minutes, --readmit-after) need the hosts: give --hostfile FILE "
        "(Open MPI's format), or run the ranks with srun in a Slurm allocation");
    return 2;
  }
  if (!o.hosts.empty()) {
    Status st = CheckCommandTakesHosts(o.command);
    if (st.ok() && o.spare_hosts >= static_cast<int>(o.hosts.size()))
      st = Status::InvalidArgument(
          fmt::format("--spare-hosts {} leaves no host to run on: {} lists {}; give fewer spares",
                      o.spare_hosts, o.hosts_source, o.hosts.size()));
    if (!st.ok()) {
      LogError("error: " + st.message());
      return 2;
    }
  }

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
