// CheckpointController: when the loop saves and when it stops, and how a saved state comes back
// (a resume, a rollback). After every iteration it says whether a save is due (--save-interval
// in iterations, --save-interval-minutes) and whether to stop (the kill switch file, SIGTERM or
// SIGUSR1, --exit-interval, --exit-duration-in-mins; the run saves before it exits). It applies
// retention after each save and logs each save's size, time and throughput.
//
// Failure rule (docs/checkpoints.md): a failed periodic save is logged as an error and training
// goes on (the previous checkpoint stays the newest; the next interval tries again); after 3
// consecutive failures the run stops with the error, so a full disk never runs for days without
// checkpoints. A failed final or stop save is an error the caller exits non-zero with.
//
// --async-save: a periodic save (SaveMode::kBackground) copies the state into staging buffers on
// the loop thread and an AsyncCheckpointWriter writes it while training goes on. Its outcome is
// collected after a later iteration (SaveDueAfterIteration) or at WaitForSave, the one wait point
// (the next save, a rollback, a stop and the end of the run come through it), and counts as a
// periodic save's. Data parallel: the background threads only write each rank's files; the ranks
// agree on the outcome and rank 0 commits on the loop thread, where every collective runs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/async_checkpoint_writer.h"
#include "checkpoint/checkpoint_store.h"
#include "checkpoint/train_checkpoint.h"
#include "config/config.h"
#include "core/env.h"
#include "train/local_checkpoint_tier.h"
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

// The reason SaveDueAfterIteration gives for a local-tier save (SaveNow writes it there).
constexpr const char* kLocalSaveReason = "--non-persistent-save-interval";

class CheckpointController {
 public:
  static constexpr int kMaxConsecutiveSaveFailures = 3;

  // `store` may be null (no --save): nothing is saved, stop requests still stop the loop.
  CheckpointController(const TrainConfig& cfg, Env* env, CheckpointStore* store, Trainer* trainer,
                       RunInfo run, nlohmann::json history,
                       std::function<void(const std::string&)> log);

  // After every iteration: a stop request (the kill switch, a signal, --exit-interval,
  // --exit-duration-in-mins; agreed by every rank) sets stop_reason(); otherwise the reason a
  // save is due now (--save-interval, --save-interval-minutes), or "" when none is (or there is
  // no --save).
  std::string SaveDueAfterIteration();
  // The outcome of a periodic save: a failure is logged and training goes on, until the third in
  // a row stops the run (stop_reason() kSaveFailures, and FinalSaveStatus() returns it). false:
  // stop.
  bool OnPeriodicSave(const Status& saved);
  // The check before a save failed (replicas differ): nothing more is saved, the run stops with
  // `error` (stop_reason() kCheckFailed). Returns `error`.
  Status CheckFailed(const Status& error);
  // What ends the run before a final save: the error of repeated save failures or of a failed
  // check (then nothing more is saved), else OK.
  Status FinalSaveStatus() const;
  // Whether the state at hand still needs a save (--save given and not saved at this iteration).
  bool NeedsSave() const;
  // kWait: the save is written and committed before SaveNow returns. kBackground: with
  // --async-save, SaveNow returns once the state is copied and its outcome comes later (see
  // above); without it, as kWait.
  enum class SaveMode { kWait, kBackground };
  // Saves the current state with the guard's slot `guard` (null: none) and logs the save; `why`
  // names it in the log. A save in flight is waited for first.
  Status SaveNow(const std::string& why, const nlohmann::json& guard = nullptr,
                 SaveMode mode = SaveMode::kWait);
  // The wait point: blocks until the save in flight (if any) is written and committed (data
  // parallel: every rank's files, then rank 0's commit; every rank calls it at the same point),
  // logs it and counts its outcome as OnPeriodicSave does. Returns that outcome (OK when none was
  // in flight); a failure has then been logged and counted already.
  Status WaitForSave();
  bool SaveInFlight() const { return writer_ != nullptr && writer_->in_flight(); }
  // A background save copies the weights and moments while the loop computes the next gradients
  // (on a backend whose memory is the host's); before the loop changes them (the update, a
  // test's weight fault) it waits here for the copies. The wait is the save's stall too.
  void WaitForSnapshot();
  // Off: the loop makes the snapshot itself when the save starts (a run with test-only faults,
  // which may write the weights anywhere).
  void set_defer_snapshot(bool on) { defer_snapshot_ = on; }
  // Seconds the loop spent in waits for background saves and their commits outside SaveNow,
  // since the last call (goodput's save stall).
  double TakeWaitSeconds();
  // After a save (and the guard's pins): removes checkpoints beyond --keep-last-checkpoints.
  // While a background save is in flight it does nothing: the writer applies retention after
  // its commit.
  void ApplyRetention();
  // Puts checkpoint `saved` (verified, read) back into the trainer: tensors, then its TrainState.
  // `in_save_dir`: it is one of this run's own checkpoints, so it counts as the last save.
  Status Restore(const SavedTrainState& saved, bool in_save_dir);
  // The one rollback, of the guard and of --load SAVE/iter_N: checkpoint `target` of the store
  // (verified, read) becomes the newest — newer ones are kept as iter_M.rolled-back, their names
  // in `kept` — and the trainer continues from its state.
  Status RollbackTo(const SavedTrainState& target, std::vector<std::string>* kept);

  // --non-persistent-save-interval: the local tier (null: off). SaveDueAfterIteration then also
  // returns kLocalSaveReason on the local interval when no persistent save is due, and SaveNow
  // writes that save there, synchronously, while a background persistent save may go on; a
  // failed local save is logged and never counts among the persistent failures.
  void set_local_tier(std::unique_ptr<LocalCheckpointTier> tier) { local_ = std::move(tier); }
  LocalCheckpointTier* local_tier() const { return local_.get(); }

  StopReason stop_reason() const { return stop_; }
  // Data parallel: every rank calls these at the same iterations (they agree on stops and
  // saves); rank 0 alone changes the run directory's shared files (the store is read-only on
  // the others).
  int64_t last_saved_iteration() const { return last_saved_; }
  // An event for the history recorded in later checkpoints (e.g. a guard rollback).
  void AddHistory(nlohmann::json event) { history_.push_back(std::move(event)); }

 private:
  // Writes `files` (built with status `built`) as checkpoint `it`: in one process a plain Save;
  // across ranks every rank's files, committed by rank 0 once all of them are written.
  Status WriteCheckpoint(int64_t it, const std::vector<CheckpointFile>& files, Status built,
                         SaveStats* stats);
  // Data parallel: after every rank wrote its files (`written`, with this rank's outcome `st`),
  // the ranks agree and rank 0 commits checkpoint `it` (or removes its temporary directory).
  Status CommitAcrossRanks(int64_t it, Status st, const std::vector<ManifestEntry>& written,
                           uint64_t start_us, SaveStats* stats);
  // Starts a background save of the current state (the previous one collected).
  Status StartBackgroundSave(int64_t it, const std::string& why, const nlohmann::json& guard);
  // Collects the save in flight (blocking until its thread is done) and commits it across
  // ranks; `waited` gets the seconds the loop spent here.
  Status FinishBackgroundSave(double* waited);
  std::string GuardNote(const nlohmann::json& guard) const;
  // Writes the current state's local pieces (kLocalSaveReason); failures are logged only.
  Status SaveLocal(const nlohmann::json& guard);

  // The save in flight (--async-save).
  struct Pending {
    int64_t iteration = -1;
    std::string why, guard_note;
    uint64_t start_us = 0;
    double stall_seconds = 0;  // the loop's: the snapshot, then the waits and commit
  };

  TrainConfig cfg_;
  Env* env_;
  CheckpointStore* store_;
  Trainer* trainer_;
  RunInfo run_;
  nlohmann::json history_;
  std::function<void(const std::string&)> log_;
  CheckpointStaging staging_;        // zero-copy views for saves written while the loop waits
  CheckpointStaging async_staging_;  // copies, reused between background saves
  bool defer_snapshot_ = true;
  // Data parallel: a background save was committed on the loop thread and its retention is left
  // to the next background save's thread (or the next ApplyRetention).
  bool retention_due_ = false;
  std::unique_ptr<AsyncCheckpointWriter> writer_;  // --async-save
  Pending pending_;
  double wait_seconds_ = 0;
  uint64_t start_us_ = 0, last_save_us_ = 0;
  // The last save started (a background one may still fail) and the last one committed.
  int64_t last_saved_ = -1, last_committed_ = -1;
  std::unique_ptr<LocalCheckpointTier> local_;
  int64_t last_local_ = -1;
  bool last_was_local_ = false;  // the save OnPeriodicSave hears about was a local one
  int consecutive_failures_ = 0;
  Status failure_;
  StopReason stop_ = StopReason::kNone;
};

}  // namespace keel
