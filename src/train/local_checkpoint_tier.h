// LocalCheckpointTier: Megatron-LM's non-persistent "local" checkpoints (docs/checkpoints.md,
// "Local tier"). Every --non-persistent-save-interval iterations each rank writes its piece of
// the checkpoint (exactly the files it writes into a persistent one) to node-local storage:
//
//   DIR/keel-local-ID/rank-R-of-N/own/iter_N/              this rank's piece (a CheckpointStore)
//   DIR/keel-local-ID/rank-R-of-N/replica-of-rank-Q/iter_N/ rank Q = (R-1+N)%N's piece, sent over
//                                                           the communicator
//   DIR/keel-local-ID/rank-R-of-N/restore/iter_N/          a resume's assembled checkpoint
//
// ID comes from SAVE/local_checkpoints.json (written once by rank 0), so a deleted and recreated
// --save never meets the local pieces of the run it replaced. Each piece is saved by the store's
// protocol (temporary directory, fsync, manifest, rename, marker last) through the Env seam; the
// newest kKeep pieces of each kind are kept. A resume takes a local iteration only if it is newer
// than --save's newest valid checkpoint and every rank's piece verifies, in its own directory or
// in its replica; the ranks agree on it over the communicator. Persistent retention never looks
// here: local checkpoints are never the only copy of progress it trusts.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/env.h"
#include "core/status.h"

namespace keel {

constexpr const char* kLocalTierIdFile = "local_checkpoints.json";

class LocalCheckpointTier {
 public:
  static constexpr int kKeep = 2;  // local pieces kept per kind (own, replica)
  using Logger = std::function<void(const std::string&)>;

  // Opens the tier of `cfg` (--save and --non-persistent-local-ckpt-dir set): rank 0 creates the
  // run's id file in --save if it has none; every rank creates and probes its directory
  // (InvalidArgument naming it when it is not writable) and removes what interrupted local saves
  // left. Collective: every rank of `comm` calls it.
  static Status Open(Env* env, Communicator* comm, const TrainConfig& cfg, Logger log,
                     std::unique_ptr<LocalCheckpointTier>* out);

  const std::string& root() const { return root_; }  // this rank's directory
  std::string Describe() const;

  // Saves this rank's piece `files` (built with status `built`) of iteration `it`, and stores the
  // piece the previous rank sends as its replica. Collective (the ring exchange); a rank whose
  // build failed sends nothing. Returns this rank's outcome; `summary` gets the log's words.
  Status Save(int64_t it, const std::vector<CheckpointFile>& files, const Status& built,
              std::string* summary);

  // The newest local iteration newer than `persistent` (-1: none) whose every piece verifies,
  // own or replica, agreed by every rank; its pieces are gathered and assembled into a complete
  // checkpoint directory `dir` on every rank ("" when there is none). Damaged pieces and
  // unusable iterations are noted in `notes`. Pieces newer than the resume point (the local
  // iteration, else `persistent`) are removed: they belong to no state the run continues from.
  // Collective. Rank 0 also notes a newer local checkpoint that a job of another number of ranks
  // wrote (never used here: a piece restores only at the rank count that wrote it).
  Status FindResume(int64_t persistent, std::string* dir, std::vector<std::string>* notes);

  // Removes the local pieces (own and replica) of iterations after `iteration`: a rollback or a
  // start from elsewhere leaves them on another timeline.
  void DiscardNewerThan(int64_t iteration);

 private:
  LocalCheckpointTier(Env* env, Communicator* comm, std::string root, Logger log);
  // Iterations of `store`'s pieces after `after` that verify; the others go into `notes`.
  std::vector<int64_t> ValidPieces(CheckpointStore* store, int64_t after,
                                   std::vector<std::string>* notes);
  // FindResume at this job's rank count; `chosen` gets the local iteration resumed from (-1).
  Status FindResumeHere(int64_t persistent, std::string* dir, int64_t* chosen,
                        std::vector<std::string>* notes);
  // The note on the newest local piece newer than `persistent` and `chosen` (-1: none) in this
  // run's directories of other rank counts (rank-R-of-K, K not this job's), if there is one.
  void NoteOtherRankCounts(int64_t persistent, int64_t chosen, std::vector<std::string>* notes);
  // Sends `mine` to the next rank and receives the previous rank's into `from_prev`.
  void ExchangeRing(const std::string& mine, std::string* from_prev);

  Env* env_;
  Communicator* comm_;
  std::string run_dir_;  // DIR/keel-local-ID, the parent of every rank count's directories
  std::string root_;
  Logger log_;
  int rank_ = 0, world_ = 1, prev_ = 0;
  std::unique_ptr<CheckpointStore> own_, replica_;
};

// A checkpoint's files as one byte string and back (the local tier's ring and gather).
Status EncodePieceFiles(const std::vector<CheckpointFile>& files, std::string* out);
Status DecodePieceFiles(const std::string& bytes, std::vector<CheckpointFile>* out);

}  // namespace keel
