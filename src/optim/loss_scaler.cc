#include "optim/loss_scaler.h"

#include <algorithm>

namespace keel {

LossScalerOptions LossScalerOptions::FromConfig(const TrainConfig& cfg) {
  LossScalerOptions o;
  o.dynamic = !(cfg.loss_scale > 0);
  o.constant_scale = cfg.loss_scale > 0 ? cfg.loss_scale : 1.0;
  o.initial_scale = cfg.initial_loss_scale;
  o.min_scale = cfg.min_loss_scale;
  o.window = cfg.loss_scale_window;
  o.hysteresis = cfg.hysteresis;
  return o;
}

const char* LossScaleChangeName(LossScaleChange c) {
  switch (c) {
    case LossScaleChange::kOverflowCounted:
      return "overflow counted";
    case LossScaleChange::kBackedOff:
      return "backed off";
    case LossScaleChange::kGrew:
      return "grew";
    case LossScaleChange::kNone:
      break;
  }
  return "none";
}

LossScaler::LossScaler(const LossScalerOptions& o) : opt_(o) {
  state_.scale = o.dynamic ? o.initial_scale : o.constant_scale;
  state_.hysteresis_tracker = o.hysteresis;
}

LossScaleChange LossScaler::Update(bool found_inf) {
  if (!opt_.dynamic) return LossScaleChange::kNone;
  LossScalerState& s = state_;
  if (found_inf) {
    s.growth_tracker = 0;
    s.hysteresis_tracker -= 1;
    if (s.hysteresis_tracker > 0) return LossScaleChange::kOverflowCounted;
    const double lowered = std::max(s.scale * opt_.backoff_factor, opt_.min_scale);
    const bool changed = lowered != s.scale;
    s.scale = lowered;
    return changed ? LossScaleChange::kBackedOff : LossScaleChange::kOverflowCounted;
  }
  s.growth_tracker += 1;
  if (s.growth_tracker == opt_.window) {
    s.growth_tracker = 0;
    s.hysteresis_tracker = opt_.hysteresis;
    s.scale *= opt_.growth_factor;
    return LossScaleChange::kGrew;
  }
  return LossScaleChange::kNone;
}

}  // namespace keel
