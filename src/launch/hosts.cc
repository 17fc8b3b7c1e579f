#include "launch/hosts.h"

#include <fmt/format.h>

#include <cstdlib>
#include <set>

namespace keel {
namespace {

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::vector<std::string> Words(const std::string& line) {
  std::vector<std::string> out;
  size_t p = 0;
  while (true) {
    p = line.find_first_not_of(" \t\r", p);
    if (p == std::string::npos) return out;
    const size_t end = std::min(line.find_first_of(" \t\r", p), line.size());
    out.push_back(line.substr(p, end - p));
    p = end;
  }
}

bool ParseCount(const std::string& s, int* v) {
  char* end = nullptr;
  const long n = std::strtol(s.c_str(), &end, 10);
  // All of it: an embedded NUL ends c_str() early.
  if (s.empty() || end != s.c_str() + s.size() || n < 1 || n > 1000000) return false;
  *v = static_cast<int>(n);
  return true;
}

// Where the launcher's own arguments end: at the program it starts (keel, or `train` after a
// wrapper), so a flag of keel train is never taken for one of mpirun's.
size_t LauncherEnd(const std::vector<std::string>& c) {
  for (size_t i = 1; i < c.size(); ++i)
    if (Basename(c[i]) == "keel" || c[i] == "train") return i;
  return c.size();
}

bool IsAny(const std::string& a, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (a == n) return true;
  return false;
}

// The flag part of "--name=value" ("--name"), else the argument itself.
std::string FlagPart(const std::string& a) {
  const size_t eq = a.find('=');
  return a.rfind("--", 0) == 0 && eq != std::string::npos ? a.substr(0, eq) : a;
}

constexpr std::initializer_list<const char*> kMpirunHostFlags = {"-H",
                                                                 "-host",
                                                                 "--host",
                                                                 "-hostfile",
                                                                 "--hostfile",
                                                                 "-machinefile",
                                                                 "--machinefile",
                                                                 "-default-hostfile",
                                                                 "--default-hostfile"};
constexpr std::initializer_list<const char*> kMpirunRankFlags = {"-np", "-n", "--np", "--n", "-c"};
constexpr std::initializer_list<const char*> kSrunHostFlags = {
    "-w", "--nodelist", "-x", "--exclude", "-F", "--nodefile"};
constexpr std::initializer_list<const char*> kSrunRankFlags = {"-n", "--ntasks"};
constexpr std::initializer_list<const char*> kSrunNodeFlags = {"-N", "--nodes"};

// A node number of a bracket range: digits only (strtol would take a sign, blanks, and stop at
// an embedded NUL as if the number ended there).
bool ParseNodeNumber(const std::string& s, long* v) {
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos)
    return false;
  *v = std::stol(s);
  return true;
}

// The most nodes a Slurm node list may name (a range of more was refused already).
constexpr size_t kMaxSlurmNodes = 100000;
// DNS's limit on a host name; it also bounds what a list of kMaxSlurmNodes expands to.
constexpr size_t kMaxHostName = 255;

}  // namespace

Status ParseHostfile(const std::string& text, const std::string& path,
                     std::vector<HostEntry>* out) {
  out->clear();
  std::set<std::string> seen;
  int line_no = 0;
  for (size_t p = 0; p < text.size();) {
    const size_t nl = std::min(text.find('\n', p), text.size());
    std::string line = text.substr(p, nl - p);
    p = nl + 1;
    ++line_no;
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    const std::vector<std::string> w = Words(line);
    if (w.empty()) continue;
    HostEntry h;
    h.name = w[0];
    if (h.name.find('=') != std::string::npos)
      return Status::InvalidArgument(fmt::format(
          "{} line {}: '{}' is not a host name; each line is NAME [slots=N] (Open MPI's hostfile "
          "format), e.g. node01 slots=8",
          path, line_no, h.name));
    for (size_t i = 1; i < w.size(); ++i) {
      const std::string& kv = w[i];
      if (kv.rfind("slots=", 0) == 0) {
        if (!ParseCount(kv.substr(6), &h.slots))
          return Status::InvalidArgument(
              fmt::format("{} line {}: '{}' needs a whole number of at least 1, e.g. slots=8", path,
                          line_no, kv));
      } else if (kv.find('=') != std::string::npos) {
        h.extra += (h.extra.empty() ? "" : " ") + kv;  // max_slots=M and the like: kept as is
      } else {
        return Status::InvalidArgument(
            fmt::format("{} line {}: '{}' after the host name is not KEY=VALUE; each line is NAME "
                        "[slots=N] [max_slots=M], one host a line",
                        path, line_no, kv));
      }
    }
    if (!seen.insert(h.name).second)
      return Status::InvalidArgument(
          fmt::format("{} line {}: host {} is listed twice; list each host once, with slots=N "
                      "for the ranks it runs",
                      path, line_no, h.name));
    out->push_back(std::move(h));
  }
  if (out->empty())
    return Status::InvalidArgument(fmt::format(
        "{} lists no host; write one host a line (NAME [slots=N], Open MPI's hostfile format)",
        path));
  return Status::OK();
}

std::string FormatHostfile(const std::vector<HostEntry>& hosts) {
  std::string s;
  for (const HostEntry& h : hosts)
    s += fmt::format("{} slots={}{}{}\n", h.name, h.slots, h.extra.empty() ? "" : " ", h.extra);
  return s;
}

Status ExpandSlurmNodeList(const std::string& list, std::vector<std::string>* out) {
  out->clear();
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(fmt::format(
        "Slurm node list '{}': {}; expected names and bracket ranges, e.g. node[01-04,07],gpu5",
        list, why));
  };
  // The whole list is capped, not only each range: a short list of many ranges would otherwise
  // expand to millions of names.
  auto too_many = [&] {
    return bad(
        fmt::format("it names more than {} nodes, more than a Slurm job has", kMaxSlurmNodes));
  };
  auto too_long = [&](const std::string& name) {
    return bad(fmt::format("'{}' has {} characters, more than a host name can ({})",
                           name.substr(0, 40) + "...", name.size(), kMaxHostName));
  };
  size_t p = 0;
  while (p < list.size()) {
    // One item: up to a comma outside brackets.
    size_t end = p;
    int depth = 0;
    for (; end < list.size() && (list[end] != ',' || depth > 0); ++end) {
      if (list[end] == '[') ++depth;
      if (list[end] == ']' && --depth < 0) return bad("a ']' without its '['");
    }
    if (depth != 0) return bad("a '[' without its ']'");
    const std::string item = list.substr(p, end - p);
    p = end + 1;
    if (item.empty()) continue;
    const size_t open = item.find('[');
    if (open == std::string::npos) {
      if (out->size() >= kMaxSlurmNodes) return too_many();
      if (item.size() > kMaxHostName) return too_long(item);
      out->push_back(item);
      continue;
    }
    const size_t close = item.find(']', open);
    const std::string prefix = item.substr(0, open), suffix = item.substr(close + 1);
    if (suffix.find('[') != std::string::npos)
      return bad("more than one bracket in '" + item + "'");
    const std::string ranges = item.substr(open + 1, close - open - 1);
    for (size_t q = 0; q <= ranges.size();) {
      const size_t comma = std::min(ranges.find(',', q), ranges.size());
      const std::string r = ranges.substr(q, comma - q);
      q = comma + 1;
      const size_t dash = r.find('-');
      const std::string lo = r.substr(0, dash),
                        hi = dash == std::string::npos ? lo : r.substr(dash + 1);
      long a = 0, b = 0;
      if (!ParseNodeNumber(lo, &a) || !ParseNodeNumber(hi, &b) || b < a || b - a > 100000)
        return bad("'" + r + "' is not a number or a range A-B");
      if (static_cast<size_t>(b - a) >= kMaxSlurmNodes - out->size()) return too_many();
      // The longest name of the range is its last (zero padding to lo's width, at least).
      if (const std::string last = prefix + fmt::format("{:0{}}", b, lo.size()) + suffix;
          last.size() > kMaxHostName)
        return too_long(last);
      for (long n = a; n <= b; ++n)
        out->push_back(prefix + fmt::format("{:0{}}", n, lo.size()) + suffix);
    }
  }
  if (out->empty()) return bad("no node");
  return Status::OK();
}

RankLauncher RankLauncherOf(const std::vector<std::string>& command) {
  if (command.empty()) return RankLauncher::kOther;
  const std::string b = Basename(command[0]);
  if (b == "mpirun" || b == "mpiexec" || b == "orterun" || b == "prterun")
    return RankLauncher::kMpirun;
  if (b == "srun") return RankLauncher::kSrun;
  return RankLauncher::kOther;
}

Status CheckCommandTakesHosts(const std::vector<std::string>& command) {
  const RankLauncher l = RankLauncherOf(command);
  if (l == RankLauncher::kOther)
    return Status::InvalidArgument(fmt::format(
        "--hostfile needs a command that starts the ranks with mpirun (or mpiexec) or srun, "
        "which launch gives the hosts of each attempt; this one starts with '{}'",
        command.empty() ? "" : command[0]));
  const size_t end = LauncherEnd(command);
  for (size_t i = 1; i < end; ++i) {
    const std::string f = FlagPart(command[i]);
    const bool mine = l == RankLauncher::kMpirun
                          ? IsAny(f, kMpirunHostFlags)
                          : IsAny(f, kSrunHostFlags) ||
                                (f.size() > 2 && (f.rfind("-w", 0) == 0 || f.rfind("-x", 0) == 0));
    if (mine)
      return Status::InvalidArgument(fmt::format(
          "the command's '{}' chooses hosts, and so does keel launch --hostfile (it gives {} the "
          "hosts in use for each attempt); remove '{}' from the command and list the hosts in "
          "--hostfile",
          command[i], Basename(command[0]), command[i]));
  }
  return Status::OK();
}

int CommandRankCount(const std::vector<std::string>& command) {
  const RankLauncher l = RankLauncherOf(command);
  const auto& flags = l == RankLauncher::kSrun ? kSrunRankFlags : kMpirunRankFlags;
  if (l == RankLauncher::kOther) return -1;
  const size_t end = LauncherEnd(command);
  int n = -1;
  for (size_t i = 1; i < end; ++i) {
    const std::string& a = command[i];
    if (IsAny(a, flags) && i + 1 < end) {
      if (!ParseCount(command[i + 1], &n)) n = -1;
      ++i;
    } else if (IsAny(FlagPart(a), flags) && a.find('=') != std::string::npos) {
      if (!ParseCount(a.substr(a.find('=') + 1), &n)) n = -1;
    }
  }
  return n;
}

std::vector<std::string> CommandForHosts(const std::vector<std::string>& command,
                                         const std::string& hostfile_path,
                                         const std::vector<HostEntry>& hosts, int ranks) {
  const RankLauncher l = RankLauncherOf(command);
  const size_t end = LauncherEnd(command);
  std::vector<std::string> out = {command[0]};
  bool ranks_given = false;
  const auto& rank_flags = l == RankLauncher::kSrun ? kSrunRankFlags : kMpirunRankFlags;
  if (l == RankLauncher::kMpirun) {
    out.push_back("--hostfile");
    out.push_back(hostfile_path);
  } else if (l == RankLauncher::kSrun) {
    std::string names;
    for (const HostEntry& h : hosts) names += (names.empty() ? "" : ",") + h.name;
    out.push_back("--nodelist=" + names);
    out.push_back(fmt::format("--nodes={}", hosts.size()));
  }
  for (size_t i = 1; i < command.size(); ++i) {
    const std::string& a = command[i];
    if (i >= end) {
      out.push_back(a);
      continue;
    }
    const bool joined = a.find('=') != std::string::npos;
    if (l == RankLauncher::kSrun && IsAny(FlagPart(a), kSrunNodeFlags)) {
      if (!joined) ++i;  // replaced by --nodes above
      continue;
    }
    if (IsAny(FlagPart(a), rank_flags) && ranks >= 0) {
      ranks_given = true;
      if (joined) {
        out.push_back(fmt::format("{}={}", FlagPart(a), ranks));
      } else if (i + 1 < end) {
        out.push_back(a);
        out.push_back(std::to_string(ranks));
        ++i;
      }
      continue;
    }
    out.push_back(a);
  }
  if (l == RankLauncher::kSrun && ranks >= 0 && !ranks_given)
    out.insert(out.begin() + 3, fmt::format("--ntasks={}", ranks));
  return out;
}

std::string CommandFlagValue(const std::vector<std::string>& command, const std::string& flag) {
  std::string value;
  for (size_t i = 0; i < command.size(); ++i) {
    if (command[i] == flag && i + 1 < command.size())
      value = command[++i];
    else if (command[i].rfind(flag + "=", 0) == 0)
      value = command[i].substr(flag.size() + 1);
  }
  return value;
}

int CommandModelParallelSize(const std::vector<std::string>& command) {
  int size = 1;
  // --model-parallel-size: Megatron's old name of the tensor-parallel size.
  for (const char* flag : {"--tensor-model-parallel-size", "--model-parallel-size",
                           "--pipeline-model-parallel-size"}) {
    const std::string v = CommandFlagValue(command, flag);
    int n = 1;
    if (!v.empty() && ParseCount(v, &n)) size *= n;
  }
  return size;
}

std::vector<std::string> CommandTrainArgs(const std::vector<std::string>& command) {
  size_t i = LauncherEnd(command);
  if (i < command.size() && Basename(command[i]) == "keel") ++i;
  if (i >= command.size() || command[i] != "train") return {};
  return std::vector<std::string>(command.begin() + static_cast<std::ptrdiff_t>(i), command.end());
}

bool ParseDuration(const std::string& text, double* seconds) {
  if (text.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !(v >= 0) || v > 1e12) return false;
  const std::string unit = end;
  const double scale = unit.empty() || unit == "s" ? 1
                       : unit == "m"               ? 60
                       : unit == "h"               ? 3600
                       : unit == "d"               ? 86400
                                                   : -1;
  if (scale < 0) return false;
  *seconds = v * scale;
  return true;
}

}  // namespace keel
