#include "launch/blame.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "watchdog/hang_analysis.h"

namespace keel {
namespace {

using json = nlohmann::json;

json ParseLine(const std::string& line) {
  return json::parse(line, nullptr, /*allow_exceptions=*/false);
}

// The one host of `ranks` in `hosts`, or "" when they are on several (or one is unknown).
std::string OneHost(const std::vector<int>& ranks, const std::map<int, std::string>& hosts) {
  std::set<std::string> names;
  for (int r : ranks) {
    auto it = hosts.find(r);
    if (it == hosts.end() || it->second.empty()) return "";
    names.insert(it->second);
  }
  return names.size() == 1 ? *names.begin() : "";
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return (ranks.size() == 1 ? "rank " : "ranks ") + s;
}

Blame FromHangDumps(Env* env, const std::string& run_dir, const std::string& dir_in) {
  Blame b;
  std::string dir = dir_in;
  if (!env->IsDirectory(dir)) dir = JoinPath(run_dir, dir_in);
  std::vector<HangDump> dumps;
  if (!ReadHangDumps(env, dir, &dumps).ok() || dumps.empty()) return b;
  const HangAnalysis a = AnalyzeHangs(dumps);
  std::map<int, std::string> hosts;
  for (const HangDump& d : dumps) hosts[d.rank] = d.host;
  std::vector<int> odd;
  std::string how;
  bool some_waiting = false, some_not = false;
  for (const HangGroup& g : a.groups) (g.state.in_flight ? some_waiting : some_not) = true;
  if (!a.missing.empty() && a.groups.size() == 1) {
    // Every rank that answered is in one state: the ones that did not answer are the odd ones.
    for (const auto& [r, h] : RankHosts(env, run_dir)) hosts.emplace(r, h);
    odd = a.missing;
    how = "left no dump (its process did not answer) while every other rank waits in one place";
  } else if (some_waiting && some_not) {
    // The ranks outside any collective while the others wait in one stopped the job.
    for (const HangGroup& g : a.groups)
      if (!g.state.in_flight) odd.insert(odd.end(), g.ranks.begin(), g.ranks.end());
    how = "was outside any collective while the other ranks waited in one";
  } else if (a.groups.size() >= 2 && a.groups[0].ranks.size() > a.groups[1].ranks.size()) {
    for (size_t i = 1; i < a.groups.size(); ++i)
      odd.insert(odd.end(), a.groups[i].ranks.begin(), a.groups[i].ranks.end());
    how = "was where no other rank was";
  }
  if (odd.empty()) return b;
  std::sort(odd.begin(), odd.end());
  b.source = dir;
  b.host = OneHost(odd, hosts);
  b.rank = odd.size() == 1 ? odd[0] : -1;
  b.kind = BlameKind::kHang;
  const std::string sentence = a.odd_ones_out.empty() ? how : a.odd_ones_out[0];
  b.evidence = b.host.empty()
                   ? fmt::format("hang dumps {}: the odd ones out ({}) are on several hosts: {}",
                                 dir, RankList(odd), sentence)
                   : fmt::format("hang dumps {}: {} on host {} {}: {}", dir, RankList(odd), b.host,
                                 how, sentence);
  return b;
}

}  // namespace

const char* BlameKindName(BlameKind k) {
  switch (k) {
    case BlameKind::kNone:
      return "none";
    case BlameKind::kHang:
      return "hang";
    case BlameKind::kReplicaMismatch:
      return "replica_mismatch";
    case BlameKind::kTransientFault:
      return "transient_fault";
    case BlameKind::kCrash:
      return "crash";
    case BlameKind::kStraggler:
      return "straggler";
  }
  return "none";
}

std::map<int, std::string> RankHosts(Env* env, const std::string& run_dir) {
  std::map<int, std::string> out;
  const std::string dir = JoinPath(run_dir, "locks");
  std::vector<std::string> names;
  if (!env->IsDirectory(dir) || !env->GetChildren(dir, &names).ok()) return out;
  int64_t world = -1;
  for (const std::string& name : names) {
    if (name.rfind("rank-", 0) != 0 || name.size() < 10 ||
        name.compare(name.size() - 5, 5, ".lock") != 0)
      continue;
    std::string text;
    if (!env->ReadFileToString(JoinPath(dir, name), &text).ok()) continue;
    const json j = ParseLine(text);
    if (!j.is_object() || !j.contains("rank") || !j["rank"].is_number_integer() ||
        !j.contains("host") || !j["host"].is_string())
      continue;
    const int rank = j["rank"].get<int>();
    out[rank] = j["host"].get<std::string>();
    if (rank == 0 && j.contains("world_size") && j["world_size"].is_number_integer())
      world = j["world_size"].get<int64_t>();
  }
  if (world > 0) out.erase(out.lower_bound(static_cast<int>(world)), out.end());
  return out;
}

std::vector<std::string> EventLinesSince(Env* env, const std::string& run_dir, uint64_t from) {
  std::vector<std::string> out;
  const std::string path = JoinPath(run_dir, "events.jsonl");
  uint64_t size = 0;
  if (!env->FileExists(path) || !env->GetFileSize(path, &size).ok() || size <= from) return out;
  std::string text;
  if (!env->ReadFileRange(path, from, static_cast<size_t>(size - from), &text).ok()) return out;
  for (size_t p = 0; p < text.size();) {
    const size_t nl = text.find('\n', p);
    if (nl == std::string::npos) break;  // a line being written
    out.push_back(text.substr(p, nl - p));
    p = nl + 1;
  }
  return out;
}

Blame BlameFromLauncherOutput(const std::string& text) {
  Blame b;
  static const std::regex mpirun(
      R"(process rank (\d+) with PID (\d+) on node (\S+) exited on signal (\d+)( \(([^)]*)\))?)");
  static const std::regex srun(R"(srun: error: ([^:\s]+): tasks? ([0-9,-]+): ([^\n]*))");
  std::smatch m;
  if (std::regex_search(text, m, mpirun)) {
    b.kind = BlameKind::kCrash;
    b.rank = std::atoi(m[1].str().c_str());
    b.host = m[3].str();
    b.source = "the launcher's output";
    b.evidence =
        fmt::format("mpirun: rank {} (pid {}) on node {} exited on signal {}{}", b.rank, m[2].str(),
                    b.host, m[4].str(), m[6].matched ? " (" + m[6].str() + ")" : "");
  } else if (std::regex_search(text, m, srun)) {
    b.kind = BlameKind::kCrash;
    b.host = m[1].str();
    const std::string tasks = m[2].str();
    if (tasks.find_first_of(",-") == std::string::npos) b.rank = std::atoi(tasks.c_str());
    b.source = "the launcher's output";
    b.evidence = fmt::format("srun: {}: task {}: {}", b.host, tasks, m[3].str());
  }
  return b;
}

Blame BlameFailure(Env* env, const std::string& run_dir, const std::vector<std::string>& events,
                   const std::string& launcher_stderr) {
  const std::string source = JoinPath(run_dir, "events.jsonl");
  // The hang dumps first: a hang's odd one out is the strongest evidence there is.
  for (const std::string& line : events) {
    const json e = ParseLine(line);
    if (!e.is_object() || e.value("event", "") != "hang" || !e.contains("dir")) continue;
    if (Blame b = FromHangDumps(env, run_dir, e["dir"].get<std::string>());
        b.kind != BlameKind::kNone)
      return b;
  }
  for (const std::string& line : events) {
    const json e = ParseLine(line);
    if (!e.is_object() || e.value("event", "") != "replica_mismatch") continue;
    // The message names each rank that differs from the majority: "rank R (host H) differs".
    const std::string msg = e.value("message", "");
    static const std::regex named(R"(rank (\d+) \(host ([^)]*)\) differs)");
    std::set<std::string> hosts;
    int rank = -1;
    for (auto it = std::sregex_iterator(msg.begin(), msg.end(), named);
         it != std::sregex_iterator(); ++it) {
      hosts.insert((*it)[2].str());
      rank = std::atoi((*it)[1].str().c_str());
    }
    Blame b;
    b.kind = BlameKind::kReplicaMismatch;
    b.source = source;
    // Two replicas have no majority: the one named may be the healthy one.
    const bool majority = msg.find("no majority") == std::string::npos;
    if (hosts.size() == 1 && majority) {
      b.host = *hosts.begin();
      b.rank = rank;
    }
    b.evidence =
        fmt::format("replica_mismatch at iteration {}: {}", e.value("iteration", int64_t{0}), msg);
    return b;
  }
  const Blame crash = BlameFromLauncherOutput(launcher_stderr);
  if (crash.kind != BlameKind::kNone && !crash.host.empty()) return crash;
  for (const std::string& line : events) {
    const json e = ParseLine(line);
    if (!e.is_object() || e.value("event", "") != "transient_fault" || !e.contains("ranks") ||
        !e["ranks"].is_array() || e["ranks"].empty())
      continue;
    std::vector<int> ranks;
    for (const json& r : e["ranks"])
      if (r.is_number_integer()) ranks.push_back(r.get<int>());
    Blame b;
    b.kind = BlameKind::kTransientFault;
    b.source = source;
    b.host = OneHost(ranks, RankHosts(env, run_dir));
    b.rank = ranks.size() == 1 ? ranks[0] : -1;
    b.evidence = fmt::format("transient_fault at iteration {}: the rerun gave other bits on {}{}",
                             e.value("iteration", int64_t{0}), RankList(ranks),
                             b.host.empty() ? "" : " (host " + b.host + ")");
    return b;
  }
  return crash;
}

}  // namespace keel
