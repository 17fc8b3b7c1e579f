#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/status.h"

namespace keel {

AdamW::AdamW(Backend* backend, size_t num_params, const AdamWConfig& cfg,
             std::optional<ShardRange> shard)
    : backend_(backend),
      n_(num_params),
      shard_(shard.value_or(ShardRange{0, num_params})),
      cfg_(cfg) {
  KEEL_CHECK(shard_.end <= n_, "optimizer shard beyond the parameters");
  m_ = backend_->AllocFloats(shard_.size());
  v_ = backend_->AllocFloats(shard_.size());
}

AdamW::~AdamW() {
  backend_->Free(m_);
  backend_->Free(v_);
}

void AdamW::Step(float* param, const float* grad, const std::vector<ParamInfo>& params, double lr,
                 Backend::AdamWStats* stats, float grad_scale, uint16_t* param_lowp) {
  ++step_;
  for (const ParamInfo& p : params) {
    const size_t lo = std::max(p.offset, shard_.begin);
    const size_t hi = std::min(p.offset + p.numel, shard_.end);
    if (lo >= hi) continue;
    const float wd = p.weight_decay ? static_cast<float>(cfg_.weight_decay) : 0.0f;
    const size_t s = lo - shard_.begin;
    backend_->AdamWUpdate(param + lo, grad + lo, m_ + s, v_ + s, hi - lo, static_cast<float>(lr),
                          static_cast<float>(cfg_.beta1), static_cast<float>(cfg_.beta2),
                          static_cast<float>(cfg_.eps), wd, step_, stats, grad_scale,
                          param_lowp != nullptr ? param_lowp + lo : nullptr);
  }
}

GradStats ComputeGradStats(Backend* backend, const float* grad, size_t n) {
  GradStats s;
  const Backend::SquaresAndZeros sz = backend->SumSquaresAndZeros(grad, n);
  const double sq = sz.sum_sq;
  // A NaN or inf element makes the sum of squares NaN or inf: a finite sum needs no second pass
  // over the gradients (an infinite one from overflowing squares is judged non-finite too).
  s.finite = std::isfinite(sq);
  s.sum_sq = sq;
  s.norm = std::sqrt(sq);
  s.num_zeros = sz.zeros;
  return s;
}

double ClipCoefficient(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  const double coeff = max_norm / (norm + 1e-6);
  return coeff >= 1.0 ? 1.0 : coeff;
}

}  // namespace keel
