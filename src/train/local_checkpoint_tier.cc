#include "train/local_checkpoint_tier.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "core/timestamp.h"

namespace keel {
namespace {

using json = nlohmann::json;

// A WritableFile that appends to a string: a safetensors image built in memory for the ring.
class StringFile : public WritableFile {
 public:
  explicit StringFile(std::string* out) : out_(out) {}
  Status Append(std::string_view data) override {
    out_->append(data);
    return Status::OK();
  }
  Status Flush() override { return Status::OK(); }
  Status Sync() override { return Status::OK(); }
  Status Close() override { return Status::OK(); }

 private:
  std::string* out_;
};

void PutU64(std::string* s, uint64_t v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

bool GetU64(const std::string& s, size_t* pos, uint64_t* v) {
  if (s.size() - *pos < sizeof(*v)) return false;
  std::memcpy(v, s.data() + *pos, sizeof(*v));
  *pos += sizeof(*v);
  return true;
}

constexpr char kPieceMagic[] = "keel-piece-1";

// The bytes of `dir`'s files as its manifest lists them (the directory verified already).
Status ReadPieceFiles(Env* env, const std::string& dir, std::vector<CheckpointFile>* out) {
  Manifest m;
  KEEL_RETURN_IF_ERROR(ReadManifest(env, dir, &m));
  out->clear();
  for (const ManifestEntry& e : m.files) {
    CheckpointFile f;
    f.name = e.name;
    KEEL_RETURN_IF_ERROR(env->ReadFileToString(JoinPath(dir, e.name), &f.bytes, e.size + 1));
    out->push_back(std::move(f));
  }
  return Status::OK();
}

// Keeps the newest `keep` checkpoints of `root`, removing older ones (a local tier's own
// retention: no pins, no marker rules, nothing any other tool reads).
void KeepNewest(Env* env, CheckpointStore* store, int keep) {
  std::vector<CheckpointInfo> all;
  if (!store->List(&all).ok()) return;
  for (size_t i = 0; i + keep < all.size(); ++i) (void)env->RemoveDirRecursive(all[i].path);
}

std::string NewRunId() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return HexDigest(v);
}

}  // namespace

Status EncodePieceFiles(const std::vector<CheckpointFile>& files, std::string* out) {
  out->assign(kPieceMagic, sizeof(kPieceMagic) - 1);
  PutU64(out, files.size());
  for (const CheckpointFile& f : files) {
    PutU64(out, f.name.size());
    out->append(f.name);
    std::string bytes;
    if (f.safetensors) {
      StringFile sf(&bytes);
      KEEL_RETURN_IF_ERROR(AppendSafetensors(&sf, f.tensors, f.metadata));
    }
    const std::string& data = f.safetensors ? bytes : f.bytes;
    PutU64(out, data.size());
    out->append(data);
  }
  return Status::OK();
}

Status DecodePieceFiles(const std::string& s, std::vector<CheckpointFile>* out) {
  const Status bad = Status::Corruption(
      "a local checkpoint piece received from another rank is "
      "malformed (a keel bug or a damaged transfer)");
  out->clear();
  const size_t magic = sizeof(kPieceMagic) - 1;
  if (s.compare(0, magic, kPieceMagic) != 0) return bad;
  size_t pos = magic;
  uint64_t count = 0;
  if (!GetU64(s, &pos, &count) || count > s.size()) return bad;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t n = 0;
    CheckpointFile f;
    if (!GetU64(s, &pos, &n) || n > s.size() - pos) return bad;
    f.name = s.substr(pos, n);
    pos += n;
    if (!GetU64(s, &pos, &n) || n > s.size() - pos) return bad;
    f.bytes = s.substr(pos, n);
    pos += n;
    if (f.name.empty() || f.name.find('/') != std::string::npos) return bad;
    out->push_back(std::move(f));
  }
  return pos == s.size() ? Status::OK() : bad;
}

LocalCheckpointTier::LocalCheckpointTier(Env* env, Communicator* comm, std::string root, Logger log)
    : env_(env), comm_(comm), root_(std::move(root)), log_(std::move(log)) {
  run_dir_ = root_.substr(0, root_.find_last_of('/'));  // Open joins it with rank-R-of-N
  rank_ = comm_->rank();
  world_ = comm_->world_size();
  prev_ = (rank_ - 1 + world_) % world_;
  own_ = std::make_unique<CheckpointStore>(env_, JoinPath(root_, "own"), log_);
  if (world_ > 1)
    replica_ = std::make_unique<CheckpointStore>(
        env_, JoinPath(root_, fmt::format("replica-of-rank-{}", prev_)), log_);
}

Status LocalCheckpointTier::Open(Env* env, Communicator* comm, const TrainConfig& cfg, Logger log,
                                 std::unique_ptr<LocalCheckpointTier>* out) {
  const std::string id_path = JoinPath(cfg.save, kLocalTierIdFile);
  Status st;
  if (comm->rank() == 0 && !env->FileExists(id_path)) {
    // The run's id: local pieces of a --save that was deleted and made anew never match it.
    json j = {{"format", "keel-local-checkpoints"},
              {"id", NewRunId()},
              {"created_at", UtcTimestamp()},
              {"dir", cfg.non_persistent_local_ckpt_dir}};
    st = WriteFileAtomic(env, id_path, j.dump(2) + "\n");
  }
  KEEL_RETURN_IF_ERROR(comm->AgreeOnStatus(st));
  std::string text, id;
  st = env->ReadFileToString(id_path, &text, 1 << 16);
  if (st.ok()) {
    const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("id") && j["id"].is_string()) id = j["id"].get<std::string>();
    if (id.empty() || id.find_first_not_of("0123456789abcdef") != std::string::npos)
      st = Status::Corruption(
          id_path +
          " is not keel's local-checkpoint id file (damaged or edited); remove it: the run's "
          "local checkpoints are then ignored and new ones are written");
  }
  const std::string root = JoinPath(JoinPath(cfg.non_persistent_local_ckpt_dir, "keel-local-" + id),
                                    fmt::format("rank-{}-of-{}", comm->rank(), comm->world_size()));
  if (st.ok()) {
    // Node-local: every rank probes its own directory.
    const std::string probe = JoinPath(root, ".keel-write-test");
    Status w = env->CreateDirs(root);
    if (w.ok()) w = WriteFileAtomic(env, probe, "ok\n");
    if (w.ok()) w = env->RemoveFile(probe);
    if (!w.ok())
      st = Status::InvalidArgument(fmt::format(
          "--non-persistent-local-ckpt-dir {} is not writable on rank {}: {}; give a writable "
          "node-local directory (e.g. /dev/shm/keel) or drop --non-persistent-save-interval",
          cfg.non_persistent_local_ckpt_dir, comm->rank(), w.message()));
  }
  std::unique_ptr<LocalCheckpointTier> tier;
  if (st.ok()) {
    tier.reset(new LocalCheckpointTier(env, comm, root, log));
    st = tier->own_->Recover();
    if (st.ok() && tier->replica_) st = tier->replica_->Recover();
  }
  KEEL_RETURN_IF_ERROR(comm->AgreeOnStatus(st));
  *out = std::move(tier);
  return Status::OK();
}

std::string LocalCheckpointTier::Describe() const {
  return world_ == 1 ? root_
                     : fmt::format("{} (with the replica of rank {}'s piece)", root_, prev_);
}

void LocalCheckpointTier::ExchangeRing(const std::string& mine, std::string* from_prev) {
  // The bytes travel as floats (padded to 4); the size goes first as two floats' bits. Even
  // ranks send first and odd ones receive first, so blocking sends never wait in a circle.
  const int next = (rank_ + 1) % world_;
  auto send = [&] {
    const uint64_t n = mine.size();
    float head[2];
    std::memcpy(head, &n, sizeof(n));
    comm_->Send(head, 2, next);
    std::vector<float> body((n + 3) / 4);
    if (!body.empty()) mine.copy(reinterpret_cast<char*>(body.data()), n);
    if (!body.empty()) comm_->Send(body.data(), body.size(), next);
  };
  auto recv = [&] {
    float head[2];
    comm_->Recv(head, 2, prev_);
    uint64_t n = 0;
    std::memcpy(&n, head, sizeof(n));
    std::vector<float> body((n + 3) / 4);
    if (!body.empty()) comm_->Recv(body.data(), body.size(), prev_);
    from_prev->assign(reinterpret_cast<const char*>(body.data()), n);
  };
  if (rank_ % 2 == 0) {
    send();
    recv();
  } else {
    recv();
    send();
  }
}

Status LocalCheckpointTier::Save(int64_t it, const std::vector<CheckpointFile>& files,
                                 const Status& built, std::string* summary) {
  Status st = built;
  SaveStats own_stats;
  if (st.ok()) st = own_->Save(it, files, &own_stats);
  if (st.ok()) KeepNewest(env_, own_.get(), kKeep);
  *summary = fmt::format("{:.1f} MB", static_cast<double>(own_stats.bytes) / 1e6);
  if (world_ == 1) return st;
  // The replica: this rank's piece goes to the next rank, the previous rank's comes here. Every
  // rank takes part even when its own save failed (it then sends nothing), so none waits.
  std::string mine, theirs;
  if (built.ok() && !EncodePieceFiles(files, &mine).ok()) mine.clear();
  ExchangeRing(mine, &theirs);
  mine = std::string();  // the memory goes before the replica is written
  Status rst;
  if (theirs.empty()) {
    rst = Status::IOError(
        fmt::format("rank {} sent no piece for iteration {} (its save failed)", prev_, it));
  } else {
    std::vector<CheckpointFile> replica;
    SaveStats rstats;
    rst = DecodePieceFiles(theirs, &replica);
    theirs = std::string();
    if (rst.ok()) rst = replica_->Save(it, replica, &rstats);
    if (rst.ok()) {
      KeepNewest(env_, replica_.get(), kKeep);
      *summary += fmt::format(", replica of rank {} {:.1f} MB", prev_,
                              static_cast<double>(rstats.bytes) / 1e6);
    }
  }
  if (!rst.ok())
    log_(
        fmt::format("WARNING: local checkpoint {}: the replica of rank {}'s piece was not "
                    "stored: {} (its own copy is unaffected)",
                    it, prev_, rst.message()));
  return st;
}

std::vector<int64_t> LocalCheckpointTier::ValidPieces(CheckpointStore* store, int64_t after,
                                                      std::vector<std::string>* notes) {
  std::vector<int64_t> valid;
  std::vector<CheckpointInfo> all;
  if (!env_->IsDirectory(store->root()) || !store->List(&all).ok()) return valid;
  for (const CheckpointInfo& c : all) {
    if (c.iteration <= after) continue;
    Status st = VerifyCheckpointDir(env_, c.path, /*check_contents=*/true, nullptr);
    if (st.ok()) {
      valid.push_back(c.iteration);
    } else {
      notes->push_back(fmt::format("local tier: skipping {}: {}", c.path, st.message()));
    }
  }
  return valid;
}

Status LocalCheckpointTier::FindResume(int64_t persistent, std::string* dir,
                                       std::vector<std::string>* notes) {
  int64_t chosen = -1;
  KEEL_RETURN_IF_ERROR(FindResumeHere(persistent, dir, &chosen, notes));
  if (rank_ == 0) NoteOtherRankCounts(persistent, dir->empty() ? -1 : chosen, notes);
  return Status::OK();
}

void LocalCheckpointTier::NoteOtherRankCounts(int64_t persistent, int64_t chosen,
                                              std::vector<std::string>* notes) {
  std::vector<std::string> names;
  if (!env_->GetChildren(run_dir_, &names).ok()) return;
  int64_t newest = std::max(persistent, chosen);
  int ranks = 0;
  std::string where;
  for (const std::string& name : names) {
    int r = -1, k = -1, used = 0;
    if (std::sscanf(name.c_str(), "rank-%d-of-%d%n", &r, &k, &used) != 2 ||
        used != static_cast<int>(name.size()) || k == world_ || k < 1)
      continue;
    // Its own pieces only (a replica is another rank's own piece); the manifest checked, not
    // the contents: this is a note, and the piece is not read.
    CheckpointStore store(env_, JoinPath(JoinPath(run_dir_, name), "own"), nullptr);
    std::vector<CheckpointInfo> all;
    if (!env_->IsDirectory(store.root()) || !store.List(&all).ok()) continue;
    for (const CheckpointInfo& c : all)
      if (c.iteration > newest && VerifyCheckpointDir(env_, c.path, false, nullptr).ok())
        newest = c.iteration, ranks = k, where = JoinPath(run_dir_, fmt::format("rank-*-of-{}", k));
  }
  if (ranks == 0) return;
  const std::string instead = chosen >= 0 ? fmt::format("the local tier's iteration {}", chosen)
                              : persistent >= 0
                                  ? fmt::format("--save instead (iteration {})", persistent)
                                  : std::string(
                                        "--save instead, which holds no valid checkpoint yet: the "
                                        "run starts fresh");
  notes->push_back(fmt::format(
      "local tier: the local checkpoint at iteration {} (in {}) was written by a job of {} ranks "
      "and "
      "is not used by this job of {} (a local checkpoint restores only at the number of ranks "
      "that wrote it); resuming from {}. To continue from it, rerun with {} ranks",
      newest, where, ranks, world_, instead, ranks));
}

Status LocalCheckpointTier::FindResumeHere(int64_t persistent, std::string* dir,
                                           int64_t* chosen_out, std::vector<std::string>* notes) {
  dir->clear();
  // What this rank holds, verified; every rank learns every rank's.
  json mine = {{"own", ValidPieces(own_.get(), persistent, notes)},
               {"replica", replica_ ? ValidPieces(replica_.get(), persistent, notes)
                                    : std::vector<int64_t>()}};
  std::vector<std::string> all;
  comm_->AllGatherBytes(mine.dump(), &all);
  std::vector<std::set<int64_t>> own(world_), held(world_);  // held[r]: rank r's replica
  std::set<int64_t, std::greater<>> candidates;
  for (int r = 0; r < world_; ++r) {
    const json j = json::parse(all[r]);
    for (int64_t i : j["own"]) own[r].insert(i), candidates.insert(i);
    for (int64_t i : j["replica"]) held[r].insert(i), candidates.insert(i);
  }
  // Every rank's piece of L: its own, else the replica on the next rank.
  int64_t chosen = -1;
  std::vector<int> from_replica;
  for (int64_t it : candidates) {
    std::vector<int> replicas;
    int missing = -1;
    for (int r = 0; r < world_ && missing < 0; ++r) {
      if (own[r].count(it)) continue;
      if (world_ > 1 && held[(r + 1) % world_].count(it)) {
        replicas.push_back(r);
        continue;
      }
      missing = r;
    }
    if (missing < 0) {
      chosen = it;
      from_replica = replicas;
      break;
    }
    notes->push_back(fmt::format(
        "local tier: iteration {} cannot be restored: rank {}'s piece is in neither its own "
        "directory nor {}",
        it, missing,
        world_ > 1 ? fmt::format("its replica on rank {}", (missing + 1) % world_)
                   : std::string("(one process: no replica)")));
  }
  *chosen_out = chosen;
  if (chosen < 0) {
    DiscardNewerThan(persistent);
    return Status::OK();
  }
  const std::string persistent_text =
      persistent < 0 ? std::string("--save holds no valid checkpoint")
                     : fmt::format("--save's newest valid checkpoint is iteration {}", persistent);
  if (world_ == 1) {
    *dir = JoinPath(own_->root(), CheckpointDirName(chosen));
    notes->push_back(fmt::format("resuming from the local tier: iteration {} in {} ({}, older)",
                                 chosen, *dir, persistent_text));
    DiscardNewerThan(chosen);
    return Status::OK();
  }
  // The pieces this rank supplies (its own, and the replica its neighbour lacks), gathered by
  // every rank and assembled into one complete checkpoint.
  Status st;
  std::string supply;
  {
    json index = json::array();
    std::string body;
    auto add = [&](int r, CheckpointStore* store) {
      std::vector<CheckpointFile> files;
      std::string bytes;
      if (st.ok())
        st = ReadPieceFiles(env_, JoinPath(store->root(), CheckpointDirName(chosen)), &files);
      if (st.ok()) st = EncodePieceFiles(files, &bytes);
      index.push_back({{"rank", r}, {"size", bytes.size()}});
      body += bytes;
    };
    if (own[rank_].count(chosen)) add(rank_, own_.get());
    if (!own[prev_].count(chosen)) add(prev_, replica_.get());
    supply = index.dump();
    supply.push_back('\n');
    supply += body;
  }
  std::vector<std::string> gathered;
  comm_->AllGatherBytes(st.ok() ? supply : std::string("error\n"), &gathered);
  std::vector<CheckpointFile> files;
  std::set<std::string> names;
  for (const std::string& g : gathered) {
    if (!st.ok()) break;
    const size_t nl = g.find('\n');
    const json index = json::parse(g.substr(0, nl), nullptr, false);
    if (nl == std::string::npos || !index.is_array()) {
      st = Status::IOError("another rank could not read its local piece");
      break;
    }
    size_t pos = nl + 1;
    for (const json& e : index) {
      std::vector<CheckpointFile> piece;
      const size_t n = e["size"].get<size_t>();
      st = pos + n <= g.size() ? DecodePieceFiles(g.substr(pos, n), &piece)
                               : DecodePieceFiles("", &piece);
      pos += n;
      if (!st.ok()) break;
      for (CheckpointFile& f : piece) {
        if (!names.insert(f.name).second) {
          st = Status::Corruption(fmt::format(
              "local pieces of iteration {} both hold {} (a keel bug)", chosen, f.name));
          break;
        }
        files.push_back(std::move(f));
      }
    }
  }
  gathered.clear();
  const std::string restore_root = JoinPath(root_, "restore");
  if (st.ok() && env_->IsDirectory(restore_root)) st = env_->RemoveDirRecursive(restore_root);
  if (st.ok()) {
    CheckpointStore restore(env_, restore_root, log_);
    SaveStats stats;
    st = restore.Save(chosen, files, &stats);
  }
  st = comm_->AgreeOnStatus(st);
  if (!st.ok()) {
    notes->push_back(fmt::format(
        "local tier: iteration {} could not be assembled ({}); resuming from the persistent "
        "tier instead",
        chosen, st.message()));
    DiscardNewerThan(persistent);
    return Status::OK();
  }
  *dir = JoinPath(restore_root, CheckpointDirName(chosen));
  std::string sources;
  for (int r : from_replica)
    sources += fmt::format("; rank {}'s piece from its replica on rank {}", r, (r + 1) % world_);
  notes->push_back(
      fmt::format("resuming from the local tier: iteration {}, assembled in {} ({}, "
                  "older){}",
                  chosen, *dir, persistent_text, sources));
  DiscardNewerThan(chosen);
  return Status::OK();
}

void LocalCheckpointTier::DiscardNewerThan(int64_t iteration) {
  for (CheckpointStore* store : {own_.get(), replica_.get()}) {
    if (store == nullptr || !env_->IsDirectory(store->root())) continue;
    std::vector<CheckpointInfo> all;
    if (!store->List(&all).ok()) continue;
    for (const CheckpointInfo& c : all) {
      if (c.iteration <= iteration) continue;
      Status st = env_->RemoveDirRecursive(c.path);
      log_(st.ok()
               ? fmt::format("note: local tier: removed {}, newer than iteration {} where the "
                             "run continues (another timeline)",
                             c.path, iteration)
               : fmt::format("WARNING: local tier: could not remove {}: {}", c.path, st.message()));
    }
  }
}

}  // namespace keel
