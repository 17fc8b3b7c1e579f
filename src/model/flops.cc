#include "model/flops.h"

namespace keel {

double TrainingFlopsPerToken(const GptSpec& spec, int seq_length) {
  const double L = spec.num_layers, h = spec.hidden, F = spec.ffn_hidden, s = seq_length;
  const double V = spec.padded_vocab, W = spec.QkvWidth(), F1 = spec.Fc1Width();
  // QKV 2hW, attention projection 2h^2, FFN 2h F1 + 2 F h, attention's two products 4sh.
  const double forward =
      L * (2 * h * W + 2 * h * h + 2 * h * F1 + 2 * F * h + 4 * s * h) + 2 * h * V;
  return 3.0 * forward;
}

double TrainingFlopsPerTokenPerRank(const GptSpec& spec, int seq_length, int tensor) {
  return TrainingFlopsPerToken(spec, seq_length) / tensor;
}

}  // namespace keel
