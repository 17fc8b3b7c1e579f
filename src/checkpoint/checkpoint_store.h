// CheckpointStore: the checkpoints of one run directory (`--save`), in Megatron's layout:
//
//   SAVE/iter_0000100/{manifest.json, state.json, model.safetensors, optimizer.safetensors, ...}
//   SAVE/latest_checkpointed_iteration.txt   (the commit marker, written last)
//   SAVE/pinned_checkpoints.json             (checkpoints retention never deletes)
//
// A save writes every file into SAVE/.tmp.iter_N, fsyncs each file, writes the manifest, fsyncs
// the directory, renames it to iter_N, fsyncs SAVE, then replaces the marker atomically. A crash
// at any instant leaves every earlier checkpoint and the marker intact; Recover() removes the
// leftovers, saying so. The store knows files, not training: what goes into a checkpoint is the
// train loop's business (checkpoint/train_checkpoint.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "core/env.h"
#include "core/status.h"

namespace keel {

constexpr const char* kMarkerFile = "latest_checkpointed_iteration.txt";
// Where each rank of a run holds its lock on the run directory (train/rank_agreement.h).
constexpr const char* kLocksDir = "locks";
constexpr const char* kPinsFile = "pinned_checkpoints.json";

// One file of a checkpoint to write: raw bytes, or a safetensors image of host fp32 tensors.
struct CheckpointFile {
  std::string name;
  std::string bytes;
  bool safetensors = false;
  std::vector<TensorView> tensors;
  std::map<std::string, std::string> metadata;
};

struct CheckpointInfo {
  int64_t iteration = 0;
  std::string name;  // iter_0000100
  std::string path;
  bool committed = false;  // at or before the marker's iteration
  bool pinned = false;
  std::string pin_reason;
};

struct SaveStats {
  std::string path;
  uint64_t bytes = 0;
  double seconds = 0;
};

class CheckpointStore {
 public:
  using Logger = std::function<void(const std::string&)>;
  CheckpointStore(Env* env, std::string root, Logger log);

  const std::string& root() const { return root_; }
  // A data-parallel rank other than 0 reads the run directory but never changes it: Recover,
  // Pin, Unpin, RollbackTo, ApplyRetention and the marker are rank 0's (they return OK and do
  // nothing here), and FindNewestValid moves nothing aside.
  void set_read_only(bool read_only) { read_only_ = read_only; }
  bool read_only() const { return read_only_; }

  // Removes what an interrupted save or edit left behind (temporary directories and files), each
  // with a log line. Safe to call at any time no save is running.
  Status Recover();
  // The checkpoints in the root, oldest first, with their commit and pin state. An unreadable
  // marker is logged, and every checkpoint then counts as uncommitted.
  Status List(std::vector<CheckpointInfo>* out);
  // The marker's iteration; NotFound when there is no marker, Corruption when it is unreadable.
  Status ReadMarker(int64_t* iteration);
  // The newest checkpoint that verifies completely (manifest, identity, sizes, checksums). Every
  // newer one that fails is logged with the reason; with `move_aside_rejected` it is renamed to
  // iter_N.corrupt(.K) so a continuing run can save iteration N again. A directory whose manifest
  // names another iteration (a copy or a renamed checkpoint) fails like a corrupt one, so it is
  // never loaded in place of the real newest. A checkpoint newer than the
  // marker (a save interrupted between its rename and the marker update) is complete by
  // construction; once it verifies it is adopted and the marker updated, with a log line.
  // NotFound if the root holds no checkpoint at all; Corruption if none verifies.
  Status FindNewestValid(bool move_aside_rejected, CheckpointInfo* out);
  // Writes a checkpoint of `iteration` as described above. On failure the partial temporary
  // directory is removed (best effort) and the error says that the previous checkpoints are intact.
  Status Save(int64_t iteration, const std::vector<CheckpointFile>& files, SaveStats* stats);

  // Save's steps, for a save written by several processes (data-parallel ranks, each writing
  // its own files into the same directory): BeginSave (one process) creates the empty temporary
  // directory; WriteSaveFiles (every process) writes and fsyncs files into it, returning their
  // manifest entries; CommitSave (one process, once every writer succeeded) writes the manifest
  // of all of them, renames the directory and updates the marker; AbortSave removes the
  // temporary directory and returns `why` as the save's error.
  std::string SaveDir(int64_t iteration) const;
  Status BeginSave(int64_t iteration);
  Status WriteSaveFiles(int64_t iteration, const std::vector<CheckpointFile>& files,
                        std::vector<ManifestEntry>* written);
  Status CommitSave(int64_t iteration, const std::vector<ManifestEntry>& files, uint64_t start_us,
                    SaveStats* stats);
  Status AbortSave(int64_t iteration, const Status& why);
  // Makes checkpoint `iteration` the newest: every newer checkpoint directory is renamed to
  // iter_M.rolled-back (kept, never deleted) and the marker set to `iteration`, each logged;
  // `moved` (may be null) gets their new names. The guard's rollbacks and `keel train --load
  // SAVE/iter_N` both come here through CheckpointController::RollbackTo.
  Status RollbackTo(int64_t iteration, std::vector<std::string>* moved = nullptr);
  // Pins or unpins a checkpoint: pinned ones survive retention.
  Status Pin(int64_t iteration, const std::string& reason);
  Status Unpin(int64_t iteration);
  Status ReadPins(std::map<int64_t, std::string>* pins);
  // Deletes committed checkpoints beyond the newest `keep_last`, except pinned ones and the
  // marker's; each deletion is logged. keep_last <= 0 keeps everything; so does an unreadable
  // marker (logged). A directory whose manifest names another iteration is skipped with a
  // warning: it is neither counted among the kept nor deleted.
  Status ApplyRetention(int keep_last);

 private:
  // The marker's iteration, or -1 when it is missing or unreadable; an unreadable one is logged
  // with `instead`, what the store does without it.
  int64_t MarkerOrWarn(const std::string& instead);
  Status ListWithMarker(int64_t marker, std::vector<CheckpointInfo>* out);
  Status MoveAside(const std::string& name, const std::string& suffix, std::string* new_name);
  Status WriteMarker(int64_t iteration);

  Env* env_;
  std::string root_;
  Logger log_;
  bool read_only_ = false;
};

// What ResolveCheckpointDir does with a checkpoint directory named directly: verify it strictly
// (manifest, identity, sizes, checksums) as any load must, or take it as it is (the inspection
// tools, which must be able to show a broken checkpoint too).
enum class NamedCheckpoint { kVerify, kAsIs };

// The checkpoint directory a user's `path` names: `path` itself when it holds a manifest (see
// `named`), else the newest valid checkpoint of the run directory `path` (FindNewestValid, moving
// nothing aside; `log` gets why newer ones were passed over). InvalidArgument naming `path` when
// it holds no checkpoint at all; Corruption when none of its checkpoints verifies.
Status ResolveCheckpointDir(Env* env, const std::string& path, const CheckpointStore::Logger& log,
                            NamedCheckpoint named, std::string* dir);

}  // namespace keel
