// TrainingRun::Train: the loop, one iteration read top to bottom, and how the run ends
// (training_run.h).
#include "train/training_run.h"

#include <fmt/format.h>

#include <chrono>

#include "checkpoint/manifest.h"
#include "core/log.h"
#include "data/prepare.h"
#include "model/generate.h"
#include "train/memory_estimate.h"

namespace keel {

const char* OutcomeName(TrainingRun::Outcome outcome) {
  switch (outcome) {
    case TrainingRun::Outcome::kFinished:
      return "finished";
    case TrainingRun::Outcome::kAlreadyComplete:
      return "already complete";
    case TrainingRun::Outcome::kStopped:
      return "stopped";
    case TrainingRun::Outcome::kNotStarted:
      return "not started";
    case TrainingRun::Outcome::kGuardStopped:
      return "stopped by the guard";
  }
  return "?";
}

// One iteration, as llm.c's step or torchtitan's train_step: the batch's gradients and the
// guard's signals, the guard's verdict, the update (or none), the report, the health checks, the
// guard's recovery, and a save or a stop. Every rank runs it in step (the collectives inside).
Status TrainingRun::RunIteration(bool* go_on) {
  // 1. The plan: this iteration's batch as a micro-batch schedule and its LR, or a skipped
  //    data window (its samples read past, nothing computed).
  const IterationPlan plan = trainer_->PlanIteration();
  StepResult r;
  GuardDecision decision;
  if (!plan.data_skipped) {
    // 2. Forward and backward of every micro-batch, the gradients reduced across the ranks,
    //    their statistics and the guard's signals. A sample that cannot be used stops here.
    if (Status st = trainer_->ComputeGradients(plan, &r); !st.ok()) return StopOnDataError(st);
    if (const PhaseTracker* phases = trainer_->phase_tracker())
      goodput_->Add(GoodputClock::Part::kDataWait, phases->IterationSeconds(Phase::kData));
    // 3. The guard's verdict on the signals (an fp16 overflow is the loss scaler's business: no
    //    update, nothing to judge). Its reruns and probes are goodput's guard time.
    StepVerdict verdict{false, {}};
    if (!r.overflow) {
      GoodputScope g(goodput_.get(), GoodputClock::Part::kGuard);
      verdict = guard_->Judge(r.signals);
    }
    decision = verdict.decision;
    // 4. The update, or a skipped one (never a non-finite one), once a background save has
    //    copied the weights and moments it changes.
    ckpt_->WaitForSnapshot();
    trainer_->Update(verdict.apply_update, &r);
  }
  // 5. The counters move past the batch; the iteration's time is the slowest rank's.
  trainer_->EndIteration(plan, &r);
  // 6. Health and report: stragglers and throughput drops; the iteration line and metrics.
  health_->OnStep(r);
  if (r.weights_nonfinite) return NonFiniteWeights(r);  // never evaluated or saved
  reporter_->Iteration(r);
  const TrainCounters& c = trainer_->state().counters;
  const bool last = c.iteration == trainer_->TotalIterations();
  if (cfg_.eval_iters > 0 && trainer_->HasValidation() &&
      (c.iteration % cfg_.eval_interval == 0 || last)) {
    PhaseScope eval(trainer_->phase_tracker(), Phase::kEval);
    GoodputScope g(goodput_.get(), GoodputClock::Part::kEval);
    ValidationResult v;
    if (Status st = trainer_->Validate(&v); !st.ok()) return StopOnDataError(st);
    reporter_->Validation(c.iteration, c.consumed_samples, v);
  }
  // 7. The guard carries out its decision: a rollback, an LR cut, or a stop. Goodput records
  //    the iterations before a rollback (it makes them lost) and counts the restore as resume.
  const bool rollback = decision.kind == GuardDecision::Kind::kRollback;
  if (rollback) {
    // A rollback reads and moves checkpoints: a background save is committed first.
    (void)ckpt_->WaitForSave();  // its failure is logged and counted there
    goodput_->Add(GoodputClock::Part::kSave, ckpt_->TakeWaitSeconds());
  }
  if (rollback) goodput_->Record("rollback", c.iteration);
  bool acted = false;
  {
    GoodputScope g(rollback ? goodput_.get() : nullptr, GoodputClock::Part::kResume);
    acted = guard_->Act(decision);
  }
  if (rollback) goodput_->MovedTo(c.iteration);
  if (!acted) {
    *go_on = false;
    return Status::OK();
  }
  // 8. Replica checks on their interval: replicas that differ stop the run, unsaved.
  KEEL_RETURN_IF_ERROR(health_->AfterIteration());
  // 9. A save on its interval; a stop request ends the loop (Train saves after it).
  //    With --async-save a periodic save goes on in the background; a finished one is collected
  //    here (its commit, across ranks, is the loop's save stall).
  const std::string save_why = ckpt_->SaveDueAfterIteration();
  goodput_->Add(GoodputClock::Part::kSave, ckpt_->TakeWaitSeconds());
  *go_on = ckpt_->stop_reason() == StopReason::kNone &&
           (save_why.empty() ||
            ckpt_->OnPeriodicSave(Save(save_why, CheckpointController::SaveMode::kBackground)));
  return Status::OK();
}

Status TrainingRun::Save(const std::string& why, CheckpointController::SaveMode mode) {
  Status st;
  {
    GoodputScope g(goodput_.get(), GoodputClock::Part::kSave);
    st = SaveUnmeasured(why, mode);
  }
  // Every checkpoint is a record's boundary: a later resume from it splits no record.
  if (st.ok()) goodput_->Record("save", trainer_->state().counters.iteration);
  return st;
}

Status TrainingRun::SaveUnmeasured(const std::string& why, CheckpointController::SaveMode mode) {
  // A damaged replica is never saved: the replicas are compared first (data parallel).
  if (Status check = health_->CheckReplicas("before a save"); !check.ok())
    return ckpt_->CheckFailed(check);
  const auto t0 = std::chrono::steady_clock::now();
  KEEL_RETURN_IF_ERROR(ckpt_->SaveNow(why, guard_->StateForCheckpoint(), mode));
  health_->OnSave(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  guard_->AfterSave(ckpt_->last_saved_iteration());  // the first save after a spike is pinned
  ckpt_->ApplyRetention();
  return Status::OK();
}

Status TrainingRun::NonFiniteWeights(const StepResult& r) {
  // The newest checkpoint is where the run can go on from: this state is never saved.
  const NonFiniteParams nf = FindNonFiniteParams(trainer_->model());
  const std::string what =
      nf.count > 0 ? fmt::format(
                         "iteration {}: the update at learning rate {:.3E} left {} of {} weights "
                         "NaN or Inf ({} in {}, the first tensor holding one); the run stops "
                         "without saving this state",
                         r.iteration, r.lr, nf.count, trainer_->model().num_params(),
                         nf.in_first_tensor, nf.first_tensor)
                   : fmt::format(
                         "iteration {}: the update at learning rate {:.3E} left weights so large "
                         "(beyond about 1e17) that their squares overflow fp32; the run stops "
                         "without saving this state",
                         r.iteration, r.lr);
  return Status::Corruption(
      fmt::format("{}; {}. {} with a smaller --lr", what, LastCheckpointText(),
                  store_ ? "Resume from it (or from an older one with --load " +
                               JoinPath(cfg_.save, "iter_N") + ")"
                         : std::string("Train again")));
}

Status TrainingRun::Train(Outcome* outcome) {
  if (not_started_) {
    *outcome = Outcome::kNotStarted;
    return Status::OK();
  }
  const TrainCounters& c = trainer_->state().counters;
  start_iteration_ = c.iteration;
  goodput_->Start(c.iteration);
  *outcome = Outcome::kFinished;
  if (c.iteration >= trainer_->TotalIterations()) {
    Log("the checkpoint at iteration {} already completes this run of {} iterations; raise "
        "--train-iters (and accept the longer decay with --override-scheduler) to train further",
        c.iteration, trainer_->TotalIterations());
    *outcome = Outcome::kAlreadyComplete;
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      for (bool go_on = true; go_on && c.iteration < trainer_->TotalIterations();)
        KEEL_RETURN_IF_ERROR(RunIteration(&go_on));
    } catch (const std::bad_alloc&) {
      return OutOfMemoryError(fmt::format("training (iteration {})", c.iteration + 1));
    }
    goodput_->LoopEnded();
    // The end of the run and a stop request wait for a background save (and commit it).
    (void)ckpt_->WaitForSave();  // a failure is logged and counted there
    goodput_->Add(GoodputClock::Part::kSave, ckpt_->TakeWaitSeconds());
    if (guard_->stopped()) {
      // The state is not healthy: no final checkpoint of it; the pinned ones remain.
      LogError("error: " + guard_->stop_message());
      LogError(fmt::format(
          "the run's chronicle is in {}",
          cfg_.save.empty() ? std::string("the log above") : JoinPath(cfg_.save, kChronicleFile)));
      Log("state fingerprint: {:016x}", trainer_->StateFingerprint());
      *outcome = Outcome::kGuardStopped;
      return Status::OK();
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    KEEL_RETURN_IF_ERROR(ckpt_->FinalSaveStatus());
    if (ckpt_->NeedsSave())
      KEEL_RETURN_IF_ERROR(
          Save(ckpt_->stop_reason() == StopReason::kNone ? "end of training" : "stop request"));
    if (ckpt_->stop_reason() != StopReason::kNone) {
      Log("stopped at iteration {} of {} because {}{}", c.iteration, trainer_->TotalIterations(),
          StopReasonText(ckpt_->stop_reason()),
          store_ ? "; run the same command to resume" : " (no --save: nothing was saved)");
      Log("state fingerprint: {:016x}", trainer_->StateFingerprint());
      *outcome = Outcome::kStopped;
      return Status::OK();
    }
    Log("training finished: iteration {} in {:.1f} s", c.iteration, secs);
    LogDataParallelTraffic(secs);
    LogDataReadAhead();
  }
  Log("state fingerprint: {:016x}", trainer_->StateFingerprint());
  health_->Stop();  // the loop is over: the sample below is data rank 0's model replica's
  if (store_)
    Log("checkpoints are in {} (sample with `keel sample --load {}`)", cfg_.save, cfg_.save);
  try {
    return PrintSample();
  } catch (const std::bad_alloc&) {
    return OutOfMemoryError("sampling text after training (--sample-tokens)");
  }
}

void TrainingRun::LogDataReadAhead() {
  const SamplePrefetcher::Stats ps = samples_->prefetch_stats();
  if (cfg_.num_workers == 0)
    Log("data: {} samples read on the loop's thread (--num-workers 0)", ps.served);
  else
    Log("data: {} samples read ahead on {}; the loop waited for {} of them ({:.1f} ms in all, "
        "{} read-ahead restarts)",
        ps.served,
        cfg_.num_workers == 1 ? std::string("a background thread")
                              : fmt::format("{} background threads", cfg_.num_workers),
        ps.waited, ps.wait_ms, ps.restarts);
}

void TrainingRun::LogDataParallelTraffic(double train_seconds) {
  // (The data group's: tensor parallel ranks reduce their own slices with their data replicas.)
  Communicator* data = trainer_->data_comm();
  const int world = data->world_size();
  if (world == 1) return;
  const ReductionStats& rs = trainer_->reduction_stats();
  const int64_t iters = trainer_->state().counters.iteration - start_iteration_;
  if (iters <= 0 || rs.buckets == 0) return;
  const size_t n = trainer_->model().num_params();
  // This rank sends the part of each bucket it does not own (reduce-scatter), then its shard to
  // every other rank (all-gather of the weights, or of the gradients without ZeRO-1).
  const double rs_bytes = static_cast<double>(rs.bytes_sent);
  const double ag_bytes = static_cast<double>(ShardOf(n, data->rank(), world).size()) * 4.0 *
                          (world - 1) * static_cast<double>(iters);
  const double bound = 2.0 * (world - 1) / world * static_cast<double>(n) * 4.0;
  const double per_iter = (rs_bytes + ag_bytes) / static_cast<double>(iters);
  Log("data parallel: this rank sent {:.2f} MB per iteration ({:.2f} reduce-scatter + {:.2f} "
      "all-gather; the 2(N-1)/N x gradient-bytes lower bound is {:.2f} MB); gradient reduction "
      "{:.3f} s in {} buckets, of which {:.3f} s not hidden behind backward ({:.0f}% overlapped); "
      "{:.1f}% of the training time waited on it",
      per_iter / 1e6, rs_bytes / static_cast<double>(iters) / 1e6,
      ag_bytes / static_cast<double>(iters) / 1e6, bound / 1e6, rs.comm_seconds, rs.buckets,
      rs.wait_seconds,
      rs.comm_seconds > 0 ? 100.0 * std::max(0.0, 1.0 - rs.wait_seconds / rs.comm_seconds) : 0.0,
      100.0 * rs.wait_seconds / std::max(train_seconds, 1e-9));
}

Status TrainingRun::StopOnDataError(const Status& error) {
  // The bad sample stopped its iteration before the update: the weights and the TrainState are
  // those of the last completed iteration, so that much progress is kept.
  const int64_t it = trainer_->state().counters.iteration;
  if (comm_->world_size() > 1)  // the other ranks wait in a collective: no save is possible
    return Status::InvalidArgument(fmt::format("{}. Rank {} stops every rank of the job; {}",
                                               error.message(), comm_->rank(),
                                               LastCheckpointText()));
  const char* resume = ": the same command resumes from it once the data is fixed";
  std::string kept;
  if (!store_) {
    kept = "No --save: nothing was saved";
  } else if (it == 0) {
    kept = "No iteration completed: nothing to save";
  } else if (ckpt_->last_saved_iteration() == it) {
    kept = fmt::format("Iteration {}, the last completed, is saved in {}{}", it, cfg_.save, resume);
  } else if (Status st = Save("bad data"); st.ok()) {
    kept =
        fmt::format("Iteration {}, the last completed, was saved in {}{}", it, cfg_.save, resume);
  } else {
    kept =
        fmt::format("Saving iteration {} failed: {}; {}", it, st.message(), LastCheckpointText());
  }
  Log("state fingerprint: {:016x}", trainer_->StateFingerprint());
  return Status::InvalidArgument(error.message() + ". " + kept);
}

std::string TrainingRun::LastCheckpointText() {
  int64_t marker = -1;
  if (!store_) return "no --save was given, so there is no checkpoint";
  if (!store_->ReadMarker(&marker).ok())
    return fmt::format("{} holds no checkpoint of this run", cfg_.save);
  return fmt::format("the last checkpoint is {} (iteration {}; `keel ckpt list {}` lists all)",
                     JoinPath(cfg_.save, CheckpointDirName(marker)), marker, cfg_.save);
}

Status TrainingRun::PrintSample() {
  // The tensor and pipeline ranks of data rank 0 generate together (the model's forward is
  // theirs); rank 0 logs.
  if (cfg_.sample_tokens <= 0 || trainer_->data_comm()->rank() != 0) return Status::OK();
  std::unique_ptr<Tokenizer> tok;
  KEEL_RETURN_IF_ERROR(LoadTokenizerForDataset(data_.prefix, data_.meta, &tok));
  std::vector<int32_t> prompt = tok->Encode(cfg_.sample_prompt);
  if (prompt.empty()) prompt.push_back(tok->EodId());
  GenerateOptions go;
  go.max_new_tokens = cfg_.sample_tokens;
  go.seed = cfg_.seed;
  go.window = cfg_.seq_length;
  // Pipeline parallel: each token's forward runs through the stages, the last stage's choice
  // sent back to all (no rank joins the whole model).
  const std::vector<int32_t> out = trainer_->Generate(prompt, go);
  prompt.insert(prompt.end(), out.begin(), out.end());  // decoded together: see sample_cmd.cc
  if (comm_->rank() == 0)
    Log("sample (temperature {}, top-k {}):\n{}", go.temperature, go.top_k, tok->Decode(prompt));
  return Status::OK();
}

}  // namespace keel
