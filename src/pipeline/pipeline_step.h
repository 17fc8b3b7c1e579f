// One iteration's micro-batches through a pipeline stage's models (model/gpt.h's ModelStage):
// the schedule (pipeline/schedule.h) run by the executor (pipeline/executor.h), the boundary
// activations and their gradients sent point to point on the pipeline group, and, with a tied
// output layer, the first and last stage's embedding gradients summed (Megatron-LM's embedding
// group) so that their two copies of the word embeddings stay the same bits. docs/pipeline.md.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "model/gpt.h"
#include "pipeline/executor.h"
#include "pipeline/schedule.h"
#include "pipeline/stage_partition.h"

namespace keel {

// The model part of chunk `chunk` on pipeline rank `rank`: virtual stage chunk * P + rank of a
// partition (PartitionStages' out, virtual stage order).
ModelStage ModelStageOf(const std::vector<StageLayers>& partition, int pipeline, int rank,
                        int chunk);

struct PipelineMicroBatch {
  // (B,T) host memory. Tokens: read on the first stage, and on every stage when position ids or
  // the attention mask are reset at documents (null elsewhere is fine). Targets: read on the
  // last stage.
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
};

// What a caller hears during a step (each optional).
struct PipelineStepHooks {
  // Right after chunk `chunk`'s forward of micro-batch `mb` (its model's last forward is that
  // micro-batch's: the loss of each sequence, log Z, the attention logits can be read).
  std::function<void(int mb, int chunk)> after_forward;
  // Before each forward (false) or backward (true) computes, and before each send or receive
  // (a run's phases: compute and the waits on other stages told apart).
  std::function<void(bool backward)> on_compute;
  std::function<void()> on_transfer;
};

struct PipelineStepResult {
  // The sum of the micro-batches' mean losses (the last stage's), the same on every stage.
  double loss_sum = 0;
  PipelineRunStats stats;  // of this stage's schedule
  int peak_slots = 0;      // most micro-batches whose activations one chunk held at once
};

// Runs stage `pipeline->rank()` of `schedule`: chunks[c] is this rank's model of virtual stage
// c * P + rank (ModelStageOf), built with the same spec and tensor group on every stage. Every
// chunk's gradients are written (StartGradAccumulation) and accumulate over the micro-batches in
// schedule order, each micro-batch's loss weighted by `dloss` per token (as GptModel::Forward).
// With a tied output layer and more than one stage, the gradients of the two copies of the word
// embeddings are then summed (SyncTiedEmbeddingGrads). InvalidArgument when the chunks or the
// micro-batches do not match the schedule or the group.
Status RunPipelineStep(const PipelineSchedule& schedule, Communicator* pipeline,
                       const std::vector<GptModel*>& chunks,
                       const std::vector<PipelineMicroBatch>& microbatches, int B, int T,
                       float dloss, PipelineStepResult* out, const PipelineStepHooks& hooks = {});

// The forward of every micro-batch only (an evaluation, the guard's reruns), one micro-batch
// after another through the virtual stages in order: *loss_sum is the sum of their mean losses,
// added in micro-batch order on the last stage (the same bits as RunPipelineStep's on the same
// weights and batches), the same on every stage. Every rank of the pipeline group calls it.
Status RunPipelineForward(Communicator* pipeline, const std::vector<GptModel*>& chunks,
                          const std::vector<PipelineMicroBatch>& microbatches, int B, int T,
                          double* loss_sum, const PipelineStepHooks& hooks = {});

// With a tied output layer split from the embedding (first and last stage differ): the first
// stage's embedding.word_embeddings.weight gradient and the last stage's copy's are both replaced
// by their sum (first + last: the same bits on both); a no-op on the other stages and otherwise.
// Every rank of the pipeline group calls it.
void SyncTiedEmbeddingGrads(Communicator* pipeline, const std::vector<GptModel*>& chunks);

}  // namespace keel
