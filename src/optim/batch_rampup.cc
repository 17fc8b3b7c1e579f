#include "optim/batch_rampup.h"

#include <string>

#include "core/status.h"

namespace keel {

BatchRampup::BatchRampup(int64_t global, int micro, int dp)
    : BatchRampup(global, 1, 0, global, micro, dp) {}

BatchRampup::BatchRampup(int64_t start, int64_t incr, int64_t ramp_samples, int64_t global,
                         int micro, int dp)
    : start_(start),
      incr_(incr),
      ramp_samples_(ramp_samples),
      global_(global),
      micro_times_dp_(int64_t{micro} * dp) {
  KEEL_CHECK(micro_times_dp_ > 0 && start > 0 && incr > 0 && ramp_samples >= 0,
             "batch ramp-up not validated");
  KEEL_CHECK(start <= global && (global - start) % incr == 0, "batch ramp-up not validated");
  num_increments_ = (global - start) / incr;
  // Megatron divides in floating point; keel must match it stage for stage. With no increments
  // (start == global) Megatron would divide by zero; keel treats that as a constant batch.
  samples_per_increment_ =
      num_increments_ > 0 ? static_cast<double>(ramp_samples) / static_cast<double>(num_increments_)
                          : 0.0;
}

BatchRampup BatchRampup::FromConfig(const TrainConfig& cfg) {
  KEEL_CHECK(cfg.global_batch_size > 0, "config not validated: global batch size unresolved");
  const auto& r = cfg.rampup_batch_size;
  if (r.empty()) {
    return BatchRampup(cfg.global_batch_size, cfg.micro_batch_size, cfg.data_parallel_size);
  }
  KEEL_CHECK(r.size() == 3, "config not validated: rampup-batch-size needs 3 values");
  return BatchRampup(r[0], r[1], r[2], cfg.global_batch_size, cfg.micro_batch_size,
                     cfg.data_parallel_size);
}

int64_t BatchRampup::GlobalBatchAt(int64_t consumed) const {
  if (num_increments_ == 0 || consumed > ramp_samples_) return global_;
  const auto steps = static_cast<int64_t>(static_cast<double>(consumed) / samples_per_increment_);
  return start_ + steps * incr_;
}

int64_t BatchRampup::NumMicroBatchesAt(int64_t consumed) const {
  return GlobalBatchAt(consumed) / micro_times_dp_;
}

int64_t TotalTrainIters(const TrainConfig& cfg) {
  if (cfg.train_iters > 0) return cfg.train_iters;
  KEEL_CHECK(cfg.global_batch_size > 0, "config not validated: global batch size unresolved");
  const int64_t g = cfg.global_batch_size;
  if (cfg.rampup_batch_size.empty()) return cfg.train_samples / g;
  const BatchRampup ramp = BatchRampup::FromConfig(cfg);
  const int64_t ramp_samples = cfg.rampup_batch_size[2];
  int64_t iterations = 0, consumed = 0;
  while (consumed <= ramp_samples) {
    consumed += ramp.GlobalBatchAt(consumed);
    ++iterations;
  }
  // Python floor division, as Megatron: the ramp's last batch may overshoot train_samples.
  const int64_t rest = cfg.train_samples - consumed;
  iterations += rest >= 0 ? rest / g : -((-rest + g - 1) / g);
  return iterations;
}

}  // namespace keel
