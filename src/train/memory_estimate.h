// The memory a training run needs, estimated before any of it is allocated, so that a model or
// micro-batch that cannot fit is refused with the numbers instead of swapping, being killed, or
// failing with std::bad_alloc hours later. Every term comes from the code that allocates it:
// GptModel::ParamCount (the parameter layout), GptModel::ActivationBytes (the buffer list the
// forward allocates) and SamplePrefetcher::BufferBytes at the run's read-ahead depth.
#pragma once

#include <cstdint>
#include <string>

#include "config/train_config.h"
#include "core/env.h"
#include "core/status.h"

namespace keel {

struct MemoryEstimate {
  uint64_t params = 0;       // parameters
  uint64_t weights = 0;      // fp32 weights (+ their 16-bit compute copy in bf16 and fp16)
  uint64_t gradients = 0;    // fp32 gradients
  uint64_t moments = 0;      // AdamW's two fp32 moments
  uint64_t activations = 0;  // one micro-batch's activations and gradient scratch
  uint64_t data = 0;         // the read-ahead ring and the loop's micro-batch token buffers
  uint64_t staging = 0;      // --async-save: the fp32 copies of weights and moments a save writes
  uint64_t total() const { return weights + gradients + moments + activations + data + staging; }
};

// Samples the run reads ahead of the loop (TrainingRun's SamplePrefetcher): two global batches,
// at most about 256 MiB of tokens, at least 8.
int64_t SamplePrefetchDepth(const TrainConfig& cfg);

// The estimate for a validated config (vocabulary known).
// std::bad_alloc as the user reads it: what keel was `doing` and what to change.
Status OutOfMemoryError(const std::string& doing);
MemoryEstimate EstimateRunMemory(const TrainConfig& cfg);

// "1.5 GiB", "320 MiB", "12.0 KiB", "512 B".
std::string FormatBytes(uint64_t bytes);

// Each term: "weights 566 KiB, gradients ..., data buffers 256 KiB".
std::string DescribeMemoryEstimate(const TrainConfig& cfg, const MemoryEstimate& e);

// InvalidArgument when `e` exceeds what `available` says this process may still allocate, naming
// the terms, the figure and its source, and what fits (the largest micro-batch, or how many
// layers); OK otherwise.
Status CheckMemoryFits(const TrainConfig& cfg, const MemoryEstimate& e,
                       const MemoryAvailable& available);

}  // namespace keel
