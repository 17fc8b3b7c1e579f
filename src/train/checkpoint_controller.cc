#include "train/checkpoint_controller.h"

#include <fmt/format.h>
#include <signal.h>

#include <set>

#include "checkpoint/manifest.h"
#include "core/stop_signal.h"
#include "watchdog/phase_tracker.h"

namespace keel {

TrainCheckpointSource CheckpointSourceOf(Trainer& trainer) {
  TrainCheckpointSource src{&trainer.config(), &trainer.model(), &trainer.optimizer(),
                            trainer.state(),   trainer.NextLr(), trainer.NextGlobalBatch()};
  src.rank = trainer.data_comm()->rank();  // the world under data parallelism alone
  src.world = trainer.data_comm()->world_size();
  src.tensor_rank = trainer.tensor_rank();
  src.tensor = trainer.tensor_size();
  src.pipeline_rank = trainer.pipeline_rank();
  src.pipeline = trainer.pipeline_size();
  src.sharded = trainer.sharded_optimizer();
  return src;
}

namespace {

// Manifest entries as text, to send them from every rank to rank 0.
std::string EncodeEntries(const std::vector<ManifestEntry>& entries) {
  std::string out;
  for (const ManifestEntry& e : entries) out += fmt::format("{}\t{}\t{}\n", e.name, e.size, e.xxh3);
  return out;
}

void DecodeEntries(const std::string& text, std::vector<ManifestEntry>* out) {
  size_t at = 0;
  while (at < text.size()) {
    const size_t nl = text.find('\n', at);
    const std::string line = text.substr(at, nl - at);
    at = nl + 1;
    const size_t t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
    out->push_back({line.substr(0, t1), std::stoull(line.substr(t1 + 1, t2 - t1 - 1)),
                    std::stoull(line.substr(t2 + 1))});
  }
}

}  // namespace

Status CheckpointController::WriteCheckpoint(int64_t it, const std::vector<CheckpointFile>& files,
                                             Status built, SaveStats* stats) {
  Communicator* comm = trainer_->comm();
  if (comm->world_size() == 1) {
    KEEL_RETURN_IF_ERROR(built);
    return store_->Save(it, files, stats);
  }
  // Every rank writes its files into the directory rank 0 prepared; rank 0 commits once all
  // succeeded. Each step ends with every rank agreeing on its outcome, so a failure on any rank
  // leaves the previous checkpoint the newest on every rank.
  const uint64_t t0 = env_->NowMicros();
  Status st = built;
  if (comm->rank() == 0 && st.ok()) st = store_->BeginSave(it);
  st = comm->AgreeOnStatus(st);
  std::vector<ManifestEntry> written;
  if (st.ok()) st = store_->WriteSaveFiles(it, files, &written);
  return CommitAcrossRanks(it, st, written, t0, stats);
}

Status CheckpointController::CommitAcrossRanks(int64_t it, Status st,
                                               const std::vector<ManifestEntry>& written,
                                               uint64_t start_us, SaveStats* stats) {
  Communicator* comm = trainer_->comm();
  const bool leader = comm->rank() == 0;
  st = comm->AgreeOnStatus(st);
  if (!st.ok()) {
    if (leader) return store_->AbortSave(it, st);
    return Status::IOError(
        fmt::format("saving checkpoint {} failed: {} (the checkpoints saved before it are intact)",
                    JoinPath(store_->root(), CheckpointDirName(it)), st.message()));
  }
  std::vector<std::string> all;
  comm->AllGatherBytes(EncodeEntries(written), &all);
  if (leader) {
    std::vector<ManifestEntry> entries;
    for (const std::string& text : all) DecodeEntries(text, &entries);
    st = store_->CommitSave(it, entries, start_us, stats);
  }
  // The commit's outcome (rank 0's) for every rank.
  st = comm->AgreeOnStatus(st);
  if (!leader && st.ok() && stats != nullptr) {
    stats->path = JoinPath(store_->root(), CheckpointDirName(it));
    stats->seconds = static_cast<double>(env_->NowMicros() - start_us) / 1e6;
    for (const ManifestEntry& e : written) stats->bytes += e.size;
  }
  return st;
}

Status RestoreTrainer(Env* env, const SavedTrainState& saved, Trainer* trainer) {
  KEEL_RETURN_IF_ERROR(LoadCheckpointTensors(env, saved, &trainer->model(), &trainer->optimizer()));
  trainer->Restore(saved.train);
  return Status::OK();
}

Status LoadWeightsOnly(Env* env, const SavedTrainState& saved, Trainer* trainer) {
  GptModel& model = trainer->model();
  KEEL_RETURN_IF_ERROR(LoadCheckpointWeights(env, saved.dir, &model));  // any layout's pieces
  if (const NonFiniteParams nf = FindNonFiniteParams(model); nf.count > 0)
    return NonFiniteWeightsError(saved.dir, nf, "fine-tune from",
                                 "`keel train ... --finetune --load RUN/iter_N` starts from one");
  return Status::OK();
}

const char* StopReasonText(StopReason r) {
  switch (r) {
    case StopReason::kNone:
      return "none";
    case StopReason::kKillSwitch:
      return "the kill switch file appeared";
    case StopReason::kSignal:
      return "a stop signal was received";
    case StopReason::kExitInterval:
      return "--exit-interval was reached";
    case StopReason::kExitDuration:
      return "--exit-duration-in-mins was reached";
    case StopReason::kSaveFailures:
      return "checkpoint saves failed repeatedly";
    case StopReason::kCheckFailed:
      return "the check before a save failed";
  }
  return "?";
}

CheckpointController::CheckpointController(const TrainConfig& cfg, Env* env, CheckpointStore* store,
                                           Trainer* trainer, RunInfo run, nlohmann::json history,
                                           std::function<void(const std::string&)> log)
    : cfg_(cfg),
      env_(env),
      store_(store),
      trainer_(trainer),
      run_(std::move(run)),
      history_(std::move(history)),
      log_(std::move(log)) {
  if (!log_) log_ = [](const std::string&) {};
  start_us_ = last_save_us_ = env_->NowMicros();
  if (cfg_.async_save && store_ != nullptr) {
    // The staging copies are allocated (and their pages touched) now, so that no save's stall
    // pays for the allocation.
    async_staging_.copy = true;
    async_staging_.params_copy.resize(trainer_->model().num_params());
    async_staging_.exp_avg_copy.resize(trainer_->optimizer().shard().size());
    async_staging_.exp_avg_sq_copy.resize(trainer_->optimizer().shard().size());
  }
}

std::string CheckpointController::GuardNote(const nlohmann::json& guard) const {
  return !guard.is_object()              ? ""
         : guard.value("healthy", false) ? "; guard: healthy"
                                         : "; guard: NOT healthy (event open)";
}

Status CheckpointController::SaveNow(const std::string& why, const nlohmann::json& guard,
                                     SaveMode mode) {
  if (store_ == nullptr) return Status::OK();
  PhaseScope save(trainer_->phase_tracker(), Phase::kSave);
  last_was_local_ = why == kLocalSaveReason && local_ != nullptr;
  if (last_was_local_) return SaveLocal(guard);
  if (SaveInFlight()) {  // at most one save in flight: this wait is part of this save's stall
    double waited = 0;
    (void)FinishBackgroundSave(&waited);  // its failure is logged and counted there
    if (stop_ == StopReason::kSaveFailures) return failure_;
  }
  const int64_t it = trainer_->state().counters.iteration;
  if (mode == SaveMode::kBackground && cfg_.async_save) return StartBackgroundSave(it, why, guard);
  std::vector<CheckpointFile> files;
  const Status built = BuildTrainCheckpoint(env_, CheckpointSourceOf(*trainer_), run_, history_,
                                            &staging_, &files, guard);
  SaveStats stats;
  KEEL_RETURN_IF_ERROR(WriteCheckpoint(it, files, built, &stats));
  last_saved_ = last_committed_ = it;
  last_save_us_ = env_->NowMicros();
  log_(fmt::format("saved checkpoint {} ({}): {:.1f} MB in {:.2f} s, {:.0f} MB/s{}", stats.path,
                   why, static_cast<double>(stats.bytes) / 1e6, stats.seconds,
                   static_cast<double>(stats.bytes) / 1e6 / std::max(stats.seconds, 1e-9),
                   GuardNote(guard)));
  return Status::OK();
}

Status CheckpointController::SaveLocal(const nlohmann::json& guard) {
  // Synchronous on the loop thread, beside a background persistent save if one is in flight:
  // both read staging of their own, and the pieces are small and local.
  const uint64_t t0 = env_->NowMicros();
  const int64_t it = trainer_->state().counters.iteration;
  std::vector<CheckpointFile> files;
  const Status built = BuildTrainCheckpoint(env_, CheckpointSourceOf(*trainer_), run_, history_,
                                            &staging_, &files, guard);
  std::string summary;
  const Status st = local_->Save(it, files, built, &summary);
  last_local_ = it;
  const double secs = static_cast<double>(env_->NowMicros() - t0) / 1e6;
  if (!st.ok()) {
    log_(fmt::format(
        "ERROR: local checkpoint {} failed: {}; training goes on (the persistent checkpoints "
        "are unaffected; the next --non-persistent-save-interval tries again)",
        it, st.message()));
    return Status::OK();
  }
  log_(
      fmt::format("saved local checkpoint {} in {} (--non-persistent-save-interval): {} in "
                  "{:.2f} s{}",
                  it, local_->root(), summary, secs, GuardNote(guard)));
  return Status::OK();
}

Status CheckpointController::StartBackgroundSave(int64_t it, const std::string& why,
                                                 const nlohmann::json& guard) {
  const uint64_t t0 = env_->NowMicros();
  if (writer_ == nullptr) {
    writer_ = std::make_unique<AsyncCheckpointWriter>(env_, store_->root(), store_->read_only());
    async_staging_.copy = true;
  }
  // The snapshot: weights and this rank's moments copied into the staging buffers; TrainState,
  // data position, guard state and history serialized into the files' bytes.
  std::vector<CheckpointFile> files;
  async_staging_.defer = defer_snapshot_;
  Status st = BuildTrainCheckpoint(env_, CheckpointSourceOf(*trainer_), run_, history_,
                                   &async_staging_, &files, guard);
  Communicator* comm = trainer_->comm();
  const bool data_parallel = comm->world_size() > 1;
  if (data_parallel) {
    const bool leader = comm->rank() == 0;
    if (leader && st.ok()) st = store_->BeginSave(it);
    st = comm->AgreeOnStatus(st);
    if (!st.ok()) {
      if (leader) return store_->AbortSave(it, st);
      return Status::IOError(fmt::format(
          "saving checkpoint {} failed: {} (the checkpoints saved before it are intact)",
          JoinPath(store_->root(), CheckpointDirName(it)), st.message()));
    }
  }
  KEEL_RETURN_IF_ERROR(st);
  AsyncCheckpointWriter::Job job;
  job.iteration = it;
  job.files = std::move(files);
  job.commit = !data_parallel;  // across ranks the commit waits for every rank's files
  job.keep_last = cfg_.keep_last_checkpoints;
  job.copies = std::move(async_staging_.deferred);
  job.retention_first = retention_due_ ? std::max(cfg_.keep_last_checkpoints, 0) : 0;
  retention_due_ = false;
  async_staging_.deferred.clear();
  writer_->Start(std::move(job));
  pending_ = Pending{};
  pending_.iteration = it;
  pending_.why = why;
  pending_.guard_note = GuardNote(guard);
  pending_.start_us = t0;
  pending_.stall_seconds = static_cast<double>(env_->NowMicros() - t0) / 1e6;
  last_saved_ = it;
  last_save_us_ = env_->NowMicros();
  return Status::OK();
}

Status CheckpointController::FinishBackgroundSave(double* waited) {
  const uint64_t t0 = env_->NowMicros();
  AsyncCheckpointWriter::Result r = writer_->Wait();
  for (const std::string& line : r.log) log_(line);
  Status st = r.status;
  SaveStats stats = r.stats;
  if (trainer_->comm()->world_size() > 1) {
    st = CommitAcrossRanks(r.iteration, st, r.written, pending_.start_us, &stats);
    // Rank 0's retention (the others' store is read-only): its deletions run on the next
    // background save's thread, or at the next synchronous save or the end, not on the loop.
    if (st.ok()) retention_due_ = true;
  }
  *waited = static_cast<double>(env_->NowMicros() - t0) / 1e6;
  pending_.stall_seconds += *waited;
  if (!st.ok()) {
    if (last_saved_ == r.iteration) last_saved_ = last_committed_;  // the state is not saved
    OnPeriodicSave(st);
    return st;
  }
  last_committed_ = r.iteration;
  consecutive_failures_ = 0;
  const double mb = static_cast<double>(stats.bytes) / 1e6;
  log_(fmt::format(
      "saved checkpoint {} ({}, --async-save): {:.1f} MB; the loop stalled {:.3f} s, the "
      "background write took {:.2f} s ({:.0f} MB/s){}",
      stats.path, pending_.why, mb, pending_.stall_seconds, r.seconds,
      mb / std::max(r.seconds, 1e-9), pending_.guard_note));
  return Status::OK();
}

Status CheckpointController::WaitForSave() {
  if (!SaveInFlight()) return Status::OK();
  PhaseScope save(trainer_->phase_tracker(), Phase::kSave);
  double waited = 0;
  Status st = FinishBackgroundSave(&waited);
  // The loop waits here anyway (a rollback, a stop, the end): the retention due now, not later.
  if (retention_due_) {
    const uint64_t t0 = env_->NowMicros();
    ApplyRetention();
    waited += static_cast<double>(env_->NowMicros() - t0) / 1e6;
  }
  wait_seconds_ += waited;
  return st;
}

void CheckpointController::WaitForSnapshot() {
  if (!SaveInFlight()) return;
  const uint64_t t0 = env_->NowMicros();
  writer_->WaitStaged();
  const double waited = static_cast<double>(env_->NowMicros() - t0) / 1e6;
  pending_.stall_seconds += waited;
  wait_seconds_ += waited;
}

double CheckpointController::TakeWaitSeconds() {
  const double s = wait_seconds_;
  wait_seconds_ = 0;
  return s;
}

void CheckpointController::ApplyRetention() {
  if (store_ == nullptr || SaveInFlight()) return;
  retention_due_ = false;
  Status st = store_->ApplyRetention(cfg_.keep_last_checkpoints);
  if (!st.ok()) log_("WARNING: retention could not remove an old checkpoint: " + st.message());
}

Status CheckpointController::CheckFailed(const Status& error) {
  failure_ = error;
  stop_ = StopReason::kCheckFailed;
  return error;
}

Status CheckpointController::Restore(const SavedTrainState& saved, bool in_save_dir) {
  KEEL_RETURN_IF_ERROR(RestoreTrainer(env_, saved, trainer_));
  if (in_save_dir) last_saved_ = saved.train.counters.iteration;
  return Status::OK();
}

Status CheckpointController::RollbackTo(const SavedTrainState& target,
                                        std::vector<std::string>* kept) {
  if (store_ == nullptr)
    return Status::NotFound(
        "there is no --save directory, so no checkpoint to roll back to; give --save");
  (void)WaitForSave();  // the save in flight first (its failure is logged and counted there)
  KEEL_RETURN_IF_ERROR(trainer_->comm()->AgreeOnStatus(
      store_->RollbackTo(target.train.counters.iteration, kept)));  // rank 0 moves, all wait
  KEEL_RETURN_IF_ERROR(trainer_->comm()->AgreeOnStatus(Restore(target, /*in_save_dir=*/true)));
  // Local pieces after the target belong to the abandoned timeline.
  if (local_) local_->DiscardNewerThan(target.train.counters.iteration);
  last_local_ = -1;
  return Status::OK();
}

std::string CheckpointController::SaveDueAfterIteration() {
  const int64_t it = trainer_->state().counters.iteration;
  const uint64_t now = env_->NowMicros();
  if (const int sig = PendingStopSignal(); sig != 0) {
    log_(fmt::format("received {} at iteration {}: saving and exiting",
                     sig == SIGTERM   ? "SIGTERM"
                     : sig == SIGUSR1 ? "SIGUSR1"
                                      : "a signal",
                     it));
    stop_ = StopReason::kSignal;
  } else if (!cfg_.kill_switch_path.empty() && env_->FileExists(cfg_.kill_switch_path)) {
    log_(
        fmt::format("kill switch {} found at iteration {}: saving and exiting (remove the file "
                    "before resuming)",
                    cfg_.kill_switch_path, it));
    stop_ = StopReason::kKillSwitch;
  } else if (cfg_.exit_interval > 0 && it % cfg_.exit_interval == 0) {
    log_(fmt::format("--exit-interval {} reached at iteration {}: saving and exiting",
                     cfg_.exit_interval, it));
    stop_ = StopReason::kExitInterval;
  } else if (cfg_.exit_duration_in_mins > 0 &&
             static_cast<double>(now - start_us_) / 60e6 >= cfg_.exit_duration_in_mins) {
    log_(fmt::format("--exit-duration-in-mins {} reached at iteration {}: saving and exiting",
                     cfg_.exit_duration_in_mins, it));
    stop_ = StopReason::kExitDuration;
  }
  bool minutes_due = cfg_.save_interval_minutes > 0 &&
                     static_cast<double>(now - last_save_us_) / 60e6 >= cfg_.save_interval_minutes;
  // A background save whose thread is done is collected here, without waiting: in one process
  // when its thread is done, across ranks when every rank's is.
  bool collect = SaveInFlight() && writer_->done();
  Communicator* comm = trainer_->comm();
  if (comm->world_size() > 1) {
    // A signal, the kill switch and the clocks are seen by each rank at its own moment: the ranks
    // take the strongest request of any, so all stop (or save) at the same iteration. A
    // background write still running on any rank defers its commit on all.
    double v[3] = {static_cast<double>(stop_), minutes_due ? 1.0 : 0.0,
                   SaveInFlight() && !collect ? 1.0 : 0.0};
    comm->AllReduceMaxHost(v, 3);
    const auto agreed = static_cast<StopReason>(static_cast<int>(v[0]));
    if (agreed != stop_)
      log_(fmt::format("stopping at iteration {} with the other ranks: {}", it,
                       StopReasonText(agreed)));
    stop_ = agreed;
    minutes_due = v[1] > 0;
    collect = SaveInFlight() && v[2] == 0;
  }
  if (collect) (void)WaitForSave();  // its outcome is logged and counted there
  if (stop_ != StopReason::kNone || store_ == nullptr || it == last_saved_) return "";
  if (cfg_.save_interval > 0 && it % cfg_.save_interval == 0) return "--save-interval";
  if (minutes_due) return "--save-interval-minutes";
  // The local tier on its own interval (a persistent save at the same iteration covers it).
  if (local_ && cfg_.non_persistent_save_interval > 0 &&
      it % cfg_.non_persistent_save_interval == 0 && it != last_local_)
    return kLocalSaveReason;
  return "";
}

bool CheckpointController::OnPeriodicSave(const Status& st) {
  if (st.ok()) {
    // A background save's outcome is counted when it is collected; a local save's never is.
    if (!SaveInFlight() && !last_was_local_) consecutive_failures_ = 0;
    return true;
  }
  // (kSaveFailures: the failure that stopped the run was counted when it was collected.)
  if (stop_ == StopReason::kCheckFailed || stop_ == StopReason::kSaveFailures) return false;
  ++consecutive_failures_;
  log_(
      fmt::format("ERROR: {} ({} of {} consecutive failures allowed; training continues and the "
                  "next save interval retries)",
                  st.message(), consecutive_failures_, kMaxConsecutiveSaveFailures));
  if (consecutive_failures_ >= kMaxConsecutiveSaveFailures) {
    failure_ = Status::IOError(fmt::format(
        "{} consecutive checkpoint saves failed, the last with: {}; stopping rather than training "
        "on without checkpoints. Fix the cause (disk space, permissions) and rerun the same "
        "command to resume from the newest valid checkpoint",
        consecutive_failures_, st.message()));
    stop_ = StopReason::kSaveFailures;
    return false;
  }
  return true;
}

Status CheckpointController::FinalSaveStatus() const {
  if (stop_ == StopReason::kSaveFailures || stop_ == StopReason::kCheckFailed) return failure_;
  return Status::OK();
}

bool CheckpointController::NeedsSave() const {
  return store_ != nullptr && trainer_->state().counters.iteration != last_saved_;
}

}  // namespace keel
