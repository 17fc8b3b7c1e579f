// Trainer: the training loop. One iteration = the global batch as micro-batches with gradient
// accumulation, an all-reduce of the gradients, clipping, and one AdamW update at the learning
// rate of the schedule. Everything that moves with the step is either a pure function of
// (config, consumed samples) — learning rate, batch size, which samples are read — or lives in
// TrainState (checkpoint/train_state.h), so a checkpoint can capture the whole run.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/train_state.h"
#include "comm/communicator.h"
#include "comm/gradient_reducer.h"
#include "config/config.h"
#include "guard/instability_detector.h"
#include "model/generate.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "optim/batch_rampup.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "pipeline/schedule.h"
#include "pipeline/stage_partition.h"
#include "train/sample_source.h"
#include "watchdog/phase_tracker.h"

namespace keel {

// One dataset's validation set (a mixture evaluates each on its own).
struct ValidationSet {
  std::string name;
  // Its weight in the mixture: the combined validation loss is the weighted mean.
  double weight = 1;
};

// What a trainer reads: its samples, and the names it reports them under.
struct TrainerData {
  TrainerData() = default;
  // Synthetic data from functions (tests, benchmarks); `valid` may be empty: no validation.
  TrainerData(SampleFn train, SampleFn valid);

  std::shared_ptr<SampleSource> samples;
  // A mixture: its datasets' names (index = the dataset a training sample says it came from;
  // with more than one, the loop reports the lm loss of each).
  std::vector<std::string> dataset_names{"data"};
  // The validation sets, evaluated one by one (none: no validation).
  std::vector<ValidationSet> valid_sets;
  // false: one unnamed validation set, one unnamed validation line. true: a line per set, after
  // the weighted mean's line when `combine_validation`; else (Megatron-DeepSpeed's validation
  // groups, each its own evaluation) only each set's line, and the first set's loss is the
  // evaluation's in the metrics record.
  bool report_each_set = false;
  bool combine_validation = true;
};

// The micro-batch schedule of one iteration, as a value: which samples each of this rank's
// micro-batches reads, in the order they are computed. Data parallel: every rank runs its
// micro-batches one after another, each forward then backward, and the gradients are reduced
// during the last backward. A pipeline schedule is another value of this kind.
struct MicroBatchSchedule {
  int64_t first_sample = 0;  // samples consumed before this iteration
  int micro_batch_size = 0;
  int64_t micro_batches = 0;  // on each rank
  int data_parallel_size = 1;
  int rank = 0;
  // Micro-batch m of rank r reads global samples (m * dp + r) * mbs + b, b < mbs.
  int64_t SampleIndex(int64_t m, int b) const {
    return first_sample + (m * data_parallel_size + rank) * static_cast<int64_t>(micro_batch_size) +
           b;
  }
};

// What one iteration will do, decided from the TrainState before it starts.
struct IterationPlan {
  int64_t iteration = 0;  // 1-based
  int64_t global_batch = 0;
  double lr = 0;  // of this iteration's update (the schedule at the position after its batch)
  uint64_t data_salt = 0;
  bool data_skipped = false;  // in a skipped data window: read past, nothing computed
  MicroBatchSchedule schedule;
};

// The first iteration of a skipped data window, as the log says it.
struct SkippedWindow {
  int64_t first = 0, last = 0;               // iterations
  int64_t first_sample = 0, end_sample = 0;  // samples [first_sample, end_sample)
};

// One iteration, as it went.
struct StepResult {
  int64_t iteration = 0;  // and the counters after it
  int64_t consumed_samples = 0;
  int64_t consumed_tokens = 0;
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
  // A non-finite loss or gradient (not a skipped window; not an fp16 overflow with a finite
  // loss, which is the loss scaler's business).
  bool nan = false;
  std::optional<SkippedWindow> window_begins;  // this iteration begins a skipped window
  // The update left NaN/Inf weights (or weights whose squares overflow): the run must stop.
  bool weights_nonfinite = false;
  // The guard's signals (log Z and the attention logit only when the guard watches).
  GuardSignals signals;
  double flops = 0;    // of the whole global batch (0 in a skipped window)
  double step_ms = 0;  // the slowest rank's time for the iteration
  // Every rank's own compute time this iteration (data, forward, backward, optimizer; the waits
  // on other ranks excluded), in rank order: what the straggler detector compares.
  std::vector<double> rank_compute_ms;
  // This rank's time in each phase of the iteration, under Megatron's timer names
  // (batch-generator, forward-compute, backward-compute, backward-params-all-reduce, optimizer);
  // empty without a phase tracker.
  std::vector<std::pair<std::string, double>> timers_ms;
  // The log interval this iteration closed (at every log-interval and at the last iteration):
  // what the iteration line reports.
  std::optional<LogIntervalState> closed_interval;
};

// The losses of one evaluation: the one the validation line and the metrics report, and each
// validation set's (in TrainerData::valid_sets order).
struct ValidationResult {
  double loss = NAN;
  std::vector<double> set_loss;
};

// TEST-ONLY faults the trainer lets a test plant at fixed points of an iteration
// (train/test_hooks.h implements them from KEEL_TRAIN_FAULTS); none in a normal run.
class TrainerFaults {
 public:
  virtual ~TrainerFaults() = default;
  // The factor on iteration `it`'s scheduled LR.
  virtual double LrFactor(int64_t it) const = 0;
  // Whether iteration `it`'s forward and backward run on a corrupted weight (a transient
  // arithmetic fault, once).
  virtual bool CorruptWeights(int64_t it) = 0;
  // After the backward of the last micro-batch, with this rank's compute seconds so far (a hang,
  // a slow rank, a crash).
  virtual void AfterBackward(int64_t it, double compute_seconds) = 0;
  // The all-reduced gradients, before their statistics (a NaN, an inf).
  virtual void OnGradients(int64_t it, float* grads, size_t n) = 0;
};

// The communicators a trainer runs on (comm/process_mesh.h): the whole world, the data-parallel
// group of its tensor position (gradients, ZeRO-1 shards, the batch's samples), and its
// tensor-parallel group (null or size 1: no tensor parallelism). With one process per model
// replica the data group is the world.
// The pipeline group (null or size 1: no pipeline parallelism) links this rank's stage to the
// others of its (tensor, data) position.
struct TrainerGroups {
  Communicator* world = nullptr;
  Communicator* data = nullptr;
  Communicator* tensor = nullptr;
  Communicator* pipeline = nullptr;
};

// The math of training, one iteration in steps that the run calls in order (TrainingRun's
// RunIteration reads top to bottom): PlanIteration, ComputeGradients, Update, EndIteration. Its
// state is the model, the optimizer and a TrainState; it decides nothing about guards, saves or
// logs.
class Trainer {
 public:
  // Data parallel only: `comm` is the world and the data group.
  Trainer(const TrainConfig& cfg, Backend* backend, Communicator* comm, TrainerData data);
  // Tensor x data parallel: the model is built on groups.tensor (with cfg.sequence_parallel), and
  // everything data parallel runs on groups.data; what every rank must agree on, on the world.
  Trainer(const TrainConfig& cfg, Backend* backend, TrainerGroups groups, TrainerData data);
  ~Trainer();

  // Fresh weights from the config's seed and init method.
  void InitializeWeights();

  // 1. What the next iteration does: its batch, its micro-batch schedule, its LR, or a skipped
  //    data window. Starts the iteration's clock and phases.
  IterationPlan PlanIteration();
  // 2. Forward and backward of every micro-batch of the plan's schedule, the gradients summed in
  //    the model's buffer and reduced across ranks, their statistics (norm, zeros, finiteness,
  //    fp16's overflow and loss-scale update) and the guard's signals, into `r`. A sample the
  //    source refuses is its Status (nothing applied; the state is the last iteration's).
  Status ComputeGradients(const IterationPlan& plan, StepResult* r);
  // 3. The AdamW update at the plan's LR when `apply` (the guard's verdict) and the gradients are
  //    finite and did not overflow; else the update is skipped and counted.
  void Update(bool apply, StepResult* r);
  // 4. The counters move past the iteration's batch; the slowest rank's time, every rank's
  //    compute time and this rank's phase timers; the log interval (closed at its end).
  void EndIteration(const IterationPlan& plan, StepResult* r);
  // 1-4 without a guard (every finite update applied): the tests' and benchmarks' iteration.
  StepResult TrainStep();

  // Whether there is validation data; the losses of one evaluation (--eval-iters batches of the
  // final global batch, the same samples each time) of every validation set.
  bool HasValidation() const { return !data_.valid_sets.empty(); }
  Status Validate(ValidationResult* out);
  // Mean lm loss over `iters` batches of validation set 0 (tests).
  double Evaluate(int64_t iters);

  // Everything but the tensors, as a value; Restore puts one back (a resume, a rollback, the
  // guard's LR cut). The tensors are the model's and the optimizer's.
  const TrainState& state() const { return state_; }
  void Restore(const TrainState& state);

  int64_t TotalIterations() const { return total_iters_; }
  // ZeRO-1 is on: this rank's optimizer holds only its shard (optimizer().shard()).
  bool sharded_optimizer() const { return zero_; }
  // The world (what every rank agrees on: saves, stops, the guard's decisions), and the
  // data-parallel and tensor-parallel groups (tensor: null without tensor parallelism).
  Communicator* comm() { return comm_; }
  Communicator* data_comm() { return data_comm_; }
  Communicator* tensor_comm() { return tensor_comm_; }
  Communicator* pipeline_comm() { return pipeline_comm_; }
  int tensor_size() const { return tp_size_; }
  int tensor_rank() const { return tp_rank_; }
  int pipeline_size() const { return pp_size_; }
  int pipeline_rank() const { return pp_rank_; }
  // Pipeline parallel: this rank's stage and its chunks' layers, for the logs.
  std::string DescribeStage() const;
  // The data-parallel gradient reduction's totals (communication time, the part not hidden
  // behind backward, bytes sent) since the trainer was built.
  const ReductionStats& reduction_stats() const { return reducer_->stats(); }
  const TrainConfig& config() const { return cfg_; }
  const TrainerData& data() const { return data_; }
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
  // collective: every rank calls it). Over the whole tensors in the one-rank model's order, so
  // the value does not depend on the layout; streamed: one rank hashes, the others send it their
  // slices one tensor at a time, so no rank holds more than about one whole tensor.
  uint64_t StateFingerprint();
  // The most host bytes the last StateFingerprint held at once on this rank (its test's figure).
  size_t fingerprint_peak_bytes() const { return fingerprint_peak_bytes_; }
  // Generation from the current weights (model/generate.h), the same tokens as the one-rank
  // model's: at P > 1 each token's forward runs through the stages and the last stage's choice
  // is sent back to every stage. A collective over this rank's tensor and pipeline groups; every
  // rank of them returns the tokens.
  std::vector<int32_t> Generate(const std::vector<int32_t>& prompt, const GenerateOptions& opts);
  double FlopsPerIteration(int64_t global_batch) const;

  // The guard's probes, between ComputeGradients and Update (every rank calls them together: a
  // collective). The mean lm loss of the current weights on this iteration's batch again (the
  // same bits as the iteration's own loss unless a transient fault struck one of the two), and
  // on the previous trained iteration's batch (NaN when there is none): low when the weights
  // are still healthy and only this batch is off. They need the guard on (the batches are kept
  // only then).
  // `differing_ranks` (optional): the ranks whose own sum differed from their first pass.
  double RerunLoss(std::vector<int>* differing_ranks = nullptr);
  double PreviousBatchLoss();

  // Test-only faults (train/test_hooks.h); null: none.
  void set_faults(TrainerFaults* f) { faults_ = f; }
  // Where the trainer reports its phases (the watchdog and the straggler detector read it);
  // null: not reported.
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
  // Reads sequence b of micro-batch m into batch_tokens_, inputs_ and targets_.
  Status LoadSequence(const IterationPlan& plan, int64_t m, int b);
  // Adds the iteration to the log interval; at the interval's end, hands it to `r`.
  void AccountIteration(StepResult* r);
  // Mean lm loss of the current weights over `iters` batches of validation set `set`.
  Status Evaluate(int64_t iters, int set, double* loss);

  // The world's sum of a per-replica value that every tensor rank (and pipeline stage) of a
  // replica holds (a loss): only one rank per replica adds its own, so every rank gets the same
  // bits.
  void SumOverReplicas(double* v, size_t n);
  // Whether this rank adds parameter `p` to the whole model's statistics: a split tensor's slice
  // always; a replicated one on tensor rank 0 only; the last stage's tied embedding copy never.
  bool CountsParam(const ParamInfo& p) const {
    return !p.tied_copy && (!p.split.replicated() || tp_rank_ == 0);
  }
  // Pipeline parallel: micro-batch m's tokens of this iteration (every stage reads them all).
  Status LoadPipelineBatch(const IterationPlan& plan, int64_t num_micro);
  // The forward of `micro` recorded micro-batches' (b, T + 1) samples through the stages; the sum
  // of their mean losses (every stage gets it).
  double PipelineForwardLoss(const int32_t* samples, int64_t micro);
  // The schedule of `micro` micro-batches (built once per count).
  const PipelineSchedule& ScheduleFor(int64_t micro);
  // This rank's share of the whole model's gradient statistics over own = [begin, end) of its
  // buffer: split tensors' elements each counted by the rank holding them, replicated tensors by
  // tensor rank 0 only; finiteness from every element.
  GradStats LocalGradStats(const float* grads, ShardRange own);

  TrainConfig cfg_;
  Backend* backend_;
  Communicator* comm_;                     // the world
  Communicator* data_comm_ = nullptr;      // the data-parallel group
  Communicator* tensor_comm_ = nullptr;    // the tensor-parallel group (null: none)
  Communicator* pipeline_comm_ = nullptr;  // the pipeline group (null: none)
  int tp_size_ = 1, tp_rank_ = 0;
  int pp_size_ = 1, pp_rank_ = 0;
  std::vector<GptModel*> chunks_;   // the model chunks this rank computes (pipeline parallel)
  std::vector<StageLayers> parts_;  // every virtual stage's layers (PartitionStages)
  std::map<int64_t, PipelineSchedule> schedules_;
  // Pipeline parallel: the iteration's micro-batches, (m, b, T) inputs and targets.
  std::vector<int32_t> pp_inputs_, pp_targets_;
  std::vector<int> pp_dataset_of_;
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
  // The guard watches: the signals that cost work (log Z, the attention logit) are measured and
  // the batches kept for its probes.
  bool watch_ = false;
  std::vector<int32_t> batch_tokens_, inputs_, targets_;
  // This rank's samples (seq_length + 1 tokens each) of the current and the previous trained
  // iteration, for the guard's probes.
  struct BatchRecord {
    std::vector<int32_t> tokens;
    int64_t micro_batches = 0;
  };
  BatchRecord cur_batch_, prev_batch_;
  double local_loss_sum_ = 0;  // this rank's sum of its micro-batch losses, this iteration
  // The one rank of each model replica that adds the replica's losses to the world's sums (tensor
  // rank 0 of the last stage, which measures them).
  bool replica_representative() const { return tp_rank_ == 0 && pp_rank_ == pp_size_ - 1; }
  double ReplayLocalLoss(const BatchRecord& b);
  std::vector<int> dataset_of_;                     // dataset of each sequence of the micro-batch
  std::vector<IterationRange> config_skip_ranges_;  // --skip-train-iteration/samples-range
  // Between ComputeGradients and Update: the factor on the gradients as the update reads them
  // (fp16's unscaling times the clipping coefficient).
  double grad_scale_ = 1.0;
  bool prev_data_skipped_ = false;  // the previous iteration of this process was skipped data
  std::chrono::steady_clock::time_point iteration_start_;
  TrainerFaults* faults_ = nullptr;
  PhaseTracker* phases_ = nullptr;
  double last_update_ratio_ = NAN;  // ||w_new - w_old|| / ||w_new|| of the last update
  double last_max_v_ = NAN;         // max of Adam's second moment after the last update
  size_t fingerprint_peak_bytes_ = 0;
};

}  // namespace keel
