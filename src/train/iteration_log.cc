#include "train/iteration_log.h"

#include <fmt/format.h>

#include <cmath>

namespace keel {

std::string FormatIterationLine(const IterationStats& s) {
  std::string out;
  out += fmt::format(" iteration {:8d}/{:8d} |", s.iteration, s.train_iters);
  out += fmt::format(" consumed samples: {:12d} |", s.consumed_samples);
  out += fmt::format(" consumed tokens: {:12d} |", s.consumed_tokens);
  out += fmt::format(" elapsed time per iteration (ms): {:.1f} |", s.elapsed_ms_per_iter);
  out += fmt::format(" learning rate: {:.3E} |", s.learning_rate);
  out += fmt::format(" global batch size: {:5d} |", s.global_batch_size);
  // Like Megatron, a field with no value in this interval is left out: no lm loss when no update
  // was applied, no grad norm after a skipped window, no throughput when nothing was computed.
  if (!std::isnan(s.lm_loss)) out += fmt::format(" lm loss: {:.6E} |", s.lm_loss);
  out += fmt::format(" loss scale: {:.1f} |", s.loss_scale);
  if (!std::isnan(s.grad_norm)) {
    out += fmt::format(" grad norm: {:.3f} |", s.grad_norm);
    out += fmt::format(" num zeros: {:.1f} |", s.num_zeros);
  }
  out += fmt::format(" number of skipped iterations: {:3d} |", s.skipped_iterations);
  out += fmt::format(" number of nan iterations: {:3d} |", s.nan_iterations);
  if (!std::isnan(s.samples_per_second))
    out += fmt::format(" samples per second: {:.3f} |", s.samples_per_second);
  if (!std::isnan(s.tflops)) out += fmt::format(" TFLOPs: {:.2f} |", s.tflops);
  return out;
}

double LossPpl(double loss) {
  return std::exp(std::min(20.0, loss));  // a diverged model's PPL stays printable
}

std::string FormatValidationLine(int64_t iteration, double loss, const std::string& dataset) {
  const double ppl = LossPpl(loss);
  return fmt::format(
      " validation loss at iteration {}{} | lm loss value: {:.6E} | lm loss PPL: {:.6E} |",
      iteration, dataset.empty() ? "" : " [" + dataset + "]", loss, ppl);
}

}  // namespace keel
