// AdamW with decoupled weight decay over the model's flat parameter buffer. Its state (first and
// second moments and the step counter) is explicit so a checkpoint can save and restore it.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/gpt.h"

namespace keel {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // applied only to tensors with ParamInfo::weight_decay
};

class AdamW {
 public:
  AdamW(Backend* backend, size_t num_params, const AdamWConfig& cfg);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // One update of every tensor in `params` (slices of `param`/`grad`) at learning rate lr.
  // With `stats`, also measures the update (see Backend::AdamWUpdate).
  void Step(float* param, const float* grad, const std::vector<ParamInfo>& params, double lr,
            Backend::AdamWStats* stats = nullptr);

  int64_t step() const { return step_; }  // number of updates applied so far
  void set_step(int64_t s) { step_ = s; }
  float* exp_avg() { return m_; }     // first moment, same layout as the parameters
  float* exp_avg_sq() { return v_; }  // second moment
  size_t size() const { return n_; }
  const AdamWConfig& config() const { return cfg_; }

 private:
  Backend* backend_;
  size_t n_;
  AdamWConfig cfg_;
  float* m_ = nullptr;
  float* v_ = nullptr;
  int64_t step_ = 0;
};

// Gradient statistics Megatron prints: the global L2 norm before clipping and the number of
// gradient elements that are exactly zero. `finite` is false if any element is NaN or Inf.
struct GradStats {
  double norm = 0.0;
  size_t num_zeros = 0;
  bool finite = true;
};
GradStats ComputeGradStats(Backend* backend, const float* grad, size_t n);
// Scales the gradients by max_norm / (norm + 1e-6) when that is below 1 (Megatron's rule).
// Returns the factor applied (1 if none).
double ClipGradients(Backend* backend, float* grad, size_t n, double norm, double max_norm);

}  // namespace keel
