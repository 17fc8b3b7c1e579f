// RunReporter: what the run says about each iteration and evaluation, in one place: the
// Megatron iteration and validation lines (train/iteration_log.h), the per-dataset and guard
// signal lines, the warnings of skipped windows and non-finite iterations, one metrics record
// per iteration and per evaluation (metrics.jsonl and TensorBoard), and the journal's note of an
// fp16 loss scale driven to its floor. It reads results; it changes no training state.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "journal/run_journal.h"
#include "metrics/run_metrics.h"
#include "train/trainer.h"

namespace keel {

class RunReporter {
 public:
  // `metrics` and `journal` may be null (not written).
  RunReporter(const TrainConfig& cfg, const TrainerData& data, int64_t total_iters,
              RunMetrics* metrics, RunJournal* journal);

  void Iteration(const StepResult& r);
  void Validation(int64_t iteration, int64_t consumed_samples, const ValidationResult& v);

 private:
  // Metrics must never stop training: a failed append is said once.
  void Append(const nlohmann::json& record);

  const TrainConfig& cfg_;
  std::vector<std::string> dataset_names_;
  std::vector<std::string> valid_names_;
  bool report_each_set_ = false;
  bool combine_validation_ = true;
  int64_t total_iters_ = 0;
  RunMetrics* metrics_;
  RunJournal* journal_;
  bool metrics_failed_ = false;
};

}  // namespace keel
