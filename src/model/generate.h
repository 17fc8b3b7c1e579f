// Text generation from a trained GptModel: temperature and top-k sampling, one token at a time
// over a fixed-size causal window (left-aligned, so padding after the last token cannot affect
// its logits). The random draws are Philox values keyed by (seed, kSampling, token position).
#pragma once

#include <cstdint>
#include <vector>

#include "model/gpt.h"

namespace keel {

struct GenerateOptions {
  int max_new_tokens = 64;
  float temperature = 0.8f;
  int top_k = 40;  // 0: no cut
  uint64_t seed = 1234;
  int window = 0;  // context length; 0: the model's max positions
};

std::vector<int32_t> Generate(GptModel& model, const std::vector<int32_t>& prompt,
                              const GenerateOptions& opts);

}  // namespace keel
