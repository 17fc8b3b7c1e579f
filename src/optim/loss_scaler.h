// LossScaler: fp16's loss scaling, with Megatron-LM's rules (its ConstantGradScaler and
// DynamicGradScaler). The loss, so every gradient, is multiplied by `scale` so that small
// gradients do not underflow fp16; the optimizer divides it out. Every iteration reports whether
// any scaled gradient overflowed (found_inf, after the data-parallel reduction):
//   found_inf  the update is skipped (by the caller); growth_tracker = 0; hysteresis_tracker -= 1;
//              when hysteresis_tracker <= 0: scale = max(scale * backoff_factor, min_scale)
//   clean      growth_tracker += 1; after `window` clean iterations in a row: scale *=
//              growth_factor, growth_tracker = 0, hysteresis_tracker = hysteresis
// Only a growth restores the hysteresis: after it is spent, every overflow lowers the scale.
// A static scaler (--loss-scale S) never changes; its overflows are still skipped.
#pragma once

#include <cstdint>

#include "config/train_config.h"

namespace keel {

struct LossScalerState {
  double scale = 1.0;
  int64_t growth_tracker = 0;
  int64_t hysteresis_tracker = 0;
  // Samples of the iterations whose update an overflow skipped. Megatron steps its LR scheduler
  // only after a successful update, so the schedule's position is consumed samples minus these.
  int64_t skipped_samples = 0;
  bool operator==(const LossScalerState&) const = default;
};

struct LossScalerOptions {
  bool dynamic = true;
  double initial_scale = 65536.0;  // 2^16 (TrainConfig::initial_loss_scale says why)
  double min_scale = 1.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t window = 1000;  // --loss-scale-window
  int64_t hysteresis = 2;
  double constant_scale = 1.0;  // when !dynamic (--loss-scale)
  // Dynamic unless cfg.loss_scale > 0.
  static LossScalerOptions FromConfig(const TrainConfig& cfg);
};

enum class LossScaleChange {
  kNone,
  kOverflowCounted,  // an overflow the hysteresis absorbed: the scale is kept
  kBackedOff,        // the scale was lowered
  kGrew,             // the scale was raised after a clean window
};
const char* LossScaleChangeName(LossScaleChange c);

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& o);
  double scale() const { return state_.scale; }
  bool dynamic() const { return opt_.dynamic; }
  // Once per iteration, after the overflow check; returns what happened to the scale.
  LossScaleChange Update(bool found_inf);
  const LossScalerState& state() const { return state_; }
  void Restore(const LossScalerState& s) { state_ = s; }
  void AddSkippedSamples(int64_t n) { state_.skipped_samples += n; }
  const LossScalerOptions& options() const { return opt_; }

 private:
  LossScalerOptions opt_;
  LossScalerState state_;
};

}  // namespace keel
