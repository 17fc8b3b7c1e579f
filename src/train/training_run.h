// TrainingRun: one process's part of a training run, as a library (LevelDB's DB::Open is the
// model). Open (training_run_open.cc) resolves everything a run needs before any work: the run
// directory, the data and the final config, the point it continues from (train checkpoint resume
// rules, rollbacks), the model, the checkpoint controller, the journal, the metrics and the
// guard, each logged as it is decided. Train (training_run.cc) runs it to its end, one
// RunIteration at a time, and says how it ended.
//
//   std::unique_ptr<TrainingRun> run;
//   KEEL_RETURN_IF_ERROR(TrainingRun::Open(config, {env, comm, &hooks}, &run));
//   TrainingRun::Outcome outcome;
//   KEEL_RETURN_IF_ERROR(run->Train(&outcome));
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/checkpoint_store.h"
#include "checkpoint/resume.h"
#include "comm/communicator.h"
#include "comm/process_mesh.h"
#include "config/config.h"
#include "core/env.h"
#include "journal/run_journal.h"
#include "metrics/run_metrics.h"
#include "train/checkpoint_controller.h"
#include "train/goodput_clock.h"
#include "train/guard_controller.h"
#include "train/rank_agreement.h"
#include "train/run_health.h"
#include "train/run_reporter.h"
#include "train/run_samples.h"
#include "train/test_hooks.h"
#include "train/trainer.h"

namespace keel {

struct RunOptions {
  Env* env = nullptr;                     // all file I/O and the clock
  Communicator* comm = nullptr;           // this process's place among the data-parallel ranks
  const TestHooks* test_hooks = nullptr;  // test-only faults (train/test_hooks.h); may be null
};

class TrainingRun {
 public:
  enum class Outcome {
    kFinished,         // trained to the end and saved (with --save)
    kAlreadyComplete,  // the checkpoint it resumed already completes the run
    kStopped,          // a stop request (signal, kill switch, exit interval): saved, resumable
    kNotStarted,       // the kill switch existed at start: nothing was done
    kGuardStopped,     // the guard could not recover (its budget spent, or no checkpoint)
  };

  // `config` as the user gave it (flags and TOML); the run completes and validates it once the
  // data (vocabulary) and the communicator (data-parallel size) are known. InvalidArgument for a
  // setting or input the user must fix; other codes for runtime failures.
  static Status Open(const TrainConfig& config, const RunOptions& options,
                     std::unique_ptr<TrainingRun>* out);
  ~TrainingRun();

  // Trains until the configured length, a stop request or a guard stop; then saves, logs the
  // state fingerprint and, with --sample-tokens, a text sample.
  Status Train(Outcome* outcome);

  const TrainConfig& config() const { return cfg_; }
  const ResumePoint& resume_point() const { return resume_; }
  Trainer& trainer() { return *trainer_; }
  uint64_t StateFingerprint() { return trainer_->StateFingerprint(); }

 private:
  TrainingRun(const TrainConfig& config, const RunOptions& options);
  // Open's steps (training_run_open.cc); `doing` names the step under way for an out-of-memory
  // message.
  static Status OpenSteps(const TrainConfig& config, const RunOptions& options,
                          std::unique_ptr<TrainingRun>* out, std::string* doing);
  // Data parallel: this rank's log, SAVE/logs/rank-NNN.log; ranks other than 0 keep stdout quiet.
  Status OpenRankLog();
  // ResolveResumePoint on every rank (rank 0 first); the ranks must agree on the checkpoint.
  Status ResolveResumeOnEveryRank();
  // Logs that the checkpoint continued from was written by another number of ranks (another
  // layout: what was resharded).
  Status NoteDataParallelChange();
  // --non-persistent-save-interval: opens the local tier and, when it holds a newer checkpoint
  // that every rank can restore, resumes from it instead (a note names the tier).
  Status ResolveLocalTier();
  // Tensor parallel: the layout's rules (config/parallel_layout.h, keel plan's), before any work.
  Status CheckLayout(std::vector<std::string>* notes);
  // "[rank 3] " or, tensor parallel, "[rank 3 (dp 1, pp 0, tp 1)] ".
  std::string RankPrefix() const;
  Status CheckMemory(std::vector<std::string>* notes);
  Status PrepareRunDirectory();
  void LogModel();
  void LogSkippedSampleRanges();
  Status StartFromResumePoint();
  Status OpenJournalMetricsAndGuard();

  // The loop (training_run.cc). One iteration, top to bottom; *go_on false: the loop ends here
  // (a stop request or the guard's stop). An error ends the run.
  Status RunIteration(bool* go_on);
  // A save: the replicas checked first, the guard's slot in it, the guard told after; its time
  // is goodput's save stall, and a record of the time before it goes to the journal.
  // kBackground: a periodic save, written in the background with --async-save.
  Status Save(const std::string& why,
              CheckpointController::SaveMode mode = CheckpointController::SaveMode::kWait);
  Status SaveUnmeasured(const std::string& why, CheckpointController::SaveMode mode);
  // After a bad sample stopped an iteration: keeps the last completed iteration (a checkpoint
  // with --save) and returns `error` with what was kept.
  Status StopOnDataError(const Status& error);
  // An update left NaN/Inf weights: the error naming them and the checkpoint to go back to.
  Status NonFiniteWeights(const StepResult& r);
  // Where the newest checkpoint is, for an error that stops the run.
  std::string LastCheckpointText();
  Status PrintSample();
  // Data parallel: bytes this rank sent per iteration against the lower bound, and how much of
  // the gradient reduction hid behind backward.
  void LogDataParallelTraffic(double train_seconds);
  void LogDataReadAhead();

  TrainConfig cfg_;
  Env* env_;
  // The watchdog, collective and replica checks, stragglers; comm_ is its recording communicator.
  std::unique_ptr<RunHealth> health_;
  Communicator* comm_;
  const TestHooks* test_hooks_;
  bool not_started_ = false;     // the kill switch was there at start
  int64_t start_iteration_ = 0;  // the iteration Train started from

  // One run per --save directory: released after every member below that writes into it.
  std::unique_ptr<RunDirectoryLock> dir_lock_;
  std::unique_ptr<WritableFile> rank_log_;  // data parallel: SAVE/logs/rank-NNN.log
  RunData data_;
  ResumePoint resume_;
  nlohmann::json history_ = nlohmann::json::array();

  // Tensor parallel (T > 1): the world as tensor x data groups; null otherwise (the world is the
  // data group).
  std::unique_ptr<ProcessMesh> mesh_;
  std::unique_ptr<Backend> backend_;
  RunSamples* samples_ = nullptr;          // the trainer's sample source (it owns it)
  std::unique_ptr<TrainerFaults> faults_;  // test-only
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<CheckpointStore> store_;  // null without --save
  std::unique_ptr<CheckpointController> ckpt_;
  std::unique_ptr<LocalCheckpointTier> local_tier_;  // until ckpt_ takes it
  std::unique_ptr<RunJournal> journal_;
  std::unique_ptr<RunMetrics> metrics_;
  std::unique_ptr<GuardController> guard_;
  std::unique_ptr<RunReporter> reporter_;
  // Goodput: this process's seconds by what they went to (destroyed before the journal).
  int64_t process_start_us_ = 0;
  std::unique_ptr<GoodputClock> goodput_;
};

const char* OutcomeName(TrainingRun::Outcome outcome);

}  // namespace keel
