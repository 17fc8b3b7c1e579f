#include "checkpoint/checkpoint_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

namespace keel {

CheckpointStore::CheckpointStore(Env* env, std::string root, Logger log)
    : env_(env), root_(std::move(root)), log_(std::move(log)) {
  if (!log_) log_ = [](const std::string&) {};
}

Status CheckpointStore::Recover() {
  if (read_only_) return Status::OK();
  if (!env_->IsDirectory(root_)) return Status::OK();
  std::vector<std::string> children;
  KEEL_RETURN_IF_ERROR(env_->GetChildren(root_, &children));
  std::sort(children.begin(), children.end());
  for (const std::string& c : children) {
    const std::string p = JoinPath(root_, c);
    if (c.rfind(".tmp.", 0) == 0) {
      log_(fmt::format(
          "WARNING: removing {}: the leftover of a checkpoint save that was interrupted (the "
          "checkpoints saved before it are intact)",
          p));
      KEEL_RETURN_IF_ERROR(env_->RemoveDirRecursive(p));
    } else if (c.rfind(".edit.", 0) == 0) {
      log_(fmt::format(
          "WARNING: removing {}: the leftover of an interrupted `keel ckpt edit` (the checkpoint "
          "itself is complete, with or without the edit; `keel ckpt inspect` shows its history)",
          p));
      KEEL_RETURN_IF_ERROR(env_->RemoveDirRecursive(p));
    } else if (c == std::string(kMarkerFile) + ".tmp" || c == std::string(kPinsFile) + ".tmp") {
      log_(fmt::format("WARNING: removing {}: the leftover of an interrupted update of {}", p,
                       c.substr(0, c.size() - 4)));
      KEEL_RETURN_IF_ERROR(env_->RemoveFile(p));
    }
  }
  return Status::OK();
}

Status CheckpointStore::ReadMarker(int64_t* iteration) {
  const std::string p = JoinPath(root_, kMarkerFile);
  if (!env_->FileExists(p)) return Status::NotFound(p + " does not exist");
  std::string text;
  KEEL_RETURN_IF_ERROR(env_->ReadFileToString(p, &text));
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  int64_t v = 0;
  if (text.empty() || text.size() > 15 ||
      !std::all_of(text.begin(), text.end(), [](char ch) { return std::isdigit(ch); }))
    return Status::Corruption(p + " does not hold an iteration number ('" + text.substr(0, 40) +
                              "')");
  v = std::stoll(text);
  *iteration = v;
  return Status::OK();
}

Status CheckpointStore::WriteMarker(int64_t iteration) {
  if (read_only_) return Status::OK();
  return WriteFileAtomic(env_, JoinPath(root_, kMarkerFile), fmt::format("{}\n", iteration));
}

Status CheckpointStore::ReadPins(std::map<int64_t, std::string>* pins) {
  pins->clear();
  const std::string p = JoinPath(root_, kPinsFile);
  if (!env_->FileExists(p)) return Status::OK();
  std::string text;
  KEEL_RETURN_IF_ERROR(env_->ReadFileToString(p, &text));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status::Corruption(p + " is not a JSON object of iteration -> reason");
  for (auto it = j.begin(); it != j.end(); ++it) {
    int64_t it_num = 0;
    if (!ParseCheckpointDirName(it.key(), &it_num) || !it->is_string())
      return Status::Corruption(p + ": entry '" + it.key() +
                                "' is not \"iter_NNNNNNN\": \"reason\"");
    (*pins)[it_num] = it->get<std::string>();
  }
  return Status::OK();
}

Status CheckpointStore::Pin(int64_t iteration, const std::string& reason) {
  if (read_only_) return Status::OK();
  std::map<int64_t, std::string> pins;
  KEEL_RETURN_IF_ERROR(ReadPins(&pins));
  pins[iteration] = reason;
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [i, r] : pins) j[CheckpointDirName(i)] = r;
  return WriteFileAtomic(env_, JoinPath(root_, kPinsFile), j.dump(2) + "\n");
}

Status CheckpointStore::Unpin(int64_t iteration) {
  if (read_only_) return Status::OK();
  std::map<int64_t, std::string> pins;
  KEEL_RETURN_IF_ERROR(ReadPins(&pins));
  pins.erase(iteration);
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [i, r] : pins) j[CheckpointDirName(i)] = r;
  return WriteFileAtomic(env_, JoinPath(root_, kPinsFile), j.dump(2) + "\n");
}

int64_t CheckpointStore::MarkerOrWarn(const std::string& instead) {
  int64_t marker = -1;
  Status st = ReadMarker(&marker);
  if (st.ok()) return marker;
  if (st.code() != Status::Code::kNotFound) log_("WARNING: " + st.message() + "; " + instead);
  return -1;
}

Status CheckpointStore::List(std::vector<CheckpointInfo>* out) {
  out->clear();
  if (!env_->IsDirectory(root_)) return Status::OK();
  return ListWithMarker(
      MarkerOrWarn("every checkpoint counts as uncommitted until a resume rewrites it"), out);
}

Status CheckpointStore::ListWithMarker(int64_t marker, std::vector<CheckpointInfo>* out) {
  out->clear();
  if (!env_->IsDirectory(root_)) return Status::OK();
  std::vector<std::string> children;
  KEEL_RETURN_IF_ERROR(env_->GetChildren(root_, &children));
  std::map<int64_t, std::string> pins;
  KEEL_RETURN_IF_ERROR(ReadPins(&pins));
  for (const std::string& c : children) {
    CheckpointInfo info;
    if (!ParseCheckpointDirName(c, &info.iteration) || !env_->IsDirectory(JoinPath(root_, c)))
      continue;
    info.name = c;
    info.path = JoinPath(root_, c);
    info.committed = info.iteration <= marker;
    auto p = pins.find(info.iteration);
    if (p != pins.end()) info.pinned = true, info.pin_reason = p->second;
    out->push_back(std::move(info));
  }
  std::sort(out->begin(), out->end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.iteration < b.iteration;
  });
  return Status::OK();
}

Status CheckpointStore::MoveAside(const std::string& name, const std::string& suffix,
                                  std::string* new_name) {
  std::string target = name + "." + suffix;
  for (int k = 1; env_->FileExists(JoinPath(root_, target)); ++k)
    target = fmt::format("{}.{}.{}", name, suffix, k);
  KEEL_RETURN_IF_ERROR(env_->RenameFile(JoinPath(root_, name), JoinPath(root_, target)));
  KEEL_RETURN_IF_ERROR(env_->SyncDir(root_));
  *new_name = target;
  return Status::OK();
}

Status CheckpointStore::FindNewestValid(bool move_aside_rejected, CheckpointInfo* out) {
  int64_t marker = -1;
  Status ms = ReadMarker(&marker);
  if (!ms.ok()) marker = -1;
  std::vector<CheckpointInfo> all;
  KEEL_RETURN_IF_ERROR(ListWithMarker(marker, &all));
  if (all.empty()) return Status::NotFound("no checkpoint (iter_NNNNNNN directory) in " + root_);
  if (!ms.ok()) {
    log_(
        fmt::format("WARNING: {}; the newest checkpoint that verifies is used and the marker "
                    "rewritten",
                    ms.message()));
  } else if (!env_->IsDirectory(JoinPath(root_, CheckpointDirName(marker)))) {
    log_(fmt::format("WARNING: {} names iteration {} but {} does not exist", kMarkerFile, marker,
                     CheckpointDirName(marker)));
  }
  std::string reasons;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    Status st = VerifyCheckpointDir(env_, it->path, /*check_contents=*/true, nullptr);
    if (!st.ok()) {
      reasons += "\n  " + st.message();
      std::string moved;
      if (move_aside_rejected && !read_only_ && MoveAside(it->name, "corrupt", &moved).ok()) {
        log_(fmt::format(
            "WARNING: checkpoint {} is unusable: {}\n  moved it to {} (kept for inspection) and "
            "falling back to an older checkpoint",
            it->path, st.message(), JoinPath(root_, moved)));
      } else {
        log_(fmt::format("WARNING: checkpoint {} is unusable: {}; falling back to an older one",
                         it->path, st.message()));
      }
      continue;
    }
    if (it->iteration != marker) {
      if (it->iteration > marker && ms.code() != Status::Code::kCorruption)  // else said above
        log_(fmt::format(
            "note: {} is complete and verifies but {} says {} (the save was interrupted before "
            "the marker update); adopting it",
            it->name, kMarkerFile, marker < 0 ? std::string("nothing") : std::to_string(marker)));
      KEEL_RETURN_IF_ERROR(WriteMarker(it->iteration));
      it->committed = true;
    }
    *out = *it;
    return Status::OK();
  }
  return Status::Corruption("no checkpoint in " + root_ + " verifies:" + reasons);
}

std::string CheckpointStore::SaveDir(int64_t iteration) const {
  return JoinPath(root_, ".tmp." + CheckpointDirName(iteration));
}

Status CheckpointStore::BeginSave(int64_t iteration) {
  const std::string tmp = SaveDir(iteration);
  KEEL_RETURN_IF_ERROR(env_->CreateDirs(root_));
  if (env_->FileExists(tmp)) KEEL_RETURN_IF_ERROR(env_->RemoveDirRecursive(tmp));
  return env_->CreateDirs(tmp);
}

Status CheckpointStore::WriteSaveFiles(int64_t iteration, const std::vector<CheckpointFile>& files,
                                       std::vector<ManifestEntry>* written) {
  const std::string tmp = SaveDir(iteration);
  for (const CheckpointFile& f : files) {
    std::unique_ptr<WritableFile> base;
    KEEL_RETURN_IF_ERROR(env_->NewWritableFile(JoinPath(tmp, f.name), &base));
    ChecksummingFile file(std::move(base));
    Status st =
        f.safetensors ? AppendSafetensors(&file, f.tensors, f.metadata) : file.Append(f.bytes);
    if (st.ok()) st = file.Sync();
    Status cst = file.Close();
    KEEL_RETURN_IF_ERROR(st);
    KEEL_RETURN_IF_ERROR(cst);
    written->push_back({f.name, file.size(), file.digest()});
  }
  return Status::OK();
}

Status CheckpointStore::CommitSave(int64_t iteration, const std::vector<ManifestEntry>& files,
                                   uint64_t start_us, SaveStats* stats) {
  const std::string name = CheckpointDirName(iteration);
  const std::string tmp = SaveDir(iteration);
  const std::string final_path = JoinPath(root_, name);
  Manifest manifest;
  manifest.iteration = iteration;
  manifest.files = files;
  uint64_t total = 0;
  for (const ManifestEntry& e : files) total += e.size;
  auto write_manifest = [&]() -> Status {
    const std::string mtext = manifest.ToJson();
    std::unique_ptr<WritableFile> mf;
    KEEL_RETURN_IF_ERROR(env_->NewWritableFile(JoinPath(tmp, kManifestFile), &mf));
    Status st = mf->Append(mtext);
    if (st.ok()) st = mf->Sync();
    Status cst = mf->Close();
    KEEL_RETURN_IF_ERROR(st);
    KEEL_RETURN_IF_ERROR(cst);
    total += mtext.size();
    return env_->SyncDir(tmp);
  };
  Status st = write_manifest();
  if (st.ok() && env_->FileExists(final_path)) {
    // An older save of the same iteration (a run resumed from an earlier checkpoint): keep it.
    std::string moved;
    st = MoveAside(name, "superseded", &moved);
    if (st.ok())
      log_(
          fmt::format("WARNING: {} already existed (from an earlier attempt at this iteration); "
                      "moved it to {}",
                      final_path, JoinPath(root_, moved)));
  }
  if (st.ok()) st = env_->RenameFile(tmp, final_path);
  if (st.ok()) st = env_->SyncDir(root_);
  if (!st.ok()) return AbortSave(iteration, st);
  st = WriteMarker(iteration);
  if (!st.ok())
    return Status::IOError(fmt::format(
        "checkpoint {} is complete but updating {} failed: {} (the next start adopts it after "
        "verifying it)",
        final_path, kMarkerFile, st.message()));
  if (stats) {
    stats->path = final_path;
    stats->bytes = total;
    stats->seconds = static_cast<double>(env_->NowMicros() - start_us) / 1e6;
  }
  return Status::OK();
}

Status CheckpointStore::AbortSave(int64_t iteration, const Status& why) {
  env_->RemoveDirRecursive(SaveDir(iteration));  // best effort; Recover() removes it otherwise
  return Status::IOError(
      fmt::format("saving checkpoint {} failed: {} (the checkpoints saved before it are intact)",
                  JoinPath(root_, CheckpointDirName(iteration)), why.message()));
}

Status CheckpointStore::Save(int64_t iteration, const std::vector<CheckpointFile>& files,
                             SaveStats* stats) {
  const uint64_t t0 = env_->NowMicros();
  std::vector<ManifestEntry> written;
  Status st = BeginSave(iteration);
  if (st.ok()) st = WriteSaveFiles(iteration, files, &written);
  if (!st.ok()) return AbortSave(iteration, st);
  return CommitSave(iteration, written, t0, stats);
}

Status CheckpointStore::RollbackTo(int64_t iteration, std::vector<std::string>* moved_names) {
  if (read_only_) return Status::OK();
  std::vector<CheckpointInfo> all;
  KEEL_RETURN_IF_ERROR(List(&all));
  bool found = false;
  for (const CheckpointInfo& c : all) found = found || c.iteration == iteration;
  if (!found)
    return Status::NotFound(
        fmt::format("no checkpoint {} in {}", CheckpointDirName(iteration), root_));
  for (const CheckpointInfo& c : all) {
    if (c.iteration <= iteration) continue;
    std::string moved;
    KEEL_RETURN_IF_ERROR(MoveAside(c.name, "rolled-back", &moved));
    if (moved_names != nullptr) moved_names->push_back(moved);
    log_(fmt::format("rolling back to {}: moved the newer {} to {}", CheckpointDirName(iteration),
                     c.name, JoinPath(root_, moved)));
  }
  return WriteMarker(iteration);
}

Status CheckpointStore::ApplyRetention(int keep_last) {
  if (read_only_) return Status::OK();
  if (keep_last <= 0) return Status::OK();
  int64_t marker = -1;
  Status ms = ReadMarker(&marker);
  std::vector<CheckpointInfo> all;
  KEEL_RETURN_IF_ERROR(ListWithMarker(ms.ok() ? marker : -1, &all));
  if (!ms.ok()) {  // nothing is known to be good: keep all
    if (!all.empty())
      log_(
          fmt::format("WARNING: {}; retention (--keep-last-checkpoints {}) deletes nothing until a "
                      "save or resume rewrites it",
                      ms.message(), keep_last));
    return Status::OK();
  }
  int kept = 0;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!it->committed) continue;
    // A directory whose manifest names another iteration is not this run's checkpoint of that
    // name: it neither takes the place of a real one among the kept nor is deleted.
    Manifest m;
    if (ReadManifest(env_, it->path, &m).ok()) {
      Status id = CheckCheckpointIdentity(it->path, m);
      if (!id.ok()) {
        log_("WARNING: retention skips " + it->path + ": " + id.message());
        continue;
      }
    }
    if (kept < keep_last || it->iteration == marker) {
      ++kept;
      continue;
    }
    if (it->pinned) continue;
    log_(
        fmt::format("removing checkpoint {} (--keep-last-checkpoints {}; pin a checkpoint with "
                    "`keel ckpt pin` to keep it)",
                    it->path, keep_last));
    KEEL_RETURN_IF_ERROR(env_->RemoveDirRecursive(it->path));
  }
  return env_->SyncDir(root_);
}

Status ResolveCheckpointDir(Env* env, const std::string& path, const CheckpointStore::Logger& log,
                            NamedCheckpoint named, std::string* dir) {
  if (env->FileExists(JoinPath(path, kManifestFile))) {
    if (named == NamedCheckpoint::kVerify)
      KEEL_RETURN_IF_ERROR(VerifyCheckpointDir(env, path, /*check_contents=*/true, nullptr));
    *dir = path;
    return Status::OK();
  }
  CheckpointStore store(env, path, log);
  CheckpointInfo info;
  Status st = store.FindNewestValid(/*move_aside_rejected=*/false, &info);
  if (st.code() == Status::Code::kNotFound)
    return Status::InvalidArgument(
        path +
        " holds no checkpoint: pass a run directory written by `keel train --save DIR` or "
        "one of its iter_NNNNNNN directories (a directory with a " +
        kManifestFile + ")");
  KEEL_RETURN_IF_ERROR(st);
  *dir = info.path;
  return Status::OK();
}

}  // namespace keel
