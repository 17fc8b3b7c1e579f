// FLOPs of one training iteration, counted the way Megatron-LM reports TFLOPs: matmuls only,
// forward x 3 for forward+backward, attention scores counted for the full (not causal) square.
//   per token forward = L (2hW + 2h^2 + 2hF1 + 2Fh + 4sh) + 2hV
// (W = QKV width, 3h without grouped-query attention; F = FFN size, F1 = F or 2F with SwiGLU).
// GPT-2's shape gives L (8h^2 + 4hF + 4sh) + 2hV; with F = 4h that is Megatron's
// 72 B s L h^2 (1 + s/(6h) + V/(12hL)) for a whole iteration.
#pragma once

#include <cstdint>

#include "model/gpt.h"

namespace keel {

double TrainingFlopsPerToken(const GptSpec& spec, int seq_length);
// One rank's share on `tensor` tensor-parallel ranks: every product is split evenly (columns,
// rows, heads or vocabulary rows; model/gpt.h), so the whole model's count divided by `tensor`.
double TrainingFlopsPerTokenPerRank(const GptSpec& spec, int seq_length, int tensor);

}  // namespace keel
