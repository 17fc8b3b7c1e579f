#include "model/flops.h"

namespace keel {

double TrainingFlopsPerToken(const GptSpec& spec, int seq_length) {
  const double L = spec.num_layers, h = spec.hidden, F = spec.ffn_hidden, s = seq_length;
  const double V = spec.padded_vocab;
  const double forward = L * (8 * h * h + 4 * h * F + 4 * s * h) + 2 * h * V;
  return 3.0 * forward;
}

}  // namespace keel
