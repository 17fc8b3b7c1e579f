// Test helpers for tests that build a Trainer by hand (and perhaps a GuardController and a
// CheckpointController): TestLoop runs the steps of TrainingRun::RunIteration in its order,
// without the run's data, health checks and journal; CapturedLog collects the lines logged;
// FunctionFaults plants gradient and transient faults from test functions.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/log.h"
#include "train/checkpoint_controller.h"
#include "train/guard_controller.h"
#include "train/run_reporter.h"
#include "train/trainer.h"

namespace keel::test_loop {

// The lines logged while it lives (stdout muted).
class CapturedLog {
 public:
  CapturedLog() {
    SetLogCopy([this](const std::string& l) { lines.push_back(l); }, /*mute_stdout=*/true, "");
  }
  ~CapturedLog() { SetLogCopy(nullptr, /*mute_stdout=*/false, ""); }
  std::vector<std::string> lines;
};

class FunctionFaults : public TrainerFaults {
 public:
  using GradFn = std::function<void(int64_t it, float* grads, size_t n)>;
  using CorruptFn = std::function<bool(int64_t it)>;
  explicit FunctionFaults(GradFn grads, CorruptFn corrupt = nullptr)
      : grads_(std::move(grads)), corrupt_(std::move(corrupt)) {}
  double LrFactor(int64_t) const override { return 1; }
  bool CorruptWeights(int64_t it) override { return corrupt_ && corrupt_(it); }
  void AfterBackward(int64_t, double) override {}
  void OnGradients(int64_t it, float* g, size_t n) override {
    if (grads_) grads_(it, g, n);
  }

 private:
  GradFn grads_;
  CorruptFn corrupt_;
};

struct TestLoop {
  explicit TestLoop(Trainer* t, GuardController* g = nullptr, CheckpointController* c = nullptr)
      : tr(t), guard(g), ckpt(c) {}

  Trainer* tr = nullptr;
  GuardController* guard = nullptr;      // may be null: every finite update applied
  CheckpointController* ckpt = nullptr;  // may be null: no saves, no stop requests
  RunMetrics* metrics = nullptr;         // may be null
  // After each iteration's report and the guard's act, before the checkpoint's turn; false
  // stops the loop.
  std::function<bool()> go_on;

  Status Save(const std::string& why) {
    KEEL_RETURN_IF_ERROR(ckpt->SaveNow(why, guard ? guard->StateForCheckpoint() : nullptr));
    if (guard) guard->AfterSave(ckpt->last_saved_iteration());
    ckpt->ApplyRetention();
    return Status::OK();
  }

  // Until the end, a stop, or a guard stop; then the final save (with a checkpoint controller).
  Status Run() {
    const TrainConfig& cfg = tr->config();
    RunReporter reporter(cfg, tr->data(), tr->TotalIterations(), metrics, nullptr);
    bool go = true;
    while (go && tr->state().counters.iteration < tr->TotalIterations()) {
      const IterationPlan plan = tr->PlanIteration();
      StepResult r;
      GuardDecision decision;
      if (!plan.data_skipped) {
        KEEL_RETURN_IF_ERROR(tr->ComputeGradients(plan, &r));
        const StepVerdict v =
            r.overflow || guard == nullptr ? StepVerdict{!r.overflow, {}} : guard->Judge(r.signals);
        decision = v.decision;
        tr->Update(v.apply_update, &r);
      }
      tr->EndIteration(plan, &r);
      if (r.weights_nonfinite) return Status::Corruption("non-finite weights");
      reporter.Iteration(r);
      const TrainCounters& c = tr->state().counters;
      if (cfg.eval_iters > 0 && tr->HasValidation() &&
          (c.iteration % cfg.eval_interval == 0 || c.iteration == tr->TotalIterations())) {
        ValidationResult v;
        KEEL_RETURN_IF_ERROR(tr->Validate(&v));
        reporter.Validation(c.iteration, c.consumed_samples, v);
      }
      if (guard && !guard->Act(decision)) return Status::OK();
      if (go_on && !go_on()) return Status::OK();
      if (ckpt == nullptr) continue;
      const std::string why = ckpt->SaveDueAfterIteration();
      go = ckpt->stop_reason() == StopReason::kNone &&
           (why.empty() || ckpt->OnPeriodicSave(Save(why)));
    }
    if (ckpt == nullptr) return Status::OK();
    KEEL_RETURN_IF_ERROR(ckpt->FinalSaveStatus());
    if (ckpt->NeedsSave())
      return Save(ckpt->stop_reason() == StopReason::kNone ? "end of training" : "stop request");
    return Status::OK();
  }
};

}  // namespace keel::test_loop
