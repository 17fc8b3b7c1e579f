// LogAnalysis: the findings `keel logs analyze` reports on a parsed training log. Spikes and
// divergences go through the guard's InstabilityDetector (the same code that watches keel's own
// runs); restarts, skipped and NaN iterations come from the log's own counters; a sustained
// throughput drop is a change in the windowed median that lasts at least a window (the rule of the
// live detectors, health/level_shift.h).
//
// Event kinds (start/end are iterations):
//   spike_recovered   loss or grad-norm spike; end = first record back within recover_z
//   resume_spike      the same, starting within resume_window iterations after a restart
//   spike_unresolved  still open at the end of the log
//   divergence        a slow rise (the detector's divergence test), or a spike whose loss did not
//                     come back within recover_iters (a level shift)
//   nan               records with a non-finite iteration (LogRecord::nonfinite: the log's NaN
//                     counter, or a nan/inf loss or grad norm where it has none)
//   skipped           records whose "number of skipped iterations" is > 0 (a skipped data
//                     window after a rollback is this, not nan)
//   restart           the iteration went back or a process start was logged; start = last
//                     iteration before, end = first after
//   throughput_drop   the median throughput fell by more than drop_threshold and stayed down
//                     (over the records that trained an iteration: LogRecord::gap ones are left
//                     out)
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/env.h"
#include "guard/instability_detector.h"
#include "metrics/megatron_log.h"

namespace keel {

struct LogAnalysisOptions {
  DetectorConfig detector;
  int64_t recover_iters = 50;   // a spike not back by then is a divergence (guard-recover-iters)
  int64_t resume_window = 100;  // a spike this close after a restart is a resume spike
  double drop_threshold = 0.03;
  int drop_window = 0;  // records per median window (0: n/20, between 3 and 50)
};

struct LogEvent {
  std::string kind;
  int64_t start = 0, end = 0;
  std::string signal;  // "lm loss", "grad norm", "TFLOPs", ...
  double value = 0, baseline = 0;
  std::string detail;  // one sentence for people
};

struct SeriesStats {
  int64_t count = 0;
  double min = 0, median = 0, mean = 0, max = 0;
};

struct LogAnalysis {
  int64_t records = 0, validations = 0;
  int64_t first_iteration = 0, last_iteration = 0;  // of the first and last record
  int64_t min_iteration = -1, max_iteration = 0, train_iters = 0;
  SeriesStats tflops, samples_per_second, iteration_seconds;
  std::string throughput_signal;  // what the drop detector watched
  int64_t skipped_iterations = 0, nan_iterations = 0, restarts = 0;
  double eta_seconds = -1;  // remaining iterations x recent median time (-1: unknown)
  std::string eta_note;     // why it is unknown
  double recent_iteration_seconds = 0;
  std::vector<LogEvent> events;  // by start iteration
};

// Fails only when the log has no iteration records.
Status AnalyzeLog(const ParsedLog& log, const LogAnalysisOptions& opt, LogAnalysis* out);
std::string FormatLogAnalysis(const ParsedLog& log, const LogAnalysis& a);
nlohmann::json LogAnalysisJson(const ParsedLog& log, const LogAnalysis& a);
// A record as a keel metrics.jsonl train record (fields the log does not have are left out; an
// interval that trained nothing has null loss and throughput, as keel writes for it).
nlohmann::json LogRecordToMetrics(const LogRecord& r);

// `keel logs analyze --to-metrics DIR`: the log as a keel run directory, DIR/metrics.jsonl and
// DIR/tensorboard/ as `keel train` writes them (a restart that went back archived the way keel's
// rewinds are), the findings as guard/events text, and DIR/log-analysis.json. Refused when DIR
// holds any of these already. Atomic: everything is built in a hidden directory beside them and
// moved into place at the end (metrics.jsonl last); on an error nothing of it remains. `log_line`
// hears of each archived restart.
Status WriteLogAsRun(Env* env, const std::string& dir, const ParsedLog& log, const LogAnalysis& a,
                     const std::function<void(const std::string&)>& log_line);

constexpr const char* kLogAnalysisFile = "log-analysis.json";

}  // namespace keel
