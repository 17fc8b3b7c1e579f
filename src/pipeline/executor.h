// Runs one stage's actions of a PipelineSchedule (pipeline/schedule.h) over the pipeline
// communicator's blocking Send/Recv, calling the stage's forward and backward per (micro-batch,
// chunk). The stage keeps what its backward needs (its saved activations) and accumulates its own
// weight gradients; the executor only moves the boundary tensors, so a stage's gradients add up
// in its schedule's backward order: micro-batch 0, 1, ... per chunk, as a sequential run does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "comm/communicator.h"
#include "core/status.h"
#include "pipeline/schedule.h"

namespace keel {

struct StageFunctions {
  // Floats at every boundary between virtual stages: micro-batch x sequence x hidden (b s h).
  size_t activation_floats = 0;
  // Forward of (micro-batch, chunk): `input` is null on the first virtual stage (the stage reads
  // its tokens), `output` null on the last (the stage computes the loss).
  std::function<void(int mb, int chunk, const float* input, float* output)> forward;
  // Backward: `output_grad` null on the last virtual stage (it starts from the loss),
  // `input_grad` null on the first.
  std::function<void(int mb, int chunk, const float* output_grad, float* input_grad)> backward;
  // Optional: before each send and receive.
  std::function<void()> before_transfer;
};

struct PipelineRunStats {
  double wall_seconds = 0;     // first action to last
  double compute_seconds = 0;  // inside forward and backward
  int64_t bytes_sent = 0, bytes_received = 0;
  int sends = 0, receives = 0;
};

// Runs stage `comm->rank()` of `schedule`; `comm` is the pipeline group (stages(), in order).
// InvalidArgument when the group's size is not the schedule's stage count or a callback is
// missing.
Status RunPipelineSchedule(const PipelineSchedule& schedule, Communicator* comm,
                           const StageFunctions& fns, PipelineRunStats* stats);

}  // namespace keel
