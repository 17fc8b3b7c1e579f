#include "optim/adamw.h"

#include <cmath>

namespace keel {

AdamW::AdamW(Backend* backend, size_t num_params, const AdamWConfig& cfg)
    : backend_(backend), n_(num_params), cfg_(cfg) {
  m_ = backend_->AllocFloats(n_);
  v_ = backend_->AllocFloats(n_);
}

AdamW::~AdamW() {
  backend_->Free(m_);
  backend_->Free(v_);
}

void AdamW::Step(float* param, const float* grad, const std::vector<ParamInfo>& params, double lr,
                 Backend::AdamWStats* stats) {
  ++step_;
  for (const ParamInfo& p : params) {
    const float wd = p.weight_decay ? static_cast<float>(cfg_.weight_decay) : 0.0f;
    backend_->AdamWUpdate(param + p.offset, grad + p.offset, m_ + p.offset, v_ + p.offset, p.numel,
                          static_cast<float>(lr), static_cast<float>(cfg_.beta1),
                          static_cast<float>(cfg_.beta2), static_cast<float>(cfg_.eps), wd, step_,
                          stats);
  }
}

GradStats ComputeGradStats(Backend* backend, const float* grad, size_t n) {
  GradStats s;
  const double sq = backend->SumSquares(grad, n);
  s.finite = std::isfinite(sq) && backend->CountNonFinite(grad, n) == 0;
  s.norm = std::sqrt(sq);
  s.num_zeros = backend->CountZeros(grad, n);
  return s;
}

double ClipGradients(Backend* backend, float* grad, size_t n, double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  const double coeff = max_norm / (norm + 1e-6);
  if (coeff >= 1.0) return 1.0;
  backend->Scale(grad, n, static_cast<float>(coeff));
  return coeff;
}

}  // namespace keel
