// The rules a parallel layout (tensor T x pipeline P x data D ranks) must obey, checked before any
// work by `keel train` and priced by `keel plan` through this one function, so the two never
// disagree:
//   - the world is a multiple of T * P (every model replica needs T * P ranks); D = world / (T P);
//   - T divides the attention heads, the key/value groups and the FFN size (each tensor rank
//     holds whole heads and an equal slice of the MLP); the vocabulary is padded to a multiple of
//     --make-vocab-size-divisible-by x T (Megatron's rule), --pad-vocab-size-to must divide by T;
//   - P is at most the layers (every stage holds a layer); with interleaving (V chunks of
//     --num-layers-per-virtual-pipeline-stage layers per stage), the layers are P * V * that,
//     and the micro-batches per data rank a multiple of P (Megatron-LM's interleaved schedule);
//   - the global batch is a multiple of micro-batch x D.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/train_config.h"
#include "core/status.h"

namespace keel {

struct ParallelLayout {
  int tensor = 1, pipeline = 1, data = 1;
  int layers_per_virtual_stage = 0;  // 0: not interleaved
  int virtual_stages = 1;            // model chunks per pipeline rank (V)
  int64_t padded_vocab = 0;          // the vocabulary padded for T
  int64_t micro_batches = 0;         // per data rank and iteration, at the full global batch
};

// `world_what` names the world in messages ("the 8 MPI ranks", "2 nodes x 4 GPUs = 8 GPUs").
// `notes` gets what was chosen on the user's behalf (padding, an uneven stage split).
Status CheckParallelLayout(const TrainConfig& c, int world, const std::string& world_what,
                           int tensor, int pipeline, int layers_per_virtual_stage,
                           ParallelLayout* out, std::vector<std::string>* notes);

// The vocabulary padded for tensor parallel T: up to a multiple of divisible_by * T.
int64_t PaddedVocabFor(int64_t vocab, int64_t divisible_by, int tensor);

}  // namespace keel
