// Text generation from a trained GptModel: temperature and top-k sampling, one token at a time
// over a fixed-size causal window (left-aligned, so padding after the last token cannot affect
// its logits). The random draws are Philox values keyed by (seed, kSampling, token position).
#pragma once

#include <cstdint>
#include <functional>
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

// The token the draw at sequence position `position` (the sequence's length so far) picks from a
// row of logits, at the options' temperature and top-k.
int32_t SampleToken(const std::vector<float>& logits, size_t position, const GenerateOptions& opts);

// Generate's loop with the forward given (a model split over pipeline stages): `next(window,
// last, position)` returns the token after position `last` of `window` (W tokens, the context
// left-aligned, zeros after it), to be drawn at sequence position `position`. W: opts.window, or
// `max_positions` when that is 0.
using NextTokenFn =
    std::function<int32_t(const std::vector<int32_t>& window, int last, size_t position)>;
std::vector<int32_t> GenerateWith(const NextTokenFn& next, const std::vector<int32_t>& prompt,
                                  const GenerateOptions& opts, int max_positions);

}  // namespace keel
