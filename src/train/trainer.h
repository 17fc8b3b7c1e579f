// Trainer: the training loop. One iteration = the global batch as micro-batches with gradient
// accumulation, an all-reduce of the gradients, clipping, and one AdamW update at the learning
// rate of the schedule. Everything that moves with the step is either a pure function of
// (config, consumed samples) — learning rate, batch size, which samples are read — or lives in
// TrainState, so a checkpoint can capture the whole run.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/env.h"
#include "guard/instability_detector.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "optim/batch_rampup.h"
#include "optim/lr_schedule.h"

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

// Counters that advance with the run; with the model and optimizer, the whole training state.
struct TrainCounters {
  int64_t iteration = 0;         // completed iterations
  int64_t consumed_samples = 0;  // all samples read (the data cursor and the schedule position)
  int64_t consumed_tokens = 0;
  int64_t skipped_iterations = 0;  // updates not applied (non-finite loss or gradients)
  int64_t nan_iterations = 0;
  int64_t data_skipped_iterations = 0;  // iterations in a skipped data window (no forward)
};

// Inclusive range of iterations whose data is skipped.
struct IterationRange {
  int64_t first = 0, last = -1;
  bool Contains(int64_t it) const { return it >= first && it <= last; }
};

struct StepResult {
  double loss = 0;  // mean lm loss over the global batch
  double grad_norm = 0;
  size_t num_zeros = 0;
  double lr = 0;
  int64_t global_batch = 0;
  std::vector<double> dataset_loss;        // per dataset: mean loss of its sequences (NaN: none)
  std::vector<int64_t> dataset_sequences;  // per dataset: sequences in this batch
  bool skipped = false;       // no update applied (non-finite, or the guard skipped it)
  bool data_skipped = false;  // in a skipped data window: nothing was computed
  GuardSignals signals;
  double step_ms = 0;
};

// Decides, from an iteration's signals, whether its update is applied (the guard).
using UpdateGate = std::function<bool(const GuardSignals&)>;

// Accumulators of the log interval in progress (the metrics cursor). They are checkpointed, so a
// run resumed mid-interval prints the same iteration lines as one that never stopped.
struct LogIntervalState {
  double loss_sum = 0, ms = 0, flops = 0;
  int64_t iters = 0, ok = 0, skipped = 0, samples = 0;
  // Per dataset of a mixture: summed mean loss of its sequences, and their count.
  std::vector<double> dataset_loss_sum;
  std::vector<int64_t> dataset_sequences;
};

// What the loop calls around iterations.
struct RunHooks {
  std::function<void(const std::string&)> log;
  // After every iteration, its log line and evaluation: false stops the loop (e.g. to save and
  // exit on a signal). May be empty.
  std::function<bool()> after_iteration;
  // One record per iteration (every field of the iteration line, per-dataset loss) and per
  // evaluation: the metrics stream. May be empty.
  std::function<void(const nlohmann::json&)> metrics;
};

class Trainer {
 public:
  Trainer(const TrainConfig& cfg, Backend* backend, Communicator* comm, Env* env,
          SampleFn train_samples, SampleFn valid_samples);
  ~Trainer();

  // Fresh weights from the config's seed and init method.
  void InitializeWeights();
  // One training iteration.
  StepResult TrainStep();
  // Mean lm loss over `iters` validation batches (the same samples at every evaluation) of the
  // constructor's validation samples, or of `samples`.
  double Evaluate(int64_t iters);
  double Evaluate(int64_t iters, const SampleFn& samples);
  // Names of the datasets of a mixture (index = what the SampleFn returns). With more than one,
  // the loop reports the lm loss of each (a line after the iteration line, and the metrics).
  void set_dataset_names(std::vector<std::string> names);
  // Per-dataset validation sets: evaluated one by one at each evaluation; the validation line's
  // loss is then their weighted mean. Without them, the constructor's validation samples are used.
  void set_validation_sets(std::vector<ValidationSet> sets) { valid_sets_ = std::move(sets); }
  // The whole run from the current state: iterations until the configured length, the Megatron
  // iteration line every log-interval, validation every eval-interval; lines go to hooks.log.
  Status Run(const RunHooks& hooks);

  int64_t TotalIterations() const { return total_iters_; }
  GptModel& model() { return *model_; }
  AdamW& optimizer() { return *optimizer_; }
  TrainCounters& counters() { return counters_; }
  LogIntervalState& log_interval_state() { return interval_; }
  // Multiplier of the schedule's learning rate (1 unless changed on resume; see train_checkpoint).
  double lr_scale() const { return lr_scale_; }
  void set_lr_scale(double s) { lr_scale_ = s; }
  const LrSchedule& schedule() const { return schedule_; }
  const BatchRampup& rampup() const { return rampup_; }
  const TrainConfig& config() const { return cfg_; }
  // Data windows skipped by the guard's rollbacks (part of the checkpoint). IsSkipped also
  // honours --skip-train-iteration-range, which comes from the config of each run.
  const std::vector<IterationRange>& skip_ranges() const { return skip_ranges_; }
  // The iterations whose batches read any of samples [first_sample, last_sample] (0-based
  // positions in the run's sample stream); first = -1 when the run never reaches them.
  IterationRange IterationsReading(int64_t first_sample, int64_t last_sample) const;
  void set_skip_ranges(std::vector<IterationRange> r) { skip_ranges_ = std::move(r); }
  void AddSkipRange(IterationRange r) { skip_ranges_.push_back(r); }
  bool IsSkipped(int64_t iteration) const;
  // Generation of the data order: 0, raised by the guard's re-seeding rung. The sample function
  // reads it to pick the order (see train_cmd).
  uint64_t data_salt() const { return data_salt_; }
  void set_data_salt(uint64_t s) { data_salt_ = s; }
  // Fault-injection seam for tests: called with the all-reduced gradients of each iteration
  // before their statistics (e.g. to plant a NaN).
  void set_gradient_fault(std::function<void(int64_t iteration, float* grads, size_t n)> f) {
    grad_fault_ = std::move(f);
  }
  // Called before every update with the iteration's signals; false skips the update.
  void set_update_gate(UpdateGate g) { gate_ = std::move(g); }
  // The samples iteration `iteration` (1-based, from the current position on) reads:
  // [first, first + count). Used to report skipped windows in samples.
  int64_t SamplesBefore(int64_t iteration) const;
  // The learning rate the next iteration's update will use.
  double NextLr() const;
  // xxh3 over parameters, optimizer moments and step, counters and the LR scale: equal
  // fingerprints mean bit-identical training state.
  uint64_t StateFingerprint();
  double FlopsPerIteration(int64_t global_batch) const;

 private:
  // Validation at an eval-interval: one line (and one metrics record), or one per dataset.
  void RunEvaluation(const RunHooks& hooks);

  TrainConfig cfg_;
  Backend* backend_;
  Communicator* comm_;
  Env* env_;
  SampleFn train_samples_, valid_samples_;
  std::unique_ptr<GptModel> model_;
  std::unique_ptr<AdamW> optimizer_;
  BatchRampup rampup_;
  LrSchedule schedule_;
  TrainCounters counters_;
  LogIntervalState interval_;
  double lr_scale_ = 1.0;
  int64_t total_iters_ = 0;
  std::vector<int32_t> batch_tokens_, inputs_, targets_;
  std::vector<int> dataset_of_;                     // dataset of each sequence of the micro-batch
  std::vector<IterationRange> skip_ranges_;         // the guard's (checkpointed)
  std::vector<IterationRange> config_skip_ranges_;  // --skip-train-iteration/samples-range
  std::vector<std::string> dataset_names_{"data"};
  std::vector<ValidationSet> valid_sets_;
  uint64_t data_salt_ = 0;
  UpdateGate gate_;
  std::function<void(int64_t, float*, size_t)> grad_fault_;
  double last_update_ratio_ = NAN;  // ||w_new - w_old|| / ||w_new|| of the last update
  double last_max_v_ = NAN;         // max of Adam's second moment after the last update
};

// The model shape a validated config describes.
GptSpec SpecFromConfig(const TrainConfig& cfg);

}  // namespace keel
