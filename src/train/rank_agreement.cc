#include "train/rank_agreement.h"

#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_store.h"
#include "config/config.h"
#include "core/host_name.h"
#include "core/timestamp.h"

namespace keel {

namespace {

// The settings every rank must share, one "name = value" line each, keel's version first.
std::vector<std::pair<std::string, std::string>> SharedSettings(const TrainConfig& cfg) {
  std::vector<std::pair<std::string, std::string>> out = {{"keel version", KEEL_VERSION}};
  for (auto& [name, value] : ConfigValues(cfg))
    if (!MayDifferBetweenRanks(name)) out.emplace_back(std::move(name), std::move(value));
  return out;
}

std::string Lines(const std::vector<std::pair<std::string, std::string>>& settings) {
  std::string text;
  for (const auto& [name, value] : settings) text += name + " = " + value + "\n";
  return text;
}

// What a lock file says of its holder, for the messages ("host a, pid 12, rank 0, since ...").
std::string DescribeHolder(const std::string& content) {
  const nlohmann::json j = nlohmann::json::parse(content, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object())
    return "a holder that wrote " +
           nlohmann::json(content.substr(0, 200))
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return fmt::format("host {}, pid {}, rank {}, since {}", j.value("host", "?"), j.value("pid", -1),
                     j.value("rank", -1), j.value("started", "?"));
}

}  // namespace

bool MayDifferBetweenRanks(const std::string& setting) {
  return setting == "threads" || setting == "num-workers";
}

Status AgreeOnConfig(Communicator* comm, const TrainConfig& cfg) {
  if (comm->world_size() == 1) return Status::OK();
  const auto mine = SharedSettings(cfg);
  const std::string text = Lines(mine);
  // The hashes first (8 bytes a rank); the whole settings only when they differ.
  const uint64_t hash = XXH3_64bits(text.data(), text.size());
  std::vector<std::string> hashes;
  comm->AllGatherBytes(std::string(reinterpret_cast<const char*>(&hash), sizeof(hash)), &hashes);
  bool same = true;
  for (const std::string& h : hashes) same = same && h == hashes[0];
  if (same) return Status::OK();

  std::vector<std::string> texts;
  comm->AllGatherBytes(text, &texts);
  // Every rank's value of every setting, in the order of the table.
  std::vector<std::string> order;
  std::map<std::string, std::map<std::string, std::vector<int>>> values;  // name -> value -> ranks
  for (size_t r = 0; r < texts.size(); ++r) {
    size_t at = 0;
    while (at < texts[r].size()) {
      size_t end = texts[r].find('\n', at);
      if (end == std::string::npos) end = texts[r].size();
      const std::string line = texts[r].substr(at, end - at);
      at = end + 1;
      const size_t eq = line.find(" = ");
      if (eq == std::string::npos) continue;
      const std::string name = line.substr(0, eq);
      if (!values.count(name)) order.push_back(name);
      values[name][line.substr(eq + 3)].push_back(static_cast<int>(r));
    }
  }
  std::vector<std::string> differing;
  for (const std::string& name : order) {
    std::vector<std::pair<std::string, std::vector<int>>> groups(values[name].begin(),
                                                                 values[name].end());
    size_t ranks_seen = 0;
    for (const auto& g : groups) ranks_seen += g.second.size();
    if (groups.size() == 1 && ranks_seen == texts.size()) continue;
    // Ranks in order: the group holding rank 0 first.
    std::sort(groups.begin(), groups.end(),
              [](const auto& a, const auto& b) { return a.second[0] < b.second[0]; });
    std::string d = name == "keel version" ? name : "--" + name;
    d += " (";
    for (size_t g = 0; g < groups.size(); ++g)
      d += fmt::format("{}{}: {}", g ? "; " : "", DescribeRanks(groups[g].second), groups[g].first);
    if (ranks_seen < texts.size()) d += "; not set on the others: another keel version";
    differing.push_back(d + ")");
  }
  constexpr size_t kShown = 12;
  std::string list;
  for (size_t i = 0; i < differing.size() && i < kShown; ++i)
    list += (i ? ", " : "") + differing[i];
  if (differing.size() > kShown) list += fmt::format(" and {} more", differing.size() - kShown);
  return Status::InvalidArgument(fmt::format(
      "the ranks of this job were started with different settings: {}. Every rank must run the "
      "same keel with the same flags and --config files (look for an MPMD ':' section or a "
      "per-rank variable in the launch script); only --threads and --num-workers may differ",
      list));
}

std::string RunDirectoryLock::LockPath(const std::string& save_dir, int rank) {
  return JoinPath(JoinPath(save_dir, kLocksDir), fmt::format("rank-{:03d}.lock", rank));
}

Status RunDirectoryLock::Acquire(Env* env, Communicator* comm, const std::string& save_dir,
                                 std::unique_ptr<RunDirectoryLock>* out,
                                 std::vector<std::string>* notes) {
  const int rank = comm->rank();
  const std::string path = LockPath(save_dir, rank);
  const std::string host = ThisHostName();
  const int pid = static_cast<int>(getpid());
  const std::string started = UtcTimestamp();
  // Different for every process and start: what rank 0 wrote is what the others must read back.
  const std::string seed = fmt::format("{}/{}/{}", host, pid, env->NowUnixMicros());
  const std::string token = fmt::format("{:016x}", XXH3_64bits(seed.data(), seed.size()));
  const std::string me = nlohmann::json{{"host", host},       {"pid", pid},
                                        {"rank", rank},       {"world_size", comm->world_size()},
                                        {"started", started}, {"token", token}}
                             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                         "\n";
  std::unique_ptr<FileLock> lock;
  std::string previous;
  Status st = env->CreateDirs(JoinPath(save_dir, kLocksDir));
  if (st.ok()) st = env->LockFile(path, me, &lock, &previous);
  if (st.ok() && lock == nullptr)
    st = Status::InvalidArgument(fmt::format(
        "--save {} is in use by another keel run ({}; its lock {}): two runs writing one "
        "directory would interleave their checkpoints. Wait for that run to end or stop it, or "
        "pass another --save directory",
        save_dir, DescribeHolder(previous), path));
  if (st.ok() && !previous.empty())
    notes->push_back(
        fmt::format("took over the lock {} left by {}: that process ended without releasing it",
                    path, DescribeHolder(previous)));
  KEEL_RETURN_IF_ERROR(comm->AgreeOnStatus(st));

  if (comm->world_size() > 1) {
    // Every rank reads rank 0's lock file back: a rank that finds another token (or none) writes
    // into a different directory (another machine's local disk, another relative path).
    std::vector<std::string> tokens;
    comm->AllGatherBytes(rank == 0 ? token : std::string(), &tokens);
    if (rank != 0) {
      std::string content;
      const std::string rank0_path = LockPath(save_dir, 0);
      const Status read = env->ReadFileToString(rank0_path, &content);
      if (!read.ok() || content.find(tokens[0]) == std::string::npos)
        st = Status::InvalidArgument(fmt::format(
            "rank {} (host {}) does not see the --save directory rank 0 writes: {} {}. Every rank "
            "must see the same --save directory: a shared filesystem when the ranks run on "
            "several machines, and an absolute path when they start in different directories",
            rank, host, rank0_path,
            read.ok()
                ? "holds " + (content.empty() ? std::string("nothing") : DescribeHolder(content)) +
                      " instead of rank 0's lock"
                : "cannot be read (" + read.message() + ")"));
    }
    KEEL_RETURN_IF_ERROR(comm->AgreeOnStatus(st));
  }
  out->reset(new RunDirectoryLock(std::move(lock)));
  return Status::OK();
}

}  // namespace keel
