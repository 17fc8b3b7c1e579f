// The Megatron iteration and validation lines, field for field as the seeds' logs show them, so
// existing log tooling (and keel's own log analyzer) reads keel's output unchanged.
#pragma once

#include <cstdint>
#include <string>

namespace keel {

struct IterationStats {
  int64_t iteration = 0;
  int64_t train_iters = 0;
  int64_t consumed_samples = 0;
  int64_t consumed_tokens = 0;
  double elapsed_ms_per_iter = 0;  // averaged over the log interval
  double learning_rate = 0;
  int64_t global_batch_size = 0;
  // NaN marks a field with no value in the interval; the line leaves it out.
  double lm_loss = 0;  // averaged over the non-skipped iterations of the log interval
  double loss_scale = 1.0;
  double grad_norm = 0;
  double num_zeros = 0;
  int64_t skipped_iterations = 0;  // in the log interval
  int64_t nan_iterations = 0;      // in the log interval: non-finite loss or gradients only
  double samples_per_second = 0;
  double tflops = 0;
};

//  iteration       10/     300 | consumed samples:           80 | ... | TFLOPs: 0.05 |
std::string FormatIterationLine(const IterationStats& s);
//  validation loss at iteration 100 | lm loss value: 5.123456E+00 | lm loss PPL: 1.678E+02 |
// exp(loss), with the exponent capped at 20 as Megatron does, so PPL stays printable.
double LossPpl(double loss);
// With `dataset`: one dataset of a mixture, " validation loss at iteration 100 [sotu] | ...".
std::string FormatValidationLine(int64_t iteration, double loss, const std::string& dataset = "");

}  // namespace keel
