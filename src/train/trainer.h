// Trainer: the training loop. One iteration = the global batch as micro-batches with gradient
// accumulation, an all-reduce of the gradients, clipping, and one AdamW update at the learning
// rate of the schedule. Everything that moves with the step is either a pure function of
// (config, consumed samples) — learning rate, batch size, which samples are read — or lives in
// TrainState (checkpoint/train_state.h), so a checkpoint can capture the whole run.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/train_state.h"
#include "comm/communicator.h"
#include "comm/gradient_reducer.h"
#include "config/config.h"
#include "guard/instability_detector.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "optim/batch_rampup.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "watchdog/phase_tracker.h"

namespace keel {

// Writes sample number `index` (seq_length + 1 tokens: inputs and shifted targets) into `tokens`
// and returns the index of the dataset of a mixture it came from (0 when there is one).
using SampleFn = std::function<int(int64_t index, int32_t* tokens)>;

// One dataset's validation set (a mixture evaluates each on its own).
struct ValidationSet {
  std::string name;
  // Its weight in the mixture: the combined validation loss is the weighted mean.
  double weight = 1;
  SampleFn samples;
};

struct StepResult {
  double loss = 0;  // mean lm loss over the global batch
  double grad_norm = 0;
  size_t num_zeros = 0;
  double lr = 0;
  int64_t global_batch = 0;
  std::vector<double> dataset_loss;        // per dataset: mean loss of its sequences (NaN: none)
  std::vector<int64_t> dataset_sequences;  // per dataset: sequences in this batch
  bool skipped = false;  // no update applied (non-finite, or the guard skipped it)
  // fp16: the scaled gradients overflowed (inf/NaN), so the update was skipped and the loss
  // scaler told (Megatron's found_inf); loss_scale is the scale after its update, as logged.
  bool overflow = false;
  double loss_scale = 1.0;
  LossScaleChange loss_scale_change = LossScaleChange::kNone;
  bool data_skipped = false;  // in a skipped data window: nothing was computed
  // The update left NaN/Inf weights (or weights whose squares overflow): the run must stop.
  bool weights_nonfinite = false;
  GuardSignals signals;
  double step_ms = 0;  // the slowest rank's time for the iteration
  // Every rank's own compute time this iteration (data, forward, backward, optimizer; the waits
  // on other ranks excluded), in rank order: what the straggler detector compares.
  std::vector<double> rank_compute_ms;
  // This rank's time in each phase of the iteration, under Megatron's timer names
  // (batch-generator, forward-compute, backward-compute, backward-params-all-reduce, optimizer);
  // empty without a phase tracker.
  std::vector<std::pair<std::string, double>> timers_ms;
};

// Decides, from an iteration's signals, whether its update is applied (the guard).
using UpdateGate = std::function<bool(const GuardSignals&)>;

// What the loop calls around iterations.
struct RunHooks {
  std::function<void(const std::string&)> log;
  // After every iteration, its log line and evaluation: false stops the loop (e.g. to save and
  // exit on a signal). May be empty.
  std::function<bool()> after_iteration;
  // One record per iteration (every field of the iteration line, per-dataset loss) and per
  // evaluation: the metrics stream. May be empty.
  std::function<void(const nlohmann::json&)> metrics;
  // After every iteration's update, with its result (every rank's compute time). May be empty.
  std::function<void(const StepResult&)> step;
};

// What a trainer reads: its training samples, and what it evaluates.
struct TrainerData {
  TrainerData() = default;
  TrainerData(SampleFn train_samples, SampleFn valid_samples)
      : train(std::move(train_samples)), valid(std::move(valid_samples)) {}

  SampleFn train;
  SampleFn valid;  // may be empty: no validation
  // A mixture: its datasets' names (index = what `train` returns; with more than one, the loop
  // reports the lm loss of each) and their validation sets, evaluated one by one (then `valid`
  // is unused and the validation line's loss is their weighted mean).
  std::vector<std::string> dataset_names{"data"};
  std::vector<ValidationSet> valid_sets;
  // The validation line is valid_sets' weighted mean, followed by each set's line; false
  // (Megatron-DeepSpeed's validation groups, each its own evaluation): only each set's line, and
  // the first set's loss is the evaluation's in the metrics record.
  bool combine_validation = true;
};

// What the micro-batches of one iteration add up to, reduced across data-parallel ranks. The
// gradients themselves are in the model's gradient buffer.
struct GradientAccumulation {
  double loss = 0;                    // mean lm loss over the global batch
  double log_z = 0;                   // mean log Z of the output softmax (a guard signal)
  double max_attn_logit = -INFINITY;  // this rank's largest attention logit (a guard signal)
  // Per dataset of a mixture: mean loss of its sequences (NaN: none), and how many there were.
  std::vector<double> dataset_loss;
  std::vector<int64_t> dataset_sequences;
};

class Trainer {
 public:
  Trainer(const TrainConfig& cfg, Backend* backend, Communicator* comm, TrainerData data);
  ~Trainer();

  // Fresh weights from the config's seed and init method.
  void InitializeWeights();
  // One training iteration: the global batch's gradients, then one update (or a skipped one).
  StepResult TrainStep();
  // Mean lm loss over `iters` validation batches (the same samples at every evaluation) of the
  // data's validation samples, or of `samples`.
  double Evaluate(int64_t iters);
  double Evaluate(int64_t iters, const SampleFn& samples);
  // The whole run from the current state: iterations until the configured length, the Megatron
  // iteration line every log-interval, validation every eval-interval; lines go to hooks.log.
  // Corruption, at once and with nothing more called, when an update leaves non-finite weights.
  Status Run(const RunHooks& hooks);

  // Everything but the tensors, as a value; Restore puts one back (a resume, a rollback, the
  // guard's LR cut). The tensors are the model's and the optimizer's.
  const TrainState& state() const { return state_; }
  void Restore(const TrainState& state);

  int64_t TotalIterations() const { return total_iters_; }
  // ZeRO-1 is on: this rank's optimizer holds only its shard (optimizer().shard()).
  bool sharded_optimizer() const { return zero_; }
  Communicator* comm() { return comm_; }
  // The data-parallel gradient reduction's totals (communication time, the part not hidden
  // behind backward, bytes sent) since the trainer was built.
  const ReductionStats& reduction_stats() const { return reducer_->stats(); }
  const TrainConfig& config() const { return cfg_; }
  GptModel& model() { return *model_; }
  AdamW& optimizer() { return *optimizer_; }
  // --fp16: the dynamic (or static) loss scaler; nullptr in fp32 and bf16, which do not scale.
  const LossScaler* loss_scaler() const { return scaler_.get(); }
  // --fp16 after a checkpoint saved in another precision: the scaler starts afresh from the
  // config (the state restored with the checkpoint belongs to no fp16 run).
  void ResetLossScaler();
  // The iterations whose batches read any of samples [first_sample, last_sample] (0-based
  // positions in the run's sample stream); first = -1 when the run never reaches them.
  IterationRange IterationsReading(int64_t first_sample, int64_t last_sample) const;
  // The first sample iteration `iteration` (1-based, from the current position on) reads.
  int64_t SamplesBefore(int64_t iteration) const;
  // The learning rate and global batch of the next iteration's update.
  double NextLr() const;
  int64_t NextGlobalBatch() const;
  // xxh3 over parameters, optimizer moments and the TrainState: equal fingerprints mean
  // bit-identical training state. The same value on every rank, whatever the sharding (a
  // collective: every rank calls it).
  uint64_t StateFingerprint();
  double FlopsPerIteration(int64_t global_batch) const;

  // Called before every update with the iteration's signals; false skips the update (the guard).
  void set_update_gate(UpdateGate g) { gate_ = std::move(g); }
  // The guard's probes, valid only inside the update gate (every rank calls them together: a
  // collective). The mean lm loss of the current weights on this iteration's batch again (the
  // same bits as the iteration's own loss unless a transient fault struck one of the two), and
  // on the previous trained iteration's batch (NaN when there is none): low when the weights
  // are still healthy and only this batch is off.
  // `differing_ranks` (optional): the ranks whose own sum differed from their first pass.
  double RerunLoss(std::vector<int>* differing_ranks = nullptr);
  double PreviousBatchLoss();
  // Called with the all-reduced gradients of each iteration before their statistics: the seam
  // of the test-only fault hooks (train/test_hooks.h), e.g. to plant a NaN.
  void set_gradient_fault(std::function<void(int64_t iteration, float* grads, size_t n)> f) {
    grad_fault_ = std::move(f);
  }
  // The factor on each iteration's scheduled LR: the seam of the test-only LR fault
  // (train/test_hooks.h), which raises the LR over a window.
  void set_lr_fault(std::function<double(int64_t iteration)> f) { lr_fault_ = std::move(f); }
  // Whether iteration N's forward and backward run on corrupted weights, once (a transient
  // arithmetic fault: the seam of the test-only hook that the guard's rerun must catch).
  void set_corrupt_fault(std::function<bool(int64_t iteration)> f) {
    corrupt_fault_ = std::move(f);
  }
  // Called on this rank after the backward of an iteration's last micro-batch, with the compute
  // seconds so far: the seam of the test-only per-rank faults (a hang, a slow rank, a crash).
  void set_compute_fault(std::function<void(int64_t iteration, double compute_seconds)> f) {
    compute_fault_ = std::move(f);
  }
  // Where the loop reports its phases (the watchdog and the straggler detector read it); null:
  // not reported.
  void set_phase_tracker(PhaseTracker* t) { phases_ = t; }
  PhaseTracker* phase_tracker() { return phases_; }

 private:
  bool IsSkipped(int64_t iteration) const;
  // Where the LR schedule stands: consumed samples, less those of fp16's overflowed iterations.
  int64_t ScheduleSamples() const {
    return state_.counters.consumed_samples - state_.loss_scaler.skipped_samples;
  }
  void EnterPhase(Phase p) {
    if (phases_) phases_->Enter(p);
  }
  // Forward and backward of every micro-batch of a global batch of `global_batch` samples, the
  // gradients summed in the model's buffer and all-reduced.
  GradientAccumulation AccumulateGradients(int64_t global_batch);
  // Gradient statistics, the guard's gate, clipping and the AdamW step at `r->lr`; fills r.
  void ApplyUpdate(int64_t iteration, const GradientAccumulation& acc, StepResult* r);
  // Adds an iteration to the log interval; prints the iteration line at the interval's end.
  void AccountIteration(const StepResult& r, const RunHooks& hooks);
  // Validation at an eval-interval: one line (and one metrics record), or one per dataset.
  void RunEvaluation(const RunHooks& hooks);

  TrainConfig cfg_;
  Backend* backend_;
  Communicator* comm_;
  TrainerData data_;
  std::unique_ptr<GptModel> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<LossScaler> scaler_;  // --fp16 only
  bool zero_ = false;  // ZeRO-1: the optimizer holds this rank's shard of the moments
  ShardRange shard_;   // this rank's shard of the parameter buffer (ShardOf)
  std::unique_ptr<GradientReducer> reducer_;
  BatchRampup rampup_;
  LrSchedule schedule_;
  TrainState state_;
  int64_t total_iters_ = 0;
  std::vector<int32_t> batch_tokens_, inputs_, targets_;
  // This rank's samples (seq_length + 1 tokens each) of the current and the previous trained
  // iteration, for the guard's probes.
  struct BatchRecord {
    std::vector<int32_t> tokens;
    int64_t micro_batches = 0;
  };
  BatchRecord cur_batch_, prev_batch_;
  double local_loss_sum_ = 0;  // this rank's sum of its micro-batch losses, this iteration
  double ReplayLocalLoss(const BatchRecord& b);
  // Test-only (train/test_hooks.h): iteration N's first forward runs on corrupted weights.
  std::function<bool(int64_t iteration)> corrupt_fault_;
  std::vector<int> dataset_of_;                     // dataset of each sequence of the micro-batch
  std::vector<IterationRange> config_skip_ranges_;  // --skip-train-iteration/samples-range
  UpdateGate gate_;
  std::function<void(int64_t, float*, size_t)> grad_fault_;
  std::function<void(int64_t, double)> compute_fault_;
  std::function<double(int64_t)> lr_fault_;
  PhaseTracker* phases_ = nullptr;
  double last_update_ratio_ = NAN;  // ||w_new - w_old|| / ||w_new|| of the last update
  double last_max_v_ = NAN;         // max of Adam's second moment after the last update
};

}  // namespace keel
