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
  uint64_t activations = 0;  // one micro-batch's activations and gradient scratch (pipeline
                             // parallel: every micro-batch a chunk holds at once under 1F1B)
  uint64_t data = 0;         // the read-ahead ring and the loop's micro-batch token buffers
  uint64_t staging = 0;      // --async-save: the fp32 copies of weights and moments a save writes
  // Pipeline parallel: the boundary activations and gradients received or waiting for their send
  // (the executor's), and the tied embedding gradient exchanged between the first and last stage.
  uint64_t boundary = 0;
  // Pipeline parallel: the stage counted (-1: no pipeline), the most micro-batches its chunks hold
  // at once (summed over chunks), and its layers ("layers 0-1 + embedding") for messages.
  int pipeline_stage = -1;
  int micro_batches_held = 1;
  std::string stage_layers;
  uint64_t total() const {
    return weights + gradients + moments + activations + data + staging + boundary;
  }
};

// Samples the run reads ahead of the loop (TrainingRun's SamplePrefetcher): two global batches,
// at most about 256 MiB of tokens, at least 8.
int64_t SamplePrefetchDepth(const TrainConfig& cfg);

// std::bad_alloc as the user reads it: what keel was `doing` and what to change.
Status OutOfMemoryError(const std::string& doing);

// The estimate for a validated config (vocabulary known), for one rank. Pipeline parallel: the
// ranks of stage `pipeline_rank` (its chunks' parameters, the activations of the micro-batches
// the 1F1B or interleaved schedule has each chunk hold at once, the boundary buffers); -1: the
// stage that needs the most (what every rank checks, so all refuse or start together).
MemoryEstimate EstimateRunMemory(const TrainConfig& cfg, int pipeline_rank = -1);

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
