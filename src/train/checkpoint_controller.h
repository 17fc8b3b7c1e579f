// CheckpointController: when the loop saves and when it stops, and how a saved state comes back
// (a resume, a rollback). After every iteration it saves on
// --save-interval (iterations) or --save-interval-minutes, and stops (after saving) when the kill
// switch file appears, on SIGTERM/SIGUSR1, on --exit-interval or --exit-duration-in-mins. It
// applies retention after each save and logs each save's size, time and throughput.
//
// Failure rule (docs/checkpoints.md): a failed periodic save is logged as an error and training
// goes on (the previous checkpoint stays the newest; the next interval tries again); after 3
// consecutive failures the run stops with the error, so a full disk never runs for days without
// checkpoints. A failed final or stop save is an error the caller exits non-zero with.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/train_checkpoint.h"
#include "config/config.h"
#include "core/env.h"
#include "train/trainer.h"

namespace keel {

// What a checkpoint of `trainer`'s current state is made of.
TrainCheckpointSource CheckpointSourceOf(Trainer& trainer);
// Puts checkpoint `saved` (verified, read) back into `trainer`: tensors, then its TrainState.
Status RestoreTrainer(Env* env, const SavedTrainState& saved, Trainer* trainer);
// --finetune: only the model weights of checkpoint `saved` (verified, read) into `trainer`'s
// model, whose shape must match tensor for tensor; the optimizer and TrainState stay fresh.
// Weights holding NaN or Inf are refused (NonFiniteWeightsError).
Status LoadWeightsOnly(Env* env, const SavedTrainState& saved, Trainer* trainer);

enum class StopReason {
  kNone,
  kKillSwitch,
  kSignal,
  kExitInterval,
  kExitDuration,
  kSaveFailures,
  kCheckFailed,  // the check before a save failed (replicas differ): nothing more is saved
};
const char* StopReasonText(StopReason r);

class CheckpointController {
 public:
  static constexpr int kMaxConsecutiveSaveFailures = 3;

  // `store` may be null (no --save): nothing is saved, stop requests still stop the loop.
  CheckpointController(const TrainConfig& cfg, Env* env, CheckpointStore* store, Trainer* trainer,
                       RunInfo run, nlohmann::json history,
                       std::function<void(const std::string&)> log);

  // Called by the loop after every iteration; false stops it.
  bool AfterIteration();
  // Saves the final state unless it was just saved. Returns the error that stopped the run after
  // repeated save failures, or the final save's error.
  Status Finish();
  Status SaveNow(const std::string& why);
  // Puts checkpoint `saved` (verified, read) back into the trainer: tensors, then its TrainState.
  // `in_save_dir`: it is one of this run's own checkpoints, so it counts as the last save.
  Status Restore(const SavedTrainState& saved, bool in_save_dir);
  // The one rollback, of the guard and of --load SAVE/iter_N: checkpoint `target` of the store
  // (verified, read) becomes the newest — newer ones are kept as iter_M.rolled-back, their names
  // in `kept` — and the trainer continues from its state.
  Status RollbackTo(const SavedTrainState& target, std::vector<std::string>* kept);

  StopReason stop_reason() const { return stop_; }
  // Data parallel: every rank calls AfterIteration, SaveNow, Finish, Restore and RollbackTo at
  // the same iterations (they agree on stops and saves); rank 0 alone changes the run directory's
  // shared files (the store is read-only on the others).
  int64_t last_saved_iteration() const { return last_saved_; }
  // Where the guard's state for each save comes from (null state when unset).
  void set_guard_state_fn(std::function<nlohmann::json()> f) { guard_state_ = std::move(f); }
  // Called after every successful save with its iteration (the guard pins post-spike saves).
  void set_after_save(std::function<void(int64_t)> f) { after_save_ = std::move(f); }
  // Called before every save; an error stops the run without saving (kCheckFailed) and is what
  // Finish returns: a replica check, so a checkpoint never holds a damaged replica's state.
  void set_before_save(std::function<Status()> f) { before_save_ = std::move(f); }
  // An event for the history recorded in later checkpoints (e.g. a guard rollback).
  void AddHistory(nlohmann::json event) { history_.push_back(std::move(event)); }

 private:
  // Writes `files` (built with status `built`) as checkpoint `it`: in one process a plain Save;
  // across ranks every rank's files, committed by rank 0 once all of them are written.
  Status WriteCheckpoint(int64_t it, const std::vector<CheckpointFile>& files, Status built,
                         SaveStats* stats);

  TrainConfig cfg_;
  Env* env_;
  CheckpointStore* store_;
  Trainer* trainer_;
  RunInfo run_;
  nlohmann::json history_;
  std::function<void(const std::string&)> log_;
  CheckpointStaging staging_;
  std::function<nlohmann::json()> guard_state_;
  std::function<void(int64_t)> after_save_;
  std::function<Status()> before_save_;
  uint64_t start_us_ = 0, last_save_us_ = 0;
  int64_t last_saved_ = -1;
  int consecutive_failures_ = 0;
  Status failure_;
  StopReason stop_ = StopReason::kNone;
};

}  // namespace keel
