// BatchRampup: the global batch size as a pure function of consumed samples, following
// Megatron-LM's RampupBatchsizeNumMicroBatches exactly (--rampup-batch-size START INCR SAMPLES):
// the batch starts at START and grows by INCR every SAMPLES / ((global - START) / INCR) samples,
// reaching the global batch once more than SAMPLES samples are consumed.
#pragma once

#include <cstdint>

#include "config/train_config.h"

namespace keel {

class BatchRampup {
 public:
  // A constant global batch.
  BatchRampup(int64_t global, int micro, int dp);
  // A ramp-up. Requires 0 < start <= global, incr > 0, (global - start) % incr == 0, and every
  // stage divisible by micro * dp (Validate enforces these).
  BatchRampup(int64_t start, int64_t incr, int64_t ramp_samples, int64_t global, int micro, int dp);
  // From a validated config.
  static BatchRampup FromConfig(const TrainConfig& cfg);

  int64_t GlobalBatchAt(int64_t consumed_samples) const;
  int64_t NumMicroBatchesAt(int64_t consumed_samples) const;
  bool ramps() const { return num_increments_ > 0; }

 private:
  int64_t start_;
  int64_t incr_;
  int64_t ramp_samples_;
  int64_t global_;
  int64_t micro_times_dp_;
  int64_t num_increments_;
  double samples_per_increment_;
};

// Iterations of the run: train_iters for iteration-based runs; for samples-based runs Megatron's
// update_train_iters: step through the ramp-up batch by batch until more than the ramp-up samples
// are consumed, then floor((train_samples - consumed) / global) more (a partial last batch is
// dropped). Expects a validated config.
int64_t TotalTrainIters(const TrainConfig& cfg);

}  // namespace keel
