// AdamW with decoupled weight decay over the model's flat parameter buffer. Its state (first and
// second moments and the step counter) is explicit so a checkpoint can save and restore it.
// With ZeRO-1 (--use-distributed-optimizer) each data-parallel rank holds the moments of only its
// shard of the buffer and updates only those parameters; the ranks then all-gather the weights.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "core/shard_range.h"
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
  // Moments for elements [shard.begin, shard.end) of a buffer of num_params (the whole buffer
  // when no shard is given; a shard may be empty).
  AdamW(Backend* backend, size_t num_params, const AdamWConfig& cfg,
        std::optional<ShardRange> shard = std::nullopt);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // One update of the shard's part of every tensor in `params` (slices of `param`/`grad`, the
  // whole buffers) at learning rate lr. With `stats`, also measures it (Backend::AdamWUpdate).
  // grad_scale multiplies every gradient as it is read (clipping, fp16's unscaling). param_lowp
  // (bf16/fp16, nullable): the weights' 16-bit compute copy, rewritten for every updated weight.
  void Step(float* param, const float* grad, const std::vector<ParamInfo>& params, double lr,
            Backend::AdamWStats* stats = nullptr, float grad_scale = 1.0f,
            uint16_t* param_lowp = nullptr);

  int64_t step() const { return step_; }  // number of updates applied so far
  void set_step(int64_t s) { step_ = s; }
  // First and second moments of the shard: element i is parameter shard().begin + i.
  float* exp_avg() { return m_; }
  float* exp_avg_sq() { return v_; }
  const ShardRange& shard() const { return shard_; }
  size_t num_params() const { return n_; }
  const AdamWConfig& config() const { return cfg_; }

 private:
  Backend* backend_;
  size_t n_;
  ShardRange shard_;
  AdamWConfig cfg_;
  float* m_ = nullptr;
  float* v_ = nullptr;
  int64_t step_ = 0;
};

// Gradient statistics Megatron prints: the global L2 norm before clipping and the number of
// gradient elements that are exactly zero. `finite` is false if any element is NaN or Inf.
struct GradStats {
  double sum_sq = 0.0;  // the squared norm (data-parallel ranks add theirs)
  double norm = 0.0;
  size_t num_zeros = 0;
  bool finite = true;
};
GradStats ComputeGradStats(Backend* backend, const float* grad, size_t n);
// Megatron's clipping factor: max_norm / (norm + 1e-6) when that is below 1, else 1 (also 1 when
// clipping is off, max_norm <= 0). The update multiplies the gradients by it (AdamW::Step).
double ClipCoefficient(double norm, double max_norm);

}  // namespace keel
