// LrSchedule: the learning rate as a pure function of consumed samples, with the semantics of
// Megatron-LM's OptimizerParamScheduler.get_lr (linear warmup, then constant/linear/cosine decay
// to min-lr, then min-lr). Iteration-based lengths are converted to samples by multiplying by the
// global batch size, exactly as Megatron does.
//
// keel's convention: the update of an iteration uses LrAt(consumed samples INCLUDING that
// iteration's batch). Megatron evaluates the rate before counting the batch, so its first step has
// lr 0 under warmup; keel's first step has lr = max_lr * batch / warmup instead.
#pragma once

#include <cstdint>

#include "config/train_config.h"

namespace keel {

class LrSchedule {
 public:
  // Lengths in samples. Requires max_lr > 0, 0 <= min_lr <= max_lr, warmup >= 0, and
  // warmup < decay unless the style is constant (Validate enforces these).
  LrSchedule(LrDecayStyle style, double max_lr, double min_lr, int64_t warmup_samples,
             int64_t decay_samples);
  // From a validated config (global batch size and decay length already resolved).
  static LrSchedule FromConfig(const TrainConfig& cfg);

  double LrAt(int64_t consumed_samples) const;

  int64_t warmup_samples() const { return warmup_; }
  int64_t decay_samples() const { return decay_; }

 private:
  LrDecayStyle style_;
  double max_lr_;
  double min_lr_;
  int64_t warmup_;
  int64_t decay_;
};

}  // namespace keel
