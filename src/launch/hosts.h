// The hosts of `keel launch --hostfile FILE --spare-hosts N`: Open MPI's hostfile format, Slurm's
// node lists (node[01-04]), and the command of one attempt: mpirun gets `--hostfile` of the hosts
// in use (srun `--nodelist`), and, when data parallelism shrinks, a smaller -np (srun --ntasks);
// the rest of the command stays as written.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace keel {

struct HostEntry {
  std::string name;
  int slots = 1;      // ranks it runs (slots=N; 1 when not given)
  std::string extra;  // the rest of its line as written (max_slots=M ...), kept in what is written
};

// Open MPI's hostfile: one host a line, "NAME [slots=N] [max_slots=M] ...", '#' comments, blank
// lines. InvalidArgument naming `path`, the line and the fix: a bad slots value, a host twice.
Status ParseHostfile(const std::string& text, const std::string& path, std::vector<HostEntry>* out);
std::string FormatHostfile(const std::vector<HostEntry>& hosts);

// Slurm's node list ("node[01-04,07],gpu5" -> node01 node02 node03 node04 node07 gpu5), zero
// padding kept. InvalidArgument for an unclosed bracket, a bad range, more than 100000 nodes or a
// name of more than 255 characters.
Status ExpandSlurmNodeList(const std::string& list, std::vector<std::string>* out);

enum class RankLauncher { kMpirun, kSrun, kOther };
RankLauncher RankLauncherOf(const std::vector<std::string>& command);

// Refuses (InvalidArgument) a command whose launcher already chooses hosts (mpirun -H, --host,
// --hostfile, --machinefile; srun -w, --nodelist, -x, --exclude), or whose launcher is neither
// mpirun nor srun: launch would fight the user over them. The message names the argument.
Status CheckCommandTakesHosts(const std::vector<std::string>& command);

// The launcher's rank count as written (mpirun -np/-n/--np/-c, srun -n/--ntasks); -1: not given.
int CommandRankCount(const std::vector<std::string>& command);

// The command of one attempt: after the launcher, `--hostfile PATH` (mpirun) or
// `--nodelist=a,b --nodes=K` (srun, replacing a --nodes/-N of the command); the rank count
// replaced by `ranks` where it is >= 0 and the command gives one (srun: added when not).
std::vector<std::string> CommandForHosts(const std::vector<std::string>& command,
                                         const std::string& hostfile_path,
                                         const std::vector<HostEntry>& hosts, int ranks);

// The value of `--flag X` or `--flag=X` in a command line ("" when absent; the last one given
// wins, as in keel's own parser): launch reads the child's --save and --kill-switch-path so they
// need not be given twice.
std::string CommandFlagValue(const std::vector<std::string>& command, const std::string& flag);

// The command's tensor and pipeline parallel sizes (Megatron's flags; 1 when absent).
int CommandModelParallelSize(const std::vector<std::string>& command);

// The arguments of the command's keel train, `train` first (after mpirun/srun and their flags,
// or after keel); empty when the command shows none (a wrapper script).
std::vector<std::string> CommandTrainArgs(const std::vector<std::string>& command);

// "30" (seconds), "90s", "45m", "2h", "1d"; false when it is not a duration >= 0.
bool ParseDuration(const std::string& text, double* seconds);

}  // namespace keel
