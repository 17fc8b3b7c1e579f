#include "optim/lr_schedule.h"

#include <cmath>
#include <numbers>
#include <string>

#include "core/status.h"

namespace keel {

LrSchedule::LrSchedule(LrDecayStyle style, double max_lr, double min_lr, int64_t warmup_samples,
                       int64_t decay_samples)
    : style_(style),
      max_lr_(max_lr),
      min_lr_(min_lr),
      warmup_(warmup_samples),
      decay_(decay_samples) {
  KEEL_CHECK(max_lr > 0 && min_lr >= 0 && min_lr <= max_lr, "lr bounds not validated");
  KEEL_CHECK(warmup_samples >= 0 && decay_samples >= 0, "negative schedule length");
  KEEL_CHECK(style == LrDecayStyle::kConstant || warmup_samples < decay_samples,
             "warmup must end before decay");
}

LrSchedule LrSchedule::FromConfig(const TrainConfig& cfg) {
  KEEL_CHECK(cfg.global_batch_size > 0, "config not validated: global batch size unresolved");
  const int64_t g = cfg.global_batch_size;
  if (cfg.train_iters > 0) {
    const int64_t decay_iters = cfg.lr_decay_iters > 0 ? cfg.lr_decay_iters : cfg.train_iters;
    return LrSchedule(cfg.lr_decay_style, cfg.lr, cfg.min_lr, cfg.lr_warmup_iters * g,
                      decay_iters * g);
  }
  const int64_t decay = cfg.lr_decay_samples > 0 ? cfg.lr_decay_samples : cfg.train_samples;
  return LrSchedule(cfg.lr_decay_style, cfg.lr, cfg.min_lr, cfg.lr_warmup_samples, decay);
}

double LrSchedule::LrAt(int64_t s) const {
  if (warmup_ > 0 && s <= warmup_) {
    return max_lr_ * static_cast<double>(s) / static_cast<double>(warmup_);
  }
  if (style_ == LrDecayStyle::kConstant) return max_lr_;
  if (s > decay_) return min_lr_;
  const double ratio = static_cast<double>(s - warmup_) / static_cast<double>(decay_ - warmup_);
  const double coeff = style_ == LrDecayStyle::kLinear
                           ? 1.0 - ratio
                           : 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  return min_lr_ + coeff * (max_lr_ - min_lr_);
}

}  // namespace keel
