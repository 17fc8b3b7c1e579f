// TrainState: everything a training run carries from one iteration to the next besides its
// tensors (weights and Adam moments). The trainer owns one; a checkpoint records it; a resume or
// a rollback reads one and hands it back (Trainer::Restore). Everything else that moves with the
// step (learning rate, batch size, which samples are read) is a pure function of the config and
// these counters.
#pragma once

#include <cstdint>
#include <vector>

#include "optim/loss_scaler.h"

namespace keel {

// Counters that advance with the run.
struct TrainCounters {
  int64_t iteration = 0;         // completed iterations
  int64_t consumed_samples = 0;  // all samples read (the data cursor and the schedule position)
  int64_t consumed_tokens = 0;
  int64_t skipped_iterations = 0;       // updates not applied (non-finite, or the guard's call)
  int64_t nan_iterations = 0;           // of those, iterations with a non-finite loss or gradient
  int64_t data_skipped_iterations = 0;  // iterations in a skipped data window (no forward)
};

// Inclusive range of iterations whose data is skipped.
struct IterationRange {
  int64_t first = 0, last = -1;
  bool Contains(int64_t it) const { return it >= first && it <= last; }
};

// Accumulators of the log interval in progress (the metrics cursor): a run resumed mid-interval
// prints the same iteration lines as one that never stopped.
struct LogIntervalState {
  double loss_sum = 0;  // over the iterations whose update was applied (`ok`)
  double ms = 0;        // wall time of every iteration of the interval
  double flops = 0;     // of the iterations that computed (not in a skipped data window)
  int64_t iters = 0, ok = 0;
  int64_t skipped = 0;  // updates not applied, for any reason
  int64_t nan = 0;      // of those, non-finite loss or gradients
  int64_t samples = 0;  // read by the iterations that computed
  // Per dataset of a mixture: summed mean loss of its sequences, and their count.
  std::vector<double> dataset_loss_sum;
  std::vector<int64_t> dataset_sequences;
};

struct TrainState {
  TrainCounters counters;
  int64_t optimizer_step = 0;  // AdamW updates applied (its bias correction)
  double lr_scale = 1.0;       // multiplier of the schedule's LR (--lr-scale-on-resume, the guard)
  std::vector<IterationRange> skip_ranges;  // data windows the guard skipped
  uint64_t data_salt = 0;  // generation of the data order, raised by the guard's re-seeding
  LogIntervalState interval;
  // fp16's loss scaler (scale 1 and zero trackers in fp32 and bf16, which do not scale).
  LossScalerState loss_scaler;
};

}  // namespace keel
