#include "train/replica_check.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <cstring>
#include <map>

namespace keel {
namespace {

uint64_t HashFloats(Backend* backend, const float* data, size_t n, std::vector<float>* host) {
  host->resize(n);
  backend->CopyToHost(host->data(), data, n);
  return XXH3_64bits(host->data(), n * sizeof(float));
}

uint64_t HashTrainState(const TrainState& s) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, &s.optimizer_step, sizeof(s.optimizer_step));
  XXH3_64bits_update(st, &s.counters, sizeof(s.counters));
  XXH3_64bits_update(st, &s.lr_scale, sizeof(s.lr_scale));
  XXH3_64bits_update(st, &s.data_salt, sizeof(s.data_salt));
  for (const IterationRange& r : s.skip_ranges) XXH3_64bits_update(st, &r, sizeof(r));
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

// Whether each of ReplicaHashes' entries is one tensor-parallel slice (compared only among the
// ranks holding the same slice: the data-parallel replicas) or the same on every rank of the
// world (replicated tensors, their moments, the train state).
std::vector<bool> SliceEntries(Trainer& trainer) {
  std::vector<bool> out;
  const bool tp = trainer.tensor_size() > 1;
  for (const ParamInfo& p : trainer.model().params()) out.push_back(tp && !p.split.replicated());
  if (!trainer.sharded_optimizer())
    for (const ParamInfo& p : trainer.model().params())
      out.insert(out.end(), 2, tp && !p.split.replicated());
  out.push_back(false);
  return out;
}

}  // namespace

std::vector<std::pair<std::string, uint64_t>> ReplicaHashes(Trainer& trainer) {
  std::vector<std::pair<std::string, uint64_t>> out;
  GptModel& model = trainer.model();
  Backend* backend = model.backend();
  std::vector<float> host;
  for (const ParamInfo& p : model.params())
    out.push_back({p.name, HashFloats(backend, model.param_data() + p.offset, p.numel, &host)});
  if (!trainer.sharded_optimizer()) {
    // A replicated optimizer: every rank holds and updates all moments.
    AdamW& opt = trainer.optimizer();
    for (const ParamInfo& p : model.params()) {
      out.push_back(
          {"exp_avg." + p.name, HashFloats(backend, opt.exp_avg() + p.offset, p.numel, &host)});
      out.push_back({"exp_avg_sq." + p.name,
                     HashFloats(backend, opt.exp_avg_sq() + p.offset, p.numel, &host)});
    }
  }
  out.push_back({"train state", HashTrainState(trainer.state())});
  return out;
}

Status CheckReplicas(Trainer& trainer, Communicator* comm, const std::vector<std::string>& hosts,
                     size_t* checked) {
  const auto mine = ReplicaHashes(trainer);
  const std::vector<bool> slice = SliceEntries(trainer);
  // Tensor parallel: world rank r holds tensor rank r % T's slices (tensor ranks adjacent).
  const int T = trainer.tensor_size();
  *checked = mine.size();
  std::string bytes(mine.size() * sizeof(uint64_t), '\0');
  for (size_t i = 0; i < mine.size(); ++i)
    std::memcpy(bytes.data() + i * sizeof(uint64_t), &mine[i].second, sizeof(uint64_t));
  std::vector<std::string> all;
  comm->AllGatherBytes(bytes, &all);
  const int world = static_cast<int>(all.size());
  // Per rank, the tensors where it differs from the majority hash of that tensor.
  std::vector<std::vector<std::string>> differs(world);
  for (int r = 0; r < world; ++r)
    if (all[r].size() != bytes.size()) differs[r].push_back("(a different set of tensors)");
  for (size_t i = 0; i < mine.size(); ++i) {
    // A slice is voted on among the ranks of its tensor rank; anything else among all ranks
    // (a replicated LayerNorm that drifted on one tensor rank is named too).
    const int groups = slice[i] ? T : 1;
    for (int g = 0; g < groups; ++g) {
      std::map<uint64_t, int> votes;
      std::vector<uint64_t> h(world, 0);
      auto member = [&](int r) {
        return all[r].size() == bytes.size() && (groups == 1 || r % T == g);
      };
      for (int r = 0; r < world; ++r) {
        if (!member(r)) continue;
        std::memcpy(&h[r], all[r].data() + i * sizeof(uint64_t), sizeof(uint64_t));
        ++votes[h[r]];
      }
      if (votes.size() <= 1) continue;
      uint64_t majority = 0;
      int best = 0;
      for (int r = 0; r < world; ++r)  // ties go to the lowest rank's value
        if (member(r) && votes[h[r]] > best) best = votes[h[r]], majority = h[r];
      for (int r = 0; r < world; ++r)
        if (member(r) && h[r] != majority) differs[r].push_back(mine[i].first);
    }
  }
  std::string report;
  int bad = 0;
  for (int r = 0; r < world; ++r) {
    if (differs[r].empty()) continue;
    ++bad;
    std::string names;
    for (size_t k = 0; k < differs[r].size() && k < 5; ++k)
      names += (k ? ", " : "") + differs[r][k];
    if (differs[r].size() > 5) names += fmt::format(" and {} more", differs[r].size() - 5);
    report += fmt::format(
        "{}rank {} (host {}) differs in {} of {} tensors: {}", bad > 1 ? "; " : "", r,
        r < static_cast<int>(hosts.size()) ? hosts[r] : "?", differs[r].size(), mine.size(), names);
  }
  if (bad == 0) return Status::OK();
  return Status::Corruption(fmt::format(
      "replica check at iteration {}: the {} no longer hold the same model: {}{}",
      trainer.state().counters.iteration,
      T > 1 ? "replicas (data-parallel copies of each slice, tensor-parallel copies of the "
              "replicated norms and biases)"
            : "data-parallel replicas",
      report, world == 2 ? " (with two ranks, no majority: either may be the damaged one)" : ""));
}

}  // namespace keel
