// FLOPs of one training iteration, counted the way Megatron-LM reports TFLOPs: matmuls only,
// forward x 3 for forward+backward, attention scores counted for the full (not causal) square.
//   per token forward = L (8h^2 + 4hF + 4sh) + 2hV     (F = FFN size; with F = 4h this is
//   Megatron's 72 B s L h^2 (1 + s/(6h) + V/(12hL)) for a whole iteration)
#pragma once

#include <cstdint>

#include "model/gpt.h"

namespace keel {

double TrainingFlopsPerToken(const GptSpec& spec, int seq_length);

}  // namespace keel
