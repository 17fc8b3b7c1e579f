#include "train/replica_check.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "comm/process_mesh.h"

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

// Who must hold the same bits as whom, for each of ReplicaHashes' entries.
enum class Scope : uint8_t {
  kWorld,  // the train state: every rank
  kStage,  // a tensor replicated across tensor ranks (norms, row-parallel biases): every rank of
           // its pipeline stage
  kSlice,  // a tensor-parallel slice: the ranks of its (tp, pp) position (the data replicas)
};

std::vector<Scope> ScopeOfEntries(Trainer& trainer) {
  std::vector<Scope> out;
  const bool tp = trainer.tensor_size() > 1;
  auto scope = [&](const ParamInfo& p) {
    return tp && !p.split.replicated() ? Scope::kSlice : Scope::kStage;
  };
  for (const ParamInfo& p : trainer.model().params()) out.push_back(scope(p));
  if (!trainer.sharded_optimizer())
    for (const ParamInfo& p : trainer.model().params()) out.insert(out.end(), 2, scope(p));
  out.push_back(Scope::kWorld);
  return out;
}

// Whether each entry is (a moment of) the last stage's copy of the tied word embeddings.
std::vector<bool> TiedCopyEntries(Trainer& trainer) {
  std::vector<bool> out;
  for (const ParamInfo& p : trainer.model().params()) out.push_back(p.tied_copy);
  if (!trainer.sharded_optimizer())
    for (const ParamInfo& p : trainer.model().params()) out.insert(out.end(), 2, p.tied_copy);
  out.push_back(false);
  return out;
}

// One rank's entries as bytes for the all-gather: per entry its scope, whether it is the tied
// copy, its name and its hash (stages hold different tensors, so every rank needs the names).
struct Entry {
  std::string name;
  uint64_t hash = 0;
  Scope scope = Scope::kWorld;
  bool tied_copy = false;
};

std::string Encode(const std::vector<Entry>& entries) {
  std::string out;
  for (const Entry& e : entries) {
    const uint32_t len = static_cast<uint32_t>(e.name.size());
    out.push_back(static_cast<char>(e.scope));
    out.push_back(e.tied_copy ? 1 : 0);
    out.append(reinterpret_cast<const char*>(&len), sizeof(len));
    out.append(e.name);
    out.append(reinterpret_cast<const char*>(&e.hash), sizeof(e.hash));
  }
  return out;
}

std::vector<Entry> Decode(const std::string& bytes) {
  std::vector<Entry> out;
  size_t at = 0;
  while (at + 2 + sizeof(uint32_t) <= bytes.size()) {
    Entry e;
    e.scope = static_cast<Scope>(bytes[at]);
    e.tied_copy = bytes[at + 1] != 0;
    uint32_t len = 0;
    std::memcpy(&len, bytes.data() + at + 2, sizeof(len));
    at += 2 + sizeof(len);
    if (at + len + sizeof(uint64_t) > bytes.size()) break;
    e.name = bytes.substr(at, len);
    std::memcpy(&e.hash, bytes.data() + at + len, sizeof(e.hash));
    at += len + sizeof(uint64_t);
    out.push_back(std::move(e));
  }
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
  const auto hashes = ReplicaHashes(trainer);
  const std::vector<Scope> scope = ScopeOfEntries(trainer);
  const std::vector<bool> tied = TiedCopyEntries(trainer);
  std::vector<Entry> mine(hashes.size());
  for (size_t i = 0; i < hashes.size(); ++i)
    mine[i] = {hashes[i].first, hashes[i].second, scope[i], tied[i]};
  *checked = mine.size();
  std::vector<std::string> all;
  comm->AllGatherBytes(Encode(mine), &all);
  const int world = static_cast<int>(all.size());
  // The mesh in Megatron's order (comm/process_mesh.h): world rank r's (tp, pp) position.
  const int T = trainer.tensor_size(), P = trainer.pipeline_size();
  const MeshShape shape{T, P, std::max(1, world / std::max(1, T * P))};
  std::vector<std::vector<Entry>> entries(world);
  for (int r = 0; r < world; ++r) entries[r] = Decode(all[r]);
  // Per rank, the tensors where it differs from the majority hash of that tensor.
  std::vector<std::vector<std::string>> differs(world);
  // The ranks of a stage hold the same list of tensors; one whose list differs from its stage's
  // lowest rank's is named for that (its hashes are not compared).
  std::vector<bool> comparable(world, true);
  for (int r = 0; r < world; ++r) {
    const int first = RankOf(shape, {0, CoordsOf(shape, r).pp, 0});
    bool same = entries[r].size() == entries[first].size();
    for (size_t i = 0; same && i < entries[r].size(); ++i)
      same = entries[r][i].name == entries[first][i].name;
    if (!same) {
      comparable[r] = false;
      differs[r].push_back("(a different set of tensors)");
    }
  }
  // Each tensor is voted on among the ranks that must hold it identically: the train state among
  // all ranks, a replicated tensor among its stage's, a slice among its (tp, pp) position's. The
  // last stage's tied copy of the word embeddings votes with the first stage's embedding (the
  // same tp position): the two copies must stay the same bits.
  struct Key {
    std::string name;
    int pp, tp;
    bool operator<(const Key& o) const {
      return std::tie(name, pp, tp) < std::tie(o.name, o.pp, o.tp);
    }
  };
  struct Vote {
    int rank;
    uint64_t hash;
    bool tied_copy;
  };
  std::map<Key, std::vector<Vote>> votes;
  for (int r = 0; r < world; ++r) {
    if (!comparable[r]) continue;
    const MeshCoords c = CoordsOf(shape, r);
    for (const Entry& e : entries[r]) {
      Key k{e.name, e.scope == Scope::kWorld ? -1 : c.pp, e.scope == Scope::kSlice ? c.tp : -1};
      if (e.tied_copy) k.pp = 0;
      votes[k].push_back({r, e.hash, e.tied_copy});
    }
  }
  bool two_copies = false;  // a tensor that differs has only two holders: no majority
  for (const auto& [key, v] : votes) {
    std::map<uint64_t, int> count;
    for (const Vote& x : v) ++count[x.hash];
    if (count.size() <= 1) continue;
    uint64_t majority = 0;
    int best = 0;
    for (const Vote& x : v)  // ties go to the lowest rank's value (v is in rank order)
      if (count[x.hash] > best) best = count[x.hash], majority = x.hash;
    for (const Vote& x : v) {
      if (x.hash == majority) continue;
      differs[x.rank].push_back(x.tied_copy ? key.name + " (the last stage's tied copy)"
                                            : key.name);
    }
    two_copies |= v.size() == 2;
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
        "{}rank {} (host {}) differs in {} of {} tensors{}: {}", bad > 1 ? "; " : "", r,
        r < static_cast<int>(hosts.size()) ? hosts[r] : "?", differs[r].size(), entries[r].size(),
        // After "(host H) differs": launch's blame reads the host from that pattern.
        P > 1 ? " (" + CoordsOf(shape, r).ToString() + ")" : std::string(), names);
  }
  if (bad == 0) return Status::OK();
  std::string who = "data-parallel replicas";
  if (T > 1 || P > 1)
    who = fmt::format("replicas (data-parallel copies of each {}{}{})",
                      P > 1 ? "stage's slice" : "slice",
                      T > 1 ? ", tensor-parallel copies of the replicated norms and biases" : "",
                      P > 1 && !trainer.model().spec().untie_embeddings
                          ? ", the first and last stage's copies of the tied word embeddings"
                          : "");
  return Status::Corruption(fmt::format(
      "replica check at iteration {}: the {} no longer hold the same model: {}{}",
      trainer.state().counters.iteration, who, report,
      two_copies ? " (with two copies, no majority: either may be the damaged one)" : ""));
}

}  // namespace keel
