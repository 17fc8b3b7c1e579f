// RunMetrics: the run's metrics, in its run directory (--save):
//   metrics.jsonl                       one JSON object per iteration ("kind": "train": every field
//                                       of the iteration line, per-dataset loss) and per evaluation
//   tensorboard/events.out.tfevents.*   the same as TensorBoard scalars under Megatron's grouped
//                                       tags, plus the guard's events as text (or in
//                                       --tensorboard-dir)
//   metrics-archive/NAME/               what a rewind set aside (nothing is deleted)
// Rollback-aware: when the run goes back to an earlier iteration (a resume from an older
// checkpoint, the guard's rollback), everything written after that iteration is moved to
// metrics-archive/ under a name that says what happened, and the live files continue cleanly
// from the resume point, so TensorBoard shows one curve without hand surgery.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/env.h"
#include "core/status.h"

namespace keel {

constexpr const char* kMetricsFile = "metrics.jsonl";
constexpr const char* kTensorBoardDir = "tensorboard";
constexpr const char* kMetricsArchiveDir = "metrics-archive";

// Where a run stands, on the three x-axes of the TensorBoard tags.
struct MetricsPosition {
  int64_t iteration = 0, samples = 0, tokens = 0;
};

// Where TensorBoard files go and which of Megatron's optional tags they carry.
struct TensorBoardOptions {
  std::string dir;  // --tensorboard-dir; empty: RUN/tensorboard (none without a run directory)
  // --log-timers-to-tensorboard: iteration-time/ (iteration time, samples and tokens per second)
  // and time/NAME-time, each phase of the iteration under Megatron's timer names.
  bool timers = false;
  bool batch_size = false;      // --log-batch-size-to-tensorboard: batch-size/
  bool validation_ppl = false;  // --log-validation-ppl-to-tensorboard: ... validation ppl
};

class RunMetrics {
 public:
  // `run_dir` empty: no metrics.jsonl (TensorBoard files only when `tb.dir` is given). Opening
  // does not touch existing files; call Rewind.
  static Status Open(Env* env, const std::string& run_dir, std::unique_ptr<RunMetrics>* out);
  static Status Open(Env* env, const std::string& run_dir, const TensorBoardOptions& tb,
                     std::unique_ptr<RunMetrics>* out);

  // The run continues after `at`: the live files as they were go to
  // metrics-archive/<reason>-iter<from>-to-iter<at>-<UTC time>-<n>/ (n: one more than the
  // archives already there, so two rewinds in one second never share a name), and the live
  // files keep only the records up to `at` (TensorBoard events up to its iteration, samples or
  // tokens). The archive is complete before a live file changes, and each live file is replaced
  // whole, so a crash at any point loses nothing. Nothing to move: nothing happens. `*archived`
  // gets the archive's path ("" if none). After a failed rewind this object writes nothing more
  // (every call returns that error): a live file may still be a hard link into the archive, and
  // appending to it would change the archive. The next process rewinds again.
  Status Rewind(const MetricsPosition& at, const std::string& reason, std::string* archived);

  // One record of the Trainer's metrics stream. A train record at or before the last one
  // written means the run went back (an in-process rollback): the files are rewound first.
  Status Append(const nlohmann::json& record);
  // A text event (the guard's journal) at `iteration`.
  Status AppendText(int64_t iteration, const std::string& tag, const std::string& text);
  // A scalar outside the metrics stream (e.g. stragglers/max_slowdown) at `iteration`.
  Status AppendScalar(int64_t iteration, const std::string& tag, double value);

  const std::string& run_dir() const { return dir_; }
  const std::string& tensorboard_dir() const { return tb_dir_; }

 private:
  Status DoRewind(const MetricsPosition& at, const std::string& reason, std::string* archived);
  Status OpenLive();
  Status WriteScalar(int64_t step, const std::string& tag, double value, double wall);

  Env* env_ = nullptr;
  std::string dir_;
  std::string tb_dir_;  // empty: no TensorBoard files
  TensorBoardOptions tb_;
  std::unique_ptr<WritableFile> jsonl_, events_;
  int64_t last_iteration_ = -1;  // of the last train record appended by this process
  Status failed_;                // of a rewind that did not finish
};

}  // namespace keel
