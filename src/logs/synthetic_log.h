// Synthetic training logs with known effects, for measuring the log detectors (`keel bench
// log-detectors`) and testing `keel logs analyze` / `watch`: iteration lines as Megatron-LM or
// Megatron-DeepSpeed print them, a healthy power-law loss with relative noise, and optionally an
// injected slow divergence of the loss and a sustained slowdown of the iteration time.
#pragma once

#include <cstdint>
#include <string>

namespace keel {

enum class SyntheticLogStyle {
  // Megatron-LM (megatron/training/training.py): "[date] iteration N/ T | consumed samples |
  // elapsed time per iteration (ms) | throughput per GPU (TFLOP/s/GPU) | learning rate | global
  // batch size | lm loss | loss scale | grad norm | number of skipped/nan iterations |"
  kMegatronLM,
  // Megatron-DeepSpeed (BigScience tr8/tr11): "iteration N/ T | consumed samples | consumed
  // tokens | elapsed time per iteration (ms) | learning rate | global batch size | lm loss | loss
  // scale | grad norm | num zeros | number of skipped/nan iterations | samples per second |
  // TFLOPs |"
  kMegatronDeepSpeed,
};

const char* SyntheticLogStyleName(SyntheticLogStyle s);  // "megatron-lm", "megatron-deepspeed"

struct SyntheticLogOptions {
  SyntheticLogStyle style = SyntheticLogStyle::kMegatronDeepSpeed;
  int64_t iterations = 10000;  // the last iteration printed (the first record is per_record)
  int per_record = 1;          // iterations per record (Megatron's --log-interval)
  uint64_t seed = 1;
  // Relative noise (standard deviation of a Gaussian factor) of each record's printed value: the
  // record's value as printed, not per iteration, so a 10-iteration record is as noisy as one.
  double loss_noise = 0.005;
  double time_noise = 0.005;

  // Healthy loss: floor + amplitude * (1 + iteration / scale)^-exponent (a power law that keeps
  // falling, slower and slower, as LM losses do).
  double loss_floor = 2.0, loss_amplitude = 6.0, loss_scale = 200.0, loss_exponent = 0.5;
  double iteration_seconds = 1.5;  // the healthy iteration time
  int64_t global_batch = 512, seq_length = 2048;
  double learning_rate = 3e-4;
  int64_t warmup_iterations = 0;  // learning rate ramps linearly from 0 over these (printed only)

  // Divergence: from iteration divergence_start (-1: none) the loss stops learning and climbs
  // from its level there: healthy(start) * (1 + divergence_size * (it - start) /
  // divergence_iterations), so it is divergence_size above that level after
  // divergence_iterations; the climb goes on past them (a divergence that does not recover).
  int64_t divergence_start = -1;
  double divergence_size = 0.05;
  int64_t divergence_iterations = 500;

  // Slowdown: from iteration slowdown_start (-1: none) the iteration time is
  // iteration_seconds * (1 + slowdown_size), and the throughput falls with it.
  int64_t slowdown_start = -1;
  double slowdown_size = 0.03;

  // Restart: after iteration restart_at (-1: none) a new process logs its start and resumes from
  // the checkpoint at resume_from (< restart_at: the log goes back); its first resume_bump_records
  // records have the loss times 1 + resume_bump (the bump after a resume).
  int64_t restart_at = -1, resume_from = -1;
  double resume_bump = 0.0;
  int resume_bump_records = 3;
};

// The log's text: a "using world size" line, then one iteration line per record.
std::string GenerateSyntheticLog(const SyntheticLogOptions& opt);

// The healthy loss at `iteration` (without noise or effects).
double SyntheticHealthyLoss(const SyntheticLogOptions& opt, double iteration);

}  // namespace keel
